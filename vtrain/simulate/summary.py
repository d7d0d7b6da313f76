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
    transfers = np.flatnonzero(columns.of_kind("pp"))
    # every task is activity of its own stage's GPU, and a transfer also of its receiver's from when it was posted
    owner = np.concatenate([columns.stage, columns.peer[transfers]])
    begins = np.concatenate([start, _posted(columns, start, end, transfers)])
    ends = np.concatenate([end, end[transfers]])
    by_owner = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[by_owner], np.arange(graph.stages + 1))
    compute_order = {graph.streams[s].stage: order for s, order in graph.stream_order.items()
                     if graph.streams[s].name == "compute"}
    summaries = []
    for stage in range(graph.stages):
        mine = by_owner[bounds[stage]:bounds[stage + 1]]
        mine = mine[np.argsort(begins[mine], kind="stable")]  # by beginning (ties: in task order)
        summaries.append(StageSummary(
            stage=stage, rank=ranks[stage],
            breakdown_us=_account(columns, start, end, waited_on, compute_order[stage], iteration_us),
            busy_us=_union_length(begins[mine], ends[mine])))
    return summaries


def _account(columns: TaskColumns, start: np.ndarray, end: np.ndarray, waited_on: np.ndarray, order: np.ndarray,
             iteration_us: float) -> dict[str, float]:
    """Split one compute stream's timeline [0, T] into the breakdown categories: each gap before a task is ``dp``
    when it waited last for an all-reduce, ``pp`` while the transfer it waited for was in flight (the rest of that
    gap ``bubble``), else ``bubble``."""
    begins, ends = start[order], end[order]
    previous_end = np.concatenate([[0.0], ends[:-1]])
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
    passes = order[~optimizer]
    tail = max(0.0, iteration_us - (float(ends[-1]) if len(ends) else 0.0))
    totals = {"compute": columns.compute_us[passes].sum(), "host": columns.host_us[passes].sum(),
              "tp": columns.tp_us[passes].sum(), "pp": exposed.sum(), "dp": gap[on_dp].sum(),
              "bubble": gap[idle & ~on_dp].sum() - exposed.sum() + tail,
              "optimizer": columns.duration_us[order[optimizer]].sum()}
    return {key: float(totals[key]) for key in CATEGORIES}


def _union_length(begins: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals sorted by their beginning: each adds what it reaches beyond the furthest
    end before it."""
    if len(begins) == 0:
        return 0.0
    reach = np.maximum.accumulate(ends)
    before = np.concatenate([[-np.inf], reach[:-1]])
    return float(np.maximum(reach - np.maximum(begins, before), 0.0).sum())


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
