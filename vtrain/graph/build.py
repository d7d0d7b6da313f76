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
  after the stage's last backward), on a first-come-first-served stream per stage; with Megatron's distributed
  optimizer a reduce-scatter, and after the optimizer step an all-gather of the bucket's parameters;
* ``optimizer``: the optimizer step of a stage, after its gradients are reduced.

Edges are data dependencies. Each stream runs its tasks in an order known before anything is timed: a compute
stream in the schedule's order (:func:`vtrain.parallel.pass_table`), then the optimizer; a transfer stream in the
order of its sender's passes (a transfer's one input is its pass, and a stage's passes end in stream order, so
first come is that order); a gradient stream in the order its buckets' blocks run (ties: chunk, then bucket).

The graph is built as arrays, one row per task (the largest pipelines of a sweep hold 200,000 tasks and more);
rows point into a short list of resolved works. :attr:`ExecutionGraph.tasks` gives the rows as :class:`Task`
objects, for the writers that walk them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from vtrain.graph.work import BlockWork, CommWork, GraphInputs, PhaseWork
from vtrain.parallel import SCHEDULE_CODES, pass_table
from vtrain.runconfig import ParallelConfig, RunConfig

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
    previous: np.ndarray  # the task before it on its stream, -1 if none
    consumer: np.ndarray  # pp: the task that waits for the transfer; -1 for other kinds

    def of_kind(self, kind: str) -> np.ndarray:
        """Whether each task is of ``kind``."""
        return self.kind == KINDS.index(kind)


#: the graph's per-task arrays, as :class:`Task` names them (``phase`` is 0 forward, 1 backward, -1 none)
_FIELDS = ("kind", "stage", "chunk", "mb", "stream", "peer", "phase", "bucket", "block", "work")
_PHASES = ("forward", "backward")


@dataclass
class ExecutionGraph:
    """Tasks as arrays (row ``i`` is task ``i``; ``work`` points into :attr:`works`), their streams and their
    data dependencies (``sources[j]`` before ``targets[j]``).

    :attr:`tasks` gives the rows as :class:`Task` objects and :attr:`graph` the dependencies as a networkx graph,
    both built on first use (importing networkx costs a simulation a third of a second)."""

    rows: dict[str, np.ndarray]  # one array per name in _FIELDS
    works: list[PhaseWork | BlockWork | CommWork]
    sources: np.ndarray
    targets: np.ndarray
    previous: np.ndarray  # the task before each on its stream, in the order the stream runs them; -1 if first
    streams: list[Stream]
    stages: int

    def __len__(self) -> int:
        return len(self.rows["kind"])

    @property
    def edge_count(self) -> int:
        """The number of data dependencies."""
        return len(self.sources)

    @cached_property
    def stream_order(self) -> dict[int, np.ndarray]:
        """Each ordered stream (a stage's compute stream) -> its task ids in execution order."""
        stream = self.rows["stream"]
        by_stream = np.argsort(stream, kind="stable")  # row order within a stream: the order it runs them
        bounds = np.searchsorted(stream[by_stream], np.arange(len(self.streams) + 1))
        return {s: by_stream[bounds[s]:bounds[s + 1]] for s, each in enumerate(self.streams) if each.ordered}

    @cached_property
    def columns(self) -> TaskColumns:
        """The tasks' times and places as arrays."""
        times = np.array([_times(work) for work in self.works], dtype=np.float64).reshape(-1, 4)[self.rows["work"]]
        kind = self.rows["kind"]
        consumer = np.full(len(self), -1, dtype=np.int64)
        sent = kind[self.sources] == KINDS.index("pp")  # a transfer's one successor waits for it
        consumer[self.sources[sent]] = self.targets[sent]
        return TaskColumns(kind=kind, stage=self.rows["stage"], peer=self.rows["peer"], duration_us=times[:, 0],
                           compute_us=times[:, 1], tp_us=times[:, 2], host_us=times[:, 3], previous=self.previous,
                           consumer=consumer)

    def task(self, i: int) -> Task:
        """Task ``i`` as an object."""
        return self._task({name: int(self.rows[name][i]) for name in _FIELDS})

    def tasks_at(self, ids: list[int]) -> list[Task]:
        """Tasks ``ids`` as objects, in that order (each field gathered once for all of them)."""
        taken = np.asarray(ids, dtype=np.int64)
        columns = {name: self.rows[name][taken].tolist() for name in _FIELDS}
        return [self._task({name: values[k] for name, values in columns.items()}) for k in range(len(ids))]

    def _task(self, row: dict[str, int]) -> Task:
        """The task of one row of fields (:data:`_FIELDS`) as an object."""
        work = self.works[row.pop("work")]
        phase = row.pop("phase")
        duration, compute, tp, host = _times(work)
        return Task(**{**row, "kind": KINDS[row["kind"]]}, duration_us=duration, compute_us=compute, tp_us=tp,
                    host_us=host, work=work, phase=_PHASES[phase] if phase >= 0 else "")

    @cached_property
    def tasks(self) -> list[Task]:
        """Every task as an object, in row order."""
        return self.tasks_at(list(range(len(self))))

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The dependencies as a networkx graph (node ``i`` is task ``i``)."""
        import networkx as nx

        graph = nx.DiGraph()
        graph.add_nodes_from(range(len(self)))
        graph.add_edges_from(zip(self.sources.tolist(), self.targets.tolist()))
        return graph


def _times(work: PhaseWork | BlockWork | CommWork) -> tuple[float, float, float, float]:
    """A task's duration and its operator, tensor-parallel and host parts."""
    if isinstance(work, CommWork):
        return work.latency_us, 0.0, 0.0, 0.0
    return work.duration_us, work.compute_us, work.tp_us, work.host_us


class _Works:
    """The distinct resolved works tasks point to, each once."""

    def __init__(self) -> None:
        self.items: list[PhaseWork | BlockWork | CommWork] = []
        self._index: dict[int, int] = {}

    def add(self, work: PhaseWork | BlockWork | CommWork) -> int:
        if id(work) not in self._index:
            self._index[id(work)] = len(self.items)
            self.items.append(work)
        return self._index[id(work)]


def _rows(n: int, **given: np.ndarray | int) -> dict[str, np.ndarray]:
    """``n`` task rows: the ``given`` columns (arrays or one value for all), the others -1 (chunk 0)."""
    defaults = {"chunk": 0}
    return {name: np.broadcast_to(np.asarray(given.get(name, defaults.get(name, -1)), dtype=np.int64), (n,))
            for name in _FIELDS}


@dataclass
class _Passes:
    """Every stage's compute tasks in stream order (stage after stage), and where each pass's tasks are: ``first``
    and ``last`` task of the forward (``forward``) and backward (``backward_first``, ``backward_last``) pass of
    each (virtual stage, micro-batch)."""

    rows: dict[str, np.ndarray]
    forward: np.ndarray  # (p * v, m)
    backward_first: np.ndarray
    backward_last: np.ndarray
    stage_last: np.ndarray  # (p,): each stage's last pass task


def _passes(par: ParallelConfig, inputs: GraphInputs, works: _Works, split_last: bool) -> _Passes:
    """The compute tasks of every pass, a backward pass split per block when its buckets overlap it."""
    p, v, m = par.pp, par.virtual_stages, par.micro_batches
    backward, chunk, mb = pass_table(SCHEDULE_CODES[par.schedule], p, m, v)
    stage = np.broadcast_to(np.arange(p)[:, None], backward.shape)
    forward_work = np.array([[works.add(inputs.forward[(s, c)]) for c in range(v)] for s in range(p)])
    backward_work = np.array([[[works.add(inputs.backward[(s, c, accumulate)]) for accumulate in (False, True)]
                               for c in range(v)] for s in range(p)])
    work = np.where(backward == 1, backward_work[stage, chunk, (mb > 0).astype(np.int64)], forward_work[stage, chunk])
    split = (backward == 1) & (mb == m - 1) & split_last
    blocks = [[inputs.backward[(s, c, m > 1)].blocks if split_last else () for c in range(v)] for s in range(p)]
    block_count = np.array([[len(each) for each in row] for row in blocks], dtype=np.int64).reshape(p, v)
    block_first = (np.cumsum(block_count) - block_count.ravel()).reshape(p, v)  # into block_work
    block_work = np.array([works.add(block) for row in blocks for each in row for block in each] + [-1])
    counts = np.where(split, block_count[stage, chunk], 1).ravel()
    first = np.cumsum(counts) - counts  # each pass's first task
    of_pass = np.repeat(np.arange(counts.size), counts)
    offset = np.arange(of_pass.size) - first[of_pass]
    split_task = split.ravel()[of_pass]
    rows = _rows(of_pass.size, kind=np.where(backward.ravel() == 1, KINDS.index("backward"),
                                             KINDS.index("forward"))[of_pass],
                 stage=stage.ravel()[of_pass], chunk=chunk.ravel()[of_pass], mb=mb.ravel()[of_pass],
                 stream=stage.ravel()[of_pass], block=np.where(split_task, offset, -1),
                 work=np.where(split_task, block_work[block_first[stage, chunk].ravel()[of_pass] + offset],
                               work.ravel()[of_pass]))
    virtual = (chunk * p + stage).ravel()
    tables = {}
    for name, is_backward, task in (("forward", 0, first), ("backward_first", 1, first),
                                    ("backward_last", 1, first + counts - 1)):
        table = np.full((p * v, m), -1, dtype=np.int64)
        chosen = backward.ravel() == is_backward
        table[virtual[chosen], mb.ravel()[chosen]] = task[chosen]
        tables[name] = table
    ends = np.cumsum(counts.reshape(p, -1).sum(axis=1)) - 1
    return _Passes(rows=rows, stage_last=ends, **tables)


def _links(passes: _Passes, p: int, v: int, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pass's output to the pass that needs it, in the order the graph numbers their transfers (per
    micro-batch: the forward links from virtual stage 1 up, then the backward links from 0 up): ``(m, links)``
    arrays of the sending and the receiving task, and per link its direction (0 forward, 1 backward) and sending
    virtual stage."""
    virtual = p * v
    ahead, back = np.arange(virtual - 1), np.arange(1, virtual)  # senders of forward / backward links
    senders = np.concatenate([passes.forward[ahead], passes.backward_last[back]]).T
    receivers = np.concatenate([passes.forward[ahead + 1], passes.backward_first[back - 1]]).T
    direction = np.repeat([0, 1], virtual - 1)
    return senders, receivers, direction, np.concatenate([ahead, back])


def build_graph(config: RunConfig, inputs: GraphInputs) -> ExecutionGraph:
    """Build the iteration's execution graph for a consistent ``config`` from resolved work."""
    par = config.parallelism
    p, v, m, d = par.pp, par.virtual_stages, par.micro_batches, par.dp
    split_last = par.dp_overlap and d > 1 and bool(inputs.dp_buckets)
    works = _Works()
    streams = [Stream("compute", stage, True) for stage in range(p)]
    passes = _passes(par, inputs, works, split_last)
    parts, edges = [passes.rows], []
    virtual_last = p * v - 1
    edges.append((passes.forward[virtual_last], passes.backward_first[virtual_last]))  # the loss turns around
    senders, receivers, direction, sender_virtual = _links(passes, p, v, m)
    count = len(passes.rows["kind"])
    if p == 1 or inputs.pp_transfer is None:  # every link within a stage
        edges.append((senders.ravel(), receivers.ravel()))
    else:  # a transfer per link, on the sender's stream of its direction (numbered as first used)
        sender_stage, receiver_stage = sender_virtual % p, (sender_virtual + 1 - 2 * direction) % p
        keys = list(dict.fromkeys(zip(direction.tolist(), sender_stage.tolist())))
        stream_of = {key: len(streams) + i for i, key in enumerate(keys)}
        streams += [Stream(f"pp-{_PHASES[phase]}", stage, False) for phase, stage in keys]
        links = np.array([stream_of[key] for key in zip(direction.tolist(), sender_stage.tolist())])
        transfers = count + np.arange(senders.size)
        work = works.add(inputs.pp_transfer)
        parts.append(_rows(senders.size, kind=KINDS.index("pp"), stage=np.tile(sender_stage, m),
                           chunk=np.tile(sender_virtual // p, m), mb=np.repeat(np.arange(m), senders.shape[1]),
                           stream=np.tile(links, m), peer=np.tile(receiver_stage, m), phase=np.tile(direction, m),
                           work=work))
        edges += [(senders.ravel(), transfers), (transfers, receivers.ravel())]
        count += senders.size
    reductions, reduction_edges = _reductions(par, inputs, passes, works, streams, count, split_last)
    parts.append(reductions)
    edges += reduction_edges
    rows = {name: np.concatenate([part[name] for part in parts]) for name in _FIELDS}
    sources = np.concatenate([np.ravel(before) for before, _ in edges])
    targets = np.concatenate([np.ravel(after) for _, after in edges])
    return ExecutionGraph(rows=rows, works=works.items, sources=sources, targets=targets,
                          previous=_stream_previous(rows, sources, targets, streams), streams=streams, stages=p)


def _reductions(par: ParallelConfig, inputs: GraphInputs, passes: _Passes, works: _Works, streams: list[Stream],
                first: int, split_last: bool) -> tuple[dict[str, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """Per stage its gradient buckets' all-reduces (when data-parallel) and its optimizer step, numbered from
    ``first``, with their dependencies; adds each stage's gradient stream to ``streams``. With the distributed
    optimizer the buckets are reduce-scattered and, after the step, their parameters all-gathered on the same
    stream."""
    p, v, m = par.pp, par.virtual_stages, par.micro_batches
    columns: dict[str, list[int]] = {name: [] for name in ("kind", "stage", "chunk", "stream", "bucket", "work")}
    before: list[int] = []
    after: list[int] = []

    def add(kind: str, stage: int, chunk: int, stream: int, bucket: int, work: int) -> int:
        for name, value in zip(columns, (KINDS.index(kind), stage, chunk, stream, bucket, work)):
            columns[name].append(value)
        return first + len(columns["kind"]) - 1

    for stage in range(p):
        last = int(passes.stage_last[stage])
        reduced: list[int] = []
        if par.dp > 1:
            stream = len(streams)
            streams.append(Stream("dp", stage, False))
            for chunk in range(v):
                for index, bucket in enumerate(inputs.dp_buckets[(stage, chunk)]):
                    task = add("dp", stage, chunk, stream, index, works.add(bucket.comm))
                    split = int(passes.backward_first[chunk * p + stage, m - 1]) + bucket.after_block
                    before.append(split if split_last else last)
                    after.append(task)
                    reduced.append(task)
        optimizer = add("optimizer", stage, 0, stage, -1, works.add(inputs.optimizer[stage]))
        before += [last, *reduced]
        after += [optimizer] * (1 + len(reduced))
        gathers = [(chunk, index, bucket.gather) for chunk in range(v) if par.dp > 1
                   for index, bucket in enumerate(inputs.dp_buckets[(stage, chunk)]) if bucket.gather is not None]
        for chunk, index, gather in gathers:  # the updated parameters, after the step (distributed optimizer)
            before.append(optimizer)
            after.append(add("dp", stage, chunk, len(streams) - 1, index, works.add(gather)))
    rows = _rows(len(columns["kind"]), **{name: np.array(values, dtype=np.int64) for name, values in columns.items()})
    return rows, [(np.array(before, dtype=np.int64), np.array(after, dtype=np.int64))]


def _stream_previous(rows: dict[str, np.ndarray], sources: np.ndarray, targets: np.ndarray,
                     streams: list[Stream]) -> np.ndarray:
    """The task before each on its stream: a compute stream in task order (its passes, then the optimizer); a
    first-come-first-served stream in the order its tasks' inputs become ready, the order of the passes they wait
    for on one compute stream (ties: task order)."""
    n = len(rows["kind"])
    stream = rows["stream"]
    waits_for = np.arange(n)  # compute tasks: themselves
    first_come = np.array([not each.ordered for each in streams])[stream]
    fed = first_come[targets]
    waits_for[targets[fed]] = sources[fed]  # a transfer or an all-reduce has one input
    order = np.argsort(stream.astype(np.int64) * n + waits_for, kind="stable")  # by stream, then input; ties: task
    previous = np.full(n, -1, dtype=np.int64)
    same = stream[order[1:]] == stream[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    return previous
