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

from collections import Counter
from dataclasses import dataclass

from vtrain.graph.build import ExecutionGraph, Task
from vtrain.graph.work import BlockWork, CommWork, PhaseWork
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
    first_activity_us: float
    last_activity_us: float

    @property
    def idle_us(self) -> float:
        """Time within the iteration without any device activity on this GPU (never below 0: the difference of two
        sums of the same intervals can round to -1e-12 on the busiest stage, printed as -0.0)."""
        return max(sum(self.breakdown_us.values()) - self.busy_us, 0.0)


def receives_posted(graph: ExecutionGraph, result: Schedule) -> dict[int, float]:
    """When the receiving stage posted each pipeline transfer (task index -> time): once the compute task before
    the one that needs the data was done. A blocking receive is on the device from then on (an NCCL receive
    kernel spins until the data is there), so that is where it starts in the predicted trace and busy time."""
    posted: dict[int, float] = {}
    for stream, order in graph.stream_order.items():
        if graph.streams[stream].name != "compute":
            continue
        stage, previous_end = graph.streams[stream].stage, 0.0
        for i in order:
            for j in graph.predecessors[i]:
                if graph.tasks[j].kind == "pp" and graph.tasks[j].peer == stage:
                    posted[j] = min(previous_end, result.start_us[j])
            previous_end = result.end_us[i]
    return posted


def stage_summaries(graph: ExecutionGraph, result: Schedule, iteration_us: float, ranks: list[int]) -> list[
        StageSummary]:
    """Breakdown and busy time of every stage."""
    tasks = graph.tasks
    compute_order = {graph.streams[s].stage: order for s, order in graph.stream_order.items()
                     if graph.streams[s].name == "compute"}
    posted = receives_posted(graph, result)
    activity: list[list[tuple[float, float]]] = [[] for _ in range(graph.stages)]
    for i, task in enumerate(tasks):
        interval = (result.start_us[i], result.end_us[i])
        activity[task.stage].append(interval)
        if task.kind == "pp":
            activity[task.peer].append((posted.get(i, interval[0]), interval[1]))

    summaries = []
    for stage in range(graph.stages):
        breakdown = _account(tasks, result, compute_order[stage], iteration_us)
        intervals = activity[stage]
        summaries.append(StageSummary(
            stage=stage, rank=ranks[stage], breakdown_us=breakdown, busy_us=_union_length(intervals),
            first_activity_us=min((a for a, _ in intervals), default=0.0),
            last_activity_us=max((b for _, b in intervals), default=0.0)))
    return summaries


def _account(tasks: list[Task], result: Schedule, order: list[int], iteration_us: float) -> dict[str, float]:
    """Split one compute stream's timeline [0, T] into the breakdown categories."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    previous_end = 0.0
    for i in order:
        task = tasks[i]
        gap = result.start_us[i] - previous_end
        if gap > 0:
            dep = result.waited_on[i]
            kind = tasks[dep].kind if dep >= 0 else ""
            if kind == "dp":
                totals["dp"] += gap
            elif kind == "pp":
                overlap = min(result.start_us[i], result.end_us[dep]) - max(previous_end, result.start_us[dep])
                exposed = max(0.0, overlap)
                totals["pp"] += exposed
                totals["bubble"] += gap - exposed
            else:
                totals["bubble"] += gap
        if task.kind == "optimizer":
            totals["optimizer"] += task.duration_us
        else:
            totals["compute"] += task.compute_us
            totals["host"] += task.host_us
            totals["tp"] += task.tp_us
        previous_end = result.end_us[i]
    totals["bubble"] += max(0.0, iteration_us - previous_end)
    return totals


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        elif end > current_end:
            current_end = end
    if current_end is not None:
        total += current_end - current_start
    return total


def coverage(graph: ExecutionGraph) -> dict[str, float]:
    """Predicted device time (summed over the representative GPUs) by latency source, in microseconds."""
    uses = Counter(id(task.work) for task in graph.tasks)
    works = {id(task.work): task.work for task in graph.tasks}
    totals = dict.fromkeys(SOURCES, 0.0)
    for key, count in uses.items():
        for resolution in _resolutions(works[key]):
            totals[resolution.source] += resolution.latency_us * count
    return totals


def _resolutions(work: PhaseWork | BlockWork | CommWork) -> list[Resolution]:
    if isinstance(work, CommWork):
        return [work.resolution] if isinstance(work.resolution, Resolution) else []
    blocks = work.blocks if isinstance(work, PhaseWork) else (work,)
    return [step.resolution for block in blocks for step in block.steps]  # type: ignore[attr-defined]


def describe_task(task: Task) -> str:
    """A short label, e.g. ``forward stage=0 mb=3`` or ``pp forward 0->1 mb=3``."""
    chunk = f" chunk={task.chunk}" if task.chunk else ""
    if task.kind == "pp":
        return f"pp {task.phase} {task.stage}->{task.peer}{chunk} mb={task.mb}"
    if task.kind == "dp":
        return f"dp all_reduce stage={task.stage} bucket={task.bucket}"
    if task.kind == "optimizer":
        return f"optimizer stage={task.stage}"
    block = f" block={task.block}" if task.block >= 0 else ""
    return f"{task.kind} stage={task.stage}{chunk} mb={task.mb}{block}"
