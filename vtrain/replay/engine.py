"""Evaluating the replay graph: every point's time is the latest ``source + delay`` over its incoming edges.

Points are visited in a topological order (Kahn's algorithm over all ranks at once, since collectives tie
ranks together); points without incoming edges keep their measured time.
"""

from __future__ import annotations

import numpy as np


class CycleError(ValueError):
    """The graph has a cycle (a collective matched across ranks in an impossible order)."""


def evaluate(measured: np.ndarray, src: np.ndarray, dst: np.ndarray, delay: np.ndarray) -> np.ndarray:
    """Replayed time of every point; raises :class:`CycleError` if some points are never reached."""
    n = len(measured)
    order = np.argsort(src, kind="stable")
    first = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    targets = dst[order].tolist()
    delays = delay[order].tolist()
    waiting = np.bincount(dst, minlength=n).tolist()
    time = measured.tolist()
    stack = [p for p in range(n) if waiting[p] == 0]
    for p in range(n):
        if waiting[p]:
            time[p] = -np.inf
    visited = 0
    while stack:
        p = stack.pop()
        visited += 1
        here = time[p]
        for k in range(first[p], first[p + 1]):
            q = targets[k]
            t = here + delays[k]
            if t > time[q]:
                time[q] = t
            waiting[q] -= 1
            if waiting[q] == 0:
                stack.append(q)
    if visited != n:
        raise CycleError(f"{n - visited} of {n} points are on or after a dependency cycle")
    return np.asarray(time, dtype=np.float64)
