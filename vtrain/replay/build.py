"""Building the replay graph of a trace set from the traces themselves.

Per rank:

* **threads** (:mod:`vtrain.replay.threads`, :mod:`vtrain.replay.waits`): each CPU thread's operators,
  annotations and runtime calls form a chain of points with their measured gaps; a blocked runtime call ends
  when the device activity it waited for ends, an idle thread resumes when what woke it finished.
* **device streams** (:mod:`vtrain.replay.streams`): an activity starts after its launch, its stream
  predecessor and what its stream waits for.
* **collectives** (this module and :mod:`vtrain.replay.collective_matching`): NCCL kernels on GPU ranks, ``gloo:*``
  annotations on CPU-only ranks, issued by a ``c10d::*`` operator; matched across ranks, each member ends at
  the last member's arrival plus its own transfer time.

Every dependency keeps its measured delay when it was the one the event waited for, and at most its typical
delay otherwise: replaying unchanged durations then reproduces the trace wherever the model explains it, and
the time it does not explain shows up as error.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vtrain.naming import iteration_id
from vtrain.parallel import Layout
from vtrain.replay.collective_matching import (
    COLLECTIVE_ANNOTATION,
    GROUP_UNKNOWN,
    ISSUING_OP,
    MATCHING_OFF,
    PEERS_MISSING,
    Collective,
    CollectiveMatch,
    GroupResolver,
    SpanIndex,
    collective_kind,
    match_collectives,
)
from vtrain.replay.context import (
    KEPT_GROUP_UNKNOWN,
    KEPT_PEER_ABSENT,
    KEPT_UNMATCHED,
    DependencyStats,
    RankContext,
)
from vtrain.replay.graph import (
    ANCHOR,
    ISSUE,
    PEER,
    THREAD,
    WAITED,
    WORK,
    EdgeList,
    ReplayOptions,
    precedes,
)
from vtrain.replay.streams import DeviceStreams, is_comm_kernel
from vtrain.replay.threads import blocking_calls, build_chains
from vtrain.replay.trace import CPU, DEVICE, RUNTIME, SYNC, RankTrace
from vtrain.replay.waits import ThreadWaits
from vtrain.runconfig import RunConfig

if TYPE_CHECKING:
    from vtrain.replay.engine import GroupedEdges

#: a gloo:send/recv span starts at most this long after the c10d op that issued it ends
_ISSUE_SLACK_US = 50.0


@dataclass
class RankPart:
    """What the graph keeps of one rank once the rank's own edges are built (its events can then be dropped):
    points numbered from 0 (placed after the ranks before it when the graph is put together), compact arrays
    of a few bytes per event and edge, and the rank's collective calls (a few per iteration)."""

    rank: int
    #: float64, every event's measured start (µs) and duration; emptied once the graph is put together (its
    #: ``measured`` holds them)
    ts: np.ndarray
    dur: np.ndarray
    edges: EdgeList  # numbered from 0; emptied once the graph is put together (its ``edges`` hold them)
    calls: list[Collective]
    launch: np.ndarray  # int64, the launching runtime call of each device activity (local index), else -1
    host: dict[int, int]  # cpu collective hosted on a chain thread -> tid
    #: the threads that host collectives (where their wait() is looked up): tid -> (points, their times)
    hosting_chains: dict[int, tuple[np.ndarray, np.ndarray]]
    #: the rank's ``ProfilerStep#N`` spans, by start: (start, end, N)
    steps: list[tuple[float, float, int]]

    def __len__(self) -> int:
        return len(self.launch)


@dataclass
class ReplayGraph:
    """The graph of a trace set: edges between event points and the measured time of every point."""

    traces: list  # per rank, sorted by rank: its RankTrace, or what was kept of it (see GraphBuilder)
    parts: list[RankPart]  # per rank, in the same order
    offsets: list[int]  # global number of each rank's first event
    edges: GroupedEdges
    measured: np.ndarray  # per point (two per event, then one join per matched collective), µs since ``origin``
    origin: float
    matches: list[CollectiveMatch]
    calls: list[Collective]  # every collective call, matched or not
    stats: DependencyStats
    #: ranks whose step numbers run ahead of (or behind) the others' -> by how many; their calls' iterations (what
    #: collectives are matched by) are renumbered (:func:`vtrain.ingest.clocks.step_shifts`)
    step_shifts: dict[int, int]


def build_graph(traces: list[RankTrace], config: RunConfig | None = None, options: ReplayOptions | None = None,
                match_across_ranks: bool = True) -> ReplayGraph:
    """The replay graph of every rank in ``traces``; ``config`` (the run's layout) helps find process groups.

    With ``match_across_ranks`` off, every collective keeps its measured duration.
    """
    builder = GraphBuilder(config, options)
    for trace in traces:
        builder.add(trace)
    return builder.graph(traces, match_across_ranks)


class GraphBuilder:
    """Builds a replay graph rank by rank: :meth:`add` builds one rank's edges and keeps only its
    :class:`RankPart`, so that a trace set can be read one file at a time; :meth:`graph` puts the ranks
    together (in rank order) and adds the collectives' ends, which need every rank."""

    def __init__(self, config: RunConfig | None = None, options: ReplayOptions | None = None) -> None:
        self.options = options or ReplayOptions()
        self.layout = Layout.of(config) if config is not None else None
        self.stats = DependencyStats()
        self.parts: dict[int, RankPart] = {}

    def add(self, trace: RankTrace) -> RankPart:
        """Build the edges of one rank (numbered from 0) and keep its part."""
        part, stats = rank_part(trace, self.layout, self.options)
        self.keep(part, stats)
        return part

    def keep(self, part: RankPart, stats: DependencyStats) -> None:
        """Keep a rank's part built elsewhere (:func:`rank_part`, in another process), with what it found."""
        self.parts[part.rank] = part
        self.stats.merge(stats)

    def graph(self, traces: list, match_across_ranks: bool = True) -> ReplayGraph:
        """The whole graph; ``traces`` (one per rank added, any order) is what the graph keeps of each rank. The
        ranks' parts go into the graph: the builder is empty afterwards."""
        from vtrain.replay.engine import GroupedEdges  # compiled (numba): not loaded by the processes reading ranks

        traces = sorted(traces, key=lambda trace: trace.rank)
        parts = [self.parts.pop(trace.rank) for trace in traces]
        offsets: list[int] = []
        total = 0
        for part in parts:
            offsets.append(total)
            total += len(part)
        origin = min((float(part.ts.min()) for part in parts if len(part)), default=0.0)
        measured = np.empty(2 * total, dtype=np.float64)
        collectives: list[Collective] = []
        for part, offset in zip(parts, offsets):
            ts = part.ts - origin
            measured[2 * offset:2 * (offset + len(part)):2] = ts
            measured[2 * offset + 1:2 * (offset + len(part)):2] = ts + part.dur
            part.ts = part.dur = np.empty(0)  # the times are in ``measured`` now
            collectives.extend(part.calls)
        stats = self.stats
        shifts = _step_shifts(parts)
        for call in collectives:
            if call.rank in shifts and call.iteration is not None:
                call.iteration -= shifts[call.rank]
        if match_across_ranks:
            matches, unmatched = match_collectives(collectives, {part.rank for part in parts})
        else:
            matches, unmatched = [], Counter({MATCHING_OFF: len(collectives)})
            for call in collectives:
                call.reason = MATCHING_OFF
        stats.collectives_matched = len(matches)
        stats.collective_calls_unmatched = unmatched
        placed = {part.rank: _Placed(part, offset) for part, offset in zip(parts, offsets)}
        across = EdgeList(wide=True)
        joins = _collective_edges(placed, collectives, matches, self.options, across, stats, first_join=2 * total)
        measured = np.concatenate([measured, np.asarray(joins, dtype=np.float64) - origin])
        edges = GroupedEdges.gather(len(measured), [(part.edges, 2 * offset) for part, offset in zip(parts, offsets)]
                                    + [(across, 0)])  # empties the parts' edge lists
        return ReplayGraph(traces=traces, parts=parts, offsets=offsets, edges=edges, measured=measured,
                           origin=origin, matches=matches, calls=collectives, stats=stats, step_shifts=shifts)


def _step_shifts(parts: list[RankPart]) -> dict[int, int]:
    """The ranks whose ``ProfilerStep#N`` numbers run apart from the others' (:func:`vtrain.ingest.clocks.step_shifts`
    of the parts' steps)."""
    import polars as pl

    from vtrain.ingest.clocks import step_shifts

    rows = [(part.rank, number, start, end - start) for part in parts for start, end, number in part.steps]
    if len({rank for rank, *_ in rows}) < 2:
        return {}
    return step_shifts(pl.DataFrame(rows, schema=["rank", "iteration", "start", "time_us"], orient="row"))


def rank_part(trace: RankTrace, layout: Layout | None, options: ReplayOptions) -> tuple[RankPart, DependencyStats]:
    """One rank's part of the graph (its edges, numbered from 0) and what its dependency model found: needs only
    the rank's own trace, so ranks can be built apart (see :meth:`GraphBuilder.keep`)."""
    stats = DependencyStats()
    builder = _RankBuilder(RankContext(trace, 0, options, EdgeList(wide=2 * len(trace) >= 2**31), stats))
    builder.build()
    launch = np.full(len(trace), -1, dtype=np.int64)
    for activity, call in builder.streams.launch.items():
        if call is not None:
            launch[activity] = call
    part = RankPart(rank=trace.rank, ts=np.asarray(trace.ts, dtype=np.float64),
                    dur=np.asarray(trace.dur, dtype=np.float64), edges=builder.ctx.edges,
                    calls=builder.collectives(layout), launch=launch, host=builder.host,
                    hosting_chains={tid: (np.asarray(builder.chain_of[tid].points, dtype=np.int64),
                                          np.asarray(builder.chain_of[tid].times, dtype=np.float64))
                                    for tid in set(builder.host.values())},
                    steps=builder.steps())
    return part, stats


@dataclass
class _Placed:
    """A rank's part with the global number of its first event."""

    part: RankPart
    offset: int

    def start(self, i: int) -> int:
        return 2 * (self.offset + i)

    def stop(self, i: int) -> int:
        return 2 * (self.offset + i) + 1


class _RankBuilder:
    """The edges of one rank (all but the collectives' ends, which need the other ranks)."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        trace = ctx.trace
        gpu = trace.has_device_activity
        self.cpu_collectives = [  # gloo:* annotations (on GPU ranks NCCL's calls are its kernels: nccl:* is not one)
            i for i, name in enumerate(trace.name)
            if trace.kind[i] == CPU and trace.cat[i] in ("user_annotation", "cpu_op")
            and COLLECTIVE_ANNOTATION.match(name) and not (gpu and name.startswith("nccl:"))
        ]
        skip = set(self.cpu_collectives)
        members = [i for i, kind in enumerate(trace.kind) if kind in (CPU, RUNTIME) and i not in skip]
        self.blocking = blocking_calls(trace)
        self.chains, self.floating = build_chains(trace, members, ctx.offset, self.blocking)
        self.chain_of = {chain.tid: chain for chain in self.chains}
        self.streams = DeviceStreams(ctx)
        self.issuer: dict[int, int] = {}  # cpu collective -> the operator that issued it
        self.host: dict[int, int] = {}  # cpu collective hosted on a chain thread -> tid
        self.arrival: dict[int, int] = {}  # hosted cpu collective -> the c10d op that issued it (its arrival)

    def build(self) -> None:
        self.streams.add_edges()
        self._collective_starts()
        ThreadWaits(self.ctx, self.chains, self.streams, self.blocking, self.cpu_collectives).add_edges()
        self._floating_edges()
        self._unlaunched_edges()

    # -- collectives and floating events --------------------------------------------------------------------

    def _collective_starts(self) -> None:
        """Issue edges of the CPU collectives (gloo:* annotations on CPU-only ranks)."""
        trace = self.ctx.trace
        issuing = sorted((i for i, name in enumerate(trace.name)
                          if trace.kind[i] == CPU and ISSUING_OP.match(name)
                          and collective_kind(trace, i) not in ("send", "recv")), key=lambda i: trace.ts[i])
        on_workers = sorted((i for i in self.cpu_collectives if trace.lane[i] not in self.chain_of),
                            key=lambda i: trace.ts[i])
        paired = len(issuing) == len(on_workers) and all(trace.ts[a] <= trace.ts[b]
                                                        for a, b in zip(issuing, on_workers))
        issuer_of = dict(zip(on_workers, issuing)) if paired else {}
        issuing_starts = [trace.ts[i] for i in issuing]
        issuing_on: dict[int, list[int]] = defaultdict(list)  # thread -> its issuing ops (sorted by start)
        for i in sorted((i for i, name in enumerate(trace.name) if trace.kind[i] == CPU and ISSUING_OP.match(name)),
                        key=lambda i: trace.ts[i]):
            issuing_on[trace.lane[i]].append(i)
        last_on_worker: dict[int, int] = {}
        for c in sorted(self.cpu_collectives, key=lambda i: trace.ts[i]):
            tid = trace.lane[c]
            chain = self.chain_of.get(tid)
            if chain is not None:  # a send/recv issued and waited on its own thread
                position = bisect_right(chain.times, trace.ts[c]) - 1
                if position >= 0:
                    self.ctx.edges.add(chain.points[position], self.ctx.start(c), trace.ts[c] - chain.times[position], ISSUE)
                self.host[c] = tid
                ops = issuing_on.get(tid, [])
                position = bisect_right([trace.ts[i] for i in ops], trace.ts[c]) - 1
                if position >= 0 and self.ctx.end[ops[position]] >= trace.ts[c] - _ISSUE_SLACK_US:
                    self.arrival[c] = ops[position]  # the transfer starts with c10d::send / c10d::recv_
                continue
            if paired:
                issuer = issuer_of[c]
            else:
                position = bisect_right(issuing_starts, trace.ts[c]) - 1
                issuer = issuing[position] if position >= 0 else None
            if issuer is not None:
                self.issuer[c] = issuer
                self.ctx.edges.add(self.ctx.start(issuer), self.ctx.start(c), trace.ts[c] - trace.ts[issuer], ISSUE)
            if tid in last_on_worker:
                self.ctx.edges.add(self.ctx.stop(last_on_worker[tid]), self.ctx.start(c), 0.0, THREAD)
            last_on_worker[tid] = c

    def _floating_edges(self) -> None:
        """Events outside the chains keep their offset from the timeline of their thread (or runtime call)."""
        trace = self.ctx.trace
        for i in self.floating:
            chain = self.chain_of.get(trace.lane[i])
            position = bisect_right(chain.times, trace.ts[i]) - 1 if chain else -1
            if position >= 0:
                self.ctx.edges.add(chain.points[position], self.ctx.start(i), trace.ts[i] - chain.times[position], ANCHOR)
            self.ctx.edges.add(self.ctx.start(i), self.ctx.stop(i), trace.dur[i], WORK)
        for i, kind in enumerate(trace.kind):
            if kind != SYNC:
                continue
            call = self.ctx.runtime_call(trace.correlation[i])
            if call is not None:
                self.ctx.edges.add(self.ctx.start(call), self.ctx.start(i), trace.ts[i] - trace.ts[call], ANCHOR)
            self.ctx.edges.add(self.ctx.start(i), self.ctx.stop(i), trace.dur[i], WORK)

    def _unlaunched_edges(self) -> None:
        """The first activity of a stream whose launch is not in the file (a pruned trace) keeps its measured
        offset from the latest earlier point of the rank's threads, rather than its wall-clock time."""
        ctx, trace = self.ctx, self.ctx.trace
        for stream_members in self.streams.members.values():
            first = stream_members[0]
            if self.streams.launch[first] is not None:
                continue
            anchor: tuple[float, int] | None = None
            for chain in self.chains:
                position = bisect_right(chain.times, trace.ts[first]) - 1
                while position >= 0 and not precedes(chain.points[position], chain.times[position],
                                                     ctx.start(first), trace.ts[first]):
                    position -= 1
                if position >= 0 and (anchor is None or (chain.times[position], chain.points[position]) > anchor):
                    anchor = chain.times[position], chain.points[position]
            if anchor is not None:
                ctx.edges.add(anchor[1], ctx.start(first), trace.ts[first] - anchor[0], ANCHOR)

    def steps(self) -> list[tuple[float, float, int]]:
        """The rank's ``ProfilerStep#N`` spans, by start: (start, end, N)."""
        trace = self.ctx.trace
        return sorted((trace.ts[i], self.ctx.end[i], number) for i, name in enumerate(trace.name)
                      if trace.kind[i] == CPU and (number := iteration_id(name)) is not None)

    def collectives(self, layout: Layout | None) -> list[Collective]:
        """This rank's collective calls with their process group (from metadata, spans or the rank's groups)."""
        trace = self.ctx.trace
        resolver = GroupResolver(trace, layout)
        spans = SpanIndex(trace)
        steps = self.steps()
        step_starts = [start for start, _, _ in steps]
        calls: list[Collective] = []
        device_comm = [i for i in self.streams.activities if is_comm_kernel(trace.name[i])]
        for i in device_comm + self.cpu_collectives:
            kind = collective_kind(trace, i)
            if trace.kind[i] == DEVICE:
                origin = self.streams.launch[i]
            else:
                origin = i if i in self.host else self.issuer.get(i)
            span = spans.around(trace.lane[origin], trace.ts[origin]) if origin is not None else None
            group, channel, label = resolver.group(kind, trace.pg_ranks[i], trace.pg_name[i], span)
            purpose = (span or {}).get("purpose") or ("pp" if kind in ("send", "recv") else None)
            arrival = self.arrival.get(i, i)
            issued = trace.ts[origin] if origin is not None else trace.ts[arrival]
            position = bisect_right(step_starts, issued) - 1
            iteration = steps[position][2] if position >= 0 and issued <= steps[position][1] else None
            calls.append(Collective(rank=trace.rank, event=i, kind=kind, elements=trace.elements[i],
                                    ts=trace.ts[i], dur=trace.dur[i], arrival_event=arrival,
                                    arrival_ts=trace.ts[arrival], on_device=trace.kind[i] == DEVICE,
                                    group=group, channel=channel, label=label, purpose=purpose,
                                    iteration=iteration))
        return calls


def _waiting_point(chain: tuple[np.ndarray, np.ndarray], finished: float,
                   options: ReplayOptions) -> tuple[int, float] | None:
    """The point of the issuing thread (its points and their times) just before an asynchronous collective's
    end, with the delay, when the end followed it closely (the thread called ``wait()`` there)."""
    points, times = chain
    position = int(np.searchsorted(times, finished, side="right")) - 1
    if position >= 0 and finished - times[position] <= options.collective_slack_us:
        return int(points[position]), float(finished - times[position])
    return None


def _collective_edges(placed: dict[int, _Placed], calls: list[Collective], matches: list[CollectiveMatch],
                      options: ReplayOptions, edges: EdgeList, stats: DependencyStats,
                      first_join: int) -> list[float]:
    """End edges of every collective call: from the last arrival of its members when matched, else its measured
    duration.

    Each matched collective gets one *join* point (numbered from ``first_join``, after every event point): the
    latest arrival of its members; each member ends its own transfer time after it. Returns the join points'
    measured times.
    """
    matched: set[tuple[int, int]] = set()
    joins: list[float] = []
    for match in matches:
        join = first_join + len(joins)
        joins.append(max(m.arrival_ts for m in match.members))
        for other in match.members:
            edges.add(placed[other.rank].start(other.arrival_event), join, 0.0, PEER)
        shortest = min(match.transfer_us)
        for member, transfer in zip(match.members, match.transfer_us):
            matched.add((member.rank, member.event))
            rank = placed[member.rank]
            end = rank.stop(member.event)
            tid = rank.part.host.get(member.event)
            waited = None
            if tid is not None and match.by_clock and transfer - shortest > options.collective_slack_us:
                waited = _waiting_point(rank.part.hosting_chains[tid], member.ts + member.dur, options)
            if waited is None:
                edges.add(join, end, transfer, PEER)
                stats.collective_ends["peers"] += 1
            else:
                edges.add(join, end, shortest, PEER)
                edges.add(waited[0] + 2 * rank.offset, end, waited[1], WAITED)
                stats.collective_ends["waited"] += 1
    unmatched = [call for call in calls if (call.rank, call.event) not in matched]
    for call in unmatched:
        rank = placed[call.rank]
        edges.add(rank.start(call.event), rank.stop(call.event), call.dur, WORK)
        stats.collective_ends["measured"] += 1
    _count_kept_collectives(unmatched, stats)
    return joins


def _count_kept_collectives(unmatched: list[Collective], stats: DependencyStats) -> None:
    """Count the waits kept inside collectives replayed with their measured duration: each call's duration
    beyond the fastest call of the same kind and size on its rank (its transfer time, as far as the trace
    tells), by why it was not matched."""
    fastest: dict[tuple, float] = {}
    for call in unmatched:
        key = (call.rank, call.kind, call.elements)
        fastest[key] = min(fastest.get(key, call.dur), call.dur)
    for call in unmatched:
        if call.reason == MATCHING_OFF:
            continue
        cause = {PEERS_MISSING: KEPT_PEER_ABSENT, GROUP_UNKNOWN: KEPT_GROUP_UNKNOWN}.get(call.reason, KEPT_UNMATCHED)
        stats.keep(cause, call.dur - fastest[(call.rank, call.kind, call.elements)])
