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
    start = _starts(before, after, duration)
    end = start + duration
    waited_on = _last_to_finish(graph.sources, graph.targets, end, n)
    data_ready = np.where(waited_on >= 0, end[waited_on], 0.0)
    stream_ready = np.where(previous >= 0, end[previous], 0.0)
    cause = np.where((previous >= 0) & (stream_ready > data_ready), previous, waited_on)
    return Schedule(start_us=start, end_us=end, cause=cause, waited_on=waited_on)


def _starts(before: np.ndarray, after: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Every task's start: the latest end among the tasks before it (0 for a task without one), the tasks timed
    one level of ready tasks at a time.

    Each round costs a fixed number of numpy calls, whatever the level's size: the successors come from a table of
    two per task (:func:`_successor_table`: the relays it adds take no time, so they pass their one predecessor's
    end on unchanged), and a task reached from two tasks of one level is kept once."""
    n = len(duration)
    table = _successor_table(before, after, n)
    total = len(table) - 1  # the last row is a sink that the table's empty places point to
    waiting = np.bincount(table.ravel(), minlength=total + 1)
    waiting[total] = np.iinfo(waiting.dtype).max  # never ready
    length = np.concatenate([duration, np.zeros(total + 1 - n)])
    start = np.zeros(total + 1)
    keep = np.ones(2 * total, dtype=bool)  # whether each of a sorted level's tasks differs from the one before it
    level = np.flatnonzero(waiting == 0)
    timed = 0
    while level.size:
        timed += level.size
        end = start.take(level) + length.take(level)
        reached = table.take(level, axis=0).ravel()
        np.maximum.at(start, reached, end.repeat(2))
        np.subtract.at(waiting, reached, 1)
        level = reached[waiting.take(reached) == 0]
        level.sort()  # a task reached twice is ready once
        first = keep[:level.size]
        np.not_equal(level[1:], level[:-1], out=first[1:])
        level = level[first]
    if timed != total:
        raise ValueError(f"execution graph has a cycle: {total - timed} tasks never became ready")
    return start[:n]


def _successor_table(before: np.ndarray, after: np.ndarray, n: int) -> np.ndarray:
    """The tasks after each of the ``n`` tasks (``before[j]`` before ``after[j]``), two per row: a task with more
    passes the rest on through relay rows (ids from ``n`` up), each holding one more of them and the next relay.
    Empty places point to the table's last row. Which place a successor takes does not matter (a task's start is
    the latest end of the tasks before it, whatever their order), so no sort is needed: a task's last edge goes in
    its first place, the other in its second."""
    counts = np.bincount(before, minlength=n)
    few = counts[before] <= 2
    tail, head = before[few], after[few]
    edge = np.arange(tail.size)
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, tail, edge)
    relays, rows = _relays(before[~few], after[~few], n)
    table = np.full((rows + 1, 2), rows, dtype=np.int64)
    table[tail, (last[tail] != edge).astype(np.int64)] = head
    for row, successors in relays:
        table[row, :len(successors)] = successors
    return table


def _relays(tail: np.ndarray, head: np.ndarray, n: int) -> tuple[list[tuple[int, list[int]]], int]:
    """The table rows of the tasks with more than two successors (``tail[j]`` before ``head[j]``), as (row, its
    successors), relay rows numbered from ``n``; and the number of rows with them."""
    successors: dict[int, list[int]] = {}
    for task, successor in zip(tail.tolist(), head.tolist()):
        successors.setdefault(task, []).append(successor)
    relays: list[tuple[int, list[int]]] = []
    rows = n
    for task, rest in successors.items():
        holder = task
        while len(rest) > 2:
            relays.append((holder, [rest.pop(0), rows]))
            holder, rows = rows, rows + 1
        relays.append((holder, rest))
    return relays, rows


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
