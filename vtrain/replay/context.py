"""What every part of a rank's graph building shares: the rank's events, where its points are numbered from,
the edge list being filled and the statistics being counted."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vtrain.replay.graph import EdgeList, ReplayOptions
from vtrain.replay.trace import RUNTIME, RankTrace

#: causes of a wait the dependency model cannot explain; the replay keeps its measured length (see ``kept_us``)
KEPT_PEER_ABSENT = "collectives waiting on a peer rank not in the folder"
KEPT_GROUP_UNKNOWN = "collectives whose process group is unknown"
KEPT_UNMATCHED = "collectives not matched across ranks"
KEPT_CROSS_STREAM = "cross-stream waits without an event record"
KEPT_DEVICE = "device activities started later than their launch and stream order explain"
KEPT_HOST = "host waits on something not in the trace"
KEPT_CAUSES = (KEPT_PEER_ABSENT, KEPT_GROUP_UNKNOWN, KEPT_UNMATCHED, KEPT_CROSS_STREAM, KEPT_DEVICE, KEPT_HOST)


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
    #: waits the model cannot explain, kept as measured delays on the op that waited: cause -> µs, and how many
    kept_us: Counter[str] = field(default_factory=Counter)
    kept_count: Counter[str] = field(default_factory=Counter)
    graph_launches: int = 0  # runtime calls (cudaGraphLaunch, ...) that released more than one activity

    def merge(self, other: DependencyStats) -> None:
        """Add what ``other`` (another rank's model) found."""
        for name, value in vars(other).items():
            mine = getattr(self, name)
            if isinstance(mine, Counter):
                mine.update(value)
            else:
                setattr(self, name, mine + value)

    def keep(self, cause: str, us: float) -> None:
        """Count a wait of ``us`` kept as measured (one of :data:`KEPT_CAUSES`)."""
        self.kept_us[cause] += max(0.0, us)
        self.kept_count[cause] += 1


class RankContext:
    """One rank's events and the graph being built; ``start(i)`` / ``stop(i)`` are the global points of local
    event ``i``."""

    def __init__(self, trace: RankTrace, offset: int, options: ReplayOptions, edges: EdgeList,
                 stats: DependencyStats) -> None:
        self.trace = trace
        self.offset = offset
        self.options = options
        self.edges = edges
        self.stats = stats
        self.end = [t + d for t, d in zip(trace.ts, trace.dur)]
        self.runtime_by_correlation: dict[int, int] = {}
        for i, kind in enumerate(trace.kind):
            if kind == RUNTIME and trace.correlation[i] is not None:
                self.runtime_by_correlation.setdefault(trace.correlation[i], i)

    def start(self, i: int) -> int:
        return 2 * (self.offset + i)

    def stop(self, i: int) -> int:
        return 2 * (self.offset + i) + 1

    def runtime_call(self, correlation: int | None) -> int | None:
        """The runtime call with this correlation id."""
        return None if correlation is None else self.runtime_by_correlation.get(correlation)
