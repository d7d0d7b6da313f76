"""Evaluating the replay graph: every point's time is the latest ``source + delay`` over its incoming edges.

Points are visited in a topological order (Kahn's algorithm over all ranks at once, since collectives tie
ranks together); points without incoming edges keep their measured time. The graph is built without cycles
(every dependency inferred from timing follows one strict order, :func:`vtrain.replay.graph.precedes`); should
one remain all the same (collectives matched in an impossible order), the evaluation releases the earliest
waiting point (by measured time) from the edges it still waits on (it keeps at least its measured time), and
counts how often it had to, which the replay reports.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from vtrain.replay.graph import GroupedEdges


def evaluate(measured: np.ndarray, src: np.ndarray, dst: np.ndarray, delay: np.ndarray) -> tuple[np.ndarray, int]:
    """Replayed time of every point, and how many points had to be released from a dependency cycle.

    Compiled (numba) over the graph's arrays: its working memory is a few bytes per point and per edge, where
    Python lists would take tens (a 10 GB trace set has tens of millions of points and edges)."""
    return evaluate_grouped(measured, GroupedEdges.from_arrays(len(measured), src, dst, delay))


def evaluate_grouped(measured: np.ndarray, edges: GroupedEdges) -> tuple[np.ndarray, int]:
    """:func:`evaluate` over edges already grouped by source (:class:`~vtrain.replay.graph.GroupedEdges`)."""
    waiting = np.zeros(len(measured), dtype=edges.targets.dtype)
    _count_incoming(edges.targets, waiting)
    stack = np.empty(len(measured), dtype=edges.targets.dtype)  # every point is pushed at most once
    times, released = _evaluate(np.ascontiguousarray(measured, dtype=np.float64), edges.first, edges.targets,
                                edges.delays, waiting, stack)
    return times, int(released)


@njit(cache=True)
def _count_incoming(targets: np.ndarray, waiting: np.ndarray) -> None:
    for k in range(len(targets)):
        waiting[targets[k]] += 1


@njit(cache=True)
def _evaluate(measured: np.ndarray, first: np.ndarray, targets: np.ndarray, delays: np.ndarray,
              waiting: np.ndarray, stack: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`evaluate` over the edges grouped by source (point ``p``'s are ``first[p]:first[p + 1]``), with
    ``waiting`` the number of incoming edges of each point: Kahn's algorithm with a stack; when the stack runs
    dry, the waiting point earliest by its time when the first cycle was met (then by number) is released."""
    n = len(measured)
    time = measured.copy()
    reached = np.zeros(n, dtype=np.bool_)  # has at least one evaluated incoming edge
    done = np.zeros(n, dtype=np.bool_)
    top = 0
    for p in range(n):
        if waiting[p] == 0:
            stack[top] = p
            top += 1
    released = 0
    backlog = np.empty(0, dtype=np.int64)  # the waiting points by (time when first needed, number)
    next_in_backlog = -1
    visited = 0
    while visited < n:
        if top == 0:
            if next_in_backlog < 0:
                waiting_points = np.nonzero(~done)[0]
                backlog = waiting_points[np.argsort(time[waiting_points], kind="mergesort")]
                next_in_backlog = 0
            while done[backlog[next_in_backlog]]:
                next_in_backlog += 1
            p = backlog[next_in_backlog]
            next_in_backlog += 1
            waiting[p] = 0
            released += 1
            time[p] = max(time[p], measured[p]) if reached[p] else measured[p]
            stack[top] = p
            top += 1
        top -= 1
        p = stack[top]
        if done[p]:
            continue
        done[p] = True
        visited += 1
        here = time[p]
        for k in range(first[p], first[p + 1]):
            q = targets[k]
            if done[q]:
                continue
            t = here + delays[k]
            if not reached[q] or t > time[q]:
                time[q] = t
                reached[q] = True
            waiting[q] -= 1
            if waiting[q] == 0:
                stack[top] = q
                top += 1
    return time, released
