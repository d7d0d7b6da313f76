"""Ingesting one rank file: its header and events, its tables written to a spool folder, and what to report.

This is the unit of work of `vtrain ingest`, run in the ingesting process or in a worker process
(:mod:`vtrain.ingest.pipeline`): it takes a file and a spool folder and returns a small, picklable
:class:`RankResult`. The rank's tables go to Arrow IPC files in the spool, so the rank's events are freed before the
next rank is read and the memory of a whole ingest is that of one rank at a time per process. Warnings are
collected, not printed, so that they come out in file order whichever process read the file; an error is kept with
the rank's header when the header was read, so that the checks across ranks still come first, as in a serial run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from vtrain.errors import InputError
from vtrain.ingest.assemble import IMPOSSIBLE_SIZE, RankTables, assemble_rank, pg_config_problem
from vtrain.ingest.classify import COMMUNICATION, COMPUTATION, MEMORY
from vtrain.ingest.clocks import empty_steps, without_steps
from vtrain.ingest.decode import MalformedEvents, TraceHeader, bare_numbers_warning, readable_trace
from vtrain.ingest.discover import rank_and_world_size
from vtrain.ingest.events import read_rank_events
from vtrain.ingest.extract import EventCounts, RankEvents
from vtrain.ingest.spans import read_header, read_header_around_events
from vtrain.ingest.text import TraceText, load_text
from vtrain.kineto import (
    C10D_OP_PREFIX,
    absurd_host_warning,
    early_activities_warning,
    empty_steps_text,
    nanoseconds_warning,
    optimizer_iterations_warning,
    unanswered_launches_warning,
)
from vtrain.naming import COMM_SPAN_PREFIX, ITERATION_PREFIX, iteration_numbers, stitched_numbers
from vtrain.tables.latency import gpu_op_calls

Progress = Callable[[int], None]

#: the tables of a rank written to the spool: the profile's event tables, the rank's operator calls (for
#: ``op_latency``) and the CPU ops that collectives are matched with (for ``nccl_latency``)
SPOOLED = ("kernels", "cpu_ops", "collectives", "graph_launches", "calls", "comm_ops")
#: CPU ops that :func:`vtrain.tables.matching.match_calls` reads: issuing c10d ops and vtrain's comm spans
_COMM_OP_PREFIXES = (C10D_OP_PREFIX, COMM_SPAN_PREFIX)


@dataclass
class RankSource:
    """One rank's trace file and what its header says."""

    path: Path
    rank: int
    world_size: int | None
    header: TraceHeader
    rank_warning: str | None = None  # the file's name and its trace disagree on the rank


@dataclass
class RankResult:
    """What the ingest of one rank file leaves beside its spooled tables (see the module docstring).

    ``source`` is ``None`` when the file failed before its rank was known; ``error`` is the file's error, if any.
    """

    index: int
    path: Path
    source: RankSource | None = None
    error: InputError | None = None
    warnings: list[str] = field(default_factory=list)
    sha256: str = ""
    iterations: list[int] = field(default_factory=list)
    counts: EventCounts = field(default_factory=EventCounts)
    activity_counts: dict[str, int] = field(default_factory=dict)
    accelerator: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    shapeless: bool = False  # it has operators, none with its input shapes
    #: its steps that hold nothing but their own spans, no iteration (:func:`vtrain.ingest.clocks.empty_steps`):
    #: number and longest span (µs), as its file numbers them
    empty_steps: list[tuple[int, float]] = field(default_factory=list)

    @property
    def has_device_activity(self) -> bool:
        """Whether the rank has kernel rows (its operators' latencies come from them, not from CPU ops)."""
        return self.rows.get("kernels", 0) > 0

    def spooled(self, spool: Path, table: str) -> Path:
        """The Arrow IPC file of one of this rank's :data:`SPOOLED` tables."""
        return spool_file(spool, self.index, table)


def spool_file(spool: Path, index: int, table: str) -> Path:
    """Where the rank file number ``index`` (in folder order) keeps its table ``table``."""
    return spool / f"{index:06d}-{table}.arrow"


def ingest_rank(index: int, path: Path, spool: Path, progress: Progress | None = None) -> RankResult:
    """Read one rank file, write its tables to ``spool`` and return what is left to report (never raises an
    :class:`InputError`: it is returned in the result)."""
    result = RankResult(index=index, path=path)
    try:
        with readable_trace(path):
            text = load_text(path, progress, scratch=spool)
            events = _read_rank(result, text, progress)
            result.sha256 = text.sha256
            if text.bare_numbers:
                result.warnings.append(bare_numbers_warning(path, text.bare_numbers))
            del text
        _check_events(path, events, result.warnings)
        assert result.source is not None
        if result.source.rank_warning:
            result.warnings.insert(0, result.source.rank_warning)
        if problem := pg_config_problem(result.source.header.distributedInfo):
            result.warnings.append(f"{path}: {problem}")
        tables, empty = without_empty_steps(assemble_rank(result.source.rank, events,
                                                          result.source.header.distributedInfo))
        del events
        result.empty_steps = list(empty.select("iteration", "dur").iter_rows())
        _report_rank(path, tables, result.warnings)
        result.shapeless = _shapeless(tables.cpu_ops)
        _keep(result, tables, spool)
    except InputError as exc:
        result.error = exc
    return result


def _read_rank(result: RankResult, text: TraceText, progress: Progress | None) -> RankEvents:
    """A rank file's header (into ``result.source``) and events. The header is first read without parsing the
    events for it (see :func:`~vtrain.ingest.spans.read_header_around_events`: 0.07 s of a 127 MB trace), which
    is right when the events then decode; else it is all read again the usual way, which reports what is
    wrong."""
    around = read_header_around_events(text)
    if around:
        try:
            result.source = _rank_source(result.path, around[0])
            return read_rank_events(text, around[1], progress)
        except (InputError, msgspec.DecodeError):
            result.source = None
    header, span = read_header(text)
    result.source = _rank_source(result.path, header)
    return read_rank_events(text, span, progress)


def _rank_source(path: Path, header: TraceHeader) -> RankSource:
    rank, world_size, warning = rank_and_world_size(path, header.distributedInfo)
    return RankSource(path=path, rank=rank, world_size=world_size, header=header, rank_warning=warning)


def without_empty_steps(tables: RankTables) -> tuple[RankTables, pl.DataFrame]:
    """A rank's tables with its steps that hold nothing (:func:`~vtrain.ingest.clocks.empty_steps`) numbered none:
    their spans in no iteration and their numbers not among the rank's iterations; and those steps."""
    empty = empty_steps(tables.cpu_ops, tables.kernels)
    if empty.is_empty():
        return tables, empty
    gone = set(empty["iteration"].to_list())
    return replace(tables, cpu_ops=without_steps(tables.cpu_ops, empty),
                   iterations=[number for number in tables.iterations if number not in gone]), empty


def _check_events(path: Path, events: RankEvents, warnings: list[str]) -> None:
    """Events ingest cannot read are said, never skipped in silence; a file with events of which none can be
    read is an error (it would give an empty profile)."""
    counts = events.counts
    if not counts.events:
        warnings.append(f"{path}: the trace holds no events (traceEvents is empty): nothing of this rank is in the "
                        f"profile")
    unread = [f"{n} {what}" for n, what in ((counts.no_phase, "have no phase (ph)"),
                                            (counts.unknown_phase, "have a phase (ph) the Chrome trace format has not"),
                                            (counts.uncategorised, "have no category (cat)")) if n]
    if counts.events and events.device.is_empty() and events.cpu.is_empty() and events.runtime.is_empty():
        raise InputError(f"none of its {counts.events} events is a device activity, CPU op or runtime call"
                         + (f" ({', '.join(unread)})" if unread else ""), path)
    if unread:
        left_out = counts.no_phase + counts.unknown_phase + counts.uncategorised
        warnings.append(f"{path}: left out {left_out} of {counts.events} events: "
                        + ", ".join(unread))
    if counts.duration_events:
        warnings.append(f"{path}: {counts.duration_events} duration events (\"ph\": \"B\"/\"E\", which Kineto does not "
                        f"write) are not read, only complete events (\"X\"): their spans are not in cpu_ops, and "
                        f"kernels they launched are credited to the complete op around them")
    if line := MalformedEvents(nameless=_nameless(events), times_as_text=counts.times_as_text).warning(path):
        warnings.append(line)


def _nameless(events: RankEvents) -> int:
    """How many device activities, CPU ops and runtime calls have no name (none, or an empty one: ingest reads a
    missing name as empty)."""
    return sum(int((frame["name"] == "").sum()) for frame in (events.device, events.cpu, events.runtime))


def _report_rank(path: Path, tables: RankTables, warnings: list[str]) -> None:
    """Warnings for what a rank's tables leave out or could not link, each with its count."""
    if line := nanoseconds_warning(path, np.concatenate([tables.kernels["ts"].to_numpy(),
                                                         tables.cpu_ops["ts"].to_numpy()]),
                                   tables.kernels["dur"].to_numpy()):
        warnings.append(line)
    if line := _unlaunched_warning(path, tables.kernels):
        warnings.append(line)
    if tables.dropped:
        warnings.append(f"{path}: dropped {tables.dropped} events with a missing or negative duration")
    if tables.absurd:
        warnings.append(f"{path}: left out {tables.absurd} device activities with an absurd time (not finite, longer "
                        f"than the trace, or starting where no queue of the trace's device work could put them): not "
                        f"counted as device time")
    if tables.absurd_host:
        warnings.append(absurd_host_warning(path, tables.absurd_host))
    if tables.repeated:
        warnings.append(f"{path}: {tables.repeated} device activities repeat another exactly (same stream, name, "
                        f"start and duration; one stream runs one at a time): a trace written twice into one file? "
                        f"They are kept, and counted as device time each")
    if tables.unlaunched:
        warnings.append(f"{path}: {tables.unlaunched} of {tables.kernels.height} device activities have no "
                        f"launching runtime call in the file (a pruned trace, or launched before profiling began): "
                        f"their launch time is their start")
    if tables.unanswered:
        warnings.append(unanswered_launches_warning(path, tables.unanswered, tables.launches))
    if line := early_activities_warning(path, tables.early):
        warnings.append(line)
    for line in (_steps_holding_none(path, tables), _repeated_steps(path, tables)):
        if line:
            warnings.append(line)
    if tables.optimizer_iterations:
        warnings.append(optimizer_iterations_warning(path, tables.optimizer_iterations))
    if tables.shared_correlations:
        warnings.append(f"{path}: {tables.shared_correlations} runtime calls share their correlation id with an "
                        f"earlier call (each call has its own in a Kineto trace: two traces merged, or rewritten?): "
                        f"the device activities of a shared id are all credited to the first call's launch and op")
    unidentified = [f"{n} {what}" for n, what in (
        (tables.unidentified_device, "device activities have no device or stream"),
        (tables.unidentified_host, "CPU ops and runtime calls have no thread")) if n]
    if unidentified:
        warnings.append(f"{path}: {' and '.join(unidentified)} (no args.device/stream, and a pid/tid that holds no "
                        f"single number): left null; such a host event nests in no op and launches no kernel")
    _report_collectives(path, tables, warnings)


def _steps_holding_none(path: Path, tables: RankTables) -> str | None:
    """The warning for a rank whose ``ProfilerStep#N`` spans hold none of its other events (spans written without
    their length): it has no iteration to measure, which `validate` and `whatif` refuse."""
    name = pl.col("name").cast(pl.String)
    step = name.str.starts_with(ITERATION_PREFIX)
    steps = tables.cpu_ops.filter(step)
    if not steps.height or tables.cpu_ops.filter(~step & pl.col("iteration").is_not_null()).height \
            or tables.kernels["iteration"].is_not_null().any():
        return None
    return f"{path}: {empty_steps_text(steps.height, steps['dur'].max())}: no iteration of it can be measured"


def _repeated_steps(path: Path, tables: RankTables) -> str | None:
    """The warning for a rank whose ``ProfilerStep#N`` numbers each name steps one after another (not one step
    marked on two threads, which overlap): the steps of a number are read as one iteration."""
    steps = tables.cpu_ops.filter(pl.col("name").cast(pl.String).str.starts_with(ITERATION_PREFIX)
                                  & pl.col("iteration").is_not_null())
    repeated = stitched_numbers(steps.select("tid", "iteration", step_ts="ts", step_end=pl.col("ts") + pl.col("dur")),
                                thread="tid")
    if not repeated.height:
        return None
    shown = ", ".join(f"#{number} x{spans}" for number, spans in repeated.select("iteration", "spans").rows()[:3])
    return (f"{path}: {repeated.height} ProfilerStep number(s) name steps one after another ({shown}"
            f"{' ...' if repeated.height > 3 else ''}): each number's steps are read as one iteration (a trace "
            f"stitched from others, or its spans renamed?)")


def _report_collectives(path: Path, tables: RankTables, warnings: list[str]) -> None:
    """Warnings for collectives whose metadata is impossible, and for those left out of ``nccl_latency``."""
    if tables.impossible_sizes:
        warnings.append(f"{path}: {tables.impossible_sizes} collectives carry a size no collective can have "
                        f"({IMPOSSIBLE_SIZE}): read as absent, so those without another size are left out of "
                        f"nccl_latency")
    if tables.unsized:
        warnings.append(f"{path}: {tables.unsized} of {tables.collectives.height} collectives have no name or no "
                        f"message size in the trace (no element count or dtype in their args, op or annotation): "
                        f"left out of nccl_latency; their time still counts as communication")


#: a rank whose kernels are more than this share without a launching operator is said: a profiler's window cuts off
#: the launches of a few at its start, a trace stripped of its links loses them all
UNLAUNCHED_SHARE = 0.5


def _unlaunched_warning(path: Path, kernels: pl.DataFrame) -> str | None:
    """One warning line for a rank most of whose kernels have no launching operator (``op_latency`` is built from
    the operators that launched them: a trace without its ``External id`` links gave an empty one, silently)."""
    launched = kernels.filter(pl.col("kind") == "kernel")["cpu_op"]
    if launched.is_empty() or launched.null_count() <= UNLAUNCHED_SHARE * launched.len():
        return None
    return (f"{path}: {launched.null_count():,} of {launched.len():,} kernels have no launching operator (no "
            f"External id or correlation links them to a CPU op: a trace converted or stripped?): they count as device "
            f"time, but op_latency holds no latency of theirs")


def _shapeless(cpu_ops: pl.DataFrame) -> bool:
    """Whether a rank has operators and none carries its input shapes (torch's profiler without
    ``record_shapes=True``, its default)."""
    ops = cpu_ops.filter(pl.col("cat") == "cpu_op")
    return not ops.is_empty() and ops["input_dims"].null_count() == ops.height


def shapeless_warning(trace_dir: Path, results: list[RankResult]) -> str | None:
    """One warning line for a folder whose rank files have operators without input shapes: every shape of an
    operator then shares one latency signature, which a prediction cannot look up by shape."""
    which = _which_do_not(sum(r.shapeless for r in results), len(results))
    if which is None:
        return None
    return (f"{trace_dir}: {which} record the operators' input shapes (profiled without record_shapes=True): each "
            f"operator's latency is one median over all its shapes, which a prediction cannot look up by shape")


def unmarked_warning(trace_dir: Path, results: list[RankResult]) -> str | None:
    """One warning line for a folder whose rank files mark no iteration (no ``ProfilerStep#N`` span: profiled
    without a schedule's ``prof.step()``): their tables hold every operator of the whole trace, warm-up included,
    and validate and whatif take the whole trace as one iteration."""
    which = _which_do_not(sum(not r.iterations and not r.empty_steps for r in results), len(results))
    if which is None:
        return None
    return (f"{trace_dir}: {which} mark iterations (no ProfilerStep#N spans: profiled without prof.step()): the "
            f"tables hold every operator of the whole trace, warm-up included, and 0 iterations are counted")


def empty_steps_warning(results: list[RankResult]) -> str | None:
    """One warning line for the steps that hold nothing but their own spans (:func:`~vtrain.ingest.clocks.empty_steps`)
    on ranks that have iterations, naming the lowest such rank's file (a rank with no other step is said by its own
    line: its spans hold none of its events)."""
    said = sorted((r for r in results if r.empty_steps and r.iterations), key=_rank_of)
    if not said:
        return None
    first = said[0].empty_steps
    shown = ", ".join(f"{ITERATION_PREFIX}{number}" for number, _ in first[:3]) + (" ..." if len(first) > 3 else "")
    longest = max(dur for r in said for _, dur in r.empty_steps)
    also = f"; and on {len(said) - 1} other rank file(s)" if len(said) > 1 else ""
    one = len(first) == 1
    return (f"{said[0].path}: {shown} {'holds' if one else 'hold'} nothing but {'its' if one else 'their'} own "
            f"span{'' if one else 's'} (the longest lasts {longest:g} us{also}): no operator, no device activity "
            f"(the profiler stopped as {'it' if one else 'they'} began); not counted as "
            f"{'an iteration' if one else 'iterations'}")


def _rank_of(result: RankResult) -> int:
    return result.source.rank if result.source else -1


def _which_do_not(some: int, of: int) -> str | None:
    """``none of its rank files`` / ``K of its N rank files do not`` (followed by a verb), None when ``some`` is 0."""
    if not some:
        return None
    return "none of its rank files" if some == of else f"{some} of its {of} rank files do not"


def _keep(result: RankResult, tables: RankTables, spool: Path) -> None:
    """Write the rank's tables to the spool and keep their counts and summary in ``result``."""
    frames = {
        "kernels": tables.kernels, "cpu_ops": tables.cpu_ops, "collectives": tables.collectives,
        "graph_launches": tables.graph_launches,
        "calls": gpu_op_calls(tables.kernels),
        "comm_ops": tables.cpu_ops.filter(pl.col("name").str.starts_with(_COMM_OP_PREFIXES[0])
                                          | pl.col("name").str.starts_with(_COMM_OP_PREFIXES[1])),
    }
    for name, frame in frames.items():
        frame.write_ipc(result.spooled(spool, name), compression="lz4")  # 4x faster to write than Parquet
        result.rows[name] = frame.height
    result.iterations = tables.iterations
    result.counts = tables.counts
    result.accelerator = tables.accelerator
    result.activity_counts = activity_counts(tables)
    result.summary = rank_row(tables.kernels, tables.cpu_ops)


def activity_counts(tables: RankTables) -> dict[str, int]:
    """A rank's device activities and where each went: ``device_activities`` = ``kernel_rows`` +
    ``dropped_activities`` (missing or negative duration) + ``absurd_activities``."""
    return {"device_activities": tables.device_activities, "kernel_rows": tables.kernels.height,
            "dropped_activities": tables.counts.device_dropped, "absurd_activities": tables.absurd,
            "unlaunched_activities": tables.unlaunched, "graph_launches": tables.graph_launches.height}


def rank_row(kernels: pl.DataFrame, cpu_ops: pl.DataFrame) -> dict[str, Any]:
    """One rank's kernel count and time per HTA kernel class (over the whole trace), its CPU operator count and its
    iteration count:
    distinct numbers of its ``ProfilerStep#N`` spans that lie in an iteration (a step marked on two threads is one
    iteration; a step that holds nothing is none: :func:`~vtrain.ingest.clocks.empty_steps`)."""
    by_class = dict(kernels.group_by("kernel_class").agg(pl.col("dur").sum()).iter_rows())
    return {
        "kernels": kernels.height,
        "computation_us": round(by_class.get(COMPUTATION, 0.0), 3),
        "communication_us": round(by_class.get(COMMUNICATION, 0.0), 3),
        "memory_us": round(by_class.get(MEMORY, 0.0), 3),
        "cpu_ops": cpu_ops.height,
        "iterations": cpu_ops.filter(pl.col("iteration").is_not_null())
                             .select(iteration_numbers(pl.col("name")).drop_nulls().n_unique()).item(),
    }
