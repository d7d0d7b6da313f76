"""Building the replay graph of a trace set from the traces themselves.

Per rank:

* **threads**: each CPU thread's operators, annotations and runtime calls form a chain of points with their
  measured gaps (:mod:`vtrain.replay.threads`). A blocked runtime call (synchronize, memcpy, ...) ends when the
  device activity it waited for ends; an idle thread resumes when the thread or collective that woke it
  finished. Those waits are edges, so they stretch or shrink when what they waited for moves.
* **device streams**: a kernel, memcpy or memset starts after its launch call, after the previous activity on
  its stream, and after what its stream waits for (``cudaStreamWaitEvent``: from the trace's ``cuda_sync``
  records where PyTorch writes them, else inferred from timing as the other-stream activity that ended just
  before it started).
* **collectives** (:mod:`vtrain.replay.collectives`): NCCL kernels on GPU ranks, ``gloo:*`` annotations on
  CPU-only ranks; matched across ranks, each member ends at the last member's arrival plus the transfer time.

Every dependency keeps its measured delay when it was the one the event waited for, and at most its typical
delay otherwise: replaying unchanged durations then reproduces the trace wherever the model explains it, and
the time it does not explain shows up as error.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from vtrain.replay.collectives import (
    COLLECTIVE_ANNOTATION,
    ISSUING_OP,
    Collective,
    CollectiveMatch,
    MATCHING_OFF,
    GroupResolver,
    Layout,
    SpanIndex,
    collective_kind,
    match_collectives,
)
from vtrain.replay.graph import (
    ANCHOR,
    EVENT,
    INFERRED,
    ISSUE,
    LAUNCH,
    PEER,
    STREAM,
    THREAD,
    WAITED,
    WAKE,
    WORK,
    EdgeList,
    ReplayOptions,
)
from vtrain.replay.threads import BLOCKED, IDLE, WORKING, ThreadChain, blocking_calls, build_chains
from vtrain.replay.trace import CPU, DEVICE, RUNTIME, SYNC, RankTrace
from vtrain.naming import iteration_id
from vtrain.runconfig import RunConfig

_DEFAULT_LAUNCH_US = 5.0
_DEFAULT_STREAM_GAP_US = 1.0
#: a gloo:send/recv span starts at most this long after the c10d op that issued it ends
_ISSUE_SLACK_US = 50.0
_DEVICE_SYNC_CALL = ("DeviceSynchronize", "CtxSynchronize")


def is_comm_kernel(name: str) -> bool:
    """NCCL kernels (HTA's communication class)."""
    return name.startswith("nccl")


@dataclass
class DependencyStats:
    """What the dependency model found: counts per explanation, and the time it could not explain."""

    device_started_by: Counter[str] = field(default_factory=Counter)  # launch, stream, event, inferred, none
    device_unexplained_us: float = 0.0
    blocked_calls: Counter[str] = field(default_factory=Counter)  # explicit, inferred, none
    thread_waits: int = 0
    collectives_matched: int = 0
    collective_calls_unmatched: Counter[str] = field(default_factory=Counter)
    collective_ends: Counter[str] = field(default_factory=Counter)  # peers, waited, measured


@dataclass
class ReplayGraph:
    """The graph of a trace set: edges between event points and the measured time of every point."""

    traces: list[RankTrace]
    offsets: list[int]  # global number of each rank's first event
    edges: EdgeList
    measured: np.ndarray  # per point, µs since ``origin``
    origin: float
    matches: list[CollectiveMatch]
    calls: list[Collective]  # every collective call, matched or not
    launches: list[dict[int, int | None]]  # per rank: device activity -> its launch call (local indices)
    stats: DependencyStats

    @property
    def events(self) -> int:
        return len(self.measured) // 2


def build_graph(traces: list[RankTrace], config: RunConfig | None = None, options: ReplayOptions | None = None,
                match_across_ranks: bool = True) -> ReplayGraph:
    """The replay graph of every rank in ``traces``; ``config`` (the run's layout) helps find process groups.

    With ``match_across_ranks`` off, every collective keeps its measured duration.
    """
    options = options or ReplayOptions()
    layout = Layout.of(config) if config is not None else None
    edges = EdgeList()
    stats = DependencyStats()
    offsets: list[int] = []
    total = 0
    for trace in traces:
        offsets.append(total)
        total += len(trace)
    origin = min((min(t.ts) for t in traces if len(t)), default=0.0)
    measured = np.empty(2 * total, dtype=np.float64)
    collectives: list[Collective] = []
    builders: dict[int, _RankBuilder] = {}
    for trace, offset in zip(traces, offsets):
        ts = np.asarray(trace.ts, dtype=np.float64) - origin
        measured[2 * offset:2 * (offset + len(trace)):2] = ts
        measured[2 * offset + 1:2 * (offset + len(trace)):2] = ts + np.asarray(trace.dur, dtype=np.float64)
        builder = _RankBuilder(trace, offset, options, edges, stats)
        builder.build()
        builders[trace.rank] = builder
        collectives.extend(builder.collectives(layout))
    if match_across_ranks:
        matches, unmatched = match_collectives(collectives, {t.rank for t in traces})
    else:
        matches, unmatched = [], Counter({MATCHING_OFF: len(collectives)})
    stats.collectives_matched = len(matches)
    stats.collective_calls_unmatched = unmatched
    _collective_edges(builders, collectives, matches, options, edges, stats)
    return ReplayGraph(traces=traces, offsets=offsets, edges=edges, measured=measured, origin=origin,
                       matches=matches, calls=collectives, launches=[builders[t.rank].launch for t in traces],
                       stats=stats)


class _RankBuilder:
    """The edges of one rank (everything but the collectives' ends, which need the other ranks)."""

    def __init__(self, trace: RankTrace, offset: int, options: ReplayOptions, edges: EdgeList,
                 stats: DependencyStats) -> None:
        self.trace = trace
        self.offset = offset
        self.options = options
        self.edges = edges
        self.stats = stats
        self.end = [t + d for t, d in zip(trace.ts, trace.dur)]
        gpu = trace.has_device_activity
        self.cpu_collectives = [
            i for i, name in enumerate(trace.name)
            if not gpu and trace.kind[i] == CPU and trace.cat[i] in ("user_annotation", "cpu_op")
            and COLLECTIVE_ANNOTATION.match(name)
        ]
        skip = set(self.cpu_collectives)
        members = [i for i, kind in enumerate(trace.kind) if kind in (CPU, RUNTIME) and i not in skip]
        self.blocking = blocking_calls(trace)
        self.chains, self.floating = build_chains(trace, members, offset, self.blocking)
        self.chain_of = {chain.tid: chain for chain in self.chains}
        self.runtime_by_correlation: dict[int, int] = {}
        for i, kind in enumerate(trace.kind):
            if kind == RUNTIME and trace.correlation[i] is not None:
                self.runtime_by_correlation.setdefault(trace.correlation[i], i)
        self.device = sorted((i for i, kind in enumerate(trace.kind) if kind == DEVICE),
                             key=lambda i: (trace.lane[i], trace.ts[i]))
        self.launch = {i: self.runtime_by_correlation.get(trace.correlation[i]) for i in self.device}
        self.issuer: dict[int, int] = {}  # cpu collective -> the operator that issued it
        self.host: dict[int, int] = {}  # cpu collective hosted on a chain thread -> tid
        self.arrival: dict[int, int] = {}  # hosted cpu collective -> the c10d op that issued it (its arrival)

    # -- points ---------------------------------------------------------------------------------------------

    def start(self, i: int) -> int:
        return 2 * (self.offset + i)

    def stop(self, i: int) -> int:
        return 2 * (self.offset + i) + 1

    def build(self) -> None:
        self._device_edges()
        self._collective_starts()
        self._thread_edges()
        self._floating_edges()

    # -- threads --------------------------------------------------------------------------------------------

    def _thread_edges(self) -> None:
        trace, options = self.trace, self.options
        # a blocked call's own time: its fastest call, at most the median runtime call (a call that found
        # nothing to wait for costs about what any runtime call costs)
        runtime_median = median([d for d, k in zip(trace.dur, trace.kind) if k == RUNTIME] or [0.0])
        fastest: dict[str, float] = {}
        for i in self.blocking:
            fastest[trace.name[i]] = min(fastest.get(trace.name[i], runtime_median), trace.dur[i])
        collective_ends = sorted((self.end[i], self.stop(i)) for i in self.cpu_collectives)
        self._collective_end_times = [t for t, _ in collective_ends]
        self._collective_end_points = [p for _, p in collective_ends]
        self._device_by_end = sorted(self.device, key=lambda i: self.end[i])
        self._device_end_times = [self.end[i] for i in self._device_by_end]
        self._sync_by_correlation: dict[int, list[int]] = defaultdict(list)
        for i, kind in enumerate(trace.kind):
            if kind == SYNC and trace.correlation[i] is not None:
                self._sync_by_correlation[trace.correlation[i]].append(i)
        for chain in self.chains:
            idle = [b - a for a, b, kind in zip(chain.times, chain.times[1:], chain.segment) if kind == IDLE]
            idle_floor = median(idle) if idle else 0.0
            first = self._cpu_waker(chain, chain.times[0] - options.thread_wake_us, chain.times[0])
            if first is not None:
                self.edges.add(first[0], chain.points[0], chain.times[0] - first[1], WAKE)
                self.stats.thread_waits += 1
            for k, kind in enumerate(chain.segment):
                a, b = chain.points[k], chain.points[k + 1]
                length = chain.times[k + 1] - chain.times[k]
                if kind == WORKING or length <= 0.0:  # a stretch of no time waited for nothing
                    self.edges.add(a, b, length, THREAD)
                    continue
                if kind == BLOCKED:
                    call = chain.blocker[k]
                    wakers = self._device_wakers(call)
                    floor = fastest[trace.name[call]]
                else:
                    found = self._cpu_waker(chain, chain.times[k], chain.times[k + 1])
                    wakers = [found] if found is not None else []
                    floor = idle_floor
                    if wakers:
                        self.stats.thread_waits += 1
                if not wakers:
                    self.edges.add(a, b, length, THREAD)
                    continue
                self.edges.add(a, b, min(length, floor), THREAD)
                for point, time in wakers:
                    self.edges.add(point, b, chain.times[k + 1] - time, WAKE)

    def _cpu_waker(self, chain: ThreadChain, low: float, high: float) -> tuple[int, float] | None:
        """What woke an idle thread at ``high``: the last collective (preferred) or other-thread point that
        ended in ``[low, high]`` at most ``thread_wake_us`` before."""
        floor = max(low, high - self.options.thread_wake_us)
        position = bisect_right(self._collective_end_times, high) - 1
        if position >= 0 and self._collective_end_times[position] >= floor:
            return self._collective_end_points[position], self._collective_end_times[position]
        best: tuple[int, float] | None = None
        for other in self.chains:
            if other is chain:
                continue
            position = bisect_right(other.times, high) - 1
            if position >= 0 and other.times[position] >= floor and (best is None or other.times[position] > best[1]):
                best = other.points[position], other.times[position]
        return best

    def _device_wakers(self, call: int) -> list[tuple[int, float]]:
        """The device activities a blocked runtime call waited for, as (end point, end time)."""
        trace = self.trace
        explicit = self._explicit_sync(call)
        if explicit:
            self.stats.blocked_calls["explicit"] += 1
            return [(self.stop(i), self.end[i]) for i in explicit]
        start, stop = trace.ts[call], self.end[call]
        if any(name in trace.name[call] for name in _DEVICE_SYNC_CALL):
            awaited = self._last_per_stream(stop)
        else:
            awaited = []
            position = bisect_right(self._device_end_times, stop) - 1
            while position >= 0 and self._device_end_times[position] >= start:
                i = self._device_by_end[position]
                launch = self.launch.get(i)
                if launch is None or trace.ts[launch] <= stop:
                    if stop - self.end[i] <= self.options.sync_wake_us:
                        awaited = [i]
                    break
                position -= 1
        self.stats.blocked_calls["inferred" if awaited else "none"] += 1
        return [(self.stop(i), self.end[i]) for i in awaited]

    def _explicit_sync(self, call: int) -> list[int]:
        """Activities named by the trace's cuda_sync records for this call (Event/Stream/Context Sync)."""
        trace = self.trace
        correlation = trace.correlation[call]
        if correlation is None or correlation not in self._sync_by_correlation:
            return []
        awaited: list[int] = []
        for s in self._sync_by_correlation[correlation]:
            name = trace.name[s]
            if name == "Context Sync":
                awaited += self._last_per_stream(trace.ts[call])
            elif name == "Stream Sync":
                awaited += self._last_on_stream(trace.lane[s], trace.ts[call])
            elif name == "Event Sync":
                record = self.runtime_by_correlation.get(trace.wait_on_event_record[s] or -1)
                if record is not None and trace.wait_on_stream[s] is not None:
                    awaited += self._last_on_stream(trace.wait_on_stream[s], trace.ts[record])
        return awaited

    def _last_per_stream(self, before: float) -> list[int]:
        streams = {self.trace.lane[i] for i in self.device}
        return [i for stream in streams for i in self._last_on_stream(stream, before)]

    def _last_on_stream(self, stream: int, launched_before: float) -> list[int]:
        """The last activity on ``stream`` launched before a time (a stream runs in launch order)."""
        position = bisect_right(self._stream_launches.get(stream, []), launched_before) - 1
        return [self._stream_members[stream][position]] if position >= 0 else []

    # -- device streams -------------------------------------------------------------------------------------

    def _device_edges(self) -> None:
        trace, options = self.trace, self.options
        self._stream_members: dict[int, list[int]] = defaultdict(list)
        for i in self.device:
            self._stream_members[trace.lane[i]].append(i)
        self._stream_launches = {
            stream: [trace.ts[self.launch[i]] if self.launch[i] is not None else trace.ts[i] for i in members]
            for stream, members in self._stream_members.items()}
        previous = {}
        for members in self._stream_members.values():
            for before, after in zip(members, members[1:]):
                previous[after] = before
        launch_us, gap_us = self._typical_delays(previous)
        waits = self._explicit_stream_waits()
        other_streams = {stream: [s for s in self._stream_members if s != stream] for stream in self._stream_members}
        ends_on = {s: [self.end[i] for i in members] for s, members in self._stream_members.items()}
        for i in self.device:
            ts = trace.ts[i]
            options_: list[tuple[int, float, float, str]] = []  # (source point, source time, typical delay, kind)
            launch = self.launch[i]
            if launch is not None:
                options_.append((self.start(launch), trace.ts[launch], launch_us, LAUNCH))
            before = previous.get(i)
            if before is not None:
                options_.append((self.stop(before), self.end[before], gap_us, STREAM))
            for source in waits.get(i, []):
                options_.append((self.stop(source), self.end[source], 0.0, EVENT))
            binding = min(range(len(options_)), key=lambda k: ts - options_[k][1] - options_[k][2], default=None)
            explained = binding is not None and ts - options_[binding][1] - options_[binding][2] <= options.device_slack_us
            if not explained:
                inferred = self._inferred_wait(i, other_streams[trace.lane[i]], ends_on)
                if inferred is not None:
                    options_.append((self.stop(inferred), self.end[inferred], 0.0, INFERRED))
                    binding, explained = len(options_) - 1, True
            if not options_:
                self.stats.device_started_by["root"] += 1
            elif explained:
                self.stats.device_started_by[options_[binding][3]] += 1
            else:
                self.stats.device_started_by["none"] += 1
                latest = max(source + min(ts - source, typical) for _, source, typical, _ in options_)
                self.stats.device_unexplained_us += max(0.0, ts - latest)
            for k, (point, source, typical, kind) in enumerate(options_):
                delay = ts - source
                self.edges.add(point, self.start(i), delay if (explained and k == binding) else min(delay, typical),
                               kind)

    def _typical_delays(self, previous: dict[int, int]) -> tuple[float, float]:
        """Median launch latency of activities launched onto an idle stream, and median gap between an
        activity and the queued one after it."""
        trace = self.trace
        latencies = []
        for i in self.device:
            launch, before = self.launch[i], previous.get(i)
            if launch is not None and (before is None or self.end[before] <= trace.ts[launch]):
                latencies.append(trace.ts[i] - trace.ts[launch])
        launch_us = median(latencies) if latencies else _DEFAULT_LAUNCH_US
        gaps = []
        for i in self.device:
            launch, before = self.launch[i], previous.get(i)
            if before is not None and (launch is None or trace.ts[launch] + launch_us < self.end[before]):
                gaps.append(trace.ts[i] - self.end[before])
        gap_us = max(0.0, median(gaps)) if gaps else _DEFAULT_STREAM_GAP_US
        return launch_us, gap_us

    def _explicit_stream_waits(self) -> dict[int, list[int]]:
        """From "Stream Wait Event" records: the activity that waits -> the activities it waits for."""
        trace = self.trace
        waits: dict[int, list[int]] = defaultdict(list)
        for s, kind in enumerate(trace.kind):
            if kind != SYNC or trace.name[s] != "Stream Wait Event":
                continue
            call = self.runtime_by_correlation.get(trace.correlation[s] or -1)
            record = self.runtime_by_correlation.get(trace.wait_on_event_record[s] or -1)
            if call is None or record is None or trace.wait_on_stream[s] is None:
                continue
            waiting = next((i for i in self._stream_members.get(trace.lane[s], [])
                            if self.launch[i] is not None and trace.ts[self.launch[i]] >= trace.ts[call]), None)
            awaited = self._last_on_stream(trace.wait_on_stream[s], trace.ts[record])
            if waiting is not None and awaited:
                waits[waiting] += awaited
        return waits

    def _inferred_wait(self, i: int, streams: list[int], ends_on: dict[int, list[float]]) -> int | None:
        """The activity on another stream that ended last before ``i`` started, within the slack, launched
        before ``i`` was."""
        trace = self.trace
        ts = trace.ts[i]
        launch = self.launch[i]
        launched = trace.ts[launch] if launch is not None else ts
        best = None
        for stream in streams:
            position = bisect_right(ends_on[stream], ts) - 1
            if position < 0:
                continue
            candidate = self._stream_members[stream][position]
            if ts - self.end[candidate] > self.options.device_slack_us:
                continue
            source_launch = self.launch[candidate]
            if source_launch is not None and trace.ts[source_launch] > launched:
                continue
            if best is None or self.end[candidate] > self.end[best]:
                best = candidate
        return best

    # -- collectives and floating events --------------------------------------------------------------------

    def _collective_starts(self) -> None:
        """Issue edges of the CPU collectives (gloo:* annotations on CPU-only ranks)."""
        trace = self.trace
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
                    self.edges.add(chain.points[position], self.start(c), trace.ts[c] - chain.times[position], ISSUE)
                self.host[c] = tid
                ops = issuing_on.get(tid, [])
                position = bisect_right([trace.ts[i] for i in ops], trace.ts[c]) - 1
                if position >= 0 and self.end[ops[position]] >= trace.ts[c] - _ISSUE_SLACK_US:
                    self.arrival[c] = ops[position]  # the transfer starts with c10d::send / c10d::recv_
                continue
            if paired:
                issuer = issuer_of[c]
            else:
                position = bisect_right(issuing_starts, trace.ts[c]) - 1
                issuer = issuing[position] if position >= 0 else None
            if issuer is not None:
                self.issuer[c] = issuer
                self.edges.add(self.start(issuer), self.start(c), trace.ts[c] - trace.ts[issuer], ISSUE)
            if tid in last_on_worker:
                self.edges.add(self.stop(last_on_worker[tid]), self.start(c), 0.0, THREAD)
            last_on_worker[tid] = c

    def _floating_edges(self) -> None:
        """Events outside the chains keep their offset from the timeline of their thread (or runtime call)."""
        trace = self.trace
        for i in self.floating:
            chain = self.chain_of.get(trace.lane[i])
            position = bisect_right(chain.times, trace.ts[i]) - 1 if chain else -1
            if position >= 0:
                self.edges.add(chain.points[position], self.start(i), trace.ts[i] - chain.times[position], ANCHOR)
            self.edges.add(self.start(i), self.stop(i), trace.dur[i], WORK)
        for i, kind in enumerate(trace.kind):
            if kind != SYNC:
                continue
            call = self.runtime_by_correlation.get(trace.correlation[i] or -1)
            if call is not None:
                self.edges.add(self.start(call), self.start(i), trace.ts[i] - trace.ts[call], ANCHOR)
            self.edges.add(self.start(i), self.stop(i), trace.dur[i], WORK)

    def collectives(self, layout: Layout | None) -> list[Collective]:
        """This rank's collective calls with their process group (from metadata, spans or the rank's groups)."""
        trace = self.trace
        resolver = GroupResolver(trace, layout)
        spans = SpanIndex(trace)
        steps = sorted((trace.ts[i], self.end[i], iteration_id(name)) for i, name in enumerate(trace.name)
                       if trace.kind[i] == CPU and iteration_id(name) is not None)
        step_starts = [start for start, _, _ in steps]
        calls: list[Collective] = []
        device_comm = [i for i in self.device if is_comm_kernel(trace.name[i])]
        for i in device_comm + self.cpu_collectives:
            kind = collective_kind(trace, i)
            if trace.kind[i] == DEVICE:
                origin = self.launch[i]
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


def _waiting_point(chain: ThreadChain, finished: float, options: ReplayOptions) -> tuple[int, float] | None:
    """The point of the issuing thread just before an asynchronous collective's end, with the delay, when the
    end followed it closely (the thread called ``wait()`` there)."""
    position = bisect_right(chain.times, finished) - 1
    if position >= 0 and finished - chain.times[position] <= options.collective_slack_us:
        return chain.points[position], finished - chain.times[position]
    return None


def _collective_edges(builders: dict[int, _RankBuilder], calls: list[Collective], matches: list[CollectiveMatch],
                      options: ReplayOptions, edges: EdgeList, stats: DependencyStats) -> None:
    """End edges of every collective call: from all members' arrivals when matched, else its measured duration."""
    matched: set[tuple[int, int]] = set()
    for match in matches:
        shortest = min(match.transfer_us)
        for member, transfer in zip(match.members, match.transfer_us):
            matched.add((member.rank, member.event))
            builder = builders[member.rank]
            end = builder.stop(member.event)
            tid = builder.host.get(member.event)
            waited = None
            if tid is not None and match.by_clock and transfer - shortest > options.collective_slack_us:
                waited = _waiting_point(builder.chain_of[tid], member.ts + member.dur, options)
            if waited is None:
                for other in match.members:
                    edges.add(builders[other.rank].start(other.arrival_event), end, transfer, PEER)
                stats.collective_ends["peers"] += 1
                continue
            for other in match.members:
                edges.add(builders[other.rank].start(other.arrival_event), end, shortest, PEER)
            edges.add(waited[0], end, waited[1], WAITED)
            stats.collective_ends["waited"] += 1
    for call in calls:
        if (call.rank, call.event) not in matched:
            builder = builders[call.rank]
            edges.add(builder.start(call.event), builder.stop(call.event), call.dur, WORK)
            stats.collective_ends["measured"] += 1
    for builder in builders.values():
        trace = builder.trace
        for i in builder.device:
            if not is_comm_kernel(trace.name[i]):
                edges.add(builder.start(i), builder.stop(i), trace.dur[i], WORK)
