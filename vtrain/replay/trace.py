"""Reading the events the replay needs from one rank's Kineto trace, whatever generation wrote it.

Ingest keeps kernels and CPU operators; the replay also needs every runtime call (launches, graph launches,
synchronisations, memcpys, event record/wait) and, where newer PyTorch versions write them, the CUPTI
``cuda_sync`` activities ("Stream Wait Event", "Event Sync", "Stream Sync", "Context Sync") with the stream and
the ``cudaEventRecord`` they wait on.

What an event is comes from :mod:`vtrain.kineto` (categories in any case and generation, ROCm and MTIA
categories, arg keys in any spelling, hex stream ids). Events are decoded by the tolerant decoder of
:mod:`vtrain.ingest.decode` (:class:`~vtrain.ingest.decode.LooseEvent`) a span of the file's text at a time, as
`vtrain ingest` reads them (:mod:`vtrain.ingest.spans`: the text is mapped and each span's pages handed back once
decoded, so memory is bounded by what is kept, not by the file): an event that is not an object, or whose time or
lane is unusable, is counted in ``dropped`` rather than failing the file; only a file that is not a trace at all is
an error.

A file is read once: ``read_rank_trace(path, sink)`` hands every decoded batch to ``sink`` as well (`vtrain
validate` builds ingest's tables from them), and keeps the file's text in ``RankTrace.source`` (a
:class:`KeptText`: compressed, batch by batch) for writing the replayed trace (:mod:`vtrain.replay.chrome`)
without reading the file again, and without ever holding the whole text twice.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import zlib
from array import array
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

import msgspec
import numpy as np
import polars as pl

from vtrain import kineto
from vtrain.distributed import map_in_order, map_on_ray_in_order, release_freed_memory
from vtrain.errors import InputError
from vtrain.ingest.decode import (
    LooseEvent,
    MalformedEvents,
    TraceHeader,
    args_not_an_object,
    bare_numbers_warning,
    loose_name,
    readable_trace,
)
from vtrain.ingest.enclosing import enclosing_op_ids
from vtrain.ingest.discover import (
    RankClaims,
    find_trace_files,
    missing_ranks_warning,
    not_read_warnings,
    rank_and_world_size,
    rank_from_file_name,
)
from vtrain.ingest.spans import Span, decode_loose_span, decode_spans, read_header, read_header_around_events
from vtrain.ingest.text import TraceText, load_text
from vtrain.naming import ITERATION_PREFIX

#: what an event is in the replay
CPU, RUNTIME, DEVICE, SYNC = kineto.CPU, kineto.RUNTIME, kineto.DEVICE, kineto.SYNC

#: what is kept of each rank read (:func:`read_ranks`)
Kept = TypeVar("Kept")


@dataclass
class KeptText:
    """A trace file's text, kept to write its replay: the top-level fields other than ``traceEvents`` as JSON
    text, and the events, in batches (each a span of the file's text, events and their separators, zlib-compressed),
    so that they can be rewritten one batch at a time."""

    fields: list[tuple[str, bytes]] = field(default_factory=list)
    batches: list[bytes] = field(default_factory=list)
    #: batches set aside in a file (:meth:`set_aside`): the file, and each batch's offset and length in it
    aside: BinaryIO | None = None
    places: list[tuple[int, int]] = field(default_factory=list)

    def events(self) -> Iterator[list[msgspec.Raw]]:
        """The raw events, batch by batch."""
        for batch in self._compressed():
            yield _RAW_EVENTS.decode(b"[" + zlib.decompress(batch) + b"]")

    def _compressed(self) -> Iterator[bytes]:
        for offset, length in self.places:
            self.aside.seek(offset)
            yield self.aside.read(length)
        yield from self.batches

    def set_aside(self, file: BinaryIO) -> None:
        """Move the batches to the end of ``file``, out of memory; on an error writing (no space left) they stay
        here, and the error is raised."""
        places = []
        for batch in self.batches:
            places.append((file.seek(0, os.SEEK_END), len(batch)))
            file.write(batch)
        file.flush()
        self.aside, self.places, self.batches = file, places, []


class TextAside:
    """An unnamed temporary file that takes the ranks' kept text out of memory (a few tens of bytes an event:
    about 1 GB for a 10 GB trace folder) until the replayed traces are written. It has no name, so nothing is
    left behind however the process ends. Where it cannot be written (no space left), the text stays in memory
    and :attr:`problem` says why."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.file: BinaryIO | None = None
        try:
            self.file = tempfile.TemporaryFile(prefix="vtrain-text-")
        except OSError as error:
            self.problem = _write_problem(error)

    def take(self, text: KeptText) -> None:
        """Set ``text``'s batches aside (kept in memory once a write has failed)."""
        if self.file is None or self.problem is not None:
            return
        try:
            text.set_aside(self.file)
        except OSError as error:
            self.problem = _write_problem(error)

    def close(self) -> None:
        """Remove the file (once every text set aside in it has been read for the last time)."""
        if self.file is not None:
            self.file.close()
            self.file = None


def _write_problem(error: OSError) -> str:
    """Why the temporary folder could not take the text, in a few words."""
    return f"{error.strerror or error} in {tempfile.gettempdir()}"


_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_RAW_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])


class Sink(Protocol):
    """Another reader of the events decoded for the replay (`vtrain validate`'s latency tables): it gets every
    batch of a file's events, then the file's :class:`RankTrace` once the file is read."""

    def add(self, events: list[LooseEvent | None], times: list[float | None],
            durations: list[float | None]) -> None:
        """A batch of events with their start times and durations read as numbers (``None`` where unusable)."""

    def restart(self) -> None:
        """The file is being read again from its start: forget the batches of this file."""

    def close(self, trace: RankTrace) -> None:
        """The file is read."""


@dataclass
class RankTrace:
    """The replay's view of one rank: every complete event it uses, as columns (one entry per event).

    ``kind`` is cpu (operators and annotations), runtime (runtime/driver calls), device (kernels, memcpys,
    memsets) or sync (CUPTI synchronisation activities). ``cat`` is the category in one spelling (``cpu_op``,
    ``user_annotation``, ``kernel``, ``gpu_memcpy``, ``gpu_memset``, the runtime category in lower case,
    ``cuda_sync``). ``lane`` is the thread id for cpu and runtime events and the stream for device and sync
    events. ``device`` is a device activity's device (its ``device`` arg; -1 for other events and where it has
    none). ``index`` is the event's position in the file's ``traceEvents`` (used to write the predicted trace).
    The numeric columns ``lane``, ``ts``, ``dur``, ``device`` and ``index`` are compact arrays (8 bytes an event).
    ``source`` is the file's text, compressed (:class:`KeptText`). ``process_groups`` are the entries of the
    trace's ``distributedInfo.pg_config`` that are process groups of the job (:func:`vtrain.kineto.process_groups`)
    and ``pg_config_problem`` what else it holds (:func:`vtrain.kineto.process_groups_problem`), as ingest reads
    them.
    """

    rank: int
    path: Path
    world_size: int | None
    process_groups: list[dict[str, Any]]
    kind: list[str]
    cat: list[str]
    name: list[str]
    lane: array  # of int64
    ts: array  # of float64
    dur: array  # of float64
    correlation: list[int | None]
    external_id: list[int | None]
    wait_on_stream: list[int | None]
    wait_on_event_record: list[int | None]
    collective_name: list[str | None]
    elements: list[int | None]
    pg_ranks: list[str | None]
    pg_name: list[str | None]
    input_dims: list[str | None]  # CPU operators: their ``Input Dims`` as compact JSON text
    device: array  # of int64
    index: array  # of int64
    dropped: int = 0
    #: correlation ids of the device activities left out in ``dropped`` (their launches are answered: the activity
    #: is in the file, without a usable time)
    dropped_correlations: list[int] = field(default_factory=list)
    absurd: int = 0  # device activities left out for a time no measurement can have (kineto.absurd_activities)
    absurd_host: int = 0  # host events left out for such a time (kineto.absurd_host_events)
    repeated: int = 0  # device activities that repeat another exactly (same device, stream, name, start, duration)
    devices: tuple[int, ...] = ()  # the devices the file's device activities name (several: one process, many GPUs)
    device_categories: set[str] = field(default_factory=set)  # the device activities' categories as written
    unreadable_args: int = 0  # events with an id, stream, device or count that is no 64-bit whole number
    begin_end: int = 0  # spans written as "B"/"E" pairs (their "B" events): not read
    bare_numbers: int = 0  # NaN or Infinity values read as null (vtrain.ingest.decode.decode_text)
    unanswered: int = 0  # kernel launches without their device activity (kineto.unanswered_launches)
    launches: int = 0  # kernel launches in all
    early: kineto.EarlyActivities = kineto.EarlyActivities(0, 0, 0.0)  # activities starting before their launch
    malformed: MalformedEvents = field(default_factory=MalformedEvents)  # events read loosely or left out for it
    rank_warning: str | None = None  # the file's name and its trace disagree on the rank (rank_and_world_size)
    pg_config_problem: str | None = None  # what its distributedInfo.pg_config holds that is no group of the job
    optimizer_iterations: int = 0  # ProfilerStep#N spans made from its optimizer steps (it had none)
    nanoseconds: str | None = None  # its times look like nanoseconds (kineto.nanoseconds_warning)
    source: KeptText = field(default_factory=KeptText)

    def __len__(self) -> int:
        return len(self.ts)

    def count_launches(self) -> None:
        """Count the kernel launches, and those whose device activity is not in the file (:attr:`unanswered`), as
        `vtrain ingest` counts them: before any activity is left out for an absurd time. An activity left out for
        its duration (:attr:`dropped_correlations`) is in the file: its launch is answered."""
        runtime = [i for i, kind in enumerate(self.kind) if kind == RUNTIME]
        device = [c for c, kind in zip(self.correlation, self.kind) if kind == DEVICE] + self.dropped_correlations
        self.unanswered, self.launches = kineto.unanswered_launches(
            (self.name[i] for i in runtime), (self.correlation[i] for i in runtime), device)

    def link_launches(self) -> None:
        """A device activity without an external id (its launching operator's) takes its launch's: the runtime
        event of its correlation id. Traces whose kernels carry only the correlation id (as some PyTorch versions
        and exporters write them) had each kernel classed by its own name, not its operator's (cuDNN's convolution
        kernels, ``..._implicit_gemm``, read as GEMMs)."""
        unlinked = {correlation for kind, external, correlation in zip(self.kind, self.external_id, self.correlation)
                    if kind == DEVICE and external is None and correlation is not None}
        if not unlinked:
            return
        launch = {correlation: external for correlation, external, kind
                  in zip(self.correlation, self.external_id, self.kind)
                  if kind == RUNTIME and correlation in unlinked and external is not None}
        launch.update(self._enclosing_ops(unlinked - set(launch)))
        for index, (kind, external, correlation) in enumerate(zip(self.kind, self.external_id, self.correlation)):
            if kind == DEVICE and external is None and correlation in launch:
                self.external_id[index] = launch[correlation]

    def _enclosing_ops(self, correlations: set[int]) -> dict[int, int]:
        """For launches of ``correlations`` that carry no external id either (PyTorch 1.8's): the external id of
        the innermost CPU operator around the launch on its thread, as `vtrain ingest` finds it."""
        runtime = [i for i, (kind, correlation) in enumerate(zip(self.kind, self.correlation))
                   if kind == RUNTIME and correlation in correlations]
        ops = [i for i, (kind, cat, external) in enumerate(zip(self.kind, self.cat, self.external_id))
               if kind == CPU and cat == "cpu_op" and external is not None]
        if not runtime or not ops:
            return {}
        found = enclosing_op_ids(
            pl.DataFrame({"tid": [self.lane[i] for i in ops], "ts": [self.ts[i] for i in ops],
                          "dur": [self.dur[i] for i in ops], "external_id": [self.external_id[i] for i in ops]}),
            pl.DataFrame({"correlation": [self.correlation[i] for i in runtime],
                          "tid": [self.lane[i] for i in runtime], "ts": [self.ts[i] for i in runtime]}))
        return {correlation: op for correlation, op in found.iter_rows() if op is not None}

    def check_device_times(self) -> None:
        """Count the device activities that repeat another exactly on one device (:attr:`repeated`, kept), note the
        devices they name (:attr:`devices`) and leave out the events whose time cannot be a measurement, by the rules
        `vtrain ingest` applies: host events (:func:`vtrain.kineto.absurd_host_events`, counted in
        :attr:`absurd_host`), then device activities against the span of the others
        (:func:`vtrain.kineto.absurd_activities`, counted in :attr:`absurd`)."""
        kinds = np.fromiter((_KIND_CODES[kind] for kind in self.kind), dtype=np.int8, count=len(self.kind))
        ts, dur = np.frombuffer(self.ts, dtype=np.float64), np.frombuffer(self.dur, dtype=np.float64)
        host = (kinds == _KIND_CODES[CPU]) | (kinds == _KIND_CODES[RUNTIME])
        device = kinds == _KIND_CODES[DEVICE]
        self.nanoseconds = kineto.nanoseconds_warning(self.path, ts, dur[device])
        absurd = np.zeros(len(kinds), dtype=bool)
        absurd[host] = kineto.absurd_host_events(ts[host], dur[host])
        self.absurd_host = int(absurd.sum())
        host &= ~absurd
        if device.any():
            lanes = np.frombuffer(self.lane, dtype=np.int64)[device]
            devices = np.frombuffer(self.device, dtype=np.int64)[device]
            self.devices = tuple(int(d) for d in np.unique(devices[devices >= 0]))
            self.repeated = _repeats(devices, lanes, [self.name[i] for i in np.flatnonzero(device)], ts[device],
                                     dur[device])
            start = float(ts[host].min()) if host.any() else None
            end = float((ts[host] + dur[host]).max()) if host.any() else None
            absurd[device] = kineto.absurd_activities(start, end, ts[device], dur[device])
            self.absurd = int(absurd.sum()) - self.absurd_host
        if not absurd.any():
            return
        keep = np.flatnonzero(~absurd)
        for name in _COLUMNS:
            column = getattr(self, name)
            kept = np.asarray(column)[keep] if isinstance(column, array) else [column[i] for i in keep]
            setattr(self, name, array(column.typecode, kept.tobytes()) if isinstance(column, array) else kept)

    def count_early(self) -> None:
        """Count the device activities that start before their launching runtime call began (:attr:`early`), as
        `vtrain ingest` counts them (:func:`vtrain.kineto.early_activities`)."""
        launched: dict[int, float] = {}
        for kind, correlation, ts in zip(self.kind, self.correlation, self.ts):
            if kind == RUNTIME and correlation is not None:
                launched.setdefault(correlation, ts)
        pairs = [(ts, launched[correlation]) for kind, correlation, ts in zip(self.kind, self.correlation, self.ts)
                 if kind == DEVICE and correlation in launched]
        if pairs:
            self.early = kineto.early_activities(*np.array(pairs).T)

    @property
    def has_device_activity(self) -> bool:
        return DEVICE in self.kind

    @property
    def accelerator(self) -> str | None:
        """The accelerator the device activities ran on, as `vtrain ingest` reads it (:func:`vtrain.kineto.accelerator`:
        ``cuda``, ``rocm``, ``mtia``); ``None`` without device activity."""
        if not self.has_device_activity:
            return None
        return kineto.accelerator(self.device_categories,
                                  {name for name, kind in zip(self.name, self.kind) if kind == RUNTIME})

    @property
    def replayable(self) -> bool:
        """Whether the rank has an event the replay can move (anything but CUPTI synchronisation records)."""
        return any(kind != SYNC for kind in self.kind)

    def event_columns(self) -> pl.DataFrame:
        """The columns of the replay's event frame that come from the events themselves (:data:`EVENT_COLUMNS`);
        text as categories (one copy of each distinct name)."""
        return pl.DataFrame({
            "kind": pl.Series(self.kind, dtype=pl.Categorical), "cat": pl.Series(self.cat, dtype=pl.Categorical),
            "name": pl.Series(self.name, dtype=pl.Categorical),
            "lane": pl.Series(np.frombuffer(self.lane, dtype=np.int64), dtype=pl.Int64),
            "external_id": pl.Series(self.external_id, dtype=pl.Int64),
            "input_dims": pl.Series(self.input_dims, dtype=pl.Categorical),
        })

    def kept(self) -> KeptRank:
        """What is kept of this rank once its part of the replay graph is built."""
        return KeptRank(rank=self.rank, path=self.path, world_size=self.world_size,
                        process_groups=self.process_groups, dropped=self.dropped, absurd=self.absurd,
                        absurd_host=self.absurd_host,
                        repeated=self.repeated, devices=self.devices, accelerator=self.accelerator,
                        unreadable_args=self.unreadable_args, begin_end=self.begin_end,
                        bare_numbers=self.bare_numbers, unanswered=self.unanswered,
                        launches=self.launches, early=self.early, malformed=self.malformed,
                        rank_warning=self.rank_warning, pg_config_problem=self.pg_config_problem,
                        optimizer_iterations=self.optimizer_iterations, nanoseconds=self.nanoseconds,
                        replayable=self.replayable, columns=self.event_columns(), index=self.index,
                        source=self.source)


#: each kind of event as a small number
_KIND_CODES = {kind: code for code, kind in enumerate((CPU, RUNTIME, DEVICE, SYNC))}


def _repeats(devices: np.ndarray, lanes: np.ndarray, names: list[str], ts: np.ndarray, dur: np.ndarray) -> int:
    """How many of these activities repeat an earlier one exactly (same device, lane, name, start and duration:
    one process driving two GPUs runs the same kernels on both at once): rows of five 64-bit numbers (the name by a
    number of its own, times by their bits, ``-0.0`` as ``0.0``), counted apart from their distinct rows."""
    codes: dict[str, int] = {}
    named = np.fromiter((codes.setdefault(name, len(codes)) for name in names), dtype=np.int64, count=len(names))
    rows = np.column_stack([devices, lanes, named, (ts + 0.0).view(np.int64), (dur + 0.0).view(np.int64)])
    return len(rows) - len(np.unique(rows, axis=0))


#: the per-event columns of a :class:`RankTrace`
_COLUMNS = ("kind", "cat", "name", "lane", "ts", "dur", "correlation", "external_id", "wait_on_stream",
            "wait_on_event_record", "collective_name", "elements", "pg_ranks", "pg_name", "input_dims", "device",
            "index")

#: the event frame's columns read off the events (the others are times, launches and collectives)
EVENT_COLUMNS = ("kind", "cat", "name", "lane", "external_id", "input_dims")


@dataclass
class KeptRank:
    """What `vtrain validate` keeps of a rank file once the rank's part of the replay graph is built
    (:class:`vtrain.replay.build.GraphBuilder`): the event frame's columns (:data:`EVENT_COLUMNS`, compact: text
    as categories), and for writing the replayed trace, the events' positions in the file and the file's text.
    A few tens of bytes an event, where the :class:`RankTrace` it comes from holds a few hundred."""

    rank: int
    path: Path
    world_size: int | None
    process_groups: list[dict[str, Any]]
    dropped: int
    absurd: int
    absurd_host: int
    repeated: int
    devices: tuple[int, ...]
    accelerator: str | None
    unreadable_args: int
    begin_end: int
    bare_numbers: int
    unanswered: int
    launches: int
    early: kineto.EarlyActivities
    malformed: MalformedEvents
    rank_warning: str | None
    pg_config_problem: str | None
    optimizer_iterations: int
    nanoseconds: str | None
    replayable: bool
    columns: pl.DataFrame
    index: array  # of int64
    source: KeptText

    def __len__(self) -> int:
        return self.columns.height

    def event_columns(self) -> pl.DataFrame:
        """The event frame's columns read off the events (as :meth:`RankTrace.event_columns`)."""
        return self.columns

    def release_columns(self) -> None:
        """Forget the event columns (once the replay's event frame holds them)."""
        self.columns = self.columns.clear()


def read_rank_trace(path: Path, sink: Sink | None = None) -> RankTrace:
    """Decode one rank file (read once); errors name the file. ``sink``, if given, gets every batch of decoded
    events, then the trace."""
    with readable_trace(path):
        return _read_rank_trace(path, sink)


def _read_rank_trace(path: Path, sink: Sink | None) -> RankTrace:
    """The rank's events a span of the text at a time (:func:`vtrain.ingest.spans.decode_spans`), the header first
    read from the text around the events, as `vtrain ingest` reads it: where the events then do not decode, the
    file is read again with its whole text parsed for the header, which names what is wrong."""
    text = load_text(path, hashed=False)
    around = read_header_around_events(text)
    if around:
        try:
            return _read_events(text, *around, sink)
        except (InputError, msgspec.DecodeError):
            if sink is not None:
                sink.restart()
    return _read_events(text, *read_header(text), sink)


def _read_events(text: TraceText, header: TraceHeader, events: Span | None, sink: Sink | None) -> RankTrace:
    """The rank's events (``events`` of ``text``, the file's top level being ``header``), span by span; each span's
    text is kept, compressed, for writing the replayed trace."""
    source = KeptText(fields=_top_level_fields(text, events))
    trace = _empty_trace(text.path, header.distributedInfo, source)
    trace.bare_numbers = text.bare_numbers
    reader = _Reader(trace)

    def add(span: Span) -> int:
        decoded = decode_loose_span(text, span)
        source.batches.append(zlib.compress(text.buffer[span.start:span.end], 1))
        times = [_number(event.ts) if event is not None else None for event in decoded]
        durations = [_number(event.dur) if event is not None else None for event in decoded]
        reader.add(decoded, times, durations, span.first_event)
        if sink is not None:
            sink.add(decoded, times, durations)
        return len(decoded)

    decode_spans(text, events, add)
    _add_optimizer_iterations(trace)
    trace.count_launches()
    trace.link_launches()
    trace.check_device_times()
    trace.count_early()
    if sink is not None:
        sink.close(trace)
    return trace


def _add_optimizer_iterations(trace: RankTrace) -> None:
    """Give a rank without ``ProfilerStep#N`` spans those its optimizer steps make
    (:func:`vtrain.kineto.optimizer_iterations`), as ingest does: annotations of the optimizer's thread (category
    :data:`~vtrain.kineto.OPTIMIZER_ITERATION`), placed after the file's events (they are none of its: the replayed
    trace does not write them)."""
    names = set(trace.name)  # the file's few distinct names: most files leave here
    if any(name.startswith(ITERATION_PREFIX) for name in names) or not any(map(kineto.OPTIMIZER_STEP.match, names)):
        return
    steps, backward, first = [], [], math.inf
    for kind, name, ts, dur, lane in zip(trace.kind, trace.name, trace.ts, trace.dur, trace.lane):
        if kind not in (CPU, RUNTIME):
            continue
        first = min(first, ts)
        if kind == CPU and kineto.OPTIMIZER_STEP.match(name):
            steps.append((ts, ts + dur, lane))
        elif kind == CPU and name.startswith(kineto.BACKWARD_OP_PREFIX):
            backward.append(ts)
    spans = kineto.optimizer_iterations(steps, first, backward) if steps else []
    after = (max(trace.index) + 1) if len(trace.index) else 0
    for k, (thread, start, dur) in enumerate(spans):
        for column, value in ((trace.kind, CPU), (trace.cat, kineto.OPTIMIZER_ITERATION),
                              (trace.name, f"{ITERATION_PREFIX}{k + 1}"), (trace.lane, thread), (trace.ts, start),
                              (trace.dur, dur), (trace.correlation, None), (trace.external_id, None),
                              (trace.wait_on_stream, None), (trace.wait_on_event_record, None),
                              (trace.collective_name, None), (trace.elements, None), (trace.pg_ranks, None),
                              (trace.pg_name, None), (trace.input_dims, None), (trace.device, -1),
                              (trace.index, after + k)):
            column.append(value)
    trace.optimizer_iterations = len(spans)


def _top_level_fields(text: TraceText, events: Span | None) -> list[tuple[str, bytes]]:
    """The file's top-level fields other than ``traceEvents``, as JSON text, read from the text around the
    events."""
    buffer = text.buffer
    around = buffer if events is None else bytes(buffer[:events.start]) + bytes(buffer[events.end:])
    return [(key, bytes(value)) for key, value in _TOP_LEVEL.decode(around).items() if key != "traceEvents"]


def rank_trace_of_events(path: Path, header: dict[str, Any], events: list[dict[str, Any]]) -> RankTrace:
    """One rank's trace from its header and events already in memory (`vtrain validate` reads the simulator's
    prediction this way instead of reading back the files it writes), by the same rules as a file's; ``path``
    names the file the events are written to."""
    trace = _empty_trace(path, header.get("distributedInfo"), KeptText())
    loose = msgspec.convert(events, list[LooseEvent], strict=False)
    _Reader(trace).add(loose, [_number(e.ts) for e in loose], [_number(e.dur) for e in loose], 0)
    return trace


def _empty_trace(path: Path, distributed_info: Any, source: KeptText) -> RankTrace:
    """A rank's trace with no events yet: its rank, world size and process groups from ``distributedInfo``."""
    info = distributed_info if isinstance(distributed_info, dict) else {}
    rank, world_size, rank_warning = rank_and_world_size(path, info)
    groups = info.get("pg_config")
    return RankTrace(rank=rank, path=path, world_size=world_size, rank_warning=rank_warning,
                     process_groups=[pg for pg, _ in kineto.process_groups(groups, world_size)],
                     pg_config_problem=kineto.process_groups_problem(groups, world_size),
                     kind=[], cat=[], name=[], lane=array("q"), ts=array("d"), dur=array("d"), correlation=[],
                     external_id=[], wait_on_stream=[], wait_on_event_record=[], collective_name=[], elements=[],
                     pg_ranks=[], pg_name=[], input_dims=[], device=array("q"), index=array("q"), source=source)


class _Reader:
    """Appends the events the replay uses to a :class:`RankTrace`; repeated strings are stored once."""

    def __init__(self, trace: RankTrace) -> None:
        self.trace = trace
        self.strings: dict[str, str] = {}
        self.named_lanes: dict[str, int] = {}  # thread ids that are names, not numbers
        self.keys: dict[str, str] = {}  # arg key as written -> folded (kineto.arg_key)

    def add(self, events: list[LooseEvent | None], times: list[float | None], durations: list[float | None],
            offset: int) -> None:
        """Append the events of a batch the replay uses (``times`` and ``durations`` are their ``ts`` and ``dur``
        read as finite numbers, ``offset`` the first one's position in ``traceEvents``); count those left out, and
        those read loosely (:attr:`RankTrace.malformed`)."""
        trace, malformed = self.trace, self.trace.malformed
        for position, event in enumerate(events):
            if event is None:
                malformed.not_objects += 1
                continue
            if event.ph != "X":
                trace.begin_end += event.ph == "B" and isinstance(event.cat, str) and bool(kineto.event_kind(event.cat))
                continue
            if not isinstance(event.cat, str) or not event.cat:
                malformed.uncategorised += 1
                continue
            kind = kineto.event_kind(event.cat)
            if kind is None:
                continue
            args = self._args(event.args)
            ts, dur = times[position], durations[position]
            on_host = kind == CPU or kind == RUNTIME
            numbers = _whole_numbers(args, _HOST_ID_KEYS if on_host else _DEVICE_ID_KEYS)
            number = numbers.get
            correlation, stream = number("correlation"), number("stream")
            lane = self._lane(event.tid) if stream is None else stream  # a device event without one: its thread's
            if ts is None or dur is None or dur < 0 or lane is None:
                if _infinite(event.ts) or _infinite(event.dur):
                    malformed.infinite += 1
                else:
                    trace.dropped += 1
                if kind == DEVICE and correlation is not None:
                    trace.dropped_correlations.append(correlation)
                continue
            trace.unreadable_args += None in numbers.values()
            malformed.times_as_text += isinstance(event.ts, str) + isinstance(event.dur, str)
            name = self._name(event)
            malformed.args_not_objects += args_not_an_object(event)
            cat = self._category(kind, event.cat, name)
            if kind == DEVICE:
                trace.device_categories.add(event.cat)
            trace.kind.append(kind)
            trace.cat.append(cat)
            trace.name.append(self.strings.setdefault(name, name))
            trace.lane.append(lane)
            trace.ts.append(ts)
            trace.dur.append(dur)
            trace.correlation.append(correlation)
            trace.external_id.append(number("external_id"))
            trace.wait_on_stream.append(number("wait_on_stream"))
            trace.wait_on_event_record.append(number("wait_on_cuda_event_record_corr_id"))
            trace.collective_name.append(_text(args.get("collective_name")))
            sized = cat == "user_annotation" or name.startswith(kineto.ISSUING_OP_PREFIXES)
            elements = number("in_msg_nelems") or number("out_msg_nelems")
            trace.elements.append(elements or (_elements(args.get("input_dims")) if sized else None))
            trace.pg_ranks.append(_text(args.get("process_group_ranks"), keep_json=True))
            trace.pg_name.append(_text(args.get("process_group_name")))
            dims = _compact(args.get("input_dims")) if cat == "cpu_op" else None
            trace.input_dims.append(dims if dims is None else self.strings.setdefault(dims, dims))
            device = number("device") if kind == DEVICE else None
            trace.device.append(-1 if device is None else device)
            trace.index.append(offset + position)

    def _name(self, event: LooseEvent) -> str:
        """The event's name (:func:`~vtrain.ingest.decode.loose_name`); one missing, empty or not text is
        counted."""
        name, malformed = event.name, self.trace.malformed
        if name is None or name == "":
            malformed.nameless += 1
        elif not isinstance(name, str):
            malformed.names_not_text += 1
        return loose_name(event)

    def _args(self, args: dict[str, Any] | None) -> dict[str, Any]:
        """The event's args with folded keys (``External id`` and ``external id`` -> ``external_id``)."""
        if not args:
            return {}
        keys = self.keys
        folded = {}
        for key, value in args.items():
            name = keys.get(key)
            if name is None:
                name = keys[key] = kineto.arg_key(key)
            folded[name] = value
        return folded

    def _category(self, kind: str, category: str, name: str) -> str:
        """The category in one spelling: device activities by their kind (an MTIA DMA is a ``gpu_memcpy``), CPU
        categories as today's PyTorch writes them (``Operator`` -> ``cpu_op``), others in lower case."""
        if kind == DEVICE:
            folded = kineto.canonical_category(kineto.device_kind(category, name))
        elif kind == CPU:
            folded = kineto.canonical_category(category)
        else:
            folded = category.lower()
        return self.strings.setdefault(folded, folded)

    def _lane(self, tid: Any) -> int | None:
        """A thread id as an integer; a thread named by text gets a stable negative number of its own."""
        number = kineto.parse_stream(tid)
        if number is not None or not isinstance(tid, str):
            return number
        return self.named_lanes.setdefault(tid, -1 - len(self.named_lanes))


#: the args (folded, :func:`vtrain.kineto.arg_key`) the replay reads as whole numbers: ids and counts of every
#: event; device and sync events' stream and device besides
_HOST_ID_KEYS = frozenset({"correlation", "external_id", "wait_on_stream", "wait_on_cuda_event_record_corr_id",
                           "in_msg_nelems", "out_msg_nelems"})
_DEVICE_ID_KEYS = _HOST_ID_KEYS | {"stream", "device"}


def _whole_numbers(args: dict[str, Any], keys: frozenset[str]) -> dict[str, int | None]:
    """The args of ``keys`` an event has (not null), each read as a whole number (:func:`_integer`); ``None`` for
    one that is none (``"External id": "n/a"``, a stream ``"s1"``, an id beyond 64 bits)."""
    return {key: _integer(args[key]) for key in args.keys() & keys if args[key] is not None}


def _number(value: Any) -> float | None:
    """A time in µs: a JSON number, or a string holding one (some writers quote them); NaN is no time, and neither
    is an infinity (:func:`_infinite`)."""
    number = _float(value)
    return number if number is not None and math.isfinite(number) else None


def _infinite(value: Any) -> bool:
    """Whether a time is a number beyond a float's range (``1e400``, read as an infinity), or an infinity."""
    number = _float(value)
    return number is not None and math.isinf(number)


def _float(value: Any) -> float | None:
    """A JSON number, or a string holding one, as a float: an infinity for one beyond a float's range (an integer
    too); ``None`` for anything else, and for NaN."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        return math.inf if value > 0 else -math.inf


def _integer(value: Any) -> int | None:
    """An id or a count: an integer, or a number or string holding one, within 64 bits
    (:func:`vtrain.kineto.parse_stream`)."""
    return kineto.parse_stream(value) if isinstance(value, (int, float, str)) else None


def _text(value: Any, keep_json: bool = False) -> str | None:
    """A string argument; with ``keep_json`` a list is kept as its JSON text (``Process Group Ranks``)."""
    if isinstance(value, str):
        return value
    if keep_json and isinstance(value, list):
        return msgspec.json.encode(value).decode()
    return None


def _compact(dims: Any) -> str | None:
    """``Input Dims`` as JSON text without spaces (``[[8,64]]``), whatever spacing the writer used."""
    return msgspec.json.encode(dims).decode() if dims else None


def _elements(dims: Any) -> int | None:
    """Elements of the first tensor in ``Input Dims`` (collective annotations carry their buffer there)."""
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    if not isinstance(dims, list) or not dims or not all(isinstance(x, int) for x in dims):
        return None
    total = 1
    for x in dims:
        total *= x
    return total


def read_trace_set(trace_dir: str | Path, sink: Sink | None = None) -> list[RankTrace]:
    """Every rank file of a trace folder, sorted by rank, each read once (``sink`` sees its events too); two files
    claiming one rank, or different world sizes, is an error."""
    return read_ranks(trace_dir, partial(read_rank_trace, sink=sink))


def read_ranks(trace_dir: str | Path, read: Callable[[Path], Kept], *, workers: int = 1,
               ray_address: str | None = None) -> list[Kept]:
    """What ``read`` keeps of every rank file of a trace folder, sorted by rank: ``read(path)`` reads one file
    (:func:`read_rank_trace`) and returns what is kept of it, with its ``rank``, ``world_size`` and ``path``. The
    files are read in rank order where their names tell it: one at a time here, by ``workers`` processes, or as
    Ray tasks at ``ray_address`` (``read`` and what it keeps must then pickle; :mod:`vtrain.distributed`), and
    their results taken in that order. Two files claiming one rank, or different world sizes, is an error
    (:class:`~vtrain.ingest.discover.RankClaims`)."""
    files = sorted(find_trace_files(trace_dir), key=_rank_order)
    results = map_on_ray_in_order(ray_address, read, files) if ray_address else map_in_order(read, files, workers)
    kept: list[Kept] = []
    claims = RankClaims()
    with closing(results):
        for item in results:
            claims.claim(item.path, item.rank, item.world_size)
            kept.append(item)
            release_freed_memory()  # the rank's decoded events, freed before the next file is read
    return sorted(kept, key=lambda k: k.rank)


def check_replayable(trace_dir: Path, traces: list[RankTrace] | list[KeptRank]) -> None:
    """An error unless some rank holds something a replay can time (a CPU operator, runtime call or device
    activity with a time), in `vtrain validate` and `vtrain whatif` alike."""
    if not any(trace.replayable for trace in traces):
        dropped = sum(trace.dropped for trace in traces)
        raise InputError("nothing to replay: no CPU operator, runtime call or device activity with a time"
                         + (f" ({dropped} such events without a usable time, lane or duration)" if dropped else ""),
                         trace_dir)


def trace_set_warnings(trace_dir: Path, traces: list[RankTrace] | list[KeptRank],
                       world_size: int | None) -> list[str]:
    """The warning lines for what reading a trace folder (``traces``, by rank; the job's ``world_size`` if known)
    did not read, left out or found suspicious, in `vtrain validate` and `vtrain whatif` alike: entries named like
    a trace that are no file, ranks of the job with no file, and each rank's values, events and launches that could
    not be used."""
    lines = not_read_warnings(trace_dir)
    if line := missing_ranks_warning(trace_dir, (t.rank for t in traces), world_size):
        lines.append(line)
    lines += _pg_config_warnings(traces)
    others_marked = not all(trace.optimizer_iterations for trace in traces)
    for trace in traces:
        lines += _rank_trace_warnings(trace)
        if trace.optimizer_iterations:
            lines.append(kineto.optimizer_iterations_warning(trace.path, trace.optimizer_iterations, others_marked))
    return lines


def _pg_config_warnings(traces: list[RankTrace] | list[KeptRank]) -> list[str]:
    """Ingest's warning line on a rank file's ``distributedInfo.pg_config`` (:attr:`RankTrace.pg_config_problem`),
    once for the trace set: a line for each problem, naming the first file that has it and how many others do."""
    files: dict[str, list[Path]] = {}
    for trace in traces:
        if trace.pg_config_problem:
            files.setdefault(trace.pg_config_problem, []).append(trace.path)
    return [f"{paths[0]}{_others(len(paths) - 1)}: {problem}" for problem, paths in files.items()]


def _others(count: int) -> str:
    """`` (and N other rank files)`` after a file's name in a warning line (nothing when ``count`` is 0)."""
    return f" (and {count} other rank file{'s' if count > 1 else ''})" if count else ""


def _rank_trace_warnings(trace: RankTrace | KeptRank) -> list[str]:
    """The warning lines for one rank of :func:`trace_set_warnings`."""
    path = trace.path
    lines = [trace.rank_warning] if trace.rank_warning else []
    if trace.bare_numbers:
        lines.append(bare_numbers_warning(path, trace.bare_numbers))
    if line := trace.malformed.warning(path):
        lines.append(line)
    if trace.dropped:
        lines.append(f"{path}: {trace.dropped} event(s) without a usable time, duration or lane were left out")
    if trace.begin_end:
        lines.append(f"{path}: {trace.begin_end} span(s) written as \"B\"/\"E\" (begin/end) pairs were left out: the "
                     f"replay reads complete (\"X\") events, as Kineto writes them")
    if trace.unreadable_args:
        lines.append(f"{path}: {trace.unreadable_args} event(s) with an id, stream, device or count that is no whole "
                     f"number (such as \"External id\": \"n/a\") were read without it")
    if trace.repeated:
        lines.append(f"{path}: {trace.repeated} device activities repeat another exactly (same device, stream, name, "
                     f"start and duration): a trace written twice into one file? They are kept")
    if len(trace.devices) > 1:
        lines.append(f"{path}: device activities on {len(trace.devices)} devices "
                     f"({', '.join(map(str, trace.devices))}): one process driving several GPUs? The replay takes them "
                     f"as one rank, and a stream number on several devices as one stream")
    if trace.absurd_host:
        lines.append(kineto.absurd_host_warning(path, trace.absurd_host))
    if trace.absurd:
        lines.append(f"{path}: left out {trace.absurd} device activities with an absurd time (not finite, longer "
                     f"than the trace, or starting where no queue of the trace's device work could put them)")
    if trace.unanswered:
        lines.append(kineto.unanswered_launches_warning(path, trace.unanswered, trace.launches))
    if line := kineto.early_activities_warning(path, trace.early):
        lines.append(line)
    if trace.nanoseconds:
        lines.append(trace.nanoseconds)
    return lines


def _rank_order(path: Path) -> tuple[int, str]:
    """Files by the rank in their name (``rank-2`` before ``rank-10``), then by name."""
    rank = rank_from_file_name(path)
    return (rank if rank is not None else sys.maxsize, path.name)
