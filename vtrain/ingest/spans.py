"""Decoding a trace's events in batches straight from the file's text, without copying it.

The top level is decoded from the text around the events alone (:func:`read_header_around_events`), or where
that fails with ``traceEvents`` as one raw slice of the text (:func:`read_header`); either says where the events
are. They are decoded a *span* at a time: the bytes of consecutive whole events. A span is decoded in place: the
separator bytes just before its first event and just after its last one are overwritten with ``[`` and ``]``,
which makes the span one JSON array, and put back afterwards. The text is a private copy of the file (see
:mod:`vtrain.ingest.text`), so the file is never written.

Spans are first cut where an event seems to end, at the first ``}, {"`` after every :data:`SPAN_BYTES`
(:func:`cut_points`). Starting at an event, brackets and quotes balance only at the end of an event, so a span
that decodes was cut right and the next one starts at an event too. Where one does not decode (a cut inside an
event, or a malformed event), the rest of the events are found one by one, as raw slices, and cut every
:data:`SPAN_EVENTS` events (:func:`whole_event_spans`).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import msgspec

from vtrain.errors import InputError
from vtrain.ingest.decode import (
    EVENTS_KEY,
    LOOSE_EVENTS_DECODER,
    LooseEvent,
    TraceHeader,
    decode_header,
    decode_loose_one_by_one,
    decode_text,
    not_utf8,
    one_events_list,
    raise_if_not_utf8,
)
from vtrain.ingest.text import TraceText

#: bytes per span: small enough that a span's decoded objects stay in the CPU's caches while its columns are read
#: (on the 127 MB benchmark trace 1 MiB takes 0.05-0.1 s less than 8 MiB), large enough that polars' fixed cost
#: per frame is small beside the span's decoding
SPAN_BYTES = 1 << 20
#: events per span where spans are cut between events found one by one
SPAN_EVENTS = 50_000


class Span(NamedTuple):
    """The bytes ``[start, end)`` of the text holding consecutive events, the first being event ``first_event``
    of ``traceEvents``."""

    start: int
    end: int
    first_event: int


class _EventsAsOneSlice(TraceHeader):
    """The top level with ``traceEvents`` as one raw slice of the text."""

    traceEvents: msgspec.Raw  # type: ignore[assignment]


_HEADER_DECODER = msgspec.json.Decoder(_EventsAsOneSlice)
_PLAIN_HEADER_DECODER = msgspec.json.Decoder(TraceHeader)
#: closing brackets tried from the end of the text (Kineto's logs, after the events, hold a few)
_CLOSINGS_TRIED = 1000
_RAW_EVENTS_DECODER = msgspec.json.Decoder(list[msgspec.Raw])
_BLANK = re.compile(rb"[ \t\r\n]*")
#: where one event seems to end and the next to begin (a kernel name holds ``{lambda()#1}, ...``)
_BETWEEN_EVENTS = re.compile(rb'\},[ \t\r\n]*\{[ \t\r\n]*"')


def read_header(text: TraceText) -> tuple[TraceHeader, Span | None]:
    """The trace's top level and the span of all its events (``None`` if there are none).

    The header's ``traceEvents`` is emptied: only the span is kept. A text that is not JSON because it holds NaN
    or Infinity values is read with them as ``null`` (:func:`~vtrain.ingest.decode.decode_text`): ``text`` then
    holds that reading, and counts them in ``bare_numbers``.
    """
    header, text.buffer, text.bare_numbers = decode_text(text.buffer, text.path, _HEADER_DECODER)
    events = memoryview(header.traceEvents)
    header.traceEvents = []
    if events[:1] != b"[":
        decode_header(text.buffer, text.path)  # raises the error of a trace whose traceEvents is not a list
    start = _address(events) - _address(text.buffer) + 1
    return header, _events_span(text, start, start + len(events) - 2)


def _events_span(text: TraceText, start: int, end: int) -> Span | None:
    """The events between the brackets at ``start - 1`` and ``end``, ``None`` if there are none."""
    return None if _BLANK.fullmatch(text.buffer, start, end) else Span(start, end, 0)


def read_header_around_events(text: TraceText) -> tuple[TraceHeader, Span | None] | None:
    """:func:`read_header` without parsing the events: the top level is decoded from the text before the first
    ``"traceEvents": [`` and after the ``]`` that seems to close it (the last one that follows a ``}``, where
    the top level decodes); ``None`` where there is none.

    Right only if every event then decodes: the events were found in the wrong place only if a ``]`` after a
    ``}`` follows the end of ``traceEvents`` (or such a key precedes it), and then the text in between holds an
    unbalanced bracket. Invalid JSON outside the events would fail the decoding here, inside them that of a span.
    """
    buffer = text.buffer
    key = EVENTS_KEY.search(buffer)
    if not key:
        return None
    end = len(buffer)
    for _ in range(_CLOSINGS_TRIED):
        end = buffer.rfind(b"]", key.end(), end)
        if end < 0:
            return None
        last = bytes(buffer[max(key.end(), end - 256):end]).rstrip()
        if last and not last.endswith(b"}"):
            continue
        around = bytes(buffer[:key.end()]) + bytes(buffer[end:])
        one_events_list(around, text.path)
        try:
            header = _PLAIN_HEADER_DECODER.decode(around)
        except msgspec.MsgspecError:
            continue
        return header, _events_span(text, key.end(), end)
    return None


def cut_points(text: TraceText, events: Span, span_bytes: int = SPAN_BYTES) -> Iterator[int]:
    """Where spans of about ``span_bytes`` of ``events`` seem to end: at the comma of the first ``}, {"`` (any
    whitespace) after every ``span_bytes``, and at the end of the events."""
    position = events.start + span_bytes
    while position < events.end:
        found = _BETWEEN_EVENTS.search(text.buffer, position, events.end)
        if not found:
            break
        yield found.start() + 1
        position = found.start() + 1 + span_bytes
    yield events.end


def decode_spans(text: TraceText, events: Span | None, decode: Callable[[Span], int], *,
                 span_bytes: int = SPAN_BYTES, events_per_span: int = SPAN_EVENTS) -> None:
    """Hand ``events`` to ``decode`` a span at a time, releasing each span's text once it is decoded. ``decode``
    returns the number of events in its span, and raises :class:`InputError` or ``msgspec.DecodeError`` for a span
    that does not decode: from that one on, the events are found one by one (:func:`whole_event_spans`), whose
    own error, if any, is the file's."""
    if not events:
        return
    start, first_event = events.start, 0
    for end in cut_points(text, events, span_bytes):
        try:
            first_event += decode(Span(start, end, first_event))
        except (InputError, msgspec.DecodeError):  # a cut inside an event, or a malformed event
            for span in whole_event_spans(text, Span(start, events.end, first_event), events_per_span):
                decode(span)
                text.release(span.end)
            return
        text.release(end)  # decoded: its pages of text are not needed again
        start = end + 1


def whole_event_spans(text: TraceText, events: Span, events_per_span: int = SPAN_EVENTS) -> list[Span]:
    """``events``, which starts at an event, cut every ``events_per_span`` events found one by one."""
    raws = decode_span(text, events, _RAW_EVENTS_DECODER)
    base = _address(text.buffer)
    spans = []
    for first in range(0, len(raws), events_per_span):
        last = raws[min(first + events_per_span, len(raws)) - 1]
        spans.append(Span(_address(raws[first]) - base, _address(last) - base + len(last),
                          events.first_event + first))
    return spans


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (part of the stable ABI since 3.11)."""

    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_GET_BUFFER = ctypes.pythonapi.PyObject_GetBuffer
_GET_BUFFER.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_RELEASE_BUFFER = ctypes.pythonapi.PyBuffer_Release
_RELEASE_BUFFER.argtypes = [ctypes.POINTER(_PyBuffer)]


def _address(obj: Any) -> int:
    """The memory address of a buffer's first byte (a raw event is a slice of the text: its offset is the
    difference of the two addresses; Python exposes no other way to get it)."""
    view = _PyBuffer()
    if _GET_BUFFER(obj, ctypes.byref(view), 0) != 0:  # raises the Python error itself on failure
        raise TypeError(f"{type(obj).__name__} does not expose a buffer")
    try:
        return int(view.buf or 0)
    finally:
        _RELEASE_BUFFER(ctypes.byref(view))


def decode_span(text: TraceText, span: Span, decoder: msgspec.json.Decoder) -> Any:
    """Decode the events in ``span`` as one JSON array with ``decoder``, whose type is a list; a malformed event
    is an error naming its position in ``traceEvents``."""
    start, end, first_event = span
    buffer = text.buffer
    # the byte before the first event is ``[`` or a separator (``,`` or whitespace), and so is the byte after the
    # last one (``]`` at worst): the events themselves are never touched
    before, after = buffer[start - 1], buffer[end]
    buffer[start - 1], buffer[end] = ord("["), ord("]")
    try:
        return decoder.decode(memoryview(buffer)[start - 1:end + 1])
    except msgspec.ValidationError as exc:
        raise InputError(f"malformed trace event: {_absolute(str(exc), first_event)}", text.path) from None
    except msgspec.DecodeError as exc:  # msgspec 0.23 says bytes that are no UTF-8 so (0.22: UnicodeDecodeError)
        try:
            raise_if_not_utf8(exc, buffer[start:end])
        except UnicodeDecodeError as bad:
            raise InputError(not_utf8(bad), text.path) from None
        raise
    finally:
        buffer[start - 1], buffer[end] = before, after


def decode_loose_span(text: TraceText, span: Span) -> list[LooseEvent | None]:
    """The events in ``span`` decoded tolerantly (:class:`~vtrain.ingest.decode.LooseEvent`; ``None`` for an entry
    that is not an object, see :func:`~vtrain.ingest.decode.decode_loose_one_by_one`); ``msgspec.DecodeError`` where
    the span is not whole events of JSON."""
    try:
        return decode_span(text, span, LOOSE_EVENTS_DECODER)
    except InputError:  # an entry of another shape: each is decoded on its own
        return decode_loose_one_by_one(decode_span(text, span, _RAW_EVENTS_DECODER))


def _absolute(message: str, first_event: int) -> str:
    """msgspec's ``at `$[i]...``` with ``i`` counted in the span, as ``at `$.traceEvents[n]...``` in the file."""
    return re.sub(r"`\$\[(\d+)\]", lambda m: f"`$.traceEvents[{first_event + int(m.group(1))}]", message, count=1)
