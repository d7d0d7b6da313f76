"""User-facing errors and stops.

Every problem with the user's input is raised as :class:`InputError`; the command line prints its message as
one line (naming the file and what is wrong) and exits with code 2, without a traceback. A stop signal (Ctrl-C,
SIGTERM) is raised as :class:`Stopped` by :func:`stop`, which also remembers it: Python drops an exception raised
while a weakref callback or ``__del__`` runs (it prints "Exception ignored" and goes on), so the places that must
not finish a stopped run (publishing an output, the command's exit) ask :func:`raise_if_stopped` again.
"""

from __future__ import annotations

import re
import signal
import threading
import warnings
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

#: stop signal -> (line printed, exit code): 128 + the signal's number, as shells report it
STOPS = {signal.SIGINT: ("interrupted", 130), signal.SIGTERM: ("terminated", 143)}
_STOPPED: list[int] = []  # the stop signals that arrived in this process


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows
    it, and not KeyboardInterrupt itself, which click turns into "Aborted!" and exit code 1."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(STOPS[signal.Signals(signum)][0])


def stop(signum: int) -> NoReturn:
    """Raise :class:`Stopped` for the signal ``signum``, and remember that it arrived."""
    _STOPPED.append(signum)
    raise Stopped(signum)


def raise_if_stopped() -> None:
    """Raise :class:`Stopped` again if a stop signal arrived (its first exception may have been dropped)."""
    if _STOPPED:
        raise Stopped(_STOPPED[0])


@contextmanager
def stops_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver the first that arrived to the handler that was
    in place (Python handles signals in the main thread only: elsewhere there is nothing to hold)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {each: signal.signal(each, lambda signum, _: arrived.append(signum))
                for each in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, signal.SIG_DFL if handler is None else handler)
        if arrived:
            signal.raise_signal(arrived[0])


class InputError(Exception):
    """Bad input from the user: a file, a folder, a config or a flag."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)


class InputWarning(UserWarning):
    """Suspicious but usable input: the command line prints it as one line ``warning: <file>: <problem>``."""


def os_error_number(exc: BaseException) -> int | None:
    """The operating system's error number of an exception: Python's ``OSError``'s, or polars' (Rust's) errors',
    whose text ends its IO error with ``(os error 28)`` (an ``OSError`` of no number, or a polars error); None for
    any other exception."""
    number = exc.errno if isinstance(exc, OSError) else None
    if number is None and (isinstance(exc, OSError) or type(exc).__module__.startswith("polars")):
        found = re.search(r"\(os error (\d+)\)", str(exc))
        number = int(found.group(1)) if found else None
    return number


def some_of(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names`` and how many more, as a message lists them: ``"a, b, c and 4 more"``."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def number_ranges(numbers: Iterable[int], shortest: int = 2) -> str:
    """Whole numbers as text, runs of ``shortest`` or more consecutive ones as ranges: ``0-3, 5, 6`` for 0, 1, 2, 3,
    5, 6 with ``shortest`` 3 (``0-3, 5-6`` with 2)."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(f"{a}-{b}" if b - a + 1 >= shortest else ", ".join(map(str, range(a, b + 1))) for a, b in runs)


def warn_input(message: str, path: str | Path | None = None) -> None:
    """Say something suspicious about the user's input (for code with no warning list to hand it to)."""
    warnings.warn(InputWarning(f"{path}: {message}" if path is not None else message), stacklevel=2)
