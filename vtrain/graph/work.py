"""What the graph builder is given: resolved durations of every kind of task, computed once per distinct block.

The simulator resolves each block's steps (see :mod:`vtrain.simulate.workload`) and hands the graph builder a
:class:`GraphInputs`. The graph keeps references to these objects on its tasks, so the Chrome-trace writer can
expand a task back into its ops without resolving anything again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockWork:
    """One block (embedding, layer, head, optimizer) in one phase, with its resolved steps."""

    kind: str  # embedding | layer | head | optimizer
    phase: str  # forward | recompute | backward | optimizer
    layer: int | None
    steps: tuple[object, ...]  # resolved steps, opaque to the graph (used by the trace writer)
    compute_us: float  # time of the operators
    tp_us: float  # time of tensor-parallel collectives (they block the compute stream)
    host_us: float = 0.0  # time the stream waits for the host between steps (measured gaps, issue overhead)

    @property
    def duration_us(self) -> float:
        return self.compute_us + self.host_us + self.tp_us


@dataclass(frozen=True)
class PhaseWork:
    """The blocks one pass runs, in execution order, and their times summed (when it is made: every pass's are
    read, and a cached property takes a lock on each first read)."""

    blocks: tuple[BlockWork, ...]
    compute_us: float = field(init=False, compare=False, repr=False)
    tp_us: float = field(init=False, compare=False, repr=False)
    host_us: float = field(init=False, compare=False, repr=False)
    duration_us: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        compute = sum(b.compute_us for b in self.blocks)
        tp = sum(b.tp_us for b in self.blocks)
        host = sum(b.host_us for b in self.blocks)
        for name, value in (("compute_us", compute), ("tp_us", tp), ("host_us", host),
                            ("duration_us", compute + host + tp)):
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class CommWork:
    """One pipeline transfer or data-parallel all-reduce."""

    op: str  # send | all_reduce
    bytes: int
    group_size: int
    latency_us: float
    resolution: object  # how the latency was obtained (opaque to the graph)


def steps_of(work: PhaseWork | BlockWork | CommWork) -> list[object]:
    """The resolved steps a pass or block runs, in order (none for a transfer or all-reduce, which is one step of its
    own: its ``resolution``)."""
    if isinstance(work, CommWork):
        return []
    blocks = work.blocks if isinstance(work, PhaseWork) else (work,)
    return [step for block in blocks for step in block.steps]


@dataclass(frozen=True)
class Bucket:
    """A data-parallel gradient bucket. With overlap it is all-reduced once the backward of block ``after_block``
    (an index into the chunk's backward blocks) has produced its last gradient; without, after the last backward
    pass of the stage. With Megatron's distributed optimizer it is reduce-scattered instead, and its parameters,
    once the stage's optimizer step has updated this rank's share of them, all-gathered (``gather``)."""

    after_block: int
    comm: CommWork
    gather: CommWork | None = None


@dataclass
class GraphInputs:
    """Resolved work for every task kind of one run."""

    forward: dict[tuple[int, int], PhaseWork]  # (stage, chunk) -> forward pass
    backward: dict[tuple[int, int, bool], PhaseWork]  # (stage, chunk, accumulate) -> backward pass
    optimizer: dict[int, PhaseWork]  # stage -> optimizer step
    pp_transfer: CommWork | None  # one activation (or its gradient) between adjacent stages
    dp_buckets: dict[tuple[int, int], list[Bucket]] = field(default_factory=dict)  # (stage, chunk) -> buckets
