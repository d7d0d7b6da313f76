"""Evaluating the replay graph: every point's time is the latest ``source + delay`` over its incoming edges.

Points are visited in a topological order (Kahn's algorithm over all ranks at once, since collectives tie
ranks together); points without incoming edges keep their measured time. The graph is built without cycles
(every dependency inferred from timing follows one strict order, :func:`vtrain.replay.graph.precedes`); should
one remain all the same (collectives matched in an impossible order), the evaluation releases the earliest
waiting point (by measured time) from the edges it still waits on (it keeps at least its measured time), and
counts how often it had to, which the replay reports.
"""

from __future__ import annotations

import heapq

import numpy as np


def evaluate(measured: np.ndarray, src: np.ndarray, dst: np.ndarray, delay: np.ndarray) -> tuple[np.ndarray, int]:
    """Replayed time of every point, and how many points had to be released from a dependency cycle."""
    n = len(measured)
    order = np.argsort(src, kind="stable")
    first = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    targets = dst[order].tolist()
    delays = delay[order].tolist()
    waiting = np.bincount(dst, minlength=n).tolist()
    measured_list = measured.tolist()
    time = list(measured_list)
    reached = [False] * n  # has at least one evaluated incoming edge
    stack = [p for p in range(n) if waiting[p] == 0]
    done = [False] * n
    released = 0
    backlog: list[tuple[float, int]] | None = None
    visited = 0
    while visited < n:
        if not stack:
            if backlog is None:
                backlog = [(time[p], p) for p in range(n) if not done[p]]
                heapq.heapify(backlog)
            while backlog and done[backlog[0][1]]:
                heapq.heappop(backlog)
            _, p = heapq.heappop(backlog)
            waiting[p] = 0
            released += 1
            time[p] = max(time[p], measured_list[p]) if reached[p] else measured_list[p]
            stack.append(p)
        p = stack.pop()
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
                stack.append(q)
    return np.asarray(time, dtype=np.float64), released
