"""List scheduling of an execution graph (vTrain's Algorithm 1), level by level over arrays.

A task starts when all its predecessors (its data, and the task before it on its stream) have finished. Every
stream's order is known before anything is timed (:mod:`vtrain.graph.build`: a compute stream runs the schedule's
order; a first-come-first-served stream the order its tasks' inputs become ready), so the schedule is the longest
path through the graph, and the tasks whose predecessors are all done can be timed together: each round times one
such level with a few array operations. A pipeline of 105 stages and 480 micro-batches (200,000 tasks) takes
about 1,500 rounds, where a heap of tasks took a Python step per task.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtrain.graph.build import ExecutionGraph


@dataclass
class Schedule:
    """When every task ran, and which task it waited for last (``-1``: none, it started at 0); row ``i`` is task
    ``i``."""

    start_us: np.ndarray
    end_us: np.ndarray
    cause: np.ndarray  # the predecessor (data or stream) whose end fixed this task's start
    waited_on: np.ndarray  # the last data predecessor to finish (-1 if none)

    @property
    def makespan_us(self) -> float:
        return float(self.end_us.max()) if self.end_us.size else 0.0


def schedule(graph: ExecutionGraph) -> Schedule:
    """Simulate the graph; raises ``ValueError`` if it has a cycle (some task never becomes ready)."""
    n = len(graph)
    duration = graph.columns.duration_us
    previous = graph.previous
    chained = np.flatnonzero(previous >= 0)
    before = np.concatenate([graph.sources, previous[chained]])  # every dependency, data or stream
    after = np.concatenate([graph.targets, chained])
    by_before = np.argsort(before, kind="stable")
    successors, bounds = after[by_before], np.searchsorted(before[by_before], np.arange(n + 1))
    waiting = np.bincount(after, minlength=n)
    start, end = np.zeros(n), np.zeros(n)
    level = np.flatnonzero(waiting == 0)
    timed = 0
    while level.size:
        timed += level.size
        end[level] = start[level] + duration[level]
        first = bounds[level]
        counts = bounds[level + 1] - first
        reached = successors[(first - counts.cumsum() + counts).repeat(counts) + np.arange(counts.sum())]
        np.maximum.at(start, reached, end[level].repeat(counts))
        np.subtract.at(waiting, reached, 1)
        level = np.sort(reached[waiting[reached] == 0])  # a task reached twice is ready once
        level = level[np.append(level[1:] != level[:-1], True)] if level.size else level
    if timed != n:
        raise ValueError(f"execution graph has a cycle: {n - timed} tasks never became ready")
    waited_on = _last_to_finish(graph.sources, graph.targets, end, n)
    data_ready = np.where(waited_on >= 0, end[waited_on], 0.0)
    stream_ready = np.where(previous >= 0, end[previous], 0.0)
    cause = np.where((previous >= 0) & (stream_ready > data_ready), previous, waited_on)
    return Schedule(start_us=start, end_us=end, cause=cause, waited_on=waited_on)


def _last_to_finish(sources: np.ndarray, targets: np.ndarray, end: np.ndarray, n: int) -> np.ndarray:
    """Each task's data predecessor that finished last (ties: the later task), -1 for a task without one."""
    finished = end[sources]
    latest = np.full(n, -np.inf)
    np.maximum.at(latest, targets, finished)
    last = finished == latest[targets]
    found = np.full(n, -1, dtype=np.int64)
    np.maximum.at(found, targets[last], sources[last])
    return found


def critical_path(graph: ExecutionGraph, result: Schedule) -> list[int]:
    """Task ids from the first to the last task of the chain that fixes the iteration time."""
    if not len(graph):
        return []
    path = [int(np.argmax(result.end_us))]
    while result.cause[path[-1]] >= 0:
        path.append(int(result.cause[path[-1]]))
    path.reverse()
    return path
