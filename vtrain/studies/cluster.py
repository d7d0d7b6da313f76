"""Multi-tenant cluster scheduling: an event-driven simulation of training jobs sharing a GPU cluster.

Each job trains a model on a number of tokens; its speed on ``g`` GPUs is the best plan's speed for ``g`` GPUs
(:data:`~vtrain.studies.throughput.Throughput`). Between two events (an arrival or a completion) allocations are
fixed and every running job advances at its speed; at every event the policy decides the allocations again.

Policies:

- **baseline** (:func:`baseline_policy`): first come, first served. A job gets exactly the GPUs it asked for once
  that many are free and every job that arrived before it has started; it keeps them to the end.
- **vtrain** (:func:`vtrain_policy`): at every arrival and completion the whole cluster is handed out again,
  one step at a time, to the job whose predicted speed gains the most per added GPU, the gain measured as the
  share of the job's *remaining* work it finishes per hour. A step takes a job from nothing to its smallest
  runnable allocation or from its allocation to a larger one. With exactly linear speed-ups this is
  shortest-remaining-work-first; with real, sub-linear ones GPUs go where they still buy speed, and a job whose
  speed no longer grows gets none. It optimises throughput, not completion times: two alike jobs on a cluster
  that either could use whole (16 GPUs at 1.976x the speed of 8) share it, 8 and 8, for a makespan shorter than
  running them one after the other (19.38 h against 19.62 h in an audit) and a mean completion time longer (19.38
  h against FIFO's 14.72 h). A job that has run before and gets a new allocation (resized, or resumed
  after being preempted) pays ``resize_overhead_h`` (a checkpoint-restart), counted as that much time at its new
  speed. Like SRPT, it can keep a long job waiting while shorter ones keep arriving.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vtrain.studies.throughput import Prediction, Throughput, Workload

#: a completion within this share of a job's tokens of the next event counts as happening at that event
_RELATIVE_EPS = 1e-9


@dataclass(frozen=True)
class Job:
    """A training job: what it trains, how many tokens, when it arrives, and what it asks for."""

    name: str
    workload: Workload
    tokens: float
    arrival_h: float = 0.0
    deadline_h: float | None = None  # hours after its arrival
    gpus: int | None = None  # what it asks for (the baseline gives exactly this)


@dataclass(frozen=True)
class Segment:
    """A stretch of time a job ran on a fixed number of GPUs with one plan."""

    start_h: float
    end_h: float
    gpus: int
    plan: str


@dataclass
class JobResult:
    """When a job started and ended, and on what it ran."""

    name: str
    arrival_h: float
    deadline_h: float | None
    segments: list[Segment] = field(default_factory=list)

    @property
    def start_h(self) -> float:
        return self.segments[0].start_h

    @property
    def end_h(self) -> float:
        return self.segments[-1].end_h

    @property
    def jct_h(self) -> float:
        """Job completion time: from arrival to the end."""
        return self.end_h - self.arrival_h

    @property
    def gpu_hours(self) -> float:
        return sum(s.gpus * (s.end_h - s.start_h) for s in self.segments)

    @property
    def met_deadline(self) -> bool | None:
        return None if self.deadline_h is None else self.jct_h <= self.deadline_h + 1e-9

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "arrival_h": self.arrival_h, "start_h": self.start_h, "end_h": self.end_h,
                "jct_h": self.jct_h, "gpu_hours": self.gpu_hours, "deadline_h": self.deadline_h,
                "met_deadline": self.met_deadline,
                "segments": [{"start_h": s.start_h, "end_h": s.end_h, "gpus": s.gpus, "plan": s.plan}
                             for s in self.segments]}


@dataclass
class Schedule:
    """What one policy did with the cluster."""

    policy: str
    cluster_gpus: int
    jobs: list[JobResult]

    @property
    def makespan_h(self) -> float:
        """From the first arrival to the last completion."""
        return max(j.end_h for j in self.jobs) - min(j.arrival_h for j in self.jobs)

    @property
    def mean_jct_h(self) -> float:
        return sum(j.jct_h for j in self.jobs) / len(self.jobs)

    @property
    def utilization(self) -> float:
        """GPU-hours allocated over the cluster's GPU-hours during the makespan."""
        return sum(j.gpu_hours for j in self.jobs) / (self.cluster_gpus * self.makespan_h)

    def to_dict(self) -> dict[str, object]:
        return {"policy": self.policy, "cluster_gpus": self.cluster_gpus, "makespan_h": self.makespan_h,
                "mean_jct_h": self.mean_jct_h, "utilization": self.utilization,
                "deadlines_met": sum(1 for j in self.jobs if j.met_deadline),
                "deadlines": sum(1 for j in self.jobs if j.deadline_h is not None),
                "jobs": [j.to_dict() for j in self.jobs]}


class Speeds:
    """A job's predicted speed per allocation, each (job, GPUs) asked for once."""

    def __init__(self, throughput: Throughput, sizes: Sequence[int]) -> None:
        self._throughput = throughput
        self.sizes = sorted(set(sizes))
        self._cache: dict[tuple[Workload, int], Prediction | None] = {}

    def at(self, job: Job, gpus: int) -> Prediction | None:
        """The best plan's speed of ``job`` on ``gpus`` GPUs (None: no plan runs on that many)."""
        key = (job.workload, gpus)
        if key not in self._cache:
            self._cache[key] = self._throughput(job.workload, gpus)
        return self._cache[key]

    def rate(self, job: Job, gpus: int) -> float:
        """Tokens per second of ``job`` on ``gpus`` GPUs (0 on none, or where no plan runs)."""
        prediction = self.at(job, gpus) if gpus else None
        return prediction.tokens_per_s if prediction is not None else 0.0

    def options(self, job: Job, limit: int) -> list[int]:
        """The allocation sizes up to ``limit`` on which ``job`` runs."""
        return [g for g in self.sizes if g <= limit and self.at(job, g) is not None]


def allocation_sizes(cluster_gpus: int, asked: list[int]) -> list[int]:
    """The allocations the vtrain policy chooses from: every power of two up to the cluster, the whole cluster
    and what the jobs asked for."""
    sizes = {cluster_gpus, *(g for g in asked if g <= cluster_gpus)}
    size = 1
    while size <= cluster_gpus:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


#: (jobs waiting or running in arrival order, their remaining tokens, their current GPUs, cluster GPUs, speeds,
#: the hours a running job's resize costs) -> the new GPUs of each job (0 or absent: it waits)
Policy = Callable[[list[Job], dict[str, float], dict[str, int], int, Speeds, float], dict[str, int]]


def baseline_policy(active: list[Job], remaining: dict[str, float], current: dict[str, int], cluster: int,
                    speeds: Speeds, resize_overhead_h: float = 0.0) -> dict[str, int]:
    """First come, first served with the GPUs each job asked for; no job is resized."""
    allocation = {name: gpus for name, gpus in current.items() if gpus > 0}
    free = cluster - sum(allocation.values())
    for job in active:
        if job.name in allocation:
            continue
        if job.gpus is None or job.gpus > free:
            break  # strict arrival order: no later job overtakes a waiting one
        allocation[job.name] = job.gpus
        free -= job.gpus
    return allocation


def vtrain_policy(active: list[Job], remaining: dict[str, float], current: dict[str, int], cluster: int,
                  speeds: Speeds, resize_overhead_h: float = 0.0) -> dict[str, int]:
    """Every GPU of the cluster, step by step, where the predicted speed gain per added GPU, as a share of the
    job's remaining work, is largest (from nothing to a job's smallest runnable allocation, or from its
    allocation to a larger one); ties go to the earlier arrival. A running job's speed on another allocation is
    its mean speed to its end there, the resize's checkpoint-restart included (:func:`_mean_rate`): a job near
    its end is not resized for a gain its restart would cost more than."""
    allocation: dict[str, int] = {}
    free = cluster
    while True:
        best: tuple[float, Job, int] | None = None
        for job in active:
            gpus = allocation.get(job.name, 0)
            now = _mean_rate(job, gpus, current, remaining, speeds, resize_overhead_h)
            for more in speeds.options(job, gpus + free):
                if more <= gpus:
                    continue
                faster = _mean_rate(job, more, current, remaining, speeds, resize_overhead_h) - now
                gain = faster / remaining[job.name] / (more - gpus)
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, job, more)
        if best is None:
            return allocation
        _, job, more = best
        free -= more - allocation.get(job.name, 0)
        allocation[job.name] = more


def _mean_rate(job: Job, gpus: int, current: dict[str, int], remaining: dict[str, float], speeds: Speeds,
               resize_overhead_h: float) -> float:
    """Tokens per second of ``job`` on ``gpus`` GPUs, for a running job moved to another allocation averaged over
    what it has left and the ``resize_overhead_h`` its checkpoint-restart takes first."""
    rate = speeds.rate(job, gpus)
    if rate <= 0 or resize_overhead_h <= 0 or current.get(job.name, 0) in (0, gpus):
        return rate
    left_s = remaining[job.name] / rate
    return remaining[job.name] / (left_s + resize_overhead_h * 3600)


POLICIES: dict[str, Policy] = {"baseline": baseline_policy, "vtrain": vtrain_policy}


def simulate_cluster(jobs: Sequence[Job], cluster_gpus: int, speeds: Speeds, policy: str,
                     resize_overhead_h: float = 0.0) -> Schedule:
    """Run ``jobs`` on a cluster of ``cluster_gpus`` GPUs under ``policy`` until every job has finished.

    Every event admits an arrival or ends a running job (the job whose end is the event ends there, whatever the
    rounding of its remaining tokens), so the simulation takes at most one event per arrival and one per job's
    end: at a late clock (10^9 h) a short job's remaining tokens never reached zero, and it ran forever."""
    decide = POLICIES[policy]
    order = sorted(jobs, key=lambda j: j.arrival_h)  # stable: ties keep the file's order
    remaining = {job.name: float(job.tokens) for job in order}
    results = {job.name: JobResult(job.name, job.arrival_h, job.deadline_h) for job in order}
    current: dict[str, int] = {}
    opened: dict[str, tuple[float, int, Prediction]] = {}  # running job -> (segment start, GPUs, prediction)
    now, arrived, active = 0.0, 0, []
    if order:
        now = order[0].arrival_h
    for _ in range(2 * len(order) + 1):
        if arrived == len(order) and not active:
            return Schedule(policy, cluster_gpus, [results[job.name] for job in jobs])
        while arrived < len(order) and order[arrived].arrival_h <= now:
            active.append(order[arrived])
            arrived += 1
        decided = decide(active, remaining, current, cluster_gpus, speeds, resize_overhead_h)
        allocation = {name: gpus for name, gpus in decided.items() if gpus > 0}
        _check_allocation(allocation, cluster_gpus, policy)
        for job in active:
            gpus = allocation.get(job.name, 0)
            if gpus == current.get(job.name, 0):
                continue
            _close(results, opened, job.name, now)
            if gpus:
                prediction = speeds.at(job, gpus)
                assert prediction is not None
                if results[job.name].segments:  # it ran before: checkpoint, restart
                    remaining[job.name] += prediction.tokens_per_s * 3600 * resize_overhead_h
                opened[job.name] = (now, gpus, prediction)
        current = allocation
        next_arrival = order[arrived].arrival_h if arrived < len(order) else math.inf
        finish = {name: now + remaining[name] / (p.tokens_per_s * 3600) for name, (_, _, p) in opened.items()}
        then = min([next_arrival, *finish.values()])
        if math.isinf(then):
            waiting = ", ".join(job.name for job in active)
            raise ValueError(f"policy {policy}: jobs {waiting} can never run on {cluster_gpus} GPUs")
        for name, (_, _, prediction) in opened.items():
            remaining[name] -= prediction.tokens_per_s * 3600 * (then - now)
        now = then
        for job in list(active):
            if job.name in opened and (finish[job.name] <= then  # the event is its end, whatever the rounding
                                       or remaining[job.name] <= _RELATIVE_EPS * job.tokens):
                _close(results, opened, job.name, now, ended=True)
                active.remove(job)
                current.pop(job.name, None)
    raise AssertionError(f"policy {policy}: {len(order)} jobs took more than {2 * len(order) + 1} events")


def _close(results: dict[str, JobResult], opened: dict[str, tuple[float, int, Prediction]], name: str,
           now: float, ended: bool = False) -> None:
    """End the running segment of job ``name`` at ``now``; one of no length is left out, unless the job
    ``ended`` in it and has no other (a job of a few tokens, its run lost in the rounding of the clock)."""
    if name in opened:
        start, gpus, prediction = opened.pop(name)
        if now > start or (ended and not results[name].segments):
            results[name].segments.append(Segment(start, now, gpus, prediction.label))


def _check_allocation(allocation: dict[str, int], cluster_gpus: int, policy: str) -> None:
    used = sum(allocation.values())
    if used > cluster_gpus:
        raise AssertionError(f"policy {policy} allocated {used} of {cluster_gpus} GPUs")
