"""Turning user errors into one line on stderr and exit code 2."""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

import typer

from vtrain.errors import InputError

F = TypeVar("F", bound=Callable[..., object])

EXIT_BAD_INPUT = 2


def user_errors(command: F) -> F:
    """Decorate a command so that :class:`InputError` prints ``error: <file>: <problem>`` and exits 2."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return command(*args, **kwargs)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT) from None

    return wrapper  # type: ignore[return-value]
