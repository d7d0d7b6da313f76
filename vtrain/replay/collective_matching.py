"""Collectives across ranks: which calls on different ranks are one collective, and how long it takes without
waiting for the slowest rank.

A collective ends on every member at about the same time: once the last member has arrived, plus its
transfer time (:func:`transfer_times`). The replay therefore ends each member at ``max(arrival of every
member) + transfer time``.

Members are found per process group and iteration (``ProfilerStep#N``), in issue order (NCCL and gloo run a
group's collectives in the order they were issued); a partly profiled iteration at the edge of one rank's
window therefore spoils only that iteration. The group of a call comes, in this order, from:

1. the trace's own metadata (``Process Group Ranks`` / ``Process Group Name`` on NCCL kernels);
2. the ``vtrain/comm purpose=tp|dp|pp ...`` span around the call and the run's layout (recorded runs);
3. the rank's process groups when they all hold the same ranks (e.g. a 2-rank job).

Calls whose group is unknown, or whose peers have no trace in the folder, keep their measured duration, and
the replay says how many there were and why.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass

from vtrain import kineto
from vtrain.ingest.collectives import canonical_collective, parse_nccl_kernel
from vtrain.naming import COMM_SPAN_PREFIX, parse_span_name
from vtrain.parallel import Layout
from vtrain.replay.trace import CPU, DEVICE, RankTrace

#: CPU-side collective annotations written by the c10d backends (gloo:all_reduce, nccl:send, ...)
COLLECTIVE_ANNOTATION = re.compile("^(" + "|".join(map(re.escape, kineto.BACKEND_ANNOTATION_PREFIXES)) + ")")
#: CPU operators that issue a collective
ISSUING_OP = re.compile("^(" + "|".join(map(re.escape, kineto.ISSUING_OP_PREFIXES)) + ")")
_P2P = ("send", "recv")

#: reasons a collective is replayed with its measured duration
GROUP_UNKNOWN = "process group unknown"
PEERS_MISSING = "peers have no trace in the folder"
SEQUENCE_MISMATCH = "peers issued a different sequence of collectives"
MATCHING_OFF = "matching across ranks was turned off"
OUT_OF_ORDER = "a member ended before another arrived (calls cut off by the profiling window)"


@dataclass
class Collective:
    """One rank's part of a collective (or of a point-to-point transfer)."""

    rank: int
    event: int  # local index in the rank's trace
    kind: str | None
    elements: int | None
    ts: float
    dur: float
    arrival_event: int  # the event whose start is this rank's arrival (the c10d op for a gloo send/recv)
    arrival_ts: float
    on_device: bool
    group: tuple[int, ...] | None = None
    channel: tuple[int, int] | None = None  # point-to-point: (sender, receiver)
    label: tuple[str, str] | None = None  # point-to-point: (phase, micro-batch) from the vtrain span
    purpose: str | None = None  # tp | dp | pp from the vtrain span, else pp for send/recv, else None
    iteration: int | None = None  # the ProfilerStep#N it was issued in
    matched: bool = False
    reason: str | None = None  # why it was left unmatched (one of the reasons above)


@dataclass
class CollectiveMatch:
    """The members of one collective across ranks and each one's time from the last arrival to its end."""

    members: list[Collective]
    transfer_us: list[float]
    by_clock: bool


class SpanIndex:
    """The ``vtrain/comm`` spans of one rank, per thread, to find the span around a time."""

    def __init__(self, trace: RankTrace) -> None:
        spans: dict[int, list[tuple[float, float, dict[str, str]]]] = defaultdict(list)
        for i, name in enumerate(trace.name):
            if trace.kind[i] == CPU and name.startswith(COMM_SPAN_PREFIX):
                parsed = parse_span_name(name)
                if parsed:
                    spans[trace.lane[i]].append((trace.ts[i], trace.ts[i] + trace.dur[i], parsed[1]))
        self._spans = {tid: sorted(items, key=lambda s: s[0]) for tid, items in spans.items()}
        self._starts = {tid: [s[0] for s in items] for tid, items in self._spans.items()}

    def around(self, tid: int, ts: float) -> dict[str, str] | None:
        """Fields of the innermost comm span on ``tid`` holding ``ts``."""
        items = self._spans.get(tid)
        if not items:
            return None
        position = bisect_right(self._starts[tid], ts) - 1
        if position >= 0 and items[position][1] >= ts:  # comm spans do not nest in one another
            return items[position][2]
        return None


class GroupResolver:
    """The process group (member ranks) of a rank's collectives."""

    def __init__(self, trace: RankTrace, layout: Layout | None) -> None:
        self.rank = trace.rank
        self.layout = layout
        groups = kineto.process_groups(trace.process_groups, trace.world_size)
        self.by_name = {str(pg.get("pg_name")): ranks for pg, ranks in groups}
        only = kineto.only_group(self.rank, trace.process_groups, trace.world_size)
        self.only_group = only[1] if only else None

    def group(self, kind: str | None, pg_ranks: str | None, pg_name: str | None,
              span: dict[str, str] | None) -> tuple[tuple[int, ...] | None, tuple[int, int] | None,
                                                    tuple[str, str] | None]:
        """``(group, channel, label)``: the member ranks, and for send/recv the (sender, receiver) pair and the
        (phase, micro-batch) label when a vtrain span gives them."""
        group = _parse_ranks(pg_ranks) or (self.by_name.get(pg_name) if pg_name else None)
        label = None
        if span is not None and self.layout is not None:
            from_span = self._from_span(span)
            if from_span is not None:
                group = group or from_span
                if kind in _P2P:
                    label = (span.get("phase", ""), span.get("mb", ""))
        group = group or self.only_group
        channel = None
        if kind in _P2P and group is not None and len(group) == 2:
            peer = group[0] if group[1] == self.rank else group[1]
            channel = (self.rank, peer) if kind == "send" else (peer, self.rank)
        return group, channel, label

    def _from_span(self, span: dict[str, str]) -> tuple[int, ...] | None:
        layout = self.layout
        assert layout is not None
        purpose = span.get("purpose")
        if purpose == "tp":
            return tuple(layout.tp_group(self.rank))
        if purpose == "dp":
            return tuple(layout.dp_group(self.rank))
        if purpose == "pp" and span.get("peer", "").isdigit() and int(span["peer"]) < layout.pp:
            peer = layout.pp_group(self.rank)[int(span["peer"])]
            return tuple(sorted((self.rank, peer)))
        return None


def _parse_ranks(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        ranks = json.loads(text)
    except json.JSONDecodeError:
        return None
    return kineto.group_ranks(ranks)


def collective_kind(trace: RankTrace, i: int) -> str | None:
    """The canonical collective of a device kernel or CPU annotation."""
    kind = canonical_collective(trace.collective_name[i])
    if kind:
        return kind
    if trace.kind[i] == DEVICE:
        return parse_nccl_kernel(trace.name[i])[0]
    return canonical_collective(trace.name[i])


def match_collectives(collectives: list[Collective], ranks_present: set[int]) -> tuple[list[CollectiveMatch],
                                                                                          Counter[str]]:
    """Group the calls of all ranks into collectives; the second value counts the calls left unmatched, by
    reason."""
    unmatched: Counter[str] = Counter()
    buckets: dict[tuple, dict[int, list[Collective]]] = defaultdict(lambda: defaultdict(list))
    for call in collectives:
        if call.group is None or (call.kind in _P2P and call.channel is None):
            unmatched[GROUP_UNKNOWN] += 1
            call.reason = GROUP_UNKNOWN
            continue
        if not set(call.group) <= ranks_present:
            unmatched[PEERS_MISSING] += 1
            call.reason = PEERS_MISSING
            continue
        if call.channel is not None:
            key: tuple = ("p2p", call.channel, call.label, call.iteration)
        else:
            key = ("group", call.group, call.kind, call.iteration)
        buckets[key][call.rank].append(call)
    matches: list[CollectiveMatch] = []
    for key, per_rank in buckets.items():
        members = list(key[1])
        calls = [sorted(per_rank.get(rank, []), key=lambda c: c.arrival_ts) for rank in members]
        if len({len(c) for c in calls}) != 1 or not _consistent(key, calls):
            unmatched[SEQUENCE_MISMATCH] += sum(len(c) for c in calls)
            for call in (c for rank_calls in calls for c in rank_calls):
                call.reason = SEQUENCE_MISMATCH
            continue
        for position in range(len(calls[0])):
            group = [c[position] for c in calls]
            transfer, by_clock = transfer_times(group)
            if not by_clock and not group[0].on_device:  # CPU ranks share a clock: a member ended before
                unmatched[OUT_OF_ORDER] += len(group)  # another arrived, so these calls are not one collective
                for call in group:
                    call.reason = OUT_OF_ORDER
                continue
            for call in group:
                call.matched = True
            matches.append(CollectiveMatch(members=group, transfer_us=transfer, by_clock=by_clock))
    return matches, unmatched


def transfer_times(members: list[Collective]) -> tuple[list[float], bool]:
    """How long each member took once every member had arrived, and whether the clocks told.

    When the ranks' clocks agree (every member ended after the last one arrived), each member keeps its own
    time from the last arrival to its end: members of one collective do not all finish at once (ring steps,
    busy CPU cores). Otherwise every member gets the shortest member duration (the last to arrive barely
    waited).
    """
    last_arrival = max(c.arrival_ts for c in members)
    ends = [c.ts + c.dur for c in members]
    if all(end >= last_arrival for end in ends):
        return [end - last_arrival for end in ends], True
    shortest = min(c.dur for c in members)
    return [shortest] * len(members), False


def _consistent(key: tuple, calls: list[list[Collective]]) -> bool:
    """Same sizes (where known) position by position; for point-to-point, a send on the sender's side and a
    receive on the receiver's."""
    for position in range(len(calls[0])):
        group = [c[position] for c in calls]
        sizes = {c.elements for c in group if c.elements}
        if len(sizes) > 1:
            return False
        if key[0] == "p2p" and (group[0].kind, group[1].kind) != ("send", "recv"):
            return False
    return True
