"""The wait inside collective calls not matched to their peers' (their peers' traces not in the folder, their
process group unknown): what a ``--scale`` of their class leaves as measured.

A matched collective's own time is its transfer from its members' join (:mod:`vtrain.whatif.owners`); its wait
for the last member follows from the arrivals. An unmatched call has only its measured duration, its wait for
the peers included, and scaling all of it scaled that wait too (rank 3 of ``traces/t2p2d2`` alone read +76 %
under ``--scale comm=2``, the whole job +10 %; now +18 %). Its duration is split in two:

* its transfer, the part a scale multiplies: the fastest call of the same kind and size on its rank (the replay
  counts the rest of each call as a wait it kept, :class:`vtrain.replay.context.DependencyStats`). An upper
  bound: what every such call waited (a pipeline stage's recv always waits for its peer's backward) stays in it;
* its wait: the rest, kept as measured.

A call issued on its own thread (gloo's send and recv, after their ``c10d`` op) that ended where that thread,
having run on, waited for it is all wait: its transfer was done by then and cannot be told apart. It is told as
the replay tells a matched member that ended at its ``wait()``, without peers to compare it with: its end at
most ``collective_slack_us`` after a point of the thread, and that point more than ``collective_slack_us`` after
the call's start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vtrain.replay.build import RankPart
from vtrain.replay.collective_matching import Collective
from vtrain.replay.graph import ReplayOptions
from vtrain.whatif.owners import OwnedGraph


@dataclass(frozen=True)
class UnmatchedWaits:
    """Per holder, the part of its time that is a wait for peers (zero but for unmatched collective calls), and
    what the warning says of it."""

    wait: np.ndarray
    at_thread_wait: int  # calls that ended at their thread's wait(): all wait
    total_us: float  # the calls' measured time
    transfer_us: float  # the part of it a scale multiplies


def unmatched_waits(owned: OwnedGraph, slack_us: float = ReplayOptions().collective_slack_us) -> UnmatchedWaits:
    """The wait of every unmatched collective call of ``owned`` (see the module docstring)."""
    graph, held = owned.graph, owned.held_time
    placed = {part.rank: (part, offset) for part, offset in zip(graph.parts, graph.offsets)}
    calls = [(call, placed[call.rank][1] + call.event, _ended_at_thread_wait(call, placed[call.rank][0], slack_us))
             for call in graph.calls if not call.matched]
    fastest: dict[tuple[int, str | None, int | None], float] = {}
    for call, event, _ in calls:
        fastest[_kind_and_size(call)] = min(fastest.get(_kind_and_size(call), held[event]), held[event])
    wait = np.zeros(owned.holders)
    for call, event, at_wait in calls:
        wait[event] = held[event] - (0.0 if at_wait else fastest[_kind_and_size(call)])
    total = float(sum(held[event] for _, event, _ in calls))
    return UnmatchedWaits(wait=wait, at_thread_wait=sum(at_wait for _, _, at_wait in calls), total_us=total,
                          transfer_us=total - float(wait.sum()))


def _kind_and_size(call: Collective) -> tuple[int, str | None, int | None]:
    """The calls of a rank whose transfers are taken to take the same time."""
    return call.rank, call.kind, call.elements


def _ended_at_thread_wait(call: Collective, part: RankPart, slack_us: float) -> bool:
    """Whether a call issued on its own thread ended where the thread, having run on, waited for it."""
    tid = part.host.get(call.event)
    if tid is None or call.on_device or call.arrival_event == call.event:  # not issued on its own thread
        return False
    _, times = part.hosting_chains[tid]
    end = call.ts + call.dur
    position = int(np.searchsorted(times, end, side="right")) - 1
    return position >= 0 and end - times[position] <= slack_us and times[position] - call.ts > slack_us
