"""Host gaps: the time a rank's timeline spends between the operators a workload model places, per phase.

The simulator chains operator latencies; a real run also spends time between them: Python, the dispatcher and
autograd on the host, views and bookkeeping operators the model does not place, and, on GPUs, the launch gap
between kernels on a stream. :func:`op_gaps` measures it as the idle time before each *placed* operator:

* CPU ranks: every call of an operator with a placed signature, on any thread of the rank, nested in another
  operator or not (the model places nested ones too, e.g. the bias copy inside ``aten::addmm``, and a gap is
  per placed call); collectives and what they hold are left out. GPU ranks: the device activities launched by
  a placed operator, and those a CUDA graph launch released (a graph's kernels carry its launch's correlation,
  and no operator of their own: they are work, not gap, and the gap before a graph is its launch's). Everything
  else (other operators, idle) between two placed calls is gap.
* The gap before an operator runs from the end of everything placed before it in the iteration to its start,
  minus the time spent in collectives that end within it: waiting for a collective (and for the other ranks in
  it) is the collective's time, which the simulator accounts for separately. On CPU ranks a collective starts
  when the rank issued it (the ``c10d::*`` operator), gloo sends are left out (their span lasts until the
  sender waits for them), and a data-parallel gradient reduction (``vtrain/comm purpose=dp``) that completed
  within the pass that issued it counts only once its issuing operator returned: the simulator overlaps those
  with the pass on their own stream, so the time the thread spent issuing one (on gloo, often the whole
  reduction) is host time.
  On GPU ranks an idle stream before a point-to-point receive completes is waiting for the sender, from the
  end of the previous operator (the receive kernel may start only when the data flows).
* The phase of a gap is the ``vtrain/forward|backward|recompute|optimizer`` span around the operator after it
  (``recompute`` inside ``backward``); every gap also counts in phase ``all``. When a rank has such spans, a
  call outside them is not placed (the model has no operator between its passes: e.g. copies of gradient
  buckets that share a signature with a placed operator) and its time is gap; without any, the phase is
  ``other``.
  The first gap of an iteration starts at its ``ProfilerStep#N``; time between passes (issuing and waiting for
  pipeline transfers, the schedule's own Python) is in the gap before the first operator of the next pass.

The statistic per phase is the mean gap per placed operator (the total over an iteration is what adds up) of a
typical iteration: each iteration's mean over its ranks' operators, the median over iterations, so that a burst
of slow iterations (another job on the machine) does not move it. Its per-operator median and 90th percentile
are for the report. :func:`placed_events` gives every placed operator with its
duration and the gap before it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

import numpy as np
import polars as pl

from vtrain.naming import ALL, ITERATION_PREFIX, OTHER, SPAN_PREFIX
from vtrain.tables.latency import in_communication, op_nesting
from vtrain.tables.matching import match_calls
from vtrain.tables.schema import COMMUNICATION

DATA_PARALLEL = "dp"
_PHASES = ("forward", "backward", "optimizer")
_NESTED = "recompute"

Signature = tuple[str, str, str]

EVENTS_SCHEMA = {"rank": pl.Int64, "iteration": pl.Int64, "device_type": pl.String, "phase": pl.String,
                 "op": pl.String, "input_dims": pl.String, "input_types": pl.String, "dur": pl.Float64,
                 "gap": pl.Float64, "host": pl.Float64, "queued": pl.Int64, "ahead": pl.Boolean,
                 "graph": pl.Boolean}
GAPS_SCHEMA = {"device_type": pl.String, "phase": pl.String, "ops": pl.Int64, "rank_iterations": pl.Int64,
               "gap_us": pl.Float64, "mean_us": pl.Float64, "median_us": pl.Float64, "p90_us": pl.Float64,
               "op_calls": pl.Int64, "host_us": pl.Float64, "host_calls": pl.Int64, "graph_host_us": pl.Float64,
               "device_gap_us": pl.Float64}
#: the columns :func:`_timed` gives every placed call (how the host issued it is known on GPU ranks only)
_TIMED = [name for name in EVENTS_SCHEMA if name not in ("host", "queued", "ahead", "graph")]
#: a stretch between two launches in which fewer device activities than this were ever queued had the host wait
#: for no slot in the launch queue (CUDA's holds about a thousand; 754 were the most queued in the H200 and H100
#: recordings, 979 in Megatron-core's): its time is the host's own
FREE_QUEUE = 256


def op_gaps(events: pl.DataFrame) -> pl.DataFrame:
    """Gap statistics per device type and phase (:data:`GAPS_SCHEMA`) of :func:`placed_events`."""
    if events.is_empty():
        return pl.DataFrame(schema=GAPS_SCHEMA)
    both = pl.concat([events, events.with_columns(phase=pl.lit(ALL))])
    # each mean is a typical iteration's (the median of the iterations' means): a cold or disturbed one moves it less
    typical = (both.group_by("device_type", "phase", "iteration")
               .agg(mean_us=pl.col("gap").mean(), host_us=_issue_times(False).mean(),
                    graph_host_us=_issue_times(True).mean(), device_gap_us=pl.col("gap").filter(pl.col("ahead")).mean())
               .group_by("device_type", "phase")
               .agg(pl.col("mean_us", "host_us", "graph_host_us", "device_gap_us").median()))
    return (
        both.group_by("device_type", "phase")
        .agg(ops=pl.len().cast(pl.Int64), rank_iterations=pl.struct("rank", "iteration").n_unique().cast(pl.Int64),
             gap_us=pl.col("gap").sum(), median_us=pl.col("gap").median(),
             p90_us=pl.col("gap").quantile(0.9, interpolation="linear"),
             op_calls=(~pl.col("graph")).sum().cast(pl.Int64), host_calls=_issue_times(False).count().cast(pl.Int64))
        .join(typical, on=["device_type", "phase"], nulls_equal=True)
        .sort("device_type", "phase")
        .select(list(GAPS_SCHEMA))
    )


def _issue_times(graph: bool) -> pl.Expr:
    """The host's times to issue an operator (or, ``graph``, to replay a CUDA graph): the time since the previous
    launch, for stretches in which the host waited for no slot in the launch queue (:data:`FREE_QUEUE`) and launches
    the host made on its own, ahead of the device or with the device idle before the operator (a launch just as the
    device became free is the host keeping pace with it: a synchronous call, or a timeline written so)."""
    return pl.col("host").filter((pl.col("graph") == graph) & (pl.col("queued") < FREE_QUEUE)
                                 & (pl.col("ahead") | (pl.col("gap") > 0)))


def placed_events(cpu_ops: pl.DataFrame, kernels: pl.DataFrame, collectives: pl.DataFrame,
                  placed: set[Signature], graph_launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every placed operator call in an iteration: rank, iteration, device type, phase, signature (``op``,
    ``input_dims``, ``input_types``), its duration (``dur``: on GPUs its kernels' total) and the ``gap`` before
    it; ``placed`` is the set of signatures the model places, ``graph_launches`` the profile's table of CUDA graph
    launches (the kernels each released are work too)."""
    gpu_ranks = set(kernels["rank"].unique().to_list()) if not kernels.is_empty() else set()
    waits = _blocking_collectives(collectives, cpu_ops)
    frames = [_cpu_events(cpu_ops.filter(~pl.col("rank").is_in(list(gpu_ranks))), waits, placed)]
    if gpu_ranks:
        frames.append(_gpu_events(kernels, cpu_ops, waits, placed, graph_launches))
    frames = [f for f in frames if not f.is_empty()]
    return pl.concat(frames) if frames else pl.DataFrame(schema=EVENTS_SCHEMA)


def _blocking_collectives(collectives: pl.DataFrame, cpu_ops: pl.DataFrame) -> dict[int, np.ndarray]:
    """Per rank, the [start, end] of collectives a rank can wait for, sorted by end: from the arrival, except
    for data-parallel reductions that completed within the pass that issued them (overlapped with it: from the
    issuing operator's return) and receives on GPUs (from minus infinity: an idle stream before a receive
    completes is waiting)."""
    if collectives.is_empty():
        return {}
    phases = _PhaseLookup(cpu_ops)
    calls = match_calls(collectives, cpu_ops).filter(
        ~((pl.col("device_type") == "cpu") & (pl.col("collective") == "send")))
    result = {}
    for (rank,), group in calls.group_by("rank"):
        pass_end = pl.Series(phases.pass_end(rank, group["arrival_ts"].to_numpy()), dtype=pl.Float64,
                             nan_to_null=True)
        overlapped = ((pl.col("purpose") == DATA_PARALLEL) & pl.col("issue_end_ts").is_not_null()
                      & (pl.col("ts") + pl.col("dur") <= pass_end).fill_null(False))
        result[int(rank)] = group.select(
            start=pl.when((pl.col("device_type") == "cuda") & (pl.col("collective") == "recv")).then(-np.inf)
            .when(overlapped).then(pl.col("issue_end_ts")).otherwise(pl.col("arrival_ts")),
            end=pl.col("ts") + pl.col("dur"),
        ).sort("end").to_numpy()
    return result


def _cpu_events(cpu_ops: pl.DataFrame, waits: dict[int, np.ndarray], placed: set[Signature]) -> pl.DataFrame:
    ops = cpu_ops.filter(pl.col("cat") == "cpu_op").sort("rank", "tid", "ts", pl.col("dur"),
                                                         descending=[False, False, False, True])
    if ops.is_empty():
        return pl.DataFrame()
    parent, _ = op_nesting(ops["rank"].to_list(), ops["tid"].to_list(), ops["ts"].to_list(), ops["dur"].to_list())
    blocked = in_communication(ops["name"].to_list(), parent)
    marked = _placed_mask(ops.select("name", "input_dims", "input_types"), placed)
    ops = ops.filter(pl.Series([m and not b for m, b in zip(marked, blocked)], dtype=pl.Boolean))
    ops = ops.rename({"name": "op"})
    return _timed(ops, cpu_ops, waits, "cpu").with_columns(host=pl.lit(None, pl.Float64), queued=pl.lit(None, pl.Int64),
                                                           ahead=pl.lit(False), graph=pl.lit(False))


def _gpu_events(kernels: pl.DataFrame, cpu_ops: pl.DataFrame, waits: dict[int, np.ndarray],
                placed: set[Signature], graph_launches: pl.DataFrame | None) -> pl.DataFrame:
    graphed, graph_ts = pl.lit(False), pl.lit(None, pl.Float64)
    if graph_launches is not None and not graph_launches.is_empty():  # a graph's kernels carry its launch's id
        launched = graph_launches.unique(["rank", "correlation"]).select(
            "rank", "correlation", graph_ts=pl.col("ts"), graphed=pl.lit(True))
        kernels = kernels.join(launched, on=["rank", "correlation"], how="left", maintain_order="left")
        graphed, graph_ts = pl.col("graphed").fill_null(False), pl.col("graph_ts")
    # a graph launched outside any operator still released work; one call: its launch
    work = kernels.filter((pl.col("kernel_class") != COMMUNICATION) & pl.col("iteration").is_not_null()
                          & (pl.col("cpu_op").is_not_null() | graphed)).with_columns(
        call=pl.when(graphed).then(-pl.col("correlation")).otherwise(pl.col("external_id")), graph_ts=graph_ts)
    placed_mask = pl.Series(_placed_mask(work.select("cpu_op", "input_dims", "input_types"), placed),
                            dtype=pl.Boolean)
    work = work.filter(placed_mask | work.select(graphed.alias("graphed"))["graphed"]).drop("graphed", strict=False)
    launches = (cpu_ops.filter(pl.col("external_id").is_not_null()).unique(["rank", "external_id"], keep="first")
                .select("rank", "external_id", launch_ts=pl.col("ts")))
    work = work.join(launches, on=["rank", "external_id"], how="left").with_columns(
        launch_ts=pl.coalesce("graph_ts", "launch_ts", "ts")).rename({"cpu_op": "op"})
    per_kernel = _timed(work, cpu_ops, waits, "cuda", phase_at="launch_ts", keep=["call", "launch_ts", "ts"])
    calls = (per_kernel.group_by("rank", "iteration", "call", maintain_order=True)
             .agg(pl.col("device_type", "phase", "op", "input_dims", "input_types").first(), pl.col("dur", "gap").sum(),
                  launch=pl.col("launch_ts").min(), end=(pl.col("ts") + pl.col("dur")).max(),
                  graph=(pl.col("call") < 0).fill_null(False).first()))
    return _issued(calls, _queued_at(kernels, launches)).select(list(EVENTS_SCHEMA))


def _queued_at(kernels: pl.DataFrame, launches: pl.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per GPU rank, the sorted launch and start times of all its device activities: how many were queued (launched,
    not yet started) at a time is the count of launches before it less the count of starts."""
    timed = kernels.join(launches, on=["rank", "external_id"], how="left").with_columns(
        launch_ts=pl.coalesce("launch_ts", "ts"))
    return {int(rank): (np.sort(group["launch_ts"].to_numpy()), np.sort(group["ts"].to_numpy()))
            for (rank,), group in timed.group_by("rank")}


def _issued(calls: pl.DataFrame, queued: dict[int, tuple[np.ndarray, np.ndarray]]) -> pl.DataFrame:
    """Placed GPU calls with how the host issued them: ``host``, the time since the previous placed call's launch
    in the iteration (null for the first); ``queued``, the most device activities launched and not yet started at
    any launch since that one (:func:`_most_queued`: near the launch queue's depth the host waits for the device
    and its time is not its own); ``ahead``, whether it was launched
    before the previous one ended on the device (its gap is then the device's own time between operators, not a
    wait for the host)."""
    frames = []
    for (rank, _), group in calls.group_by("rank", "iteration"):
        group = group.sort("launch")
        launched, started = queued[int(rank)]
        waiting = _most_queued(launched, started, group["launch"].to_numpy())
        frames.append(group.with_columns(
            host=pl.col("launch").diff(), queued=pl.Series(waiting, dtype=pl.Int64),
            ahead=(pl.col("launch") < pl.col("end").cum_max().shift()).fill_null(False)))
    return pl.concat(frames) if frames else calls.with_columns(host=pl.lit(None, pl.Float64),
                                                                queued=pl.lit(None, pl.Int64), ahead=pl.lit(False))


def _most_queued(launched: np.ndarray, started: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each launch in ``at`` (sorted), the most device activities queued (launched, not yet started) at any
    launch since the one before it: a host that waited for a slot anywhere in between did not spend that time on
    its own (one such wait in Megatron-core's 24-layer run made 204 ms of an iteration's 694 the host's)."""
    depth = np.append(np.arange(len(launched)) - np.searchsorted(started, launched, side="right"), -1)
    first = np.searchsorted(launched, at[:1], side="left")
    bounds = np.concatenate([first, np.searchsorted(launched, at, side="right")])  # launch i's: [i, i + 1)
    most = np.maximum.reduceat(depth, bounds)[:-1]  # a stretch with no launch (a graph's, launched at no kernel's
    # launch time) reads the next launch's depth, never above its own: the count at its own launch settles it
    own = np.searchsorted(launched, at, side="left") - np.searchsorted(started, at, side="right")
    return np.maximum(most, own)


def _timed(calls: pl.DataFrame, cpu_ops: pl.DataFrame, waits: dict[int, np.ndarray], device_type: str,
           phase_at: str = "ts", keep: list[str] | None = None) -> pl.DataFrame:
    """Calls with the gap before each (per rank and iteration, in start order) and the phase around each."""
    starts = _iteration_starts(cpu_ops)
    phases = _PhaseLookup(cpu_ops)
    rows = []
    for (rank, iteration), group in calls.filter(pl.col("iteration").is_not_null()).group_by("rank", "iteration"):
        group = group.sort("ts")
        phase = pl.Series(phases(rank, group[phase_at].to_numpy()), dtype=pl.String)
        if phases.has_spans(rank):  # the model places no operator outside its passes
            group, phase = group.filter(phase != OTHER), phase.filter(phase != OTHER)
        if group.is_empty():
            continue
        ts, ends = group["ts"].to_numpy(), (group["ts"] + group["dur"]).to_numpy()
        gaps = _gaps(ts, ends, starts.get((rank, iteration), ts[0]), waits.get(rank))
        rows.append(group.select("op", "input_dims", "input_types", "dur", *(keep or [])).with_columns(
            rank=pl.lit(rank, dtype=pl.Int64), iteration=pl.lit(iteration, dtype=pl.Int64),
            device_type=pl.lit(device_type), phase=phase, gap=pl.Series(gaps, dtype=pl.Float64)))
    if not rows:  # nothing placed was timed: an empty frame that still has the kept columns
        return pl.DataFrame(schema={**{name: EVENTS_SCHEMA[name] for name in _TIMED},
                                    **{name: calls.schema[name] for name in keep or []}})
    return pl.concat(rows).select(*_TIMED, *(keep or []))


def _placed_mask(signatures: pl.DataFrame, placed: set[Signature]) -> list[bool]:
    return [tuple(row) in placed for row in signatures.iter_rows()]


def _gaps(starts: np.ndarray, ends: np.ndarray, origin: float, waits: np.ndarray | None) -> list[float]:
    """Idle time before each event (sorted by start) since the end of everything before it (``origin`` for the
    first), less the parts of collectives ending within it."""
    wait_ends = waits[:, 1] if waits is not None and len(waits) else np.empty(0)
    gaps = []
    reached = origin
    for start, end in zip(starts, ends):
        gap = start - reached - _covered(waits, wait_ends, reached, start) if start > reached else 0.0
        gaps.append(max(gap, 0.0))
        reached = max(reached, end)
    return gaps


def _covered(waits: np.ndarray | None, wait_ends: np.ndarray, low: float, high: float) -> float:
    """Length of the union of [max(low, arrival), end] over the collectives ending in (low, high]."""
    if waits is None or not len(wait_ends):
        return 0.0
    ending = waits[bisect_right(wait_ends, low):bisect_right(wait_ends, high)]
    intervals = sorted((max(low, a), e) for a, e in ending if max(low, a) < e)
    return _union(intervals)


def _union(intervals: Iterable[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return total + (current_end - current_start if current_end is not None else 0.0)


def _iteration_starts(cpu_ops: pl.DataFrame) -> dict[tuple[int, int], float]:
    steps = cpu_ops.filter(pl.col("name").str.starts_with(ITERATION_PREFIX) & pl.col("iteration").is_not_null())
    return {(rank, iteration): ts for rank, iteration, ts in steps.select("rank", "iteration", "ts").iter_rows()}


class _PhaseLookup:
    """The phase around a rank's times, from its ``vtrain/`` pass spans."""

    def __init__(self, cpu_ops: pl.DataFrame) -> None:
        spans = cpu_ops.filter(pl.col("name").str.starts_with(SPAN_PREFIX)).with_columns(
            kind=pl.col("name").str.extract(rf"^{SPAN_PREFIX}(\w+)"))
        self._spans: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, list[str]]] = {}
        for (rank, nested), group in spans.filter(pl.col("kind").is_in([*_PHASES, _NESTED])).with_columns(
                nested=pl.col("kind") == _NESTED).group_by("rank", "nested"):
            group = group.sort("ts")
            self._spans[(rank, nested)] = (group["ts"].to_numpy(), (group["ts"] + group["dur"]).to_numpy(),
                                           group["kind"].to_list())

    def has_spans(self, rank: int) -> bool:
        """Whether the rank's trace has pass spans at all."""
        return (rank, False) in self._spans

    def __call__(self, rank: int, times: np.ndarray) -> list[str]:
        outer, _ = _inside(self._spans.get((rank, False)), times)
        inner, _ = _inside(self._spans.get((rank, True)), times)
        return [i or o or OTHER for o, i in zip(outer, inner)]

    def pass_end(self, rank: int, times: np.ndarray) -> np.ndarray:
        """The end of the pass around each time (NaN outside one)."""
        return _inside(self._spans.get((rank, False)), times)[1]


def _inside(spans: tuple[np.ndarray, np.ndarray, list[str]] | None,
            times: np.ndarray) -> tuple[list[str | None], np.ndarray]:
    """The kind and end of the (non-overlapping) span holding each time; ``None`` and NaN outside one."""
    if spans is None:
        return [None] * len(times), np.full(len(times), np.nan)
    starts, ends, kinds = spans
    index = np.searchsorted(starts, times, side="right") - 1
    held = (index >= 0) & (times < ends[np.maximum(index, 0)])
    return ([kinds[i] if h else None for i, h in zip(index, held)],
            np.where(held, ends[np.maximum(index, 0)], np.nan))
