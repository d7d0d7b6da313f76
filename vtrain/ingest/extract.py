"""From complete trace events to per-rank polars frames: device activities, CPU ops, runtime launches.

This is the one place with Python code per event, so it stays lean: one pass splits the events by category, a
comprehension per column reads them, and values derived from names (kernel class, memory kind) are computed once
per distinct name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgspec
import polars as pl

from vtrain.ingest.classify import kernel_class
from vtrain.ingest.decode import EventArgs
from vtrain.kineto import (
    ATTENTION_OPS,
    CPU,
    DEVICE,
    RUNTIME,
    accelerator,
    canonical_category,
    device_kind,
    event_kind,
    fused_attention_signature,
    parse_stream,
)
from vtrain.tables.signature import signatures_without_out

_NO_ARGS = EventArgs()

#: collective metadata that Kineto puts on NCCL kernels and on ``record_param_comms`` ops
COLLECTIVE_ARG_SCHEMA = {
    "arg_collective": pl.String, "arg_in_nelems": pl.Int64, "arg_out_nelems": pl.Int64,
    "arg_group_size": pl.Int64, "arg_dtype": pl.String, "arg_pg_name": pl.String, "arg_pg_ranks": pl.String,
}
DEVICE_SCHEMA = {
    "device": pl.Int32, "stream": pl.Int64, "name": pl.String, "kind": pl.String,
    "memory_kind": pl.String, "kernel_class": pl.String, "ts": pl.Float64, "dur": pl.Float64,
    "correlation": pl.Int64, "external_id": pl.Int64, **COLLECTIVE_ARG_SCHEMA,
}
#: a part's device activities, before the columns computed once for the whole rank (device, stream, classes)
_DEVICE_PART_SCHEMA = {
    "arg_device": pl.Int64, "pid": pl.Int64, "arg_stream": pl.Int64, "tid": pl.Int64, "name": pl.String,
    "cat": pl.String, "ts": pl.Float64, "dur": pl.Float64, "correlation": pl.Int64, "external_id": pl.Int64,
    **COLLECTIVE_ARG_SCHEMA,
}
CPU_SCHEMA = {
    "tid": pl.Int64, "cat": pl.String, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
    "external_id": pl.Int64, "input_dims": pl.String, "input_types": pl.String, **COLLECTIVE_ARG_SCHEMA,
}
#: runtime calls: where a kernel was launched from, and which calls launch whole graphs
RUNTIME_SCHEMA = {"tid": pl.Int64, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
                  "correlation": pl.Int64, "external_id": pl.Int64}

Column = list[Any] | pl.Series | None  # None: all null


@dataclass
class EventCounts:
    """What the decoder saw of a rank's events besides the frames: ``dropped`` complete events left out for a
    missing or negative duration (``device_dropped`` of them device activities, whose correlation ids are
    ``dropped_correlations``), complete events without a category (``uncategorised``), events without a phase
    (``no_phase``) or of a phase the Chrome trace format has not (``unknown_phase``), duration events (``"ph":
    "B"``/``"E"``, not read: ``duration_events``), times and durations written as text (``times_as_text``), and
    ``events`` in all."""

    dropped: int = 0
    device_dropped: int = 0
    uncategorised: int = 0
    no_phase: int = 0
    unknown_phase: int = 0
    duration_events: int = 0
    times_as_text: int = 0
    events: int = 0
    dropped_correlations: list[int] = field(default_factory=list)

    def add(self, other: EventCounts) -> None:
        """Add another part's counts to these."""
        self.dropped += other.dropped
        self.device_dropped += other.device_dropped
        self.uncategorised += other.uncategorised
        self.no_phase += other.no_phase
        self.unknown_phase += other.unknown_phase
        self.duration_events += other.duration_events
        self.times_as_text += other.times_as_text
        self.events += other.events
        self.dropped_correlations += other.dropped_correlations


@dataclass
class RankEvents:
    """The frames of one rank's trace, before tables are assembled, and the counts of what was left out."""

    device: pl.DataFrame
    cpu: pl.DataFrame
    runtime: pl.DataFrame
    counts: EventCounts
    accelerator: str | None = None  # cuda, rocm or mtia (vtrain.kineto.accelerator); None without device activity

    @property
    def dropped(self) -> int:
        """Complete events left out for a missing or negative duration."""
        return self.counts.dropped


@dataclass
class EventsPart:
    """The frames of some of a rank's complete events (see :func:`event_frames`)."""

    device: pl.DataFrame
    cpu: pl.DataFrame
    runtime: pl.DataFrame
    counts: EventCounts


class JsonText:
    """Canonical JSON text of raw ``Input Dims`` / ``Input type`` values, cached (they repeat a lot); the cache
    is emptied when it reaches :data:`MAX_ENTRIES` texts, so that it stays small however many files it serves."""

    MAX_ENTRIES = 1 << 16

    def __init__(self) -> None:
        self._cache: dict[bytes, str] = {}

    def column(self, raws: list[msgspec.Raw]) -> list[str | None] | None:
        """One text per raw value (``None`` where absent); ``None`` when no event has a value."""
        if not any(raws):
            return None
        if len(self._cache) >= self.MAX_ENTRIES:
            self._cache.clear()
        cache = self._cache
        texts: list[str | None] = []
        for raw in raws:
            if not raw:
                texts.append(None)
                continue
            key = bytes(raw)
            text = cache.get(key)
            if text is None:
                text = cache[key] = json.dumps(json.loads(key))
            texts.append(text)
        return texts


def concat_rank_events(parts: Iterable[EventsPart]) -> RankEvents:
    """A rank's frames from the frames of its parts, in order.

    Parts leave out the columns no event of theirs has (collective metadata, mostly), and the columns derived
    from others are computed here: polars' fixed cost per operation adds up over hundreds of parts. So are the
    signatures of GEMMs called with an output argument, without it
    (:func:`~vtrain.tables.signature.signatures_without_out`).
    """
    device: list[pl.DataFrame] = []
    cpu: list[pl.DataFrame] = []
    runtime: list[pl.DataFrame] = []
    counts = EventCounts()
    for part in parts:
        device.append(part.device)
        cpu.append(part.cpu)
        runtime.append(part.runtime)
        counts.add(part.counts)
    activities = _concat(device, _DEVICE_PART_SCHEMA)
    calls = _concat(runtime, RUNTIME_SCHEMA)
    return RankEvents(
        device=_finish_device(activities),
        cpu=signatures_without_out(_canonical_categories(_concat(cpu, CPU_SCHEMA)), "name"),
        runtime=calls,
        counts=counts,
        accelerator=accelerator(activities["cat"].unique(), calls["name"].unique()) if activities.height else None,
    )


def _canonical_categories(cpu: pl.DataFrame) -> pl.DataFrame:
    """CPU ops with their category as today's PyTorch names it (``Operator`` -> ``cpu_op``), so readers of
    ``cpu_ops`` need to know one name."""
    names = {c: canonical_category(c) for c in cpu["cat"].unique()}
    if all(c == name for c, name in names.items()):
        return cpu
    return cpu.with_columns(cat=pl.col("cat").replace_strict(names, return_dtype=pl.String))


def _concat(frames: list[pl.DataFrame], schema: dict[str, Any]) -> pl.DataFrame:
    """The frames one after the other, with every column of ``schema`` (null where a frame has none), in order."""
    if not frames:
        return pl.DataFrame(schema=schema)
    joined = pl.concat(frames, how="diagonal")
    return joined.select([pl.col(name) if name in joined.columns else pl.lit(None, dtype=dtype).alias(name)
                          for name, dtype in schema.items()])


def event_frames(events: Sequence[Any], times: Sequence[float | None],
                 json_text: JsonText | None = None) -> EventsPart:
    """Split complete events into device, CPU and runtime frames by their category, in any case and of any
    Kineto generation (:func:`vtrain.kineto.event_kind`); events with a missing or negative duration (or no
    start) are dropped and counted, as are complete events without a category.

    ``events`` are :class:`~vtrain.ingest.events.CompleteEvent` or complete
    :class:`~vtrain.ingest.decode.TraceEvent` objects (the same fields), ``times`` their start times (``ts``).
    """
    # one bucket of events and one of start times per slot (see _SLOTS); the loop only sorts them
    events_in: list[list[Any]] = [[] for _ in _SLOTS]
    times_in: list[list[float]] = [[] for _ in _SLOTS]
    slots = _SLOT_OF_CATEGORY
    dropped = 0
    dropped_correlations: list[int] = []
    for event, ts in zip(events, times):
        slot = slots.get(event.cat)
        if slot is None:
            slot = _slot(event.cat)
        dur = event.dur
        if dur is None or dur < 0 or ts is None:
            dropped += 1
            if slot == 0:  # its launch is answered: said as dropped, not as a launch without device activity
                dropped_correlations.append((event.args or _NO_ARGS).correlation)
            continue
        events_in[slot].append(event)
        times_in[slot].append(ts)
    counts = EventCounts(dropped=dropped, device_dropped=len(dropped_correlations), uncategorised=len(events_in[4]),
                         dropped_correlations=[c for c in dropped_correlations if c is not None])
    return EventsPart(_device_frame(events_in[0], times_in[0]),
                      _cpu_frame(events_in[1], times_in[1], json_text or JsonText()),
                      _runtime_frame(events_in[2], times_in[2]), counts)


#: the bucket of each kind of event in :func:`event_frames` (kinds of :func:`vtrain.kineto.event_kind`, then
#: events of another category and events without one)
_SLOTS = (DEVICE, CPU, RUNTIME, "other", "no category")
#: category -> slot, for the categories met so far
_SLOT_OF_CATEGORY: dict[str, int] = {}


def _slot(category: str) -> int:
    """The slot of a category not met before (remembered)."""
    kind = event_kind(category) if category else "no category"
    slot = _SLOT_OF_CATEGORY[category] = _SLOTS.index(kind) if kind in _SLOTS else _SLOTS.index("other")
    return slot


def _frame(columns: dict[str, Column], schema: dict[str, Any]) -> pl.DataFrame:
    """A frame with the columns given (not ``None``), lists typed as in ``schema``."""
    return pl.DataFrame([
        values.alias(name) if isinstance(values, pl.Series) else pl.Series(name, values, dtype=schema[name])
        for name, values in columns.items() if values is not None
    ])


def _collective_arg_columns(args: list[EventArgs]) -> dict[str, Column]:
    """The collective-metadata columns; none (all null) without a pass per column when no event carries any."""
    names = [a.collective_name for a in args]
    elements = [a.in_nelems for a in args]
    if names.count(None) == len(names) and elements.count(None) == len(elements):
        return {}
    return {
        "arg_collective": names,
        "arg_in_nelems": elements,
        "arg_out_nelems": [a.out_nelems for a in args],
        "arg_group_size": [a.group_size for a in args],
        "arg_dtype": [a.dtype for a in args],
        "arg_pg_name": [a.pg_name for a in args],
        "arg_pg_ranks": [a.pg_ranks if not isinstance(a.pg_ranks, list) else msgspec.json.encode(a.pg_ranks).decode()
                         for a in args],  # a list as its JSON text, as the replay keeps it
    }


def _external_ids(args: list[EventArgs]) -> list[int | None]:
    """The External id of each event, under either spelling (PyTorch 1.8-1.9 wrote ``external id``)."""
    ids = [a.external_id for a in args]
    legacy = [a.external_id_legacy for a in args]
    if legacy.count(None) == len(legacy):
        return ids
    return [new if new is not None else old for new, old in zip(ids, legacy)]


def _streams(values: list[Any]) -> pl.Series:
    """Stream ids as integers: ROCm traces write some as hex strings (``"0x0"``)."""
    try:
        return pl.Series(values, dtype=pl.Int64, strict=True)
    except TypeError:  # some are strings
        return pl.Series([parse_stream(v) for v in values], dtype=pl.Int64)


def _thread_ids(values: list[Any]) -> pl.Series:
    """``pid`` or ``tid`` values as integers (:func:`thread_id` for those written as text); an integer beyond 64
    bits is no id, as a text holding one is (JSON numbers have no size limit)."""
    try:
        return pl.Series(values, dtype=pl.Int64, strict=True)
    except TypeError:  # some are strings, or integers beyond 64 bits
        return pl.Series([parse_stream(v) if type(v) is int else thread_id(v) for v in values], dtype=pl.Int64)


_WHOLE_NUMBER = re.compile(r"-?\d+")


@lru_cache(maxsize=4096)
def thread_id(value: str | None) -> int | None:
    """The number in a ``pid`` or ``tid`` written as text, where it holds exactly one (``"[pid] 123"``,
    ``"[tid] 456"``, ``"GPU 0"``, ``"stream 7"``: exporters other than Kineto write them so); None where it holds
    none (Kineto's own ``"Spans"`` rows) or several (which one is the id is a guess). Ingest counts the null ones
    on device activities and host events, with a warning."""
    numbers = _WHOLE_NUMBER.findall(value) if isinstance(value, str) else []
    number = int(numbers[0]) if len(numbers) == 1 else None
    return number if number is not None and -(1 << 63) <= number < (1 << 63) else None  # an Int64 column's range


def _device_frame(events: list[Any], times: list[float]) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    devices = [a.device for a in args]
    streams = [a.stream for a in args]
    return _frame({
        # pid and tid stand in for a device and a stream missing from args (Kineto usually writes both)
        "arg_device": devices,
        "pid": _thread_ids([e.pid for e in events]) if None in devices else None,
        "arg_stream": _streams(streams),
        "tid": _thread_ids([e.tid for e in events]) if None in streams else None,
        "name": [e.name for e in events],
        "cat": [e.cat for e in events],
        "ts": times,
        "dur": [e.dur for e in events],
        "correlation": [a.correlation for a in args],
        "external_id": _external_ids(args),
        **_collective_arg_columns(args),
    }, _DEVICE_PART_SCHEMA)


def _finish_device(frame: pl.DataFrame) -> pl.DataFrame:
    """The device table's columns: the device and stream in args win over pid and tid; ``kind``
    (:func:`vtrain.kineto.device_kind`) is computed once per distinct category and name, ``kernel_class`` and
    ``memory_kind`` once per distinct name."""
    name, kind = pl.col("name"), pl.col("kind")
    names = frame["name"].unique()
    by_category = {c: device_kind(c, "") for c in frame["cat"].unique()}
    by_name = {n: device_kind("kernel", n) for n in names}  # a kernel can be a memory copy by its name (MTIA DMA)
    copies_by_name = [n for n, k in by_name.items() if k != "kernel"]
    frame = frame.with_columns(kind=pl.when((pl.col("cat").replace_strict(by_category) == "kernel")
                                            & name.is_in(copies_by_name))
                               .then(name.replace_strict(by_name, default=None))
                               .otherwise(pl.col("cat").replace_strict(by_category, return_dtype=pl.String)))
    classes = {n: kernel_class(n) for n in names}
    copies = {n: _memory_kind("memcpy", n) for n in frame.filter(kind == "memcpy")["name"].unique()}
    sets = {n: _memory_kind("memset", n) for n in frame.filter(kind == "memset")["name"].unique()}
    return frame.with_columns(
        device=pl.coalesce("arg_device", "pid").cast(pl.Int32),
        stream=pl.coalesce("arg_stream", "tid"),
        kernel_class=name.replace_strict(classes, return_dtype=pl.String),
        memory_kind=pl.when(kind == "memcpy").then(name.replace_strict(copies, default=None, return_dtype=pl.String))
        .when(kind == "memset").then(name.replace_strict(sets, default=None, return_dtype=pl.String)),
    ).select(list(DEVICE_SCHEMA))


def _memory_kind(kind: str, name: str) -> str | None:
    if kind == "memcpy":
        return name.removeprefix("Memcpy ").strip() or None
    if kind == "memset":
        return name.removeprefix("Memset ").strip(" ()") or None
    return None


def _cpu_frame(events: list[Any], times: list[float], json_text: JsonText) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    names = [e.name for e in events]
    dims = json_text.column([a.input_dims or a.input_dims_legacy for a in args])
    types = json_text.column([a.input_types for a in args])
    if dims is not None and types is not None and not ATTENTION_OPS.isdisjoint(names):
        _fused_attention_signatures(names, dims, types)
    return _frame({
        "tid": _thread_ids([e.tid for e in events]),
        "cat": [e.cat for e in events],
        "name": names,
        "ts": times,
        "dur": [e.dur for e in events],
        "external_id": _external_ids(args),
        "input_dims": dims,
        "input_types": types,
        **_collective_arg_columns(args),
    }, CPU_SCHEMA)


def _fused_attention_signatures(names: list[str], dims: list[str | None], types: list[str | None]) -> None:
    """The signatures of fused attention calls (:data:`~vtrain.kineto.ATTENTION_OPS`), in place, as the model
    places them: their [b, heads, s, d] tensors (:func:`~vtrain.kineto.fused_attention_signature`)."""
    for i, name in enumerate(names):
        if name in ATTENTION_OPS and dims[i] is not None and types[i] is not None:
            dims[i], types[i] = fused_attention_signature(dims[i], types[i])  # type: ignore[arg-type]


def _runtime_frame(events: list[Any], times: list[float]) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    return _frame({
        "tid": _thread_ids([e.tid for e in events]),
        "name": [e.name for e in events],
        "ts": times,
        "dur": [e.dur for e in events],
        "correlation": [a.correlation for a in args],
        "external_id": _external_ids(args),
    }, RUNTIME_SCHEMA)
