"""Entry point of `python -m vtrain.cli.main` and of the `vtrain` console script.

`vtrain ingest` and `vtrain simulate` parse their own arguments and run without importing typer (see
:mod:`vtrain.cli.ingest`, :mod:`vtrain.cli.simulate`); every other command goes through the typer app of
:mod:`vtrain.cli.app`, imported only then. A usage error (an unknown
flag, ``--top 0``) is one line ``error: <problem>`` and exit code 2, like bad input.

Ctrl-C (SIGINT) and SIGTERM stop any command the same way: the staging folder being written is removed on the way
out (every writer stages, see :mod:`vtrain.outputs`), one line ``interrupted`` (or ``terminated``) goes to stderr,
no traceback, and the exit code is 130 (143). A second signal during that clean-up is ignored.
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
import warnings
from types import FrameType
from typing import Any, NoReturn

from vtrain.cli.errors import EXIT_BAD_INPUT, ReaderGone
from vtrain.errors import STOPS, InputWarning, Stopped, os_error_number, raise_if_stopped, stop
from vtrain.outputs import forget_checks

#: commands that parse their own arguments -> their module (its ``main(argv)`` returns the exit code)
OWN_ARGUMENTS = {"ingest": "vtrain.cli.ingest", "simulate": "vtrain.cli.simulate"}

#: exit code when stdout's reader has gone: 128 + SIGPIPE, as shells report a tool killed by it
_BROKEN_PIPE = 141


def _stop(signum: int, frame: FrameType | None) -> NoReturn:
    for each in STOPS:
        signal.signal(each, signal.SIG_IGN)  # let the clean-up on the way out finish
    stop(signum)


def _unraisable(unraisable: Any) -> None:
    """Python's hook for an exception it cannot raise (one from a ``__del__`` or a C library's callback), printed as
    "Exception ignored in ..." with its traceback: a stop's is dropped silently (it is remembered, and raised again
    on the way out: :func:`vtrain.errors.raise_if_stopped`); any other is printed as Python prints it."""
    if not isinstance(unraisable.exc_value, Stopped):
        sys.__unraisablehook__(unraisable)


def main() -> None:
    """Run the command named on the command line."""
    for each in STOPS:
        signal.signal(each, _stop)
    sys.unraisablehook = _unraisable
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", InputWarning)
            warnings.showwarning = _show_warning
            try:
                _run(sys.argv[1:])
            finally:
                raise_if_stopped()  # a stop whose exception was dropped on the way (see vtrain.errors)
    except Stopped as stopped:
        line, code = STOPS[signal.Signals(stopped.signum)]
        print(line, file=sys.stderr)
        sys.exit(code)
    except (BrokenPipeError, ReaderGone):  # the reader went away (`vtrain simulate ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        sys.exit(_BROKEN_PIPE)
    except MemoryError:  # the process's memory limit reached (ulimit -v, a container's): a line, not a traceback
        print("error: out of memory: the process reached its memory limit (ulimit -v, a container's, or the "
              "machine's); give vtrain more, or less to hold at once (--workers 1)", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # where the file system refuses what was asked, wherever it is first touched
        line = _refused_by_the_file_system(exc)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


#: what a file system answers about the place (full, read-only, not permitted, gone), not about vtrain: one line
_REFUSED_BY_THE_FILE_SYSTEM = {errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                               errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EIO, errno.EFBIG,
                               errno.ELOOP, errno.ENOTEMPTY, errno.EEXIST}


def _refused_by_the_file_system(exc: Exception) -> str | None:
    """The error line for an exception that is the file system's refusal: Python's OSError, or polars' (Rust's)
    errors, whose message ends its IO error with ``(os error 28)``; None for any other exception."""
    number = os_error_number(exc)
    if number not in _REFUSED_BY_THE_FILE_SYSTEM:
        return None
    filename = getattr(exc, "filename", None)
    if number == errno.ENAMETOOLONG:
        return f"{_shown_name(filename)}: file name too long for this system"
    return f"{_shown_name(filename) if filename else 'the file system refused it'}: {os.strerror(number)}"


def _shown_name(name: object) -> str:
    """A file name for an error line: its first 60 characters and how long it is, on one line."""
    from vtrain.cli.errors import one_line

    text = one_line(str(name))
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


def _show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    """An :class:`~vtrain.errors.InputWarning` as one line ``warning: ...``; any other warning as Python shows it."""
    if issubclass(category, InputWarning):
        from vtrain.cli.errors import warn

        warn(str(message))
    else:
        _PYTHON_SHOWWARNING(message, category, *args, **kwargs)


_PYTHON_SHOWWARNING = warnings.showwarning


def _run(args: list[str]) -> None:
    forget_checks()  # a command starts afresh, however many ran in this process before
    unread = next((index for index, arg in enumerate(args) if _other_digits(arg)), None)
    if unread is not None:  # Python's int() and float() read them; run configs, YAML and JSON do not
        flag = args[unread - 1] + " " if unread and args[unread - 1].startswith("--") else ""
        print(f"error: {_shown_name(flag + args[unread])}: a number written in digits other than 0-9: write it in "
              "0-9", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if args[:1] and args[0] in OWN_ARGUMENTS:
        sys.exit(importlib.import_module(OWN_ARGUMENTS[args[0]]).main(args[1:]))
    from typer._click.exceptions import ClickException

    from vtrain.cli.app import app
    from vtrain.cli.errors import one_line

    try:
        code = app(standalone_mode=False)
    except ClickException as exc:  # a usage error (bad flag or value): one line, as for bad input
        if exc.format_message():  # empty after `vtrain` alone has printed the help
            print(f"error: {one_line(exc.format_message())}", file=sys.stderr)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


def _other_digits(arg: str) -> bool:
    """Whether a command-line value (``--gpus=٨``, ``..٣٣٦٠``, ``٨,١٦``) is a number in digits other than ASCII's:
    `--gpus ٨` ran 8 GPUs where a run config's ``tp: ٨`` is refused."""
    if arg.isascii():
        return False
    value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
    for part in value.removeprefix("..").split(","):
        try:
            float(part)
        except ValueError:
            continue
        return not part.isascii()
    return False


def __getattr__(name: str) -> Any:
    """``app``, the typer app (the console script and the tests use it), imported on first use."""
    if name == "app":
        from vtrain.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
