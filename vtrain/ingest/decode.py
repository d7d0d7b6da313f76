"""What a Kineto (Chrome JSON) trace file is read into, and the rules for reading its bytes.

The file's bytes (gzip a bounded piece at a time, :func:`inflate`; a byte-order mark; NaN and Infinity, which JSON
does not have; two ``traceEvents`` lists) and its top level (:class:`TraceHeader`, the events left raw) are read
here; the events are decoded a span of the text at a time by :mod:`vtrain.ingest.spans`, into small structs holding
only the fields vtrain keeps, so memory grows with the kept fields, not with the JSON text. Every error names the
file and what is wrong.

Two event types: the strict one (:class:`TraceEvent`: a field of the wrong type fails the file, naming the event,
as `vtrain ingest` reads) and the tolerant one (:class:`LooseEvent`: every field loosely typed, for readers that
count and leave out what they cannot use: the replay and `vtrain validate`, which turns its events into ingest's
typed events with :func:`typed_event`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import msgspec

from vtrain.errors import InputError
from vtrain.kineto import EXTERNAL_ID_KEYS, INPUT_DIMS_KEYS, INT64_MAX, INT64_MIN
from vtrain.limits import GZIP_RATIO_FROM_BYTES, MAX_GZIP_RATIO

READ_CHUNK = 16 << 20


#: an integer field of an event: ids, streams and counts are 64-bit in every writer (and in vtrain's tables); a
#: larger one is a malformed event, not a table that cannot be built
Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
#: a device's number, which vtrain's tables hold in 32 bits (no machine has more devices)
Int32 = Annotated[int, msgspec.Meta(ge=-(1 << 31), le=(1 << 31) - 1)]


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` of an event, restricted to the keys vtrain reads (all optional: schemas differ).

    Keys spelled differently by older PyTorch versions (:data:`vtrain.kineto.EXTERNAL_ID_KEYS`,
    :data:`vtrain.kineto.INPUT_DIMS_KEYS`) have a field each (``*_legacy``): read the current one, else the
    legacy one. ``stream`` is an integer, or the hex string ROCm traces write on runtime calls (``"0x0"``): read it
    with :func:`vtrain.kineto.parse_stream`.
    """

    external_id: Int64 | None = msgspec.field(default=None, name=EXTERNAL_ID_KEYS[0])
    external_id_legacy: Int64 | None = msgspec.field(default=None, name=EXTERNAL_ID_KEYS[1])  # PyTorch 1.8-1.9
    correlation: Int64 | None = None
    stream: Int64 | str | None = None
    device: Int32 | None = None
    wait_on_stream: Int64 | None = None  # cudaStreamWaitEvent (read by the replay)
    wait_on_event_record: Int64 | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name=INPUT_DIMS_KEYS[0])
    input_dims_legacy: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name=INPUT_DIMS_KEYS[1])  # PyTorch 1.8
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: Int64 | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Int64 | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: Int64 | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")  # text or a list


class EventFields(msgspec.Struct, gc=False):
    """The fields vtrain reads from every Chrome-trace event except its phase ``ph``; ``pid``/``tid`` are ints
    in Kineto but strings on its own span rows."""

    cat: str = ""
    name: str = ""
    pid: int | str | None = None  # not kept in any table
    tid: Int64 | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: EventArgs | None = None


class TraceEvent(EventFields, gc=False):
    """One Chrome-trace event of any phase."""

    ph: str = ""


class TraceHeader(msgspec.Struct):
    """The top level of a Kineto trace; ``traceEvents`` stays raw until decoded in batches."""

    traceEvents: list[msgspec.Raw]
    schemaVersion: int | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    pytorch_version: Any = None
    record_shapes: Any = None


_HEADER_DECODER = msgspec.json.Decoder(TraceHeader)
#: decodes a JSON array of trace events
TRACE_EVENTS_DECODER = msgspec.json.Decoder(list[TraceEvent], strict=False)  # "5" for 5, as in ingest/events.py


@contextmanager
def readable_trace(path: Path) -> Iterator[None]:
    """Errors while decoding a trace file that are the file's fault (bytes that are not UTF-8, JSON nested
    deeper than Python's stack) become one :class:`InputError` line naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:
        # msgspec counts the position within the string it was decoding, not the file: not said
        raise InputError(not_utf8(exc), path) from None
    except RecursionError:
        raise InputError("JSON nested too deep to be a Kineto trace", path) from None


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The error of a trace holding bytes that are not UTF-8, showing them (where they are is not said: msgspec
    counts within the string it decodes)."""
    return f"not UTF-8 text ({exc.reason} in a string, {exc.object[exc.start:exc.start + 4]!r}...): not a Kineto trace"


def raise_if_not_utf8(exc: msgspec.DecodeError, data: Any) -> None:
    """Raise the :class:`UnicodeDecodeError` of ``data`` where msgspec's ``exc`` is about bytes that are no UTF-8:
    msgspec 0.23 reports them as a DecodeError (0.22 raised the UnicodeDecodeError itself; the tolerant readers then
    skipped such an event as malformed, and a trace of it read as "nothing to replay")."""
    if "utf-8" in str(exc).lower():
        bytes(data).decode("utf-8")


#: a UTF-8 byte-order mark: read as nothing before a trace's text
BOM = b"\xef\xbb\xbf"


Text = bytes | bytearray | Any  # a trace's JSON text (an mmap too)

#: the top-level key of the events (whitespace allowed around the colon)
EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
#: what Python's ``json.dump`` writes for a float NaN or infinity: tokens JSON does not have
BARE_NUMBERS = (b"NaN", b"-Infinity", b"Infinity")
_BLANKS = b" \t\r\n"


def bare_numbers_as_null(data: Text) -> tuple[Text, int]:
    """``data`` with every NaN or (-)Infinity that stands where a value belongs read as ``null`` (a copy; the
    file is never written), and how many there were (``data`` itself if none).

    Python's ``json.dump`` writes these for a float that is not finite, and JSON does not allow them. A token
    inside a string (a name ``"x: NaN, y"``) is text and stays as it is."""
    candidates = sorted(found for token in BARE_NUMBERS for found in _bare(data, token))
    if not candidates:
        return data, 0
    text = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    tokens = list(_outside_strings(text, candidates))
    if not tokens:
        return data, 0
    pieces, position = [], 0
    for start, end in tokens:
        pieces += [data[position:start], b"null"]
        position = end
    pieces.append(data[position:])
    return bytearray().join(pieces), len(tokens)


def _outside_strings(text: bytes | bytearray, spans: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """The ``spans`` (in order) that start outside every JSON string: a string opens and closes at a quote that
    no odd run of backslashes escapes, so the parity of such quotes before a span says whether it is inside one."""
    inside, position = False, 0
    for start, end in spans:
        quotes = text.count(b'"', position, start)
        escaped = sum(1 for run in _ESCAPED_QUOTE.finditer(text, position, start) if (run.end() - run.start()) % 2 == 0)
        inside ^= (quotes - escaped) % 2 == 1
        position = start
        if not inside:
            yield start, end


#: a run of backslashes before a quote: the quote is escaped when the run is odd (the match, quote included, even)
_ESCAPED_QUOTE = re.compile(rb'\\+"')


def _bare(data: Text, token: bytes) -> Iterator[tuple[int, int]]:
    """Where ``token`` stands as a value: after ``:``, ``,`` or ``[`` and before ``,``, ``]`` or ``}`` (blanks
    aside); not part of a longer token (``-Infinity`` is not also an ``Infinity``)."""
    found = data.find(token)
    while found >= 0:
        end = found + len(token)
        before = found - 1
        while before >= 0 and data[before] in _BLANKS:
            before -= 1
        after = end
        while after < len(data) and data[after] in _BLANKS:
            after += 1
        if before >= 0 and data[before] in b":,[" and after < len(data) and data[after] in b",]}":
            yield found, end
        found = data.find(token, end)


def _events_keys(data: Text) -> Iterator[int]:
    """Where :data:`EVENTS_KEY` matches (a plain search for the name first: several times faster than the
    pattern's on a large text)."""
    found = data.find(_EVENTS_NAME)
    while found >= 0:
        if EVENTS_KEY.match(data, found):
            yield found
        found = data.find(_EVENTS_NAME, found + len(_EVENTS_NAME))


_EVENTS_NAME = b'"traceEvents"'


def bare_numbers_warning(path: Path, count: int) -> str:
    """The warning line for a trace whose ``count`` NaN or Infinity values were read as ``null``."""
    return (f"{path}: {count} value(s) written as NaN or Infinity (not JSON; Python's json.dump writes them for a "
            f"float that is not finite) read as missing: an event missing its time or duration is left out")


@dataclass
class MalformedEvents:
    """Events a reader read loosely or left out for their shape, by kind: the tolerant readers (the replay, `vtrain
    validate`, `vtrain whatif`) count every kind, `vtrain ingest` (which fails a file for the others) the events
    without a name. Said in one warning line per file (:meth:`warning`)."""

    not_objects: int = 0  # entries of traceEvents that are not objects: left out
    infinite: int = 0  # complete events with a time or duration beyond a float's range (1e400): left out
    uncategorised: int = 0  # complete events without a category, or with one that is not text: left out
    nameless: int = 0  # complete events without a name (none, or an empty one): kept, with an empty name
    names_not_text: int = 0  # complete events whose name is not text (a number): kept, with an empty name
    args_not_objects: int = 0  # complete events whose args are not an object (a list): kept, without their args
    times_as_text: int = 0  # times and durations written as text ("ts": "1234.5"): read as the numbers they hold

    def warning(self, path: Path) -> str | None:
        """The warning line for ``path``'s malformed events, each kind with its count and what was done with
        them; ``None`` if there are none."""
        said = [f"{count} {what}" for count, what in (
            (self.not_objects, "entries of traceEvents that are not objects (left out)"),
            (self.infinite, "with a time or duration beyond a float's range, such as 1e400 (left out)"),
            (self.uncategorised, "without a category or with one that is not text (left out)"),
            (self.nameless, "without a name (kept, with an empty name)"),
            (self.names_not_text, "with a name that is not text (kept, with an empty name)"),
            (self.args_not_objects, "with args that are not an object (kept, without their args)"),
            (self.times_as_text, "times or durations written as text, \"ts\": \"1234.5\" (read as the numbers they "
                                 "hold)")) if count]
        return f"{path}: malformed events: {'; '.join(said)}" if said else None


def one_events_list(data: Text, path: Path) -> None:
    """An error for a text with two ``traceEvents`` lists at the top level: JSON readers disagree on which one
    the file means (Python's ``json`` and HTA take the last, msgspec the first). A ``traceEvents`` list inside
    another value (``"meta": {"traceEvents": [...]}``) is that value's, not a second one."""
    found = sum(1 for _ in _events_keys(data))
    if found > 1 and found - _events_keys_inside_values(data) > 1:
        raise InputError("two traceEvents lists (readers disagree on which one the file means: Python's json and "
                         "HTA take the last, others the first); keep one", path)


_TOP_LEVEL_VALUES = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _events_keys_inside_values(data: Text) -> int:
    """How many ``"traceEvents": [`` lie inside the values of the text's top level (each value's text searched;
    the top level decoded once, only where the key was found more than once). 0 where the text does not decode:
    then every key found counts as a top-level one."""
    try:
        values = _TOP_LEVEL_VALUES.decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return 0
    return sum(sum(1 for _ in _events_keys(bytes(value))) for value in values.values())


def is_gzip(handle: BinaryIO, path: Path) -> bool:
    """Whether the open file holds gzip data (the handle is left at the start); errors for an empty file or a
    ``.gz`` name on plain data."""
    head = handle.read(2)
    if not head:
        raise InputError("file is empty", path)
    handle.seek(0)
    gzip = head == b"\x1f\x8b"
    if path.suffix == ".gz" and not gzip:
        raise InputError("not a gzip file (the name ends in .gz)", path)
    return gzip


#: most bytes one step of :func:`inflate` gives (a 16 MiB chunk of a gzip bomb would otherwise give 16 GiB at once)
INFLATE_STEP = 16 << 20


def inflate(handle: BinaryIO, path: Path, progress: Callable[[int], None] | None, digest: Any) -> Iterator[bytes]:
    """The decompressed content of the gzip file ``handle``, a bounded piece at a time, every member of a
    multi-member file (as ``gzip`` and ``zcat`` read it); ``digest`` is fed the compressed bytes and ``progress``
    their count. Errors name the file: corrupt or truncated gzip data, and data that expands more than
    :data:`~vtrain.limits.MAX_GZIP_RATIO` times (no trace does; a gzip bomb does)."""
    inflater = zlib.decompressobj(wbits=31)
    read = written = 0
    fed = False  # whether the current member has had any bytes
    while chunk := handle.read(READ_CHUNK):
        digest.update(chunk)
        read += len(chunk)
        if progress:
            progress(len(chunk))
        while True:  # until the chunk is used up and its output given (a full step may leave output in zlib)
            try:
                piece = inflater.decompress(chunk, INFLATE_STEP)
            except zlib.error as exc:
                raise InputError(f"corrupt gzip data: {exc}", path) from None
            fed, chunk, written = True, inflater.unconsumed_tail, written + len(piece)
            used = read - len(chunk)
            if written > GZIP_RATIO_FROM_BYTES and written > MAX_GZIP_RATIO * used:
                raise InputError(f"gzip data expands more than {MAX_GZIP_RATIO} times ({used:,} bytes gave {written:,}"
                                 f" so far; traces expand about 15 times): not read (a gzip bomb?)", path)
            yield piece
            if inflater.eof and (rest := inflater.unused_data.lstrip(b"\0")):  # the next member
                chunk, inflater, fed = rest, zlib.decompressobj(wbits=31), False
            elif not chunk and len(piece) < INFLATE_STEP:
                break
    if fed and not inflater.eof:
        raise InputError("truncated gzip file (the compressed stream ends early)", path)


def decode_text(data: Text, path: Path, decoder: msgspec.json.Decoder = _HEADER_DECODER
                ) -> tuple[TraceHeader, Text, int]:
    """:func:`decode_header` of a trace's whole text; where it is not JSON because it holds NaN or Infinity values,
    those are read as ``null`` (:func:`bare_numbers_as_null`). The header, the text it was decoded from (the
    events are slices of it), and how many such values there were, for the caller to say."""
    try:
        return decode_header(data, path, decoder), data, 0
    except InputError:
        nulled, count = bare_numbers_as_null(data)
        if not count:
            raise
    return decode_header(nulled, path, decoder), nulled, count


def decode_header(data: Text, path: Path, decoder: msgspec.json.Decoder = _HEADER_DECODER) -> TraceHeader:
    """Decode the top level of a trace (with ``decoder``, whose type is a :class:`TraceHeader`); the events stay
    raw. Two ``traceEvents`` lists are an error (:func:`one_events_list`)."""
    one_events_list(data, path)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"not a Kineto trace: {_describe_validation(exc)}", path) from None
    except msgspec.DecodeError as exc:
        try:  # msgspec 0.23 checks every string's bytes here (0.22 when decoding events)
            raise_if_not_utf8(exc, data)
        except UnicodeDecodeError as bad:
            raise InputError(not_utf8(bad), path) from None
        raise InputError(f"invalid JSON: {_describe_decode(exc, len(data))}{_unescaped_name_hint(exc, data)}",
                         path) from None


class LooseEvent(msgspec.Struct, gc=False):
    """A Chrome-trace event with every field left loosely typed: what the tolerant readers decode. The
    readers that use it (the replay, `vtrain validate`) check each field themselves and leave out what they
    cannot use, counting it, instead of failing the file."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: dict[str, Any] | None = None


class _ArgsNotAnObject(LooseEvent, gc=False):
    """The fallback for an event whose ``args`` is not an object (its args are then ignored:
    :func:`args_not_an_object`)."""

    args: Any = None  # type: ignore[assignment]


#: decodes a JSON array of events tolerantly (a span of them: :func:`vtrain.ingest.spans.decode_loose_span`)
LOOSE_EVENTS_DECODER = msgspec.json.Decoder(list[LooseEvent])
#: one event at a time; a number beyond a float's range (``1e400``, which msgspec otherwise refuses) is read as
#: Python reads it, an infinity, for the reader to leave out
_LOOSE_ONE = msgspec.json.Decoder(LooseEvent, float_hook=float)
_ARGS_NOT_AN_OBJECT = msgspec.json.Decoder(_ArgsNotAnObject, float_hook=float)


def decode_loose_one_by_one(raw: list[msgspec.Raw]) -> list[LooseEvent | None]:
    """Raw events as :class:`LooseEvent`, each on its own (for a batch that did not decode as a whole): ``None``
    for one that is not an object, ``args=None`` for one whose args are not an object (:func:`args_not_an_object`
    tells it), an infinity for a number beyond a float's range."""
    events: list[LooseEvent | None] = []
    for item in raw:
        try:
            events.append(_LOOSE_ONE.decode(item))
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            if isinstance(exc, msgspec.DecodeError):
                raise_if_not_utf8(exc, item)  # the file's error, not one malformed event
            try:
                loose = _ARGS_NOT_AN_OBJECT.decode(item)
                loose.args = None
                events.append(loose)
            except (msgspec.ValidationError, msgspec.DecodeError):
                events.append(None)
    return events


#: EventArgs fields kept as raw JSON text, by their key in a trace
_RAW_ARGS = {f.encode_name: f.name for f in msgspec.structs.fields(EventArgs) if f.type is msgspec.Raw}
#: the other EventArgs fields, by their key in a trace
_ARG_FIELDS = {f.encode_name: f.name for f in msgspec.structs.fields(EventArgs) if f.type is not msgspec.Raw}


def args_not_an_object(event: LooseEvent) -> bool:
    """Whether the event's ``args`` was there but not an object (it was decoded without them)."""
    return isinstance(event, _ArgsNotAnObject)


def loose_name(event: LooseEvent) -> str:
    """The event's name as the tolerant readers read it: empty where it has none or it is not text (a number)."""
    return event.name if isinstance(event.name, str) else ""


def typed_event(event: LooseEvent, ts: float | None, dur: float | None) -> TraceEvent | None:
    """A loosely decoded complete event as the typed :class:`TraceEvent` ingest's tables are built from, with
    ``ts`` and ``dur`` already read as numbers and its name as :func:`loose_name` reads it; ``None`` when ``cat``
    is not text. An argument of the wrong type (``"External id": "5"`` is read as 5; a list where a number
    belongs) is left out, not the event."""
    cat, name = event.cat, loose_name(event)
    if not isinstance(cat, str):
        return None
    pid = event.pid if isinstance(event.pid, (int, str)) and not isinstance(event.pid, bool) else None
    tid = event.tid if isinstance(event.tid, (int, str)) and not isinstance(event.tid, bool) else None
    args = typed_args(event.args) if event.args else None
    return TraceEvent(cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=args, ph="X")


def typed_args(args: dict[str, Any]) -> EventArgs:
    """An event's ``args`` object as :class:`EventArgs`; numbers written as strings are read, values that do not
    fit their field are left out."""
    values = {key: value for key, value in args.items() if key not in _RAW_ARGS}
    try:
        typed = msgspec.convert(values, EventArgs, strict=False)
    except msgspec.ValidationError:
        typed = EventArgs()
        for key, value in values.items():
            field = _ARG_FIELDS.get(key)
            try:
                one = msgspec.convert({key: value}, EventArgs, strict=False) if field else None
            except msgspec.ValidationError:
                continue
            if one is not None:
                setattr(typed, field, getattr(one, field))
    for key, field in _RAW_ARGS.items():
        if key in args:
            setattr(typed, field, msgspec.Raw(msgspec.json.encode(args[key])))
    return typed


def _describe_validation(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    if "missing required field `traceEvents`" in text:
        return "no traceEvents list"
    if text.startswith("Expected `object`, got `array`") and "$" not in text:
        return ("the top level is a JSON array (Chrome's array format, as torch.autograd.profiler wrote traces before "
                "PyTorch 1.8): vtrain reads torch.profiler's Kineto traces, an object with traceEvents")
    if text.startswith("Expected `object`") and "$" not in text:
        return "the top level is not a JSON object"
    return text


#: where msgspec says a JSON error is (``... (byte 7783)``)
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")
#: a line of Kineto's JSON that holds an event's name (Kineto writes each field on a line of its own)
_NAME_LINE = re.compile(rb'^\s*"name"\s*:\s*"(?P<name>.*)"\s*,?\s*$')
#: the most bytes of a line :func:`_unescaped_name_hint` looks at on each side of the error
_LINE_REACH = 1 << 16


def _unescaped_name_hint(exc: msgspec.DecodeError, data: Text) -> str:
    """Where the JSON error lies in an event's ``"name"`` line whose name holds a bare double quote, what it is:
    PyTorch's profiler writes ``record_function`` names into the trace without escaping them, so a span named
    ``say "hi"`` makes the whole file invalid JSON. Else nothing."""
    where = _ERROR_BYTE.search(str(exc))
    if where is None:
        return ""
    at = int(where[1])
    start = data.rfind(b"\n", max(0, at - _LINE_REACH), at) + 1
    end = data.find(b"\n", at, at + _LINE_REACH)
    line = bytes(data[start:end if end >= 0 else at])
    name = _NAME_LINE.match(line)
    if name is None or not re.search(rb'(?<!\\)"', name["name"]):
        return ""
    shown = name["name"].decode("utf-8", "replace")
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return (f": an event name there holds a double quote that is not escaped ({shown}); PyTorch's profiler writes "
            f"record_function names as they are: rename the span without '\"' and record again, or escape the quote "
            f"in the file")


def _describe_decode(exc: msgspec.DecodeError, size: int) -> str:
    text = str(exc)
    if "truncated" in text.lower() or "end of" in text.lower():
        return f"truncated JSON (the text ends early, after {size} bytes)"
    return text
