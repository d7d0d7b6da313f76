"""Evaluating the replay graph: every point's time is the latest ``source + delay`` over its incoming edges.

Points are visited in a topological order (Kahn's algorithm over all ranks at once, since collectives tie
ranks together); points without incoming edges keep their measured time. The graph is built without cycles
(every dependency inferred from timing follows one strict order, :func:`vtrain.replay.graph.precedes`); should
one remain all the same (collectives matched in an impossible order), the evaluation releases the earliest
waiting point (by measured time) from the edges it still waits on (it keeps at least its measured time), and
counts how often it had to, which the replay reports.

The walk reads the edges grouped by source (:class:`GroupedEdges`, 13 bytes an edge), filled straight from the
ranks' edge lists as the graph is put together. This module is compiled (numba) and so is not imported by the
processes that read ranks (a hundred megabytes each).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from vtrain.replay.graph import EDGE_KINDS, EdgeList, kind_name


@dataclass
class GroupedEdges:
    """A graph's edges grouped by source point, the form its evaluation walks: point ``p``'s edges are
    ``first[p]:first[p + 1]`` of ``targets``, ``delays`` and ``kinds``, in the order they were added. Point
    numbers take 4 bytes where the graph's points fit (13 bytes an edge in all)."""

    first: np.ndarray
    targets: np.ndarray
    delays: np.ndarray
    kinds: np.ndarray

    @classmethod
    def gather(cls, points: int, lists: list[tuple[EdgeList, int]]) -> GroupedEdges:
        """The edges of ``lists`` (each with the number its points are moved by: a rank's edges are numbered
        from 0) over ``points`` points. Each list is emptied, and its edges' memory goes as soon as they are
        placed, so the edges are held about once, not twice, while they are grouped."""
        parts = [(*edge_list.arrays(), shift) for edge_list, shift in lists]
        for edge_list, _ in lists:
            edge_list.clear()  # the views in ``parts`` hold each list's edges until they are placed
        return cls._sorted(points, parts)

    @classmethod
    def from_arrays(cls, points: int, src: np.ndarray, dst: np.ndarray, delay: np.ndarray,
                    kind: np.ndarray | None = None) -> GroupedEdges:
        """The edges ``src[k] -> dst[k]`` with ``delay[k]`` (and kind code ``kind[k]``, else 0) over ``points``
        points."""
        kinds = np.zeros(len(src), dtype=np.int8) if kind is None else kind
        return cls._sorted(points, [(src, dst, delay, kinds, 0)])

    @classmethod
    def _sorted(cls, points: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]
                ) -> GroupedEdges:
        """A counting sort of ``parts`` (source, target, delay, kind code, shift) by source, stable; each part
        is let go of once placed."""
        grouped = cls.empty(points, sum(len(part[0]) for part in parts))
        _count_parts(parts, grouped.first)
        np.cumsum(grouped.first, dtype=grouped.first.dtype, out=grouped.first)
        parts.reverse()
        while parts:
            _place(*parts.pop(), grouped.first, grouped.targets, grouped.delays, grouped.kinds)
        _shift_back(grouped.first)
        return grouped

    @classmethod
    def empty(cls, points: int, edges: int) -> GroupedEdges:
        """Arrays for ``edges`` edges over ``points`` points, none placed yet (``first`` all 0)."""
        point = np.int32 if points < np.iinfo(np.int32).max else np.int64
        return cls(first=np.zeros(points + 1, dtype=np.int32 if edges < np.iinfo(np.int32).max else np.int64),
                   targets=np.empty(edges, dtype=point), delays=np.empty(edges, dtype=np.float64),
                   kinds=np.empty(edges, dtype=np.int8))

    def __len__(self) -> int:
        return len(self.targets)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Source, target, delay and kind code of every edge (by source), as 64-bit point numbers."""
        src = np.repeat(np.arange(len(self.first) - 1, dtype=np.int64), np.diff(self.first))
        return src, self.targets.astype(np.int64), self.delays, self.kinds

    def kind_counts(self) -> dict[str, int]:
        """How many edges there are of each kind (kinds without edges left out)."""
        counts = np.zeros(len(EDGE_KINDS), dtype=np.int64)
        _tally(self.kinds, counts)  # np.bincount would first copy the codes into 8 bytes each
        return {kind_name(code): int(n) for code, n in enumerate(counts) if n}


def _count_parts(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]], first: np.ndarray) -> None:
    """:func:`_count` over every part (in a function of its own: no loop variable outlives it to hold a part)."""
    for src, _, _, _, shift in parts:
        _count(src, shift, first)


@njit(cache=True)
def _count(src: np.ndarray, shift: int, first: np.ndarray) -> None:
    """Count each source's edges one place up: ``first[p + 1]`` (a running sum then gives where each starts)."""
    for k in range(len(src)):
        first[src[k] + shift + 1] += 1


@njit(cache=True)
def _place(src: np.ndarray, dst: np.ndarray, delay: np.ndarray, kind: np.ndarray, shift: int, cursor: np.ndarray,
           targets: np.ndarray, delays: np.ndarray, kinds: np.ndarray) -> None:
    """Place edges at their source's cursor (where its next edge goes; it moves up one place per edge): a
    counting sort, stable, with no array beyond those it fills."""
    for k in range(len(src)):
        p = src[k] + shift
        at = cursor[p]
        targets[at] = dst[k] + shift
        delays[at] = delay[k]
        kinds[at] = kind[k]
        cursor[p] = at + 1


@njit(cache=True)
def _tally(codes: np.ndarray, counts: np.ndarray) -> None:
    for k in range(len(codes)):
        counts[codes[k]] += 1


@njit(cache=True)
def _shift_back(first: np.ndarray) -> None:
    """Once every edge is placed each cursor is where its point's edges end, i.e. where the next point's start:
    move them up one place to make them the starts again."""
    for p in range(len(first) - 1, 0, -1):
        first[p] = first[p - 1]
    first[0] = 0


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
