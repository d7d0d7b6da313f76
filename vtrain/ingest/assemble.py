"""Assembling one rank's frames into the ``kernels``, ``cpu_ops`` and ``collectives`` tables."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import polars as pl

from vtrain.ingest.classify import COMMUNICATION
from vtrain.ingest.collectives import (
    canonical_collective,
    elements_from_dims,
    parse_nccl_kernel,
)
from vtrain.ingest.discover import json_count
from vtrain.ingest.enclosing import enclosing_op_ids
from vtrain.ingest.extract import EventCounts, RankEvents
from vtrain.kineto import (
    BACKEND_ANNOTATION_PREFIXES,
    BACKWARD_OP_PREFIX,
    C10D_OP_PREFIX,
    OPTIMIZER_ITERATION,
    OPTIMIZER_STEP,
    absurd_host_events,
    EarlyActivities,
    dtype_bytes,
    early_activities,
    first_dtype,
    is_graph_launch,
    only_group,
    optimizer_iterations,
    process_groups,
    process_groups_problem,
    unanswered_launches,
)
from vtrain.kineto import absurd_activities as absurd_activities_of
from vtrain.limits import FITTED_COUNTS, MAX_MESSAGE_BYTES
from vtrain.naming import ITERATION_PREFIX, iteration_numbers, step_windows
from vtrain.tables.latency import all_gather_output, input_sized_all_gather
from vtrain.tables.store import conform


@dataclass
class RankTables:
    """The event tables of one rank, and what was left out of them or could not be linked.

    ``device_activities`` counts the rank's device activities as decoded (those with a missing or negative
    duration included); each became one row of ``kernels``, unless dropped for that duration
    (``counts.device_dropped``) or for an absurd one (``absurd``). ``unlaunched`` kernel rows have no launching
    runtime call in the file (a pruned trace, or launched before the profiler started); ``unanswered`` launching
    calls have no device activity in the file (:func:`vtrain.kineto.unanswered_launches`).
    """

    rank: int
    kernels: pl.DataFrame
    cpu_ops: pl.DataFrame
    collectives: pl.DataFrame
    graph_launches: pl.DataFrame
    iterations: list[int]
    counts: EventCounts
    device_activities: int
    absurd: int
    absurd_host: int  # host events left out for an absurd time (vtrain.kineto.absurd_host_events)
    unlaunched: int
    unanswered: int  # kernel launches (runtime calls) with no device activity of theirs in the file
    early: EarlyActivities  # activities starting before their launch (kineto.early_activities)
    launches: int  # kernel launches (runtime calls) in all
    repeated: int  # kernel rows that repeat another exactly (same device, stream, name, start and duration)
    accelerator: str | None
    shared_correlations: int = 0  # runtime calls whose correlation id an earlier call of the file already has
    optimizer_iterations: int = 0  # ProfilerStep#N spans made from its optimizer steps (it had none)
    impossible_sizes: int = 0  # collectives whose size or group size no collective can have (read as absent)
    unsized: int = 0  # collectives without a name or a size in bytes (but those impossible): not in nccl_latency
    #: device activities without a device or stream, and host events (CPU ops, runtime calls) without a thread, that
    #: is a number: neither args.device/stream nor a pid/tid holding one (:func:`vtrain.ingest.extract.thread_id`)
    unidentified_device: int = 0
    unidentified_host: int = 0

    @property
    def dropped(self) -> int:
        """Complete events left out for a missing or negative duration."""
        return self.counts.dropped


def iteration_spans(cpu: pl.DataFrame) -> pl.DataFrame:
    """The iterations' windows of the ``ProfilerStep#N`` spans (:func:`vtrain.naming.step_windows`) as
    (iteration, step_ts, step_end), sorted by start."""
    spans = (cpu.filter(pl.col("name").str.starts_with(ITERATION_PREFIX))
             .with_columns(iteration=iteration_numbers(pl.col("name")))
             .filter(pl.col("iteration").is_not_null()))
    made = spans.select((pl.col("cat") == OPTIMIZER_ITERATION).any()).item()
    return step_windows(spans.select("iteration", "tid", step_ts=pl.col("ts"), step_end=pl.col("ts") + pl.col("dur")),
                        thread=None if made else "tid")


@dataclass(frozen=True)
class MadeSteps:
    """A rank's CPU events with the ``ProfilerStep#N`` spans made from its optimizer steps, and how many."""

    cpu: pl.DataFrame
    made: int


def with_optimizer_iterations(cpu: pl.DataFrame) -> MadeSteps:
    """``cpu`` with ``ProfilerStep#N`` spans made from its optimizer steps where it has none
    (:func:`vtrain.kineto.optimizer_iterations`: a profile taken without ``step()``), annotations of the optimizer's
    thread (category :data:`~vtrain.kineto.OPTIMIZER_ITERATION`)."""
    name = pl.col("name")
    if cpu.is_empty() or cpu.select(name.str.starts_with(ITERATION_PREFIX).any()).item():
        return MadeSteps(cpu, 0)
    steps = cpu.filter(name.str.contains(OPTIMIZER_STEP.pattern) & pl.col("ts").is_not_null()
                       & pl.col("dur").is_not_null())
    backward = cpu.filter(name.str.starts_with(BACKWARD_OP_PREFIX) & pl.col("ts").is_not_null())["ts"]
    spans = optimizer_iterations(zip(steps["ts"], steps["ts"] + steps["dur"], steps["tid"]), cpu["ts"].min(),
                                 backward)
    if not spans:
        return MadeSteps(cpu, 0)
    made = pl.DataFrame({"tid": [thread for thread, _, _ in spans], "cat": [OPTIMIZER_ITERATION] * len(spans),
                         "name": [f"{ITERATION_PREFIX}{k}" for k in range(1, len(spans) + 1)],
                         "ts": [start for _, start, _ in spans], "dur": [dur for _, _, dur in spans]},
                        schema_overrides={"tid": cpu.schema["tid"], "ts": cpu.schema["ts"], "dur": cpu.schema["dur"]})
    return MadeSteps(pl.concat([cpu, made], how="diagonal_relaxed").select(cpu.columns), len(spans))


def assign_iteration(frame: pl.DataFrame, steps: pl.DataFrame, ts_column: str = "ts") -> pl.DataFrame:
    """Add ``iteration``: the ProfilerStep whose span holds ``ts_column`` (null outside every step).

    The step is the last one starting at or before the time (a binary search in the sorted step starts, so the
    frame keeps its order without being sorted).
    """
    if steps.is_empty():
        return frame.with_columns(iteration=pl.lit(None, dtype=pl.Int64))
    latest = steps["step_ts"].search_sorted(frame[ts_column], side="right").cast(pl.Int64) - 1
    started = latest >= 0
    step = latest.clip(lower_bound=0)
    inside = started & (frame[ts_column] < steps["step_end"].gather(step))
    return frame.with_columns(iteration=pl.when(inside).then(steps["iteration"].gather(step)))


def assemble_rank(rank: int, events: RankEvents, dist_info: dict[str, Any] | None) -> RankTables:
    """Build the kernels, cpu_ops, collectives and graph_launches tables of one rank."""
    events, absurd_host = without_absurd_host_events(events)
    made_steps = with_optimizer_iterations(events.cpu)
    events = replace(events, cpu=made_steps.cpu)
    steps = iteration_spans(events.cpu)
    cpu = assign_iteration(events.cpu, steps)
    absurd = absurd_activities(events)
    device = events.device.filter(~absurd)
    kernels = _kernels(device, events.runtime, cpu, steps)
    if kernels.height != device.height:  # every join below is many-to-one: this cannot happen, and must not
        raise RuntimeError(f"rank {rank}: {device.height} device activities became {kernels.height} kernel rows")
    collectives = _collectives(rank, kernels, cpu, dist_info)
    impossible = collectives["impossible_size"].fill_null(False)
    # an all-gather sized by its input alone is sized in nccl_latency, which says so where it cannot be
    input_sized = collectives.select(input_sized_all_gather().fill_null(False)).to_series()
    unsized = (collectives["collective"].is_null() | collectives["bytes"].is_null()) & ~impossible & ~input_sized
    # a device activity dropped for its duration answers its launch: it is said as dropped, not as missing
    unanswered, launches = unanswered_launches(events.runtime["name"], events.runtime["correlation"],
                                               chain(events.device["correlation"], events.counts.dropped_correlations))
    return RankTables(
        rank=rank,
        kernels=conform(kernels.with_columns(rank=pl.lit(rank)), "kernels"),
        cpu_ops=conform(cpu.with_columns(rank=pl.lit(rank)), "cpu_ops"),
        collectives=conform(collectives, "collectives"),
        graph_launches=conform(_graph_launches(events.runtime, kernels, steps).with_columns(rank=pl.lit(rank)),
                               "graph_launches"),
        iterations=steps["iteration"].to_list(),
        optimizer_iterations=made_steps.made,
        counts=events.counts,
        device_activities=events.device.height + events.counts.device_dropped,
        absurd=int(absurd.sum()),
        absurd_host=absurd_host,
        unlaunched=kernels["launch_tid"].null_count(),
        early=early_activities(kernels["ts"].to_numpy(),
                               kernels.select(pl.when(pl.col("launch_tid").is_not_null()).then("launch_ts"))
                               .to_series().to_numpy().astype(float)),
        unanswered=unanswered,
        launches=launches,
        repeated=kernels.height - kernels.select("device", "stream", "name", "ts", "dur").n_unique(),
        accelerator=events.accelerator,
        shared_correlations=_shared_correlations(events.runtime),
        impossible_sizes=int(impossible.sum()),
        unsized=int(unsized.sum()),
        unidentified_device=kernels.filter(pl.col("device").is_null() | pl.col("stream").is_null()).height,
        unidentified_host=cpu["tid"].null_count() + events.runtime["tid"].null_count(),
    )


def _shared_correlations(runtime: pl.DataFrame) -> int:
    """How many runtime calls repeat the correlation id of an earlier call: CUPTI gives each call its own, so a
    kernel of that id is credited to the first call's launch and op (a trace merged from two, or rewritten)."""
    ids = runtime["correlation"].drop_nulls()
    return ids.len() - ids.n_unique()


def without_absurd_host_events(events: RankEvents) -> tuple[RankEvents, int]:
    """The rank's events without the CPU ops and runtime calls whose time cannot be a measurement
    (:func:`vtrain.kineto.absurd_host_events`), and how many those were."""
    host = pl.concat([events.cpu.select("ts", "dur"), events.runtime.select("ts", "dur")])
    absurd = absurd_host_events(host["ts"].to_numpy(), host["dur"].to_numpy())
    if not absurd.any():
        return events, 0
    cpu_rows = events.cpu.height
    kept = replace(events, cpu=events.cpu.filter(pl.Series(~absurd[:cpu_rows])),
                               runtime=events.runtime.filter(pl.Series(~absurd[cpu_rows:])))
    return kept, int(absurd.sum())


def absurd_activities(events: RankEvents) -> pl.Series:
    """Which device activities have a time that cannot be a measurement (:func:`vtrain.kineto.absurd_activities`:
    not finite, longer than the trace, or starting where no queue of the trace's device work could put them)."""
    device = events.device
    host = pl.concat([events.cpu.select("ts", "dur"), events.runtime.select("ts", "dur")])
    start = None if host.is_empty() else host["ts"].min()
    end = None if host.is_empty() else (host["ts"] + host["dur"]).max()
    return pl.Series(absurd_activities_of(start, end, device["ts"].to_numpy(), device["dur"].to_numpy()))


def _kernels(device: pl.DataFrame, runtime: pl.DataFrame, cpu: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Device activities with their launching CPU op and the iteration of their launch.

    The launching op is the CPU op whose External id the kernel carries, else the one its launching runtime call
    carries (PyTorch 1.8's traces: the call's ``external id`` names ``record_param_comms``, where the op enclosing
    the call was the ``nccl:all_reduce`` annotation). Some traces give neither; there the launching op is the
    innermost CPU op on the launching thread that encloses the runtime call (``external_id`` is then that op's
    id). A graph launch (``cudaGraphLaunch``)
    is one runtime call whose correlation id all the graph's kernels share: each keeps its row, and all name the
    op that launched the graph. Every join is many-to-one (checked: ``validate="m:1"``), so a kernel is never
    repeated; ``launch_tid`` is null where the launching call is not in the file.
    """
    launching_ops = (
        cpu.filter(pl.col("external_id").is_not_null())
        .select("external_id", cpu_op="name", input_dims="input_dims", input_types="input_types",
                op_collective="arg_collective", op_in_nelems="arg_in_nelems", op_out_nelems="arg_out_nelems",
                op_group_size="arg_group_size", op_dtype="arg_dtype", op_pg_name="arg_pg_name",
                op_pg_ranks="arg_pg_ranks")
        .unique("external_id", keep="first")
    )
    launches = (
        runtime.filter(pl.col("correlation").is_not_null())
        .unique("correlation", keep="first")
        .select("correlation", launch_tid="tid", launch_ts="ts", launch_external_id="external_id")
    )
    ops = launching_ops["external_id"].implode()
    device = device.join(launches, on="correlation", how="left", validate="m:1")
    # a kernel without an External id of its own (older PyTorch, graph kernels): its launching call's, else
    # (a call without one) the op enclosing the call
    own = pl.col("external_id").is_in(ops).fill_null(False)
    device = device.with_columns(
        external_id=pl.when(own).then("external_id").otherwise(pl.coalesce("launch_external_id", "external_id")),
    ).drop("launch_external_id")
    known = pl.col("external_id").is_in(ops).fill_null(False)
    unresolved = device.filter(~known & pl.col("launch_ts").is_not_null())
    if not unresolved.is_empty():
        # one probe per launching call: a graph launch's kernels share it
        probes = unresolved.select("correlation", tid="launch_tid", ts="launch_ts").unique("correlation")
        device = (
            device.join(enclosing_op_ids(cpu, probes), on="correlation", how="left", validate="m:1")
            .with_columns(external_id=pl.when(known)
                          .then(pl.col("external_id")).otherwise(pl.coalesce("enclosing_id", "external_id")))
            .drop("enclosing_id")
        )
    device = (
        device.join(launching_ops, on="external_id", how="left", validate="m:1")
        .with_columns(launch_ts=pl.coalesce("launch_ts", "ts"))
    )
    return assign_iteration(device, steps, ts_column="launch_ts")


def _graph_launches(runtime: pl.DataFrame, kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """One row per graph launch call (:func:`vtrain.kineto.is_graph_launch`): the op that launched it, how
    many device activities it released, their span (first start to last end) and their summed time."""
    names = [name for name in runtime["name"].unique().to_list() if is_graph_launch(name)]
    calls = runtime.filter(pl.col("name").is_in(names) & pl.col("correlation").is_not_null())
    if calls.is_empty():
        return pl.DataFrame()
    released = (
        kernels.filter(pl.col("correlation").is_in(calls["correlation"].implode()))
        .group_by("correlation")
        .agg(kernels=pl.len(), kernel_start=pl.col("ts").min(), kernel_end=(pl.col("ts") + pl.col("dur")).max(),
             kernel_us=pl.col("dur").sum(), cpu_op=pl.col("cpu_op").drop_nulls().first(),
             op_external_id=pl.col("external_id").drop_nulls().first())
    )
    launched = (
        calls.unique("correlation", keep="first", maintain_order=True)
        .join(released, on="correlation", how="left", validate="1:1")
        .with_columns(kernels=pl.col("kernels").fill_null(0),
                      external_id=pl.coalesce("op_external_id", "external_id"))
    )
    return assign_iteration(launched, steps)


#: the kernel columns a collective's description depends on (the rest is per call: stream, time, iteration)
_KERNEL_METADATA = [
    "name", "cpu_op", "input_dims", "input_types", "arg_collective", "op_collective", "arg_dtype", "op_dtype",
    "arg_in_nelems", "op_in_nelems", "arg_out_nelems", "op_out_nelems", "arg_pg_name", "op_pg_name",
    "arg_pg_ranks", "op_pg_ranks", "arg_group_size", "op_group_size",
]
_ANNOTATION_METADATA = ["name", "input_dims", "input_types", "arg_in_nelems", "arg_out_nelems", "arg_dtype",
                        "arg_pg_name", "arg_pg_ranks", "arg_group_size"]
_DESCRIPTION_SCHEMA = {
    "collective": pl.String, "process_group": pl.String, "group_ranks": pl.String, "group_size": pl.Int64,
    "dtype": pl.String, "elements": pl.Int64, "bytes": pl.Int64, "algorithm": pl.String, "protocol": pl.String,
    "metadata_source": pl.String, "impossible_size": pl.Boolean,
}
#: the element counts and group sizes of a collective's metadata: (smallest, largest) value a collective can have
#: (zero elements is a real, barrier-like call; the largest group is vtrain.limits' cluster bound)
_METADATA_BOUNDS = {
    **dict.fromkeys(["arg_in_nelems", "op_in_nelems", "arg_out_nelems", "op_out_nelems"], (0, MAX_MESSAGE_BYTES)),
    **dict.fromkeys(["arg_group_size", "op_group_size"], FITTED_COUNTS["group_size"]),
}
#: what :data:`_METADATA_BOUNDS` and :data:`MAX_MESSAGE_BYTES` rule out, for the warning line
IMPOSSIBLE_SIZE = (f"an element count negative or over 2^{MAX_MESSAGE_BYTES.bit_length() - 1} bytes, a group size "
                   f"below 1 or over {FITTED_COUNTS['group_size'][1]:,}")


def _collectives(rank: int, kernels: pl.DataFrame, cpu: pl.DataFrame,
                 dist_info: dict[str, Any] | None) -> pl.DataFrame:
    """One row per collective: NCCL kernels on GPU ranks, the ``gloo:*``/``nccl:*``/... annotations of CPU-only
    ranks, and on GPU ranks the annotations of backends that launch no kernel (``gloo:*``, ``mpi:*``, ``ucc:*``: a
    job whose CUDA tensors go through gloo, or whose object collectives and barriers do), which run on the host.

    A collective's description depends only on its kernel's (or annotation's) metadata, which repeats from
    iteration to iteration: it is worked out once per distinct metadata and joined back. An annotation names no
    process group; where the rank is in one group of more than one rank (``distributedInfo.pg_config``), or in
    several with the same members, its calls are among those ranks. An all-gather's size is its output
    (:func:`vtrain.tables.latency.all_gather_output`), which the rank's c10d all-gather ops give where its own
    metadata does not (:func:`_gathered_outputs`). The table has the columns of ``collectives`` and
    ``impossible_size`` (:func:`_description`), to be counted before it is conformed.
    """
    only = only_group(rank, _pg_config(dist_info), known_world_size(dist_info))
    group = (only[0], json.dumps(list(only[1]), separators=(",", ":"))) if only else None
    size = _default_group_size(rank, dist_info) or (len(only[1]) if only else None)  # a 2-rank job lists none
    outputs = _gathered_outputs(cpu)
    on_host = cpu.filter(pl.col("cat") == "user_annotation").filter(
        pl.any_horizontal(pl.col("name").str.starts_with(prefix) for prefix in BACKEND_ANNOTATION_PREFIXES))
    tables = []
    if not kernels.is_empty():
        on_device = kernels.filter(pl.col("kernel_class") == COMMUNICATION)
        tables.append(_describe(on_device, _KERNEL_METADATA, lambda row: _kernel_collective(row, size, outputs))
                      .with_columns(device_type=pl.lit("cuda"), stream=pl.col("stream")))
        on_host = on_host.filter(~pl.col("name").str.starts_with("nccl:"))  # NCCL's calls are its kernels
    described = _describe(on_host, _ANNOTATION_METADATA,
                          lambda row: _annotation_collective(row, size, group, outputs))
    tables.append(described.with_columns(device_type=pl.lit("cpu"), stream=pl.lit(None, dtype=pl.Int64)))
    tables = [table for table in tables if not table.is_empty()]
    if not tables:
        return conform(pl.DataFrame(), "collectives").with_columns(impossible_size=pl.lit(None, dtype=pl.Boolean))
    return pl.concat([conform(table.with_columns(rank=pl.lit(rank)), "collectives")
                      .with_columns(table["impossible_size"]) for table in tables]).sort("ts")


def _describe(calls: pl.DataFrame, keys: list[str],
              describe: Callable[[dict[str, Any]], tuple[Any, ...]]) -> pl.DataFrame:
    """``calls`` with the description columns, computed by ``describe`` once per distinct ``keys`` row."""
    distinct = calls.select(keys).unique(maintain_order=True)
    descriptions = pl.DataFrame([describe(row) for row in distinct.iter_rows(named=True)],
                                schema=_DESCRIPTION_SCHEMA, orient="row")
    table = pl.concat([distinct, descriptions], how="horizontal")
    return calls.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left", validate="m:1")


def _kernel_collective(row: dict[str, Any], default_group: int | None,
                       outputs: dict[int, int] | None = None) -> tuple[Any, ...]:
    """The description of an NCCL kernel's collective. The op-level name wins over the kernel's: NCCL runs
    all_to_all, send and recv, and ProcessGroupNCCL an all-gather among many ranks, as SendRecv kernels, and NCCL
    >= 2.19 runs every collective as ``ncclDevKernel_Generic``. A kernel launched by a c10d all-gather op itself
    has that op's input and output counts (:func:`_c10d_gather_counts`); ``outputs``: :func:`_gathered_outputs`."""
    impossible = _without_impossible(row)
    kernel_collective, algorithm, protocol = parse_nccl_kernel(row["name"])
    collective = (canonical_collective(row["arg_collective"]) or canonical_collective(row["op_collective"])
                  or canonical_collective(row["cpu_op"]) or kernel_collective)
    dtype = row["arg_dtype"] or row["op_dtype"] or first_dtype(row["input_types"])
    own = _c10d_gather_counts(row["cpu_op"], row["input_dims"])
    in_n = _first(row["arg_in_nelems"], row["op_in_nelems"], own[1] if own else elements_from_dims(row["input_dims"]))
    source = ("kernel_args" if row["arg_in_nelems"] is not None else "record_param_comms"
              if row["op_in_nelems"] is not None else "annotation" if in_n is not None else None)
    return _description(collective, row["arg_pg_name"] or row["op_pg_name"],
                        row["arg_pg_ranks"] or row["op_pg_ranks"],
                        _first(row["arg_group_size"], row["op_group_size"], default_group), dtype, in_n,
                        _first(row["arg_out_nelems"], row["op_out_nelems"], own[0] if own else None), algorithm,
                        protocol, source, impossible, outputs)


def _annotation_collective(row: dict[str, Any], default_group: int | None,
                           group: tuple[str | None, str] | None = None,
                           outputs: dict[int, int] | None = None) -> tuple[Any, ...]:
    """The description of a collective annotation's call (``gloo:all_reduce``, ...); ``outputs``:
    :func:`_gathered_outputs`."""
    impossible = _without_impossible(row)
    in_n = _first(row["arg_in_nelems"], elements_from_dims(row["input_dims"]))
    pg_name, pg_ranks = (row["arg_pg_name"], row["arg_pg_ranks"]) if row["arg_pg_ranks"] or row["arg_pg_name"] \
        else group or (None, None)
    return _description(canonical_collective(row["name"]), pg_name, pg_ranks,
                        _first(row["arg_group_size"], default_group),
                        row["arg_dtype"] or first_dtype(row["input_types"]), in_n, row["arg_out_nelems"], None, None,
                        "annotation" if in_n is not None else None, impossible, outputs)


def _first(*values: int | None) -> int | None:
    """The first value given: 0 is a size (a zero-element collective), not a missing one."""
    return next((value for value in values if value is not None), None)


def _without_impossible(row: dict[str, Any]) -> bool:
    """Read as absent the element counts and group sizes of a collective's metadata that no collective can have
    (:data:`_METADATA_BOUNDS`: negative, or beyond the largest message or cluster), so that the next source is
    used; whether there were any. Kept, a negative size made a profile that `vtrain tables` refuses."""
    impossible = False
    for key, (low, high) in _METADATA_BOUNDS.items():
        value = row.get(key)
        if value is not None and not low <= value <= high:
            row[key] = None
            impossible = True
    return impossible


def _description(collective: str | None, pg_name: str | None, pg_ranks: str | None, group_size: int | None,
                 dtype: str | None, in_n: int | None, out_n: int | None, algorithm: str | None,
                 protocol: str | None, source: str | None, impossible: bool,
                 outputs: dict[int, int] | None = None) -> tuple[Any, ...]:
    """The description columns of a collective (see :data:`_DESCRIPTION_SCHEMA`).

    An all-gather's elements are its output's (:func:`vtrain.tables.latency.all_gather_output`): ``out_n``, else the
    output of the rank's c10d all-gathers of its input (``outputs``, :func:`_gathered_outputs`), else its input times
    its group size; its group size, where no metadata gives it, its output over its input. Where none of these is
    known its elements are its input's and it has no bytes (:func:`vtrain.tables.latency.input_sized_all_gather`).

    A size beyond :data:`MAX_MESSAGE_BYTES` or below 0 (from ``Input Dims``, or an all-gather's input times its
    group) is left out, as ``impossible`` metadata (read before as absent) is: the call keeps its row and time but
    has no size, so it stays out of ``nccl_latency``, and ingest says how many. Not an error: the trace's kernels
    and other collectives are sound, and one corrupt field should not refuse them."""
    if collective in ("send", "recv", "send_recv"):
        group_size = 2
    size = dtype_bytes(dtype)
    if collective == "all_gather":
        out_n = _first(out_n, (outputs or {}).get(in_n))
        output, group_size = all_gather_output(in_n, out_n, group_size)
        elements = _first(output, in_n)
        nbytes = output * size if output is not None and size else None
    else:
        given = [n for n in (in_n, out_n) if n is not None]
        elements = max(given) if given else None
        nbytes = elements * size if elements is not None and size else None
    if elements is not None and not 0 <= max(elements, nbytes or 0) <= MAX_MESSAGE_BYTES:
        elements = nbytes = None
        impossible = True
    return (collective, pg_name, pg_ranks, group_size, dtype, elements, nbytes, algorithm, protocol, source,
            impossible)


def _c10d_gather_counts(name: str | None, dims_json: str | None) -> tuple[int, int] | None:
    """(output, input) elements of a c10d all-gather op (``c10d::_allgather_base_``, ``c10d::allgather_``,
    ``c10d::allgather_into_tensor_coalesced_`` ...: its first argument is its output, its second its input) from its
    ``Input Dims``; None for another op, or without the two sizes (tensor lists that Kineto writes as ``[]``)."""
    if not name or not name.startswith(C10D_OP_PREFIX) or canonical_collective(name) != "all_gather" or not dims_json:
        return None
    try:
        dims = json.loads(dims_json)
    except json.JSONDecodeError:
        return None
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    output, given = (elements_from_dims(json.dumps(part)) for part in dims[:2])
    return (output, given) if output and given else None


def _gathered_outputs(cpu: pl.DataFrame) -> dict[int, int]:
    """Output elements of the rank's all-gathers by input elements, from its c10d all-gather ops' tensors
    (:func:`_c10d_gather_counts`): the issuing op holds the output where the call's own metadata does not (a gloo
    annotation, ProcessGroupNCCL's ``nccl:_all_gather_base`` before PyTorch 2.2's ``record_param_comms`` sizes).
    An input gathered into outputs of several sizes (groups of several sizes) is left out: its calls' are unknown."""
    ops = cpu.filter(pl.col("name").str.starts_with(C10D_OP_PREFIX) & pl.col("input_dims").is_not_null()) \
        .select("name", "input_dims").unique()
    seen: dict[int, set[int]] = {}
    for name, dims in ops.iter_rows():
        if counts := _c10d_gather_counts(name, dims):
            seen.setdefault(counts[1], set()).add(counts[0])
    return {given: outputs.pop() for given, outputs in seen.items() if len(outputs) == 1}


def _default_group_size(rank: int, dist_info: dict[str, Any] | None) -> int | None:
    """The group size when every process group of size > 1 holding this rank has the same size (its ranks
    counted: a group is the ranks it lists, whatever its ``pg_size`` says)."""
    sizes = {len(ranks) for _, ranks in _groups_of(rank, dist_info)}
    sizes.discard(1)
    return sizes.pop() if len(sizes) == 1 else None


def _pg_config(dist_info: Any) -> Any:
    """``distributedInfo.pg_config`` as the trace gives it (None where there is none)."""
    return dist_info.get("pg_config") if isinstance(dist_info, dict) else None


def known_world_size(dist_info: Any) -> int | None:
    """``distributedInfo.world_size`` where it is a whole number >= 1 (as ingest reads a trace's world size:
    :func:`~vtrain.ingest.discover.json_count`); None where it is not known."""
    world_size = json_count(dist_info.get("world_size")) if isinstance(dist_info, dict) else None
    return world_size if world_size else None


def _groups_of(rank: int, dist_info: dict[str, Any] | None) -> list[tuple[dict[str, Any], tuple[int, ...]]]:
    """The process groups (:func:`~vtrain.kineto.process_groups`) that hold ``rank``."""
    groups = process_groups(_pg_config(dist_info), known_world_size(dist_info))
    return [(pg, ranks) for pg, ranks in groups if rank in ranks]


def pg_config_problem(dist_info: Any) -> str | None:
    """What is wrong with ``distributedInfo.pg_config`` (None when nothing is, or there is none), on one line
    (:func:`~vtrain.kineto.process_groups_problem`); the caller says so."""
    return process_groups_problem(_pg_config(dist_info), known_world_size(dist_info))
