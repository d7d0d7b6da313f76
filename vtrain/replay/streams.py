"""Device streams: when each kernel, memcpy and memset may start.

An activity starts after its launch call, after the previous activity on its stream, and after what its
stream waits for (``cudaStreamWaitEvent``: from the trace's ``cuda_sync`` "Stream Wait Event" records where
PyTorch writes them, else inferred from timing as the activity on another stream that ended just before it
started, and was launched before it). The dependency that explains the measured start keeps its measured
delay; the others keep at most their typical delay (median launch latency onto an idle stream, median gap
between queued activities).

A CUDA graph launch (``cudaGraphLaunch``, ``cuGraphLaunch``, ``hipGraphLaunch``) is one runtime call whose
correlation id many activities share, possibly on several streams: each of them depends on the launch and on
its stream order, so the graph's activities are released in their measured order on their streams.

An activity that started later than every dependency explains (a cross-stream wait with no event record, a
dependency inside a graph, a launch pruned from the trace) keeps its measured delay after the latest of its
dependencies: the wait is kept, never dropped, and counted by cause in the statistics.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from statistics import median

from vtrain.replay.context import KEPT_CROSS_STREAM, KEPT_DEVICE, RankContext
from vtrain.replay.graph import EVENT, INFERRED, LAUNCH, STREAM, WORK, precedes
from vtrain.replay.trace import DEVICE, SYNC

_DEFAULT_LAUNCH_US = 5.0
_DEFAULT_STREAM_GAP_US = 1.0


#: runtime and driver calls that launch a captured graph (many activities, one correlation id)
_GRAPH_LAUNCH = ("GraphLaunch",)


def is_comm_kernel(name: str) -> bool:
    """NCCL (and ROCm RCCL, which keeps the names) kernels: HTA's communication class."""
    return name.startswith("nccl")


def is_graph_launch(name: str) -> bool:
    """``cudaGraphLaunch``, ``cuGraphLaunch``, ``hipGraphLaunch`` (and their ``_v2`` / ``_ptsz`` variants)."""
    return any(marker in name for marker in _GRAPH_LAUNCH)


class DeviceStreams:
    """A rank's device activities per stream, with their launch calls."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        trace = ctx.trace
        self.activities = sorted((i for i, kind in enumerate(trace.kind) if kind == DEVICE),
                                 key=lambda i: (trace.lane[i], trace.ts[i]))
        self.launch = {i: ctx.runtime_call(trace.correlation[i]) for i in self.activities}
        self.members: dict[int, list[int]] = defaultdict(list)
        for i in self.activities:
            self.members[trace.lane[i]].append(i)
        self.launched = {stream: [self.launch_time(i) for i in members] for stream, members in self.members.items()}
        self.previous = {after: before for members in self.members.values()
                         for before, after in zip(members, members[1:])}
        self.ends = {stream: [ctx.end[i] for i in members] for stream, members in self.members.items()}
        self.by_end = sorted(self.activities, key=lambda i: ctx.end[i])
        self.end_times = [ctx.end[i] for i in self.by_end]

    def launch_time(self, i: int) -> float:
        """When activity ``i`` was launched (its own start when no launch call is known)."""
        launch = self.launch[i]
        return self.ctx.trace.ts[launch if launch is not None else i]

    def last_on_stream(self, stream: int, launched_before: float) -> list[int]:
        """The last activity on ``stream`` launched before a time (a stream runs in launch order)."""
        position = bisect_right(self.launched.get(stream, []), launched_before) - 1
        return [self.members[stream][position]] if position >= 0 else []

    def last_per_stream(self, launched_before: float) -> list[int]:
        return [i for stream in self.members for i in self.last_on_stream(stream, launched_before)]

    def add_edges(self) -> None:
        """Start edges of every activity, and the duration of every non-collective one."""
        ctx, trace = self.ctx, self.ctx.trace
        launch_us, gap_us = self._typical_delays()
        waits = self._recorded_waits()
        released = Counter(launch for launch in self.launch.values() if launch is not None)
        ctx.stats.graph_launches += sum(1 for launch, n in released.items()
                                        if n > 1 and is_graph_launch(trace.name[launch]))
        for i in self.activities:
            ts = trace.ts[i]
            choices: list[tuple[int, float, float, str]] = []  # (source point, source time, typical delay, kind)
            if self.launch[i] is not None:
                choices.append((ctx.start(self.launch[i]), trace.ts[self.launch[i]], launch_us, LAUNCH))
            before = self.previous.get(i)
            if before is not None:
                choices.append((ctx.stop(before), ctx.end[before], gap_us, STREAM))
            for source in waits.get(i, []):
                choices.append((ctx.stop(source), ctx.end[source], 0.0, EVENT))
            binding = min(range(len(choices)), key=lambda k: ts - choices[k][1] - choices[k][2], default=None)
            explained = (binding is not None
                         and ts - choices[binding][1] - choices[binding][2] <= ctx.options.device_slack_us)
            if not explained:
                inferred = self._inferred_wait(i)
                if inferred is not None:
                    choices.append((ctx.stop(inferred), ctx.end[inferred], 0.0, INFERRED))
                    binding, explained = len(choices) - 1, True
            if not explained and choices:
                binding = self._keep_wait(i, choices)
            self._count(choices, binding, explained)
            for k, (point, source, typical, kind) in enumerate(choices):
                delay = ts - source
                ctx.edges.add(point, ctx.start(i), delay if k == binding else min(delay, typical), kind)
            if not is_comm_kernel(trace.name[i]):  # collectives end when their peers let them
                ctx.edges.add(ctx.start(i), ctx.stop(i), trace.dur[i], WORK)

    def _keep_wait(self, i: int, choices: list[tuple[int, float, float, str]]) -> int:
        """The dependency an unexplained start keeps its measured delay after (the one that allows the latest
        start), with the kept time counted by cause: a cross-stream wait when an activity on another stream
        ended in the unexplained stretch, else a device delay the trace does not show."""
        ctx, trace = self.ctx, self.ctx.trace
        ts = trace.ts[i]
        allowed = [source + min(ts - source, typical) for _, source, typical, _ in choices]
        latest = max(range(len(choices)), key=lambda k: (allowed[k], k))
        kept = ts - allowed[latest]
        cross_stream = False
        for stream, ends in self.ends.items():
            position = bisect_right(ends, ts) - 1
            if stream != trace.lane[i] and position >= 0 and ends[position] > allowed[latest]:
                cross_stream = True
        ctx.stats.keep(KEPT_CROSS_STREAM if cross_stream else KEPT_DEVICE, kept)
        ctx.stats.device_unexplained_us += max(0.0, kept)
        return latest

    def _count(self, choices: list[tuple[int, float, float, str]], binding: int | None, explained: bool) -> None:
        stats = self.ctx.stats
        if not choices:
            stats.device_started_by["root"] += 1
        elif explained and binding is not None:
            stats.device_started_by[choices[binding][3]] += 1
        else:
            stats.device_started_by["none"] += 1

    def _typical_delays(self) -> tuple[float, float]:
        """Median launch latency of activities launched onto an idle stream, and median gap between an
        activity and the queued one after it."""
        trace, end = self.ctx.trace, self.ctx.end
        first_of_launch: dict[int, int] = {}  # a graph launch's latency is that of its first activity
        for i in self.activities:
            launch = self.launch[i]
            if launch is not None and (launch not in first_of_launch
                                       or trace.ts[i] < trace.ts[first_of_launch[launch]]):
                first_of_launch[launch] = i
        latencies = []
        for launch, i in first_of_launch.items():
            before = self.previous.get(i)
            if before is None or end[before] <= trace.ts[launch]:
                latencies.append(trace.ts[i] - trace.ts[launch])
        launch_us = median(latencies) if latencies else _DEFAULT_LAUNCH_US
        gaps = []
        for i in self.activities:
            launch, before = self.launch[i], self.previous.get(i)
            if before is not None and (launch is None or trace.ts[launch] + launch_us < end[before]):
                gaps.append(trace.ts[i] - end[before])
        gap_us = max(0.0, median(gaps)) if gaps else _DEFAULT_STREAM_GAP_US
        return launch_us, gap_us

    def _recorded_waits(self) -> dict[int, list[int]]:
        """From "Stream Wait Event" records: the activity that waits -> the activities it waits for."""
        ctx, trace = self.ctx, self.ctx.trace
        waits: dict[int, list[int]] = defaultdict(list)
        for s, kind in enumerate(trace.kind):
            if kind != SYNC or trace.name[s] != "Stream Wait Event" or trace.wait_on_stream[s] is None:
                continue
            call = ctx.runtime_call(trace.correlation[s])
            record = ctx.runtime_call(trace.wait_on_event_record[s])
            if call is None or record is None:
                continue
            waiting = next((i for i in self.members.get(trace.lane[s], [])
                            if self.launch[i] is not None and trace.ts[self.launch[i]] >= trace.ts[call]), None)
            awaited = self.last_on_stream(trace.wait_on_stream[s], trace.ts[record])
            if waiting is not None and awaited:
                waits[waiting] += awaited
        return waits

    def _inferred_wait(self, i: int) -> int | None:
        """The activity on another stream that ended last before ``i`` started, within the slack, launched
        before ``i`` was."""
        ctx, trace = self.ctx, self.ctx.trace
        ts, launched, stream_of_i = trace.ts[i], self.launch_time(i), trace.lane[i]
        best = None
        for stream, members in self.members.items():
            if stream == stream_of_i:
                continue
            position = bisect_right(self.ends[stream], ts) - 1
            if position < 0:
                continue
            candidate = members[position]
            launch = self.launch[candidate]
            if ts - ctx.end[candidate] > ctx.options.device_slack_us or (
                    launch is not None and trace.ts[launch] > launched) or not precedes(
                    ctx.stop(candidate), ctx.end[candidate], ctx.start(i), ts):
                continue
            if best is None or ctx.end[candidate] > ctx.end[best]:
                best = candidate
        return best
