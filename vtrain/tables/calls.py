"""One rank's part of a collective and the timing of a matched collective (see :mod:`vtrain.tables.matching`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass


@dataclass
class Call:
    """One rank's call of a collective, and what matching found about it."""

    row: int
    rank: int
    kind: str
    nbytes: int | None
    iteration: int | None
    on_cpu: bool
    arrival: float
    end: float
    group: tuple | None = None  # metadata key
    stage: str | None = None  # stage, peer stage, phase and micro-batch of the vtrain/comm span around the call
    peer: str | None = None
    label: tuple[str | None, str | None] = (None, None)
    match: int | None = None  # the input row of the collective's first member
    members: int | None = None
    transfer: float | None = None
    wait: float | None = None
    source: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.arrival


def classes(calls: Iterable[Call], key: Callable[[Call], Hashable]) -> dict[Hashable, list[Call]]:
    """Calls grouped by ``key``."""
    groups: dict[Hashable, list[Call]] = defaultdict(list)
    for call in calls:
        groups[key(call)].append(call)
    return groups


def ordered(per_member: Iterable[list[Call]]) -> list[list[Call]]:
    """Each member's calls in issue order."""
    return [sorted(calls, key=lambda c: c.arrival) for calls in per_member]


def align(members: list[list[Call]], source: str) -> None:
    """Match the k-th call of every member when all issued as many calls of the same size."""
    if len({len(calls) for calls in members}) != 1:
        return
    for group in zip(*members):
        if len({c.nbytes for c in group if c.nbytes}) <= 1:
            time_match(list(group), source)


def by_iteration_and_label(sends: list[Call], recvs: list[Call]) -> list[tuple[list[Call], list[Call]]]:
    """The sends and receives of one channel per iteration and span label (phase and micro-batch, when spans
    give them)."""
    by_label: dict[tuple, tuple[list[Call], list[Call]]] = defaultdict(lambda: ([], []))
    for send in sends:
        by_label[(send.iteration, send.label)][0].append(send)
    for recv in recvs:
        by_label[(recv.iteration, recv.label)][1].append(recv)
    return list(by_label.values())


def pair_in_order(sends: list[Call], recvs: list[Call], source: str) -> None:
    """Pair the k-th send with the k-th receive of one channel, per iteration and span label (phase and
    micro-batch, when spans give them): transfers on one channel with one tag arrive in order."""
    for sent, received in by_iteration_and_label(sends, recvs):
        if len(sent) != len(received):
            continue
        for send, recv in zip(*ordered((sent, received))):
            time_match([send, recv], source, completes=recv)


def time_match(group: list[Call], source: str, completes: Call | None = None) -> None:
    """Set members, transfer and wait of one matched collective (nothing when the members do not overlap on a
    shared clock; members on GPUs whose clocks disagree all get the shortest member's duration)."""
    last = max(c.arrival for c in group)
    ends = [completes.end] * len(group) if completes is not None else [c.end for c in group]
    match = min(c.row for c in group)
    if any(end < last for end in ends):
        if all(c.on_cpu for c in group):
            return  # one clock: a member ended before another arrived, so these calls are not one collective
        shortest = min(c.duration for c in (group if completes is None else [completes]))
        for call in group:
            call.match, call.members, call.transfer, call.wait, call.source = match, len(group), shortest, None, source
        return
    for call, end in zip(group, ends):
        call.match, call.members, call.source = match, len(group), source
        call.transfer, call.wait = end - last, last - call.arrival


def start_when_ready(calls: Iterable[Call], point_to_point: tuple[str, ...]) -> None:
    """Re-time matched collectives (not ``point_to_point`` kinds) from each member's *ready* time: the later of
    its arrival and the end of its previous call in the same group. A group runs its collectives in issue
    order, so a call issued asynchronously while the previous one still ran (gradient buckets reduced during
    the backward pass) was queued, not waiting for the other members: without this, an early member's wait is
    counted again at every queued call after it. Calls issued after the previous one ended are unchanged."""
    matched = classes((c for c in calls if c.match is not None and c.wait is not None and c.kind not in point_to_point),
                      lambda c: c.match)
    group_of = {match: frozenset(c.rank for c in members) for match, members in matched.items()}
    ready: dict[int, float] = {}
    for own in classes((c for members in matched.values() for c in members),
                       lambda c: (c.rank, group_of[c.match])).values():
        previous_end = -math.inf
        for call in sorted(own, key=lambda c: c.arrival):
            ready[call.row] = max(call.arrival, previous_end)
            previous_end = max(previous_end, call.end)
    for members in matched.values():
        last = max(ready[c.row] for c in members)
        if any(c.end < last for c in members):
            continue  # not serialised as assumed: keep the times from the arrivals
        for call in members:
            call.transfer, call.wait = call.end - last, last - ready[call.row]
