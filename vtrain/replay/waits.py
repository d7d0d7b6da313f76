"""CPU threads in the graph: the measured stretches between their points, and what they waited for.

A *blocked* stretch (inside a synchronize, a memcpy, ...) ends when the device activity it waited for ends:
named by the trace's ``cuda_sync`` records (Context/Stream/Event Sync) where PyTorch writes them, else the
activity that ended last before the call returned, within ``sync_wake_us`` (every stream's last activity for
a device synchronize). An *idle* stretch (between operators, inside an annotation) ends when what woke the
thread finished: a collective of the rank, else the latest point of another thread, within
``thread_wake_us``. A waiting stretch keeps only its own time (the call's fastest duration, capped by the
median runtime call; the thread's median idle gap) plus the measured wake-up delay after what it waited for.

A blocked call whose cause is not in the trace (a synchronize on work the trace does not show) keeps its
measured length, counted as a kept host wait. A thread that first appears mid-trace starts after what woke it,
else at its measured offset from the latest point of another thread of the rank (never at a wall-clock time).
Every waker precedes the point it wakes in the one strict order of points (:func:`vtrain.replay.graph.precedes`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from statistics import median

from vtrain.replay.context import KEPT_HOST, RankContext
from vtrain.replay.graph import ANCHOR, THREAD, WAKE, precedes
from vtrain.replay.streams import DeviceStreams
from vtrain.replay.threads import BLOCKED, IDLE, WORKING, ThreadChain
from vtrain.replay.trace import RUNTIME, SYNC

_DEVICE_SYNC_CALL = ("DeviceSynchronize", "CtxSynchronize")

Waker = tuple[int, float]  # (point, measured time)


class ThreadWaits:
    """Adds the edges of a rank's CPU threads."""

    def __init__(self, ctx: RankContext, chains: list[ThreadChain], streams: DeviceStreams,
                 blocking: set[int], collectives: list[int]) -> None:
        self.ctx, self.chains, self.streams = ctx, chains, streams
        trace = ctx.trace
        runtime_median = median([d for d, k in zip(trace.dur, trace.kind) if k == RUNTIME] or [0.0])
        self.own_time: dict[str, float] = {}  # a blocked call's own time, per call name
        for i in blocking:
            self.own_time[trace.name[i]] = min(self.own_time.get(trace.name[i], runtime_median), trace.dur[i])
        ends = sorted((ctx.end[i], ctx.stop(i)) for i in collectives)
        self.collective_end_times = [t for t, _ in ends]
        self.collective_end_points = [p for _, p in ends]
        self.sync_records: dict[int, list[int]] = defaultdict(list)
        for i, kind in enumerate(trace.kind):
            if kind == SYNC and trace.correlation[i] is not None:
                self.sync_records[trace.correlation[i]].append(i)

    def add_edges(self) -> None:
        ctx = self.ctx
        for chain in self.chains:
            idle = [b - a for a, b, kind in zip(chain.times, chain.times[1:], chain.segment) if kind == IDLE]
            idle_floor = median(idle) if idle else 0.0
            self._start_edge(chain)
            for k, kind in enumerate(chain.segment):
                a, b = chain.points[k], chain.points[k + 1]
                length = chain.times[k + 1] - chain.times[k]
                if kind == WORKING or length <= 0.0:  # a stretch of no time waited for nothing
                    ctx.edges.add(a, b, length, THREAD)
                    continue
                if kind == BLOCKED:
                    wakers = self._device_wakers(chain.blocker[k])
                    floor = self.own_time[ctx.trace.name[chain.blocker[k]]]
                else:  # idle; a wait for a collective (its blocker) is woken by one that ends within it
                    found = self._cpu_waker(chain, chain.times[k], chain.times[k + 1], b,
                                            any_delay=chain.blocker[k] >= 0)
                    wakers = [found] if found is not None else []
                    floor = idle_floor
                    ctx.stats.thread_waits += bool(wakers)
                ctx.edges.add(a, b, min(length, floor) if wakers else length, THREAD)
                if kind == BLOCKED and not wakers:
                    ctx.stats.keep(KEPT_HOST, length - min(length, floor))
                woke = max((time for _, time in wakers), default=0.0)
                for point, _ in wakers:  # it returns after the last of them: each bounds it by that wake-up delay
                    ctx.edges.add(point, b, chain.times[k + 1] - woke, WAKE)

    def _start_edge(self, chain: ThreadChain) -> None:
        """Where a thread's first point hangs: what woke it, else (a thread that first appears mid-trace) its
        measured offset from the latest earlier point of another thread; the rank's first thread is a root."""
        ctx = self.ctx
        point, time = chain.points[0], chain.times[0]
        first = self._cpu_waker(chain, time - ctx.options.thread_wake_us, time, point)
        if first is not None:
            ctx.edges.add(first[0], point, time - first[1], WAKE)
            ctx.stats.thread_waits += 1
            return
        earlier = self._cpu_waker(chain, float("-inf"), time, point, collectives=False)
        if earlier is not None:
            ctx.edges.add(earlier[0], point, time - earlier[1], ANCHOR)

    def _cpu_waker(self, chain: ThreadChain, low: float, high: float, woken: int | None = None,
                   collectives: bool = True, any_delay: bool = False) -> Waker | None:
        """What woke an idle thread at ``high`` (point ``woken``, by default the chain's point there): the last
        collective (preferred) or other-thread point in ``[low, high]`` at most ``thread_wake_us`` before (with
        ``low`` of minus infinity: at any time before), preceding the woken point. ``any_delay``: the thread waited
        for a collective (``wait_tensor``), which its end wakes however long the thread then takes to run again (a
        loaded CPU's scheduler: over ``thread_wake_us``, the wait was kept at its measured length and scaling the
        collective moved nothing): the last collective ending within the wait."""
        if woken is None:
            woken = chain.points[bisect_right(chain.times, high) - 1]
        floor = max(low, high - self.ctx.options.thread_wake_us) if low != float("-inf") else low
        if collectives:
            found = self._latest_before(self.collective_end_times, self.collective_end_points, high, woken)
            if found is not None and found[1] >= (low if any_delay else floor):
                return found
        best: Waker | None = None
        for other in self.chains:
            if other is chain:
                continue
            found = self._latest_before(other.times, other.points, high, woken)
            if found is not None and found[1] >= floor and (best is None or (found[1], found[0]) > (best[1], best[0])):
                best = found
        return best

    @staticmethod
    def _latest_before(times: list[float], points: list[int], high: float, woken: int) -> Waker | None:
        """The latest of sorted ``(times, points)`` that precedes point ``woken`` at ``high``."""
        position = bisect_right(times, high) - 1
        while position >= 0 and not precedes(points[position], times[position], woken, high):
            position -= 1
        return (points[position], times[position]) if position >= 0 else None

    def _device_wakers(self, call: int) -> list[Waker]:
        """The device activities a blocked runtime call waited for."""
        ctx, streams, trace = self.ctx, self.streams, self.ctx.trace
        recorded = self._recorded_syncs(call)
        if recorded:
            ctx.stats.blocked_calls["explicit"] += 1
            return [(ctx.stop(i), ctx.end[i]) for i in recorded]
        start, stop = trace.ts[call], ctx.end[call]
        awaited: list[int] = []
        if any(name in trace.name[call] for name in _DEVICE_SYNC_CALL):
            awaited = streams.last_per_stream(stop)
        else:
            position = bisect_right(streams.end_times, stop) - 1
            while position >= 0 and streams.end_times[position] >= start:
                i = streams.by_end[position]
                if streams.launch_time(i) <= stop:
                    if stop - ctx.end[i] <= ctx.options.sync_wake_us:
                        awaited = [i]
                    break
                position -= 1
        ctx.stats.blocked_calls["inferred" if awaited else "none"] += 1
        return [(ctx.stop(i), ctx.end[i]) for i in awaited]

    def _recorded_syncs(self, call: int) -> list[int]:
        """Activities named by the trace's cuda_sync records for this call (Event/Stream/Context Sync)."""
        ctx, trace = self.ctx, self.ctx.trace
        awaited: list[int] = []
        for s in self.sync_records.get(trace.correlation[call], []) if trace.correlation[call] is not None else []:
            name = trace.name[s]
            if name == "Context Sync":
                awaited += self.streams.last_per_stream(trace.ts[call])
            elif name == "Stream Sync":
                awaited += self.streams.last_on_stream(trace.lane[s], trace.ts[call])
            elif name == "Event Sync":
                record = ctx.runtime_call(trace.wait_on_event_record[s])
                if record is not None and trace.wait_on_stream[s] is not None:
                    awaited += self.streams.last_on_stream(trace.wait_on_stream[s], trace.ts[record])
        return awaited
