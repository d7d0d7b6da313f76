"""The critical path of an iteration in an evaluated replay graph, and what it is made of.

Walking back from the iteration's last point, each step follows the incoming edge that set the point's time
(``source time + delay == point time``); the path ends at the iteration's start or at a point nothing set.
Every edge on the path is attributed to the operator class of the event whose own time it holds
(:mod:`vtrain.whatif.owners`), or, for edges that belong to no event, to what they are: host time between
operators, wake-ups, launches, stream order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from vtrain.replay.graph import EDGE_KINDS, WAKE
from vtrain.whatif.owners import NO_OWNER, OwnedGraph

#: labels of the edges that belong to no event
HOST_LABEL = "(host: Python and gaps between ops)"
HOST_OPS_LABEL = "(host: CPU operators and runtime calls of GPU ranks)"
_UNOWNED_LABEL = {WAKE: "(wake-up after a wait)"}
_TIE_US = 1e-6


@dataclass
class CriticalPath:
    """One iteration's critical path: its length and the time on it per class and per operator (µs)."""

    iteration: int
    length_us: float
    by_class: dict[str, float] = field(default_factory=dict)
    by_op: dict[tuple[str, str], float] = field(default_factory=dict)  # (class, name) -> µs


class PathFinder:
    """Critical paths of one graph evaluated with one set of delays."""

    def __init__(self, owned: OwnedGraph, delay: np.ndarray, times: np.ndarray, classes: list[str],
                 names: list[str]) -> None:
        self.classes, self.names = classes, names
        order = np.argsort(owned.dst, kind="stable")
        self.incoming = order.tolist()
        self.first = np.searchsorted(owned.dst[order], np.arange(len(times) + 1)).tolist()
        self.src, self.holder, self.kind = owned.src.tolist(), owned.holder.tolist(), owned.kind.tolist()
        self.events = owned.events
        self.delay, self.times = delay.tolist(), times.tolist()

    def path(self, iteration: int, end_point: int, start_time: float) -> CriticalPath:
        """The path from ``end_point`` back to ``start_time``: an edge that crosses ``start_time`` counts only its
        part after it (a wait begun in the iteration before is not this iteration's time)."""
        by_class: dict[str, float] = defaultdict(float)
        by_op: dict[tuple[str, str], float] = defaultdict(float)
        src, delay, times = self.src, self.delay, self.times
        point = end_point
        while times[point] > start_time + _TIE_US:
            edge = self._binding(point)
            if edge is None:  # a root, or released from a dependency cycle: kept its measured time
                break
            step = min(delay[edge], times[point] - start_time)
            holder = self.holder[edge]
            if holder != NO_OWNER and holder < self.events:
                label = self.classes[holder]
                by_op[(label, self.names[holder])] += step
            elif holder != NO_OWNER:
                label = HOST_LABEL
            else:
                name = EDGE_KINDS[self.kind[edge]]
                label = _UNOWNED_LABEL.get(name, f"({name})")
            by_class[label] += step
            point = src[edge]
        return CriticalPath(iteration=iteration, length_us=self.times[end_point] - max(times[point], start_time),
                            by_class=dict(by_class), by_op=dict(by_op))

    def _binding(self, point: int) -> int | None:
        """The incoming edge that set the point's time (the longest one when several did)."""
        target = self.times[point] - _TIE_US * max(1.0, abs(self.times[point]))
        best, best_delay = None, -1.0
        for k in range(self.first[point], self.first[point + 1]):
            edge = self.incoming[k]
            if self.times[self.src[edge]] + self.delay[edge] >= target and self.delay[edge] > best_delay:
                best, best_delay = edge, self.delay[edge]
        return best


def mean_by(paths: list[CriticalPath], attribute: str) -> dict:
    """The mean over ``paths`` of their ``by_class`` or ``by_op`` (missing entries count as 0)."""
    total: dict = defaultdict(float)
    for p in paths:
        for key, value in getattr(p, attribute).items():
            total[key] += value
    return {key: value / len(paths) for key, value in total.items()} if paths else {}
