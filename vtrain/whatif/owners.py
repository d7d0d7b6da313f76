"""Which edges of a replay graph hold an event's own time, and how much own time every event has.

The replay graph (:mod:`vtrain.replay.build`) encodes every duration as edge delays; a what-if changes durations,
so it must know which delays are whose:

* a device activity, a floating CPU event, a sync record and an unmatched collective: its ``work`` edge
  (start -> end);
* a CPU operator or runtime call in a thread chain: the ``thread`` edges of the stretches where it is the
  innermost event (its self time: a leaf's whole duration, a caller's time between its children). Stretches
  inside annotations or outside every event (Python, waiting) belong to no event: they are not an operator's
  time and a what-if keeps them;
* a matched collective: the ``peer`` edge from the members' join to this member's end (its transfer time; the
  waiting before the join is recomputed from the arrivals).

The other ``thread`` edges are *host stretches*: a thread between operators or inside an annotation (Python,
the framework, waiting). Each is held by the point it ends at (the start of the next operator, the end of the
annotation), so that another recording's host time can be matched to it as well.

Everything else (launch latencies, stream gaps, wake-up delays, measured offsets) is held by nothing.

Holders are numbered in one space: ``0 .. events-1`` are events (their own time), ``events + p`` is the host
stretch ending at point ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtrain.replay.build import ReplayGraph
from vtrain.replay.graph import EDGE_KINDS, PEER, THREAD, WORK
from vtrain.replay.trace import CPU, RUNTIME

_WORK, _THREAD, _PEER = (EDGE_KINDS.index(kind) for kind in (WORK, THREAD, PEER))

NO_OWNER = -1


@dataclass
class OwnedGraph:
    """A replay graph as arrays, with the event (global index) whose own time each edge holds."""

    graph: ReplayGraph
    src: np.ndarray
    dst: np.ndarray
    delay: np.ndarray
    kind: np.ndarray
    holder: np.ndarray  # per edge: an event (its own time), events + point (a host stretch), or NO_OWNER
    events: int  # number of events (points 0 .. 2*events-1 are theirs; joins follow)
    parent: np.ndarray  # per event: the event that encloses it on its thread, or NO_OWNER

    @property
    def holders(self) -> int:
        """The size of the holder space: events, then one host stretch per event point."""
        return 3 * self.events

    @property
    def held_time(self) -> np.ndarray:
        """Per holder, the sum of the delays of the edges it holds (µs)."""
        held = self.holder != NO_OWNER
        return np.bincount(self.holder[held], weights=self.delay[held], minlength=self.holders)

    @property
    def owner(self) -> np.ndarray:
        """Per edge, the event whose own time it holds, or NO_OWNER (host stretches included)."""
        return np.where(self.holder < self.events, self.holder, NO_OWNER)


def own_edges(graph: ReplayGraph) -> OwnedGraph:
    """The graph's edges with the holder of each (see the module docstring)."""
    src, dst, delay, kind = graph.edges.arrays()
    events = sum(len(t) for t in graph.traces)
    owner = np.full(len(src), NO_OWNER, dtype=np.int64)
    work = kind == _WORK
    owner[work] = src[work] // 2
    peer = (kind == _PEER) & (src >= 2 * events)  # join -> a member's end
    owner[peer] = dst[peer] // 2
    thread = np.flatnonzero(kind == _THREAD)
    owners, parent = _thread_owners(graph, src[thread], dst[thread], events)
    owner[thread] = np.where(owners != NO_OWNER, owners, events + dst[thread])  # else a host stretch
    return OwnedGraph(graph=graph, src=src, dst=dst, delay=delay, kind=kind, holder=owner, events=events,
                      parent=parent)


def _thread_owners(graph: ReplayGraph, src: np.ndarray, dst: np.ndarray,
                   events: int) -> tuple[np.ndarray, np.ndarray]:
    """The innermost operator or runtime call of every thread stretch (a ``thread`` edge ``src -> dst``), and
    the enclosing event of every event on a thread (NO_OWNER: none).

    Thread edges chain each thread's points in order; walking a chain with a stack of the events entered so far
    gives the innermost event of every stretch.
    """
    owning = _owning_events(graph, events)
    successor = dict(zip(src.tolist(), range(len(src))))  # point -> its thread edge
    has_predecessor = set(dst.tolist())
    owners = np.full(len(src), NO_OWNER, dtype=np.int64)
    parent = np.full(events, NO_OWNER, dtype=np.int64)
    for head in src.tolist():
        if head in has_predecessor:
            continue
        stack: list[int] = []
        point: int | None = head
        while point is not None:
            event = point // 2
            if point % 2 == 0:
                if stack:
                    parent[event] = stack[-1]
                stack.append(event)
            elif event in stack:
                del stack[len(stack) - 1 - stack[::-1].index(event):]
            edge = successor.get(point)
            if edge is None:
                break
            if stack and owning[stack[-1]]:
                owners[edge] = stack[-1]
            point = int(dst[edge])
    return owners, parent


def _owning_events(graph: ReplayGraph, events: int) -> np.ndarray:
    """Events that own their thread stretches: CPU operators and runtime calls (not annotations)."""
    owning = np.zeros(events, dtype=bool)
    for trace, offset in zip(graph.traces, graph.offsets):
        for i, (kind, cat) in enumerate(zip(trace.kind, trace.cat)):
            owning[offset + i] = kind == RUNTIME or (kind == CPU and cat == "cpu_op")
    return owning
