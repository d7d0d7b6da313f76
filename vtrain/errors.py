"""User-facing errors.

Every problem with the user's input is raised as :class:`InputError`; the command line prints its message as
one line (naming the file and what is wrong) and exits with code 2, without a traceback.
"""

from __future__ import annotations

import warnings
from pathlib import Path


class InputError(Exception):
    """Bad input from the user: a file, a folder, a config or a flag."""

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else str(path)
        super().__init__(f"{self.path}: {message}" if self.path else message)


class InputWarning(UserWarning):
    """Suspicious but usable input: the command line prints it as one line ``warning: <file>: <problem>``."""


def warn_input(message: str, path: str | Path | None = None) -> None:
    """Say something suspicious about the user's input (for code with no warning list to hand it to)."""
    warnings.warn(InputWarning(f"{path}: {message}" if path is not None else message), stacklevel=2)
