"""What a simulated iteration adds up to: per-stage busy/idle time and breakdown, coverage, critical path.

Each stage's compute stream is accounted from 0 to the iteration time ``T``:

* ``compute``: operator time of forward and backward passes (recomputation included);
* ``host``: time those passes wait for the host between operators (the host gaps measured in the profile's
  timeline, or the device model's time to issue an operator when it exceeds the previous one's);
* ``tp``: tensor-parallel collectives (they block the compute stream, so all of it is exposed);
* ``optimizer``: the optimizer step;
* ``pp``: idle time spent waiting for an incoming pipeline transfer while it is in flight;
* ``dp``: idle time before the optimizer spent waiting for the data-parallel all-reduce;
* ``bubble``: every other idle time (waiting for other stages' computation, and the tail after the stage's last
  task).

So each stage's breakdown sums to ``T``; the iteration's breakdown is the mean over stages (over all GPUs, since
tensor- and data-parallel replicas of a stage are identical). ``busy`` is the union of all device activity of a
stage's GPU (compute stream, its pipeline sends and receives, a receive from when it was posted, its
data-parallel all-reduces), the quantity HTA reports as kernel time minus idle time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtrain.graph.build import KINDS, ExecutionGraph, Task, TaskColumns
from vtrain.graph.work import BlockWork, CommWork, PhaseWork, steps_of
from vtrain.simulate.latency import SOURCES, Resolution
from vtrain.simulate.list_scheduler import Schedule

CATEGORIES = ("compute", "host", "tp", "pp", "dp", "bubble", "optimizer")


@dataclass(frozen=True)
class StageSummary:
    """Time accounting of one stage's GPU over the iteration (microseconds)."""

    stage: int
    rank: int  # global rank of the representative GPU (tp rank 0, dp rank 0)
    breakdown_us: dict[str, float]
    busy_us: float

    @property
    def idle_us(self) -> float:
        """Time within the iteration without any device activity on this GPU (never below 0: the difference of two
        sums of the same intervals can round to -1e-12 on the busiest stage, printed as -0.0)."""
        return max(sum(self.breakdown_us.values()) - self.busy_us, 0.0)


def receives_posted(graph: ExecutionGraph, result: Schedule) -> dict[int, float]:
    """When the receiving stage posted each pipeline transfer (task index -> time): once the compute task before
    the one that needs the data was done. A blocking receive is on the device from then on (an NCCL receive
    kernel spins until the data is there), so that is where it starts in the predicted trace and busy time."""
    transfers = np.flatnonzero(graph.columns.of_kind("pp"))
    posted = _posted(graph.columns, np.asarray(result.start_us), np.asarray(result.end_us), transfers)
    return dict(zip(transfers.tolist(), posted.tolist()))


def _posted(columns: TaskColumns, start: np.ndarray, end: np.ndarray, transfers: np.ndarray) -> np.ndarray:
    """:func:`receives_posted` of the transfers ``transfers``, in that order."""
    before = columns.previous[columns.consumer[transfers]]
    previous_end = np.where(before >= 0, end[np.maximum(before, 0)], 0.0)
    return np.minimum(previous_end, start[transfers])


def stage_summaries(graph: ExecutionGraph, result: Schedule, iteration_us: float, ranks: list[int]) -> list[
        StageSummary]:
    """Breakdown and busy time of every stage."""
    columns = graph.columns
    start, end, waited_on = np.asarray(result.start_us), np.asarray(result.end_us), np.asarray(result.waited_on)
    compute_order = {graph.streams[s].stage: order for s, order in graph.stream_order.items()
                     if graph.streams[s].name == "compute"}
    breakdowns = _accounts(columns, start, end, waited_on, [compute_order[stage] for stage in range(graph.stages)],
                           iteration_us)
    busy = _busy(columns, start, end, graph.stages)
    return [StageSummary(stage=stage, rank=ranks[stage], breakdown_us=breakdowns[stage], busy_us=busy[stage])
            for stage in range(graph.stages)]


def _busy(columns: TaskColumns, start: np.ndarray, end: np.ndarray, stages: int) -> list[float]:
    """Each stage's busy time: the union of its GPU's activity. Every task is activity of its own stage's GPU, and
    a transfer also of its receiver's from when it was posted."""
    transfers = np.flatnonzero(columns.kind == KINDS.index("pp"))
    owner = np.concatenate([columns.stage, columns.peer[transfers]])
    begins = np.concatenate([start, _posted(columns, start, end, transfers)])
    ends = np.concatenate([end, end[transfers]])
    small = np.int16 if stages < 2**15 else np.int64  # a stable sort of 16-bit keys is a radix sort
    by_owner = np.argsort(owner.astype(small), kind="stable")
    bounds = np.searchsorted(owner[by_owner], np.arange(stages + 1))
    mine = [by_owner[bounds[stage]:bounds[stage + 1]] for stage in range(stages)]
    # each stage's activity by beginning (ties: in task order)
    order = np.concatenate([each[np.argsort(begins[each], kind="stable")] for each in mine])
    return [float(total) for total in _union_lengths(begins[order], ends[order], bounds)]


def _union_lengths(begins: np.ndarray, ends: np.ndarray, bounds: np.ndarray) -> list[np.float64]:
    """Length of the union of each segment's intervals (segment ``s`` from ``bounds[s]`` to ``bounds[s + 1]``),
    sorted by their beginning within a segment: each adds what it reaches beyond the furthest end before it."""
    reach = np.empty_like(ends)
    starts, stops = bounds[:-1].tolist(), bounds[1:].tolist()
    for first, stop in zip(starts, stops):
        np.maximum.accumulate(ends[first:stop], out=reach[first:stop])
    before = np.concatenate([[-np.inf], reach[:-1]])
    before[[first for first, stop in zip(starts, stops) if stop > first]] = -np.inf
    return _segment_sums(np.maximum(reach - np.maximum(begins, before), 0.0), None, bounds)


def _accounts(columns: TaskColumns, start: np.ndarray, end: np.ndarray, waited_on: np.ndarray,
              orders: list[np.ndarray], iteration_us: float) -> list[dict[str, float]]:
    """Split each compute stream's timeline [0, T] (its tasks ``orders[s]`` in the order it runs them) into the
    breakdown categories: each gap before a task is ``dp`` when it waited last for an all-reduce, ``pp`` while the
    transfer it waited for was in flight (the rest of that gap ``bubble``), else ``bubble``. The streams are
    accounted together, each one's sums taken over its own tasks in its order."""
    order = np.concatenate(orders)
    bounds = np.concatenate([[0], np.cumsum([len(each) for each in orders])])
    begins, ends = start[order], end[order]
    previous_end = np.concatenate([[0.0], ends[:-1]])
    previous_end[bounds[:-1][np.diff(bounds) > 0]] = 0.0  # a stream's first task: from 0
    gap = begins - previous_end
    waited = waited_on[order]
    kind = np.where(waited >= 0, columns.kind[np.maximum(waited, 0)], -1)
    idle = gap > 0
    on_dp = idle & (kind == KINDS.index("dp"))
    on_pp = idle & (kind == KINDS.index("pp"))
    dep = np.maximum(waited, 0)
    overlap = np.minimum(begins, end[dep]) - np.maximum(previous_end, start[dep])
    exposed = np.where(on_pp, np.maximum(overlap, 0.0), 0.0)
    optimizer = columns.kind[order] == KINDS.index("optimizer")
    passes = ~optimizer
    sums = {"compute": _segment_sums(columns.compute_us[order], passes, bounds),
            "host": _segment_sums(columns.host_us[order], passes, bounds),
            "tp": _segment_sums(columns.tp_us[order], passes, bounds), "pp": _segment_sums(exposed, None, bounds),
            "dp": _segment_sums(gap, on_dp, bounds), "gaps": _segment_sums(gap, idle & ~on_dp, bounds),
            "optimizer": _segment_sums(columns.duration_us[order], optimizer, bounds)}
    accounts = []
    for stream, (first, stop) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist())):
        tail = max(0.0, iteration_us - (float(ends[stop - 1]) if stop > first else 0.0))
        totals = {key: values[stream] for key, values in sums.items()}
        totals["bubble"] = totals.pop("gaps") - totals["pp"] + tail
        accounts.append({key: float(totals[key]) for key in CATEGORIES})
    return accounts


def _segment_sums(values: np.ndarray, chosen: np.ndarray | None, bounds: np.ndarray) -> list[np.float64]:
    """The sum of each segment's ``values`` (those ``chosen``, when given), segment ``s`` from ``bounds[s]`` to
    ``bounds[s + 1]``: each summed on its own, in order, as a sum of that segment's array alone would be."""
    if chosen is not None:
        kept = np.flatnonzero(chosen)
        values, bounds = values[kept], np.searchsorted(kept, bounds)  # a segment's bound: the kept before it
    return [values[first:stop].sum() for first, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist())]


def coverage(graph: ExecutionGraph) -> dict[str, float]:
    """Predicted device time (summed over the representative GPUs) by latency source, in microseconds."""
    uses = np.bincount(graph.rows["work"], minlength=len(graph.works))
    totals = dict.fromkeys(SOURCES, 0.0)
    for work, count in zip(graph.works, uses.tolist()):
        for resolution in _resolutions(work):
            totals[resolution.source] += resolution.latency_us * count
    return totals


def _resolutions(work: PhaseWork | BlockWork | CommWork) -> list[Resolution]:
    if isinstance(work, CommWork):
        return [work.resolution] if isinstance(work.resolution, Resolution) else []
    return [step.resolution for step in steps_of(work)]  # type: ignore[attr-defined]


def describe_task(task: Task) -> str:
    """A short label, e.g. ``forward stage=0 mb=3`` or ``pp forward 0->1 mb=3``."""
    chunk = f" chunk={task.chunk}" if task.chunk else ""
    if task.kind == "pp":
        return f"pp {task.phase} {task.stage}->{task.peer}{chunk} mb={task.mb}"
    if task.kind == "dp":
        assert isinstance(task.work, CommWork)
        return f"dp {task.work.op} stage={task.stage} bucket={task.bucket}"
    if task.kind == "optimizer":
        return f"optimizer stage={task.stage}"
    block = f" block={task.block}" if task.block >= 0 else ""
    return f"{task.kind} stage={task.stage}{chunk} mb={task.mb}{block}"
