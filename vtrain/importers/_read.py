"""Reading the importers' text and CSV files: every problem becomes one :class:`InputError` naming the file (and
the line, where there is one), never a parser traceback."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import polars as pl

from vtrain.errors import InputError, warn_input
from vtrain.limits import MAX_TABLE_TEXT_BYTES

#: the line-number column that :func:`csv_rows` adds (1-based line in the file)
LINE = "line"


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes, or of a folder's files (not its subfolders or hidden files) by name and
    digest: what a profile records of the files it was built from, to know them again."""
    if not path.is_dir():
        with path.open("rb") as handle:  # streamed: a folder may hold a core dump beside its tables
            return hashlib.file_digest(handle, "sha256").hexdigest()
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    return hashlib.sha256("".join(f"{p.name}\0{file_digest(p)}\n" for p in files).encode()).hexdigest()


def read_text(path: Path) -> str:
    """The file's text (UTF-8, a byte-order mark dropped); an error for a missing, unreadable or empty file, or one
    of more than :data:`~vtrain.limits.MAX_TABLE_TEXT_BYTES` (decompressed), read no further."""
    try:
        data = _at_most(path, MAX_TABLE_TEXT_BYTES)
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a folder, not a file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read the file: {exc.strerror}", path) from None
    text = _decoded(data, path)
    if not text.strip():
        raise InputError("empty file", path)
    return text


def _at_most(path: Path, limit: int) -> bytes:
    """The file's bytes (a gzip file's decompressed), read up to ``limit``: an error beyond it."""
    with path.open("rb") as handle:
        packed = handle.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if packed else path.open("rb")) as handle:
            data = handle.read(limit + 1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise InputError(f"a gzip file that does not decompress ({exc})", path) from None
    if len(data) > limit:
        raise InputError(f"more than {limit >> 20} MiB of text{' once decompressed' if packed else ''}: no measurement "
                         f"table or training log is (a log can be cut to its runs' lines)", path)
    return data


def _decoded(data: bytes, path: Path) -> str:
    """A file's bytes as text: UTF-8 (a byte-order mark dropped); UTF-16 with its byte-order mark (what Windows
    PowerShell's ``>`` writes); a gzip file's come decompressed (:func:`_at_most`: a log kept compressed). A few
    bytes that are no UTF-8 in a long text (a host name in Latin-1) are read as U+FFFD, said; more, an error."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise InputError(f"not a text file (byte {exc.start} is not UTF-16, after a UTF-16 byte-order mark)",
                             path) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8-sig", errors="replace")
        bad = text.count("\ufffd")
        if bad > min(64, len(data) // 100):  # at most one byte in a hundred
            raise InputError(f"not a text file (byte {exc.start} is not UTF-8)", path) from None
        warn_input(f"{bad} byte(s) that are no UTF-8 (the first at byte {exc.start}) read as U+FFFD", path)
        return text


def csv_rows(path: Path, *, header: bool = True) -> tuple[list[str], pl.DataFrame]:
    """The header names and the data rows of a CSV file (or of a Markdown pipe table), every value a string with its
    whitespace stripped (null when empty).

    The rows' columns are the header names (a repeated name gets `` #2``, `` #3``...), or ``column 1``,
    ``column 2``... for a file without a header, plus :data:`LINE`. Blank lines are skipped; a short row is
    padded with nulls, and said (a cell left out shifts the row's last ones); a row longer than the header and a
    file with no data rows are errors.
    """
    return text_rows(read_text(path), path, header=header)


def text_rows(text: str, path: Path, *, header: bool = True) -> tuple[list[str], pl.DataFrame]:
    """:func:`csv_rows` of a file's text already read (``path`` names it in errors)."""
    table = _markdown_table(text)
    records = _markdown_records(text, table, path) if table else _csv_records(text, path)
    if not records:
        raise InputError("no values, only separators", path)
    if header:
        names = [value or "" for value in records[0][1]]
        records = records[1:]
    else:
        names = [f"column {i}" for i in range(1, len(records[0][1]) + 1)]
    if not records:
        raise InputError("no data rows", path)
    width = len(names)
    for line, values in records:
        if len(values) > width:
            raise InputError(f"line {line}: {len(values)} fields where the {'header' if header else 'first line'} "
                             f"has {width}", path)
    short = [line for line, values in records if len(values) < width]
    if short:
        warn_input(f"{len(short)} row(s) with fewer fields than the {'header' if header else 'first line'}'s "
                   f"{width} (line {', '.join(map(str, short[:5]))}{' ...' if len(short) > 5 else ''}): their last "
                   f"cells are read as empty (a cell left out shifts the ones after it)", path)
    columns = list(zip(*(values + [None] * (width - len(values)) for _, values in records), strict=True))
    frame = pl.DataFrame({name: list(values) for name, values in zip(unique_names(names), columns, strict=True)},
                         schema={name: pl.String for name in unique_names(names)})
    return names, frame.with_columns(pl.Series(LINE, [line for line, _ in records], dtype=pl.Int64))


def header_names(text: str) -> list[str]:
    """The column names of a table's text as :func:`csv_rows` reads them (a Markdown table's or the CSV's first
    record), without reading its rows; empty when the text has none."""
    table = _markdown_table(text)
    if table:
        return [cell or "" for cell in _markdown_cells(text.splitlines()[table[0]])]
    delimiter, text = _separated(text)
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        return [name.strip() for name in next(csv.reader([first], delimiter=delimiter), [])]
    except csv.Error:
        return []


def _csv_records(text: str, path: Path) -> list[tuple[int, list[str | None]]]:
    """The non-blank records of a CSV text with their line numbers, each value stripped (null when empty), comment
    lines left out (:func:`_without_comments`)."""
    delimiter, text = _separated(text)
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    value_of = _value_reader(text, delimiter, path)
    try:
        records = [(reader.line_num, [value_of(value) for value in fields])
                   for fields in reader if any(value.strip() for value in fields)]
    except csv.Error as exc:
        raise InputError(f"line {reader.line_num}: not CSV ({exc})", path) from None
    return _without_comments(records)


def _without_comments(records: list[tuple[int, list[str | None]]]) -> list[tuple[int, list[str | None]]]:
    """``records`` without comment lines: those starting with ``#`` above the header that have another number of
    fields than the line below them (a note over a pasted table: ``# SC21 Table 1, from the paper``; vTrain's own
    header, ``# GPUs,global batch,...``, is as wide as its rows), and those below it (no row starts with ``#``)."""
    def comment(values: list[str | None]) -> bool:
        return bool(values) and (values[0] or "").startswith("#")

    start = 0
    while start + 1 < len(records) and comment(records[start][1]) and \
            len(records[start][1]) != len(records[start + 1][1]):
        start += 1
    return records[start:start + 1] + [record for record in records[start + 1:] if not comment(record[1])]


def _markdown_table(text: str) -> tuple[int, int] | None:
    """Where the text's first Markdown pipe table lies (a table copied from a paper's or a project's
    documentation), as the 0-based indices of its header line and of the line after its last row; None when the
    text holds no line starting with ``|`` followed by the row of dashes under a header."""
    lines = [line.strip() for line in text.splitlines()]
    for index, (line, below) in enumerate(zip(lines, lines[1:])):
        if line.startswith("|") and _MARKDOWN_RULE.fullmatch(below):
            end = index + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            return index, end
    return None


#: the line under a Markdown table's header: ``|---|:--:|``
_MARKDOWN_RULE = re.compile(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?")


def _markdown_records(text: str, table: tuple[int, int], path: Path) -> list[tuple[int, list[str | None]]]:
    """The records of the Markdown pipe table at ``table`` (:func:`_markdown_table`) with their line numbers, the
    rule under the header left out, each cell stripped of spaces and of Markdown's emphasis (``**163**``: a
    table's best figure in bold), a number's thousands separators dropped, null when empty (an escaped ``\\|``
    stays in its cell);
    a warning names the lines around the table, which are not read."""
    lines = text.splitlines()
    first, end = table
    outside = sum(1 for line in lines[:first] + lines[end:] if line.strip())
    if outside:
        warn_input(f"read the Markdown table on lines {first + 1}-{end}; {outside} other line(s) not read", path)
    return [(number + 1, _markdown_cells(lines[number])) for number in [first, *range(first + 2, end)]]


def _markdown_cells(line: str) -> list[str | None]:
    """The cells of one line of a Markdown pipe table (its leading and trailing ``|`` dropped; an escaped ``\\|``
    stays in its cell), each stripped of spaces and of Markdown's emphasis, a number's thousands separators
    dropped, null when empty."""
    inner = line.strip()[1:]
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [_grouped(cell.replace("\\|", "|").strip().strip("*_`")) for cell in re.split(r"(?<!\\)\|", inner)]


def _grouped(value: str) -> str | None:
    """A value of a comma-separated file or a Markdown table, a number written with thousands separators
    (``16,797``: quoted in a CSV, as spreadsheets export them; as documentation tables print them) without them."""
    value = value.strip()
    return (value.replace(",", "") if _GROUPED.fullmatch(value) else value) or None


_GROUPED = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")


def _stripped(value: str) -> str | None:
    return value.strip() or None


def _decimal_comma(value: str) -> str | None:
    """A value of a semicolon-separated file, whose decimal mark is the comma (``812,5`` is 812.5)."""
    value = value.strip()
    return (value.replace(",", ".") if _DECIMAL_COMMA.fullmatch(value) else value) or None


_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+([eE][+-]?\d+)?")


def _value_reader(text: str, delimiter: str, path: Path) -> Callable[[str], str | None]:
    """How a CSV text's values are read: a comma between digits is the decimal mark in a semicolon-separated
    file (the export of a locale whose decimal mark is the comma) and in a tab-separated one that writes numbers
    with a comma between digits and none with a point (a locale writes one or the other), unless every such
    comma has three digits after it (``92,700``: a spreadsheet's thousands, copied), read so and said, since
    either could be meant; in a comma-separated file a quoted ``16,797`` is grouped."""
    if delimiter == ";":
        return _decimal_comma
    if delimiter != "\t" or re.search(r"\d,\d", text) is None or re.search(r"\d\.\d", text) is not None:
        return _grouped if delimiter == "," else _stripped
    numbers = re.findall(r"\d[\d,]*,\d+", text)
    if not all(_GROUPED.fullmatch(number) for number in numbers):
        return _decimal_comma
    warn_input(f"numbers such as {numbers[0]!r} read with the comma as a thousands separator (every comma between "
               f"digits has three after it; none has a point): if the comma is the decimal mark, write them with a "
               f"point", path)
    return _grouped


#: the line Excel writes first to name a CSV file's separator (``sep=;`` in a locale whose decimal mark is the comma)
_EXCEL_SEPARATOR = re.compile(r'^\ufeff?"?sep=([^\s]|\t)"?\s*$')  # quoted where a program quoted every line


def _separated(text: str) -> tuple[str, str]:
    """The field separator of a CSV text, and the text to read with it. The separator is the one an Excel ``sep=``
    first line names (that line is then left blank, the lines after it keeping their numbers: it had been read as
    the header, one field wide, "11 fields where the header has 2"), else a comma, or the semicolon or tab of a
    first line that has more of them than commas (a spreadsheet saved in a locale whose decimal mark is the comma, a
    tab-separated export; a column name may hold a comma of its own: ``"time (ms, median)"``)."""
    lines = text.split("\n")
    first = next((k for k, line in enumerate(lines) if line.strip()), None)
    if first is None:
        return ",", text
    if named := _EXCEL_SEPARATOR.match(lines[first]):
        return named.group(1), "\n".join(lines[:first] + [""] + lines[first + 1:])
    return max(",;\t", key=lines[first].count), text  # the comma on a tie


def unique_names(names: list[str]) -> list[str]:
    """The names with `` #2``, `` #3``... added to the second, third... of a repeated name."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} #{seen[name]}")
    return unique


def require_columns(rows: pl.DataFrame, columns: list[str], path: Path) -> None:
    """An error naming the columns of ``columns`` that ``rows`` lacks."""
    missing = [name for name in columns if name not in rows.columns]
    if missing:
        raise InputError(f"missing column(s) {', '.join(repr(name) for name in missing)}", path)


def numbers(rows: pl.DataFrame, columns: dict[str, type[pl.DataType]], path: Path) -> pl.DataFrame:
    """``rows`` with the string ``columns`` cast to the given numeric types; an error naming the line of the first
    missing or non-numeric value (or a missing column)."""
    require_columns(rows, list(columns), path)
    for name, dtype in columns.items():
        cast = pl.col(name).cast(dtype, strict=False)
        bad = rows.filter(cast.is_null() | (cast.is_nan() if dtype == pl.Float64 else pl.lit(False)))
        if not bad.is_empty():
            line, value = bad.row(0, named=True)[LINE], bad.row(0, named=True)[name]
            kind = "an integer" if dtype in (pl.Int64, pl.Int32) else "a number"
            problem = "is missing" if value is None else f"is not {kind}: {value!r}"
            raise InputError(f"line {line}: {name!r} {problem}", path)
        rows = rows.with_columns(cast)
    return rows


def positive(rows: pl.DataFrame, columns: list[str], path: Path) -> None:
    """An error naming the line of the first value below 1 in the (numeric) ``columns``."""
    for name in columns:
        bad = rows.filter(pl.col(name) < 1)
        if not bad.is_empty():
            raise InputError(f"line {bad[LINE][0]}: {name!r} must be at least 1 (got {bad[name][0]})", path)
