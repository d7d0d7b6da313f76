"""Start times of complete events, parsed from their raw JSON text all at once.

msgspec reads a number with more than 16 significant digits (a microsecond timestamp with a fraction, such as
``1669783689278940.0``) about ten times slower than a shorter one, which made ``ts`` a third of the decoding of
such a trace. The complete events keep ``ts`` raw, and Python's ``float`` reads a span's times, joined into one
text and split again (cheaper than reading each raw slice): the same floats, as both round correctly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec


class NotATime(ValueError):
    """A ``ts`` that is neither a finite number nor null: the span is decoded the plain way, which reports it."""


def parse_times(raws: Sequence[msgspec.Raw]) -> list[float | None]:
    """The times in ``raws`` as floats; ``None`` for a missing (empty) or ``null`` value."""
    if not raws:
        return []
    # a JSON value holds a newline only between the tokens of an array or an object: the count then differs
    lines = b"\n".join(raws).split(b"\n")
    if len(lines) != len(raws):
        raise NotATime("a ts that is an array or an object")
    try:
        times: list[float | None] = list(map(float, lines))
    except ValueError:
        times = [_time(line) for line in lines]
    if math.inf in times or -math.inf in times:
        raise NotATime("a ts out of range")
    if b"-0" in lines:  # msgspec reads the integer -0 as an integer, which becomes 0.0
        times = [0.0 if line == b"-0" else time for line, time in zip(lines, times)]
    return times


def _time(line: bytes) -> float | None:
    if line in (b"", b"null"):
        return None
    try:
        return float(line)
    except ValueError:
        raise NotATime("a ts that is not a number") from None
