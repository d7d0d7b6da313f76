"""Event-driven list scheduling of an execution graph (vTrain's Algorithm 1, in O(n log n) with a heap).

A task becomes ready when all its predecessors (and, on an ordered stream, the task before it on the stream)
have finished; ready tasks are taken from a heap in order of ready time and start as soon as their stream is
free. Compute streams run in the schedule's order; communication streams serve tasks first come, first served.
The hot loop runs on plain lists.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from vtrain.graph.build import ExecutionGraph


@dataclass
class Schedule:
    """When every task ran, and which task it waited for last (``-1``: none, it started at 0)."""

    start_us: list[float]
    end_us: list[float]
    cause: list[int]  # the predecessor (data or stream) whose end fixed this task's start
    waited_on: list[int]  # the last data predecessor to finish (-1 if none)

    @property
    def makespan_us(self) -> float:
        return max(self.end_us, default=0.0)


def schedule(graph: ExecutionGraph) -> Schedule:
    """Simulate the graph; raises ``ValueError`` if it has a cycle (some task never becomes ready)."""
    tasks = graph.tasks
    n = len(tasks)
    successors = graph.successors
    waiting = [len(before) for before in graph.predecessors]
    next_on_stream = [-1] * n  # ordered streams: a task also waits for its predecessor on the stream
    for order in graph.stream_order.values():
        for before, after in zip(order, order[1:]):
            next_on_stream[before] = after
            waiting[after] += 1
    duration = [t.duration_us for t in tasks]
    stream_of = [t.stream for t in tasks]
    ready_at = [0.0] * n
    waited_on = [-1] * n
    start = [0.0] * n
    end = [0.0] * n
    cause = [-1] * n
    stream_free = [0.0] * len(graph.streams)
    stream_last = [-1] * len(graph.streams)

    heap = [(0.0, i) for i in range(n) if waiting[i] == 0]
    heapq.heapify(heap)
    done = 0
    while heap:
        ready, i = heapq.heappop(heap)
        stream = stream_of[i]
        free = stream_free[stream]
        begin = free if free > ready else ready
        cause[i] = stream_last[stream] if free > ready_at[i] else waited_on[i]
        finish = begin + duration[i]
        start[i], end[i] = begin, finish
        stream_free[stream], stream_last[stream] = finish, i
        done += 1
        for j in successors[i]:
            if finish >= ready_at[j]:
                ready_at[j], waited_on[j] = finish, i
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (ready_at[j], j))
        j = next_on_stream[i]
        if j >= 0:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(heap, (max(ready_at[j], finish), j))
    if done != n:
        raise ValueError(f"execution graph has a cycle: {n - done} tasks never became ready")
    return Schedule(start_us=start, end_us=end, cause=cause, waited_on=waited_on)


def critical_path(graph: ExecutionGraph, result: Schedule) -> list[int]:
    """Task ids from the first to the last task of the chain that fixes the iteration time."""
    if not graph.tasks:
        return []
    last = max(range(len(graph.tasks)), key=result.end_us.__getitem__)
    path = [last]
    while result.cause[path[-1]] >= 0:
        path.append(result.cause[path[-1]])
    path.reverse()
    return path
