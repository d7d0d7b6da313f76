"""The replay graph: every event is two points (start, end); edges say "this point is at least ``delay`` µs
after that one".

Point ``2*e`` is the start of event ``e`` and ``2*e + 1`` its end (events of all ranks are numbered one after
the other). A point's replayed time is the latest ``source time + delay`` over its incoming edges; a point
without incoming edges keeps its measured time (the first event of each thread). Each edge carries a kind, so
that the report can say what the dependency model is made of.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

#: edge kinds
WORK = "work"  # an event's own duration (start -> end)
THREAD = "thread"  # consecutive points of one CPU thread (operator boundaries, measured gaps)
WAKE = "wake"  # a thread resumes after what it waited for (another thread, a collective, a device activity)
LAUNCH = "launch"  # runtime launch call -> the device activity it launched
STREAM = "stream"  # previous activity on the same stream -> the next one
EVENT = "event"  # cudaEventRecord / cudaStreamWaitEvent between streams, from the trace's cuda_sync records
INFERRED = "inferred"  # a cross-stream wait inferred from timing (traces without cuda_sync records)
ISSUE = "issue"  # the CPU call that issued a collective -> the collective's start
PEER = "peer"  # a peer's arrival at a collective -> this rank's end of the collective
WAITED = "waited"  # an asynchronous collective's end is when the issuing thread waited for it
ANCHOR = "anchor"  # an event that does not nest on its thread keeps its offset from the thread's timeline

EDGE_KINDS = (WORK, THREAD, WAKE, LAUNCH, STREAM, EVENT, INFERRED, ISSUE, PEER, WAITED, ANCHOR)
_KIND_CODE = {kind: code for code, kind in enumerate(EDGE_KINDS)}


def precedes(point: int, time: float, other: int, other_time: float) -> bool:
    """The one strict order of points that every dependency inferred from timing must follow: measured time,
    then point number. Timestamps are rounded (to 1 µs in older traces), activities can last zero time; without
    a strict order two events at one time could each be taken to wait for the other, a cycle."""
    return (time, point) < (other_time, other)


def start_point(event: int) -> int:
    """The start point of global event ``event``."""
    return 2 * event


def end_point(event: int) -> int:
    """The end point of global event ``event``."""
    return 2 * event + 1


@dataclass(frozen=True)
class ReplayOptions:
    """The tolerances of the dependency model (microseconds).

    A dependency is accepted as the reason an event started (or a thread resumed) when the event followed it
    within the tolerance; the measured delay is then kept on that edge. Dependencies that were not the reason
    keep at most their typical delay, so they only bind when something upstream moves.
    """

    #: a device activity counts as started by its launch / stream predecessor / awaited activity if it started
    #: at most this long after the typical delay of that dependency
    device_slack_us: float = 5.0
    #: a blocking runtime call (synchronize, memcpy ...) waited for a device activity that ended at most this
    #: long before the call returned
    sync_wake_us: float = 100.0
    #: an idle CPU thread (between operators, inside an annotation) was woken by another thread or a collective
    #: that finished at most this long before it resumed
    thread_wake_us: float = 1000.0
    #: an asynchronous CPU collective that ended this much later than its peers let it is taken to have ended
    #: when its thread waited for it
    collective_slack_us: float = 200.0


class EdgeList:
    """Edges in compact growing arrays (a source, a target, a delay and a kind), viewed as NumPy arrays: a trace
    set's graph has a few edges per event.

    Point numbers take 4 bytes each unless ``wide`` (8): a rank's edges are numbered from 0 within the rank, and
    a rank has fewer than 2^31 points (a billion events, hundreds of GB of JSON) unless it says otherwise."""

    def __init__(self, wide: bool = False) -> None:
        self._point = "q" if wide else "i"
        self.src = array(self._point)
        self.dst = array(self._point)
        self.delay = array("d")
        self.kind = array("b")

    def add(self, src: int, dst: int, delay: float, kind: str) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.delay.append(delay)
        self.kind.append(_KIND_CODE[kind])

    def __len__(self) -> int:
        return len(self.src)

    def clear(self) -> None:
        """Forget every edge (their memory goes once no view of them is alive)."""
        self.src, self.dst = array(self._point), array(self._point)
        self.delay, self.kind = array("d"), array("b")

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Views of the edges (no copy: no edge can be added while a view is alive): source, target, delay, kind
        code."""
        point = np.int64 if self._point == "q" else np.int32
        return (np.frombuffer(self.src, dtype=point), np.frombuffer(self.dst, dtype=point),
                np.frombuffer(self.delay, dtype=np.float64), np.frombuffer(self.kind, dtype=np.int8))


def kind_name(code: int) -> str:
    """The edge kind of an integer code."""
    return EDGE_KINDS[code]
