"""The execution graph of one training iteration, for one representative rank per pipeline stage.

Tensor- and data-parallel replicas of a stage run the same tasks at the same times, so the graph has one compute
stream per stage, whatever the number of GPUs. Nodes are tasks, sequential on one stream:

* ``forward`` / ``backward``: one pass of one micro-batch through one model chunk of a stage (tensor-parallel
  all-reduces block the compute stream, as in Megatron, so they are folded into the pass). With overlapped
  data-parallel all-reduce, the last micro-batch's backward is split per block so each gradient bucket can start
  as soon as its block is done;
* ``pp``: one activation (forward) or activation gradient (backward) sent to the adjacent stage, on a
  first-come-first-served stream per sending stage and direction;
* ``dp``: a data-parallel all-reduce of one gradient bucket (during the last backward pass when overlapped, else
  after the stage's last backward), on a first-come-first-served stream per stage;
* ``optimizer``: the optimizer step of a stage, after its gradients are reduced.

Edges are data dependencies. The order of each stage's compute stream (given by the schedule) is kept beside
the graph in :attr:`ExecutionGraph.stream_order`; communication streams have no fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from vtrain.graph.work import BlockWork, CommWork, GraphInputs, PhaseWork
from vtrain.parallel import FORWARD, stage_order
from vtrain.runconfig import RunConfig

if TYPE_CHECKING:
    import networkx as nx

COMPUTE_KINDS = ("forward", "backward", "optimizer")
COMM_KINDS = ("pp", "dp")
KINDS = (*COMPUTE_KINDS, *COMM_KINDS)  # a task's kind as a number: its index here (:attr:`TaskColumns.kind`)


@dataclass(slots=True)
class Task:
    """One node of the execution graph."""

    kind: str  # forward | backward | optimizer | pp | dp
    stage: int  # the stage whose stream runs it (the sender, for pp)
    chunk: int
    mb: int  # micro-batch, -1 for optimizer and dp
    duration_us: float
    compute_us: float  # operator time (compute tasks)
    tp_us: float  # tensor-parallel collective time (compute tasks)
    stream: int
    work: PhaseWork | BlockWork | CommWork
    peer: int = -1  # pp: the receiving stage
    phase: str = ""  # pp: forward | backward
    bucket: int = -1  # dp: bucket index within the stage
    block: int = -1  # split backward: index of the block within the pass
    host_us: float = 0.0  # time waiting for the host between operators (compute tasks)


@dataclass(frozen=True)
class Stream:
    """A sequential resource: a stage's compute stream, or a communication stream."""

    name: str  # compute | pp-forward | pp-backward | dp
    stage: int
    ordered: bool  # True: tasks run in the order given by the graph; False: first come, first served


@dataclass(frozen=True)
class TaskColumns:
    """The tasks' fields that whole-iteration accounting reads, one array each (row ``i`` is task ``i``)."""

    kind: np.ndarray  # index into KINDS
    stage: np.ndarray
    peer: np.ndarray
    duration_us: np.ndarray
    compute_us: np.ndarray
    host_us: np.ndarray
    tp_us: np.ndarray
    previous: np.ndarray  # the task before it on its ordered stream, -1 if none (or on a first-come stream)
    consumer: np.ndarray  # pp: the task that waits for the transfer; -1 for other kinds

    def of_kind(self, kind: str) -> np.ndarray:
        """Whether each task is of ``kind``."""
        return self.kind == KINDS.index(kind)


@dataclass
class ExecutionGraph:
    """Tasks, their streams and their data dependencies (task ``i`` is ``tasks[i]``).

    The dependencies are plain lists (the scheduler walks them); :attr:`graph` is the same as a networkx graph,
    built on first use (importing networkx costs a simulation a third of a second)."""

    edges: list[tuple[int, int]]  # data dependencies, each once, in the order they were added
    tasks: list[Task]
    streams: list[Stream]
    stream_order: dict[int, list[int]]  # ordered stream -> its tasks in execution order
    stages: int

    @cached_property
    def successors(self) -> list[list[int]]:
        """The tasks that wait for each task's data."""
        found: list[list[int]] = [[] for _ in self.tasks]
        for before, after in self.edges:
            found[before].append(after)
        return found

    @cached_property
    def predecessors(self) -> list[list[int]]:
        """The tasks whose data each task waits for."""
        found: list[list[int]] = [[] for _ in self.tasks]
        for before, after in self.edges:
            found[after].append(before)
        return found

    @cached_property
    def columns(self) -> TaskColumns:
        """The tasks as arrays (built on first use)."""
        n = len(self.tasks)
        codes = {kind: code for code, kind in enumerate(KINDS)}
        def column(field: str, dtype: type) -> np.ndarray:
            return np.fromiter(map(attrgetter(field), self.tasks), dtype=dtype, count=n)

        previous = np.full(n, -1, dtype=np.int64)
        for order in self.stream_order.values():
            previous[order[1:]] = order[:-1]
        kind = np.fromiter((codes[t.kind] for t in self.tasks), dtype=np.int8, count=n)
        consumer = np.full(n, -1, dtype=np.int64)
        transfers = np.flatnonzero(kind == codes["pp"])
        successors = self.successors
        consumer[transfers] = [successors[j][0] for j in transfers.tolist()]
        return TaskColumns(kind=kind, stage=column("stage", np.int64), peer=column("peer", np.int64),
                           duration_us=column("duration_us", np.float64),
                           compute_us=column("compute_us", np.float64), host_us=column("host_us", np.float64),
                           tp_us=column("tp_us", np.float64), previous=previous, consumer=consumer)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The dependencies as a networkx graph (node ``i`` is ``tasks[i]``)."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(range(len(self.tasks)))
        graph.add_edges_from(self.edges)
        return graph


class _Builder:
    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.edges: list[tuple[int, int]] = []
        self.streams: list[Stream] = []
        self.stream_order: dict[int, list[int]] = {}
        self._stream_ids: dict[tuple[str, int], int] = {}

    def stream(self, name: str, stage: int, ordered: bool) -> int:
        key = (name, stage)
        if key not in self._stream_ids:
            self._stream_ids[key] = len(self.streams)
            self.streams.append(Stream(name, stage, ordered))
        return self._stream_ids[key]

    def add(self, task: Task) -> int:
        index = len(self.tasks)
        self.tasks.append(task)
        order = self.stream_order.get(task.stream)
        if order is not None:  # an ordered stream
            order.append(index)
        elif self.streams[task.stream].ordered:
            self.stream_order[task.stream] = [index]
        return index

    def pass_task(self, kind: str, stage: int, compute: int, chunk: int, mb: int, work: PhaseWork | BlockWork,
                  block: int = -1) -> int:
        """A pass (or one block of a split one) on the stage's compute stream ``compute``."""
        return self.add(Task(kind, stage, chunk, mb, work.duration_us, work.compute_us, work.tp_us, compute, work,
                             block=block, host_us=work.host_us))

    def comm_task(self, kind: str, stage: int, comm: CommWork, stream: int, *, chunk: int = 0, mb: int = -1,
                  peer: int = -1, phase: str = "", bucket: int = -1) -> int:
        return self.add(Task(kind, stage, chunk, mb, comm.latency_us, 0.0, 0.0, stream, comm, peer=peer,
                             phase=phase, bucket=bucket))


def build_graph(config: RunConfig, inputs: GraphInputs) -> ExecutionGraph:
    """Build the iteration's execution graph for a consistent ``config`` from resolved work."""
    par = config.parallelism
    p, v, m, d = par.pp, par.virtual_stages, par.micro_batches, par.dp
    virtual = p * v
    split_last = par.dp_overlap and d > 1 and bool(inputs.dp_buckets)
    b = _Builder()
    forward: dict[tuple[int, int], int] = {}  # (virtual stage, mb) -> task
    backward_first: dict[tuple[int, int], int] = {}
    backward_last: dict[tuple[int, int], int] = {}
    split_blocks: dict[tuple[int, int], list[int]] = {}  # (stage, chunk) -> last mb's per-block tasks
    stage_last: list[int] = []

    for stage in range(p):
        compute = b.stream("compute", stage, True)
        for phase, chunk, mb in stage_order(par.schedule, p, m, stage, v):
            key = (chunk * p + stage, mb)
            if phase == FORWARD:
                ids = [b.pass_task("forward", stage, compute, chunk, mb, inputs.forward[(stage, chunk)])]
                forward[key] = ids[0]
            else:
                work = inputs.backward[(stage, chunk, mb > 0)]
                if split_last and mb == m - 1:
                    ids = [b.pass_task("backward", stage, compute, chunk, mb, block, block=i)
                           for i, block in enumerate(work.blocks)]
                    split_blocks[(stage, chunk)] = ids
                else:
                    ids = [b.pass_task("backward", stage, compute, chunk, mb, work)]
                backward_first[key], backward_last[key] = ids[0], ids[-1]
        stage_last.append(b.stream_order[compute][-1])

    def connect(src: int, dst: int, src_stage: int, dst_stage: int, phase: str, chunk: int, mb: int) -> None:
        if src_stage == dst_stage or inputs.pp_transfer is None:
            b.edges.append((src, dst))
            return
        stream = b.stream(f"pp-{phase}", src_stage, False)
        transfer = b.comm_task("pp", src_stage, inputs.pp_transfer, stream, chunk=chunk, mb=mb, peer=dst_stage,
                               phase=phase)
        b.edges += [(src, transfer), (transfer, dst)]

    for mb in range(m):
        for k in range(1, virtual):
            connect(forward[(k - 1, mb)], forward[(k, mb)], (k - 1) % p, k % p, "forward", (k - 1) // p, mb)
        for k in range(virtual - 1):
            connect(backward_last[(k + 1, mb)], backward_first[(k, mb)], (k + 1) % p, k % p, "backward",
                    (k + 1) // p, mb)
        b.edges.append((forward[(virtual - 1, mb)], backward_first[(virtual - 1, mb)]))

    for stage in range(p):
        reduced: list[int] = []
        if d > 1:
            stream = b.stream("dp", stage, False)
            for chunk in range(v):
                for index, bucket in enumerate(inputs.dp_buckets[(stage, chunk)]):
                    task = b.comm_task("dp", stage, bucket.comm, stream, chunk=chunk, bucket=index)
                    ready = split_blocks[(stage, chunk)][bucket.after_block] if split_last else stage_last[stage]
                    b.edges.append((ready, task))
                    reduced.append(task)
        compute = b.stream("compute", stage, True)
        optimizer = b.pass_task("optimizer", stage, compute, 0, -1, inputs.optimizer[stage])
        b.edges.append((stage_last[stage], optimizer))
        b.edges += [(task, optimizer) for task in reduced]

    return ExecutionGraph(edges=list(dict.fromkeys(b.edges)), tasks=b.tasks, streams=b.streams,
                          stream_order=b.stream_order, stages=p)
