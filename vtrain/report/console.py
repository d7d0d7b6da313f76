"""The console commands print on: rich's, with a reader that goes away (`vtrain tables ... | head`) raised as
Python's ``BrokenPipeError``, which the command line turns into the quiet exit shell tools give (rich's own answer
is exit 1, which reads as a failure)."""

from __future__ import annotations

from rich.console import Console


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        raise BrokenPipeError()


def stdout_console() -> Console:
    """The console every command prints its tables and lines on (standard output)."""
    return _StdoutConsole()
