"""Start times of complete events, parsed from their raw JSON text all at once.

msgspec reads a number with more than 16 significant digits (a microsecond timestamp with a fraction, such as
``1669783689278940.0``) about ten times slower than a shorter one, which made ``ts`` a third of the decoding of
such a trace. The complete events keep ``ts`` raw; polars parses a span's times in one go, to the same floats
(both round correctly).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import polars as pl


class NotATime(ValueError):
    """A ``ts`` that is neither a finite number nor null: the span is decoded the plain way, which reports it."""


def parse_times(raws: Sequence[msgspec.Raw]) -> list[float | None]:
    """The times in ``raws`` as floats; ``None`` for a missing (empty) or ``null`` value."""
    if not raws:
        return []
    # a JSON value holds a newline only between the tokens of an array or an object: the count then differs
    lines = pl.Series([b"\n".join(raws).decode(errors="replace")]).str.split("\n").explode()
    if len(lines) != len(raws):
        raise NotATime("a ts that is an array or an object")
    missing = (lines == "") | (lines == "null")
    # msgspec reads the integer -0 as an integer, which becomes 0.0; polars would read -0.0
    values = lines.replace("-0", "0").cast(pl.Float64, strict=False)
    if (values.is_null() & ~missing).any() or values.is_infinite().any():
        raise NotATime("a ts that is not a number or out of range")
    return values.to_list()
