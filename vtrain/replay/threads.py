"""CPU threads as chains of points: every operator, annotation and runtime call of a thread, nested, in order.

A thread's events nest (an operator holds the operators it calls). Walking them in order gives the thread's
timeline as a sequence of points (starts and ends); between two consecutive points the thread is in one
*segment*, whose kind decides how the replay treats it:

* ``working``: inside an operator or runtime call that does the work itself (a leaf) or between the children
  of an operator (dispatch overhead): its measured length is kept;
* ``idle``: outside every event, inside an annotation (``record_function`` spans, ``ProfilerStep#N``) or, on a
  rank without device activities, inside a wait for a collective (``_c10d_functional::wait_tensor``, which blocks
  a gloo rank's thread until the collective ends; on a GPU it only orders streams): the thread may be waiting for
  another thread or for a collective, or running Python;
* ``blocked``: inside a runtime call that can wait for the device (synchronize, memcpy, free, or any call
  far slower than usual for its name, such as a launch into a full queue).

Events that overlap the end of the event around them (asynchronous spans) are left out of the chain and
returned as *floating* events.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median

from vtrain.kineto import COLLECTIVE_WAIT_OPS, OPTIMIZER_ITERATION
from vtrain.replay.trace import CPU, RUNTIME, RankTrace

WORKING, IDLE, BLOCKED = "working", "idle", "blocked"

#: runtime calls that may wait for the device
_BLOCKING_CALL = re.compile(r"synchronize|memcpy|free", re.IGNORECASE)
#: a runtime call this many times slower than the median of its name (and over the floor below) blocked
_SLOW_FACTOR = 20.0
_SLOW_FLOOR_US = 50.0
#: nesting tolerance for timestamps rounded by the profiler (µs)
_NEST_EPS = 1e-3


@dataclass
class ThreadChain:
    """One thread's points in order; ``segment[i]`` is the kind of the stretch from point ``i`` to ``i + 1``."""

    tid: int
    points: list[int] = field(default_factory=list)  # global point ids
    times: list[float] = field(default_factory=list)  # measured times
    segment: list[str] = field(default_factory=list)
    blocker: list[int] = field(default_factory=list)  # local index of the blocking runtime call or of the
    # collective wait (idle) the segment is in, else -1


def blocking_calls(trace: RankTrace) -> set[int]:
    """Local indices of the runtime calls that may have waited for the device."""
    durations: dict[str, list[float]] = defaultdict(list)
    for i, kind in enumerate(trace.kind):
        if kind == RUNTIME:
            durations[trace.name[i]].append(trace.dur[i])
    typical = {name: median(values) for name, values in durations.items()}
    blocking: set[int] = set()
    for i, kind in enumerate(trace.kind):
        if kind != RUNTIME:
            continue
        name = trace.name[i]
        slow = trace.dur[i] > max(_SLOW_FLOOR_US, _SLOW_FACTOR * typical[name])
        if _BLOCKING_CALL.search(name) or slow:
            blocking.add(i)
    return blocking


def build_chains(trace: RankTrace, members: list[int], offset: int,
                 blocking: set[int]) -> tuple[list[ThreadChain], list[int]]:
    """Chains of the given events (local indices of cpu/runtime events) per thread, and the floating events.

    ``offset`` is the global number of the rank's first event (point ids are global).
    """
    by_thread: dict[int, list[int]] = defaultdict(list)
    for i in members:
        by_thread[trace.lane[i]].append(i)
    chains: list[ThreadChain] = []
    floating: list[int] = []
    host_waits = not trace.has_device_activity  # a collective's wait blocks the thread (see the module)
    for tid, events in sorted(by_thread.items()):
        events.sort(key=lambda i: (trace.ts[i], -trace.dur[i], i))
        nested, has_child, loose = _nest(trace, events)
        floating.extend(loose)
        chains.append(_walk(trace, tid, nested, has_child, offset, blocking, host_waits))
    return chains, floating


def _nest(trace: RankTrace, events: list[int]) -> tuple[list[int], set[int], list[int]]:
    """Split a thread's sorted events into properly nested ones (and which of them have children) and the
    ones that overlap the end of their enclosing event."""
    nested: list[int] = []
    loose: list[int] = []
    has_child: set[int] = set()
    stack: list[tuple[float, int]] = []  # (end, event)
    for i in events:
        start, end = trace.ts[i], trace.ts[i] + trace.dur[i]
        while stack and stack[-1][0] <= start + _NEST_EPS:
            stack.pop()
        if stack and end > stack[-1][0] + _NEST_EPS:
            loose.append(i)
            continue
        if stack:
            has_child.add(stack[-1][1])
        stack.append((end, i))
        nested.append(i)
    return nested, has_child, loose


def _walk(trace: RankTrace, tid: int, nested: list[int], has_child: set[int], offset: int,
          blocking: set[int], host_waits: bool) -> ThreadChain:
    """The thread's points in order, with the kind of each segment between them."""
    chain = ThreadChain(tid=tid)
    stack: list[int] = []

    def emit(point: int, time: float) -> None:
        if chain.points:
            kind, blocker = _segment_kind(trace, stack[-1] if stack else None, has_child, blocking, host_waits)
            chain.segment.append(kind)
            chain.blocker.append(blocker)
        chain.points.append(point)
        chain.times.append(time)

    for i in nested:
        start = trace.ts[i]
        while stack and _end(trace, stack[-1]) <= start + _NEST_EPS:
            top = stack[-1]
            emit(2 * (offset + top) + 1, _end(trace, top))
            stack.pop()
        emit(2 * (offset + i), start)
        stack.append(i)
    while stack:
        top = stack[-1]
        emit(2 * (offset + top) + 1, _end(trace, top))
        stack.pop()
    return chain


def _end(trace: RankTrace, i: int) -> float:
    return trace.ts[i] + trace.dur[i]


def _segment_kind(trace: RankTrace, innermost: int | None, has_child: set[int], blocking: set[int],
                  host_waits: bool) -> tuple[str, int]:
    """The kind of the segment inside ``innermost`` (see the module; ``host_waits``: the rank's collective waits
    block its threads)."""
    if innermost is None:
        return IDLE, -1
    if trace.kind[innermost] == CPU and host_waits and trace.name[innermost].startswith(COLLECTIVE_WAIT_OPS):
        return IDLE, innermost  # idle, its blocker the wait: a collective's end wakes it
    if trace.kind[innermost] == CPU and trace.cat[innermost] in ("user_annotation", OPTIMIZER_ITERATION):
        return IDLE, -1
    if innermost in blocking and innermost not in has_child:
        return BLOCKED, innermost
    return WORKING, -1
