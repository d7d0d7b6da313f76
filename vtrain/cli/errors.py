"""Turning user errors into one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Callable, NoReturn, TypeVar

from vtrain.errors import InputError

F = TypeVar("F", bound=Callable[..., object])

EXIT_BAD_INPUT = 2


class ReaderGone(Exception):
    """Standard output's reader went away (`vtrain tables ... | head`). Not an ``OSError``: click reads a broken
    pipe as its own exit 1, and vtrain exits as shell tools do (:mod:`vtrain.cli.main`)."""


def report(exc: InputError) -> int:
    """Print ``error: <file>: <problem>`` on stderr, always one line (a line break in a file name or a value is
    shown as ``\\n``); the exit code for it."""
    print(f"error: {one_line(str(exc))}", file=sys.stderr)
    return EXIT_BAD_INPUT


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped, and any other control character (a terminal escape sequence read from
    a file) shown as its code."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


def warn(line: str) -> None:
    """Print ``warning: <line>`` on stderr, one line as errors are: suspicious but usable input, never silence."""
    print(f"warning: {one_line(line)}", file=sys.stderr)


def user_errors(command: F) -> F:
    """Decorate a typer command so that :class:`InputError` prints ``error: <file>: <problem>`` and exits 2."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            import typer  # only typer commands get here: `vtrain ingest` runs without loading typer

            raise typer.Exit(report(exc)) from None
        except BrokenPipeError:
            raise ReaderGone() from None

    return wrapper  # type: ignore[return-value]


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line ``error: <problem>`` and exit code 2, as bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {one_line(message)} (see --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
