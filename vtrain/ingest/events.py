"""Decoding only the complete events (``"ph": "X"``) of a span: the only ones ingest reads.

The events are decoded as a union tagged by ``ph``: a complete event becomes a :class:`CompleteEvent`, an event
of any other phase of the Chrome trace format an empty struct, without building its strings and arguments. Half
the events of a Kineto trace are flows, instants and metadata, so this saves a third of the decoding. An event
with an unknown phase, without one, or malformed makes the span be decoded again as plain
:class:`~vtrain.ingest.decode.TraceEvent` objects, which tolerate the first two and report the last by its index
in ``traceEvents``. (Only the fields of complete events are checked: a malformed field of, say, a flow event is
ignored, as ingest never reads it.) A complete event's ``ts`` stays raw JSON text, parsed for the whole span by
:func:`~vtrain.ingest.times.parse_times`; a ``ts`` that is not a number sends the span down the plain decoder too.

Duration events (``"ph": "B"`` / ``"E"`` pairs) are not read but counted, for a warning: Kineto writes none (its
spans are complete events), other exporters may, and a span left out credits its kernels to the op around it.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Union

import msgspec

from vtrain.errors import InputError
from vtrain.ingest.decode import TRACE_EVENTS_DECODER, EventFields, TraceEvent
from vtrain.ingest.extract import (
    EventCounts,
    EventsPart,
    JsonText,
    RankEvents,
    concat_rank_events,
    event_frames,
)
from vtrain.ingest.spans import SPAN_BYTES, SPAN_EVENTS, Span, decode_span, decode_spans
from vtrain.ingest.text import Progress, TraceText
from vtrain.ingest.times import NotATime, parse_times


class CompleteEvent(EventFields, tag="X", tag_field="ph", gc=False):
    """A complete event (``"ph": "X"``): the fields of :class:`~vtrain.ingest.decode.TraceEvent` but ``ph``, with
    ``ts`` as raw JSON text (empty where absent) and ``dur`` kept as text where it is written so (the span is then
    decoded the plain way, which counts it)."""

    ts: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]
    dur: float | str | None = None  # type: ignore[assignment]


#: the other phases of the Chrome trace event format (duration, instant, counter, async, flow, sample, object,
#: metadata, memory dump, mark, clock sync, context, linked id)
OTHER_PHASES = ("B", "E", "i", "I", "C", "b", "n", "e", "S", "T", "p", "F", "s", "t", "f", "P", "N", "O", "D",
                "M", "V", "v", "R", "c", "(", ")", "=")
_SKIPPED = tuple(msgspec.defstruct(f"_Phase{number}", [], tag=phase, tag_field="ph", gc=False)
                 for number, phase in enumerate(OTHER_PHASES))
#: every phase of the format (an event of another is counted, never dropped in silence)
_PHASES = frozenset({"X", *OTHER_PHASES})
#: the phases of duration events, and their structs among :data:`_SKIPPED`
DURATION_PHASES = ("B", "E")
_DURATION_TYPES = frozenset(_SKIPPED[OTHER_PHASES.index(phase)] for phase in DURATION_PHASES)
#: not strict: a number written as a string (`"External id": "5"`, as some exporters write ids) is read as the
#: number; a field that holds no number at all still fails the file, naming the event
_COMPLETE_EVENTS_DECODER = msgspec.json.Decoder(list[Union[(CompleteEvent, *_SKIPPED)]],  # type: ignore[misc]
                                                strict=False)
_DURATION = attrgetter("dur")
#: a time or duration written as text (``"ts": "1234.5"``): counted where a span is decoded the plain way
_TEXT_TIME = re.compile(rb'"(?:ts|dur)"\s*:\s*"')


def decode_complete_events(text: TraceText, span: Span) -> tuple[list[CompleteEvent] | list[TraceEvent],
                                                                list[float | None], EventCounts]:
    """The complete events of a span, in file order, their start times, and what the decoder saw besides: the
    events in the span, how many have no phase, how many are duration events (:data:`DURATION_PHASES`), and how
    many times and durations are written as text (read as the numbers they hold; counted where a time written so
    sends the span down the plain decoder, the only way they reach ingest's tables unnoticed)."""
    try:
        decoded = decode_span(text, span, _COMPLETE_EVENTS_DECODER)
        events = [event for event in decoded if type(event) is CompleteEvent]
        if str in set(map(type, map(_DURATION, events))):
            raise NotATime("a dur written as text")
        # counted only where there are other events than complete ones, by a pass in C (map, set lookup)
        durations = (sum(map(_DURATION_TYPES.__contains__, map(type, decoded)))
                     if len(events) < len(decoded) else 0)
        return (events, parse_times([event.ts for event in events]),
                EventCounts(events=len(decoded), duration_events=durations))
    except (InputError, NotATime):
        decoded = decode_span(text, span, TRACE_EVENTS_DECODER)
        plain = [event for event in decoded if event.ph == "X"]
        return plain, [event.ts for event in plain], EventCounts(
            events=len(decoded), no_phase=sum(1 for event in decoded if not event.ph),
            unknown_phase=sum(1 for event in decoded if event.ph and event.ph not in _PHASES),
            duration_events=sum(1 for event in decoded if event.ph in DURATION_PHASES),
            times_as_text=len(_TEXT_TIME.findall(text.buffer, span.start, span.end)))


def span_frames(text: TraceText, span: Span, json_text: JsonText) -> tuple[EventsPart, int]:
    """The frames of a span's complete events, and the number of events in the span."""
    events, times, counts = decode_complete_events(text, span)
    part = event_frames(events, times, json_text)
    part.counts.add(counts)
    return part, counts.events


#: one cache of canonical ``Input Dims`` texts per process: the ranks of a job repeat each other's shapes, and a
#: worker reads many ranks (on a 1.7 MB rank with shapes recorded, a fresh cache per rank cost a fifth of its time)
_JSON_TEXT = JsonText()


def read_rank_events(text: TraceText, events: Span | None, progress: Progress | None = None, *,
                     span_bytes: int = SPAN_BYTES, events_per_span: int = SPAN_EVENTS) -> RankEvents:
    """The frames of a rank's complete events (``events``, see :func:`~vtrain.ingest.spans.read_header`), span by
    span (:func:`~vtrain.ingest.spans.decode_spans`: only the frames stay); ``progress`` gets the bytes of a plain
    file as they are decoded (a gzip file reported its bytes while it was read)."""
    json_text = _JSON_TEXT
    parts = []
    decoded = 0

    def add(span: Span) -> int:
        nonlocal decoded
        part, count = span_frames(text, span, json_text)
        parts.append(part)
        decoded += span.end - span.start
        if progress and not text.compressed:
            progress(span.end - span.start)
        return count

    decode_spans(text, events, add, span_bytes=span_bytes, events_per_span=events_per_span)
    if progress and not text.compressed:
        progress(len(text.buffer) - decoded)
    return concat_rank_events(parts)
