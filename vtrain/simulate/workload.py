"""Resolving the workload model into the graph builder's inputs: every distinct block's steps are resolved once
(all layers of a stage share one resolution) and wrapped into :class:`~vtrain.graph.work.BlockWork`.

Each operator is preceded by a gap (:class:`HostGapResolver`): a block's time is its operators' latencies
(``compute_us``) plus their gaps (``host_us``). On CPU ranks the gap is the one measured before operators of its
phase; collectives get no gap of their own (the time to issue one and to resume after it is in the gap before the
next operator, where it was measured). On GPU ranks the host and the device run apart: the host issues operators
at a rate, the one measured in the profile's timeline or else the device model's host terms (a fitted device's),
and the device runs each once issued (:func:`issued`, one model for both), so the gaps are what the device waits.
A run with ``cuda_graphs`` replays each layer's passes from CUDA graphs (:data:`GRAPHED_BLOCKS`): the host's time
to replay a graph (measured, else one operator's) stands for the graph's launch, and the graph's other operators
follow one another with none but the device's own. When the
profile is the run's own recording (as many ranks, its stages named by its spans), each pipeline stage gets its own
measured gaps and interference factors: stages of one run share the machine differently (which pass runs while
another stage waits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from vtrain.collective_cost import nodes_spanned
from vtrain.graph.work import BlockWork, Bucket, CommWork, GraphInputs, PhaseWork
from vtrain.model import gpt, megatron
from vtrain.model.gpt import GptShape
from vtrain.model.memory import kind_parameters, stage_parameters, state_bytes
from vtrain.model.ops import Collective, Op, Step
from vtrain.partition import Chunk
from vtrain.naming import ALL, parse_span_name
from vtrain.parallel import Layout
from vtrain.runconfig import RunConfig
from vtrain.simulate.collective_latency import CollectiveResolver, wait_once
from vtrain.simulate.latency import (
    DEVICE_GAP,
    HOST_ISSUE,
    MODELLED,
    HostGapResolver,
    IssueRate,
    SOURCES,
    OpLatencyResolver,
    Resolution,
)

#: blocks by kind; ``attention`` is a layer's attention core, the block selective recomputation re-runs
_FORWARD_STEPS = {"embedding": gpt.embedding_forward, "layer": gpt.layer_forward, "head": gpt.head_forward,
                  "attention": gpt.attention_core}
_BACKWARD_STEPS = {"embedding": gpt.embedding_backward, "layer": gpt.layer_backward, "head": gpt.head_backward}


@dataclass(frozen=True)
class ResolvedStep:
    """One op or collective with its resolved latency, and for ops the host gap before it."""

    step: Step
    resolution: Resolution
    gap: Resolution | None = None

    @property
    def latency_us(self) -> float:
        return self.resolution.latency_us

    @property
    def gap_us(self) -> float:
        return self.gap.latency_us if self.gap is not None else 0.0


def issued(resolved: tuple[ResolvedStep, ...], rate: IssueRate, phase: str, graph_launch: int | None = None,
           outside_graph: int = 0, collective_us: float = 0.0) -> tuple[ResolvedStep, ...]:
    """A block's steps as a GPU rank's host issues them at ``rate``, the block running among others like it (a
    layer among layers: the host's lead or lag on the device carries over from the block before, so the block is
    timed as the second of two in a row): the host issues one operator every ``rate.host`` and a collective every
    ``collective_us`` (a measured rate holds the collectives' time in its operators'); a CUDA graph costs it one
    replay, at ``graph_launch``: the time the profile measured for one, else one operator's, and the
    ``outside_graph`` operators it still issues one by one; the device starts an operator once it is issued and the
    previous step has finished, plus the device's own time between operators (a graph replays the kernels of
    operators the model does not place too). Each step's gap is the time the stream idles before it, so the
    block's time is still its latencies plus its gaps."""
    host, issued_at, finished = rate.host.latency_us, 0.0, 0.0
    replay = rate.graph_launch.latency_us if rate.graph_launch is not None else host
    idle: list[float] = []
    for _ in range(2):
        idle = []
        for index, step in enumerate(resolved):
            is_op = isinstance(step.step, Op)
            if is_op and graph_launch is None:
                issued_at += host
            elif not is_op:
                issued_at += collective_us
            elif index == graph_launch:
                issued_at += replay + outside_graph * host
            start = max(issued_at, finished + (rate.device_gap_us if is_op else 0.0))
            idle.append(start - finished)
            finished = start + step.latency_us
    detail = f"{rate.host.detail}; device {rate.device_gap_us:.1f} us between operators"
    parts = ((HOST_ISSUE, host), (DEVICE_GAP, rate.device_gap_us))
    return tuple(ResolvedStep(step.step, step.resolution, Resolution(
        wait, MODELLED, f"issued at the host's rate ({phase}): {wait:.1f} us idle before it; {detail}", parts=parts))
        for step, wait in zip(resolved, idle))


#: the blocks a run with ``cuda_graphs`` replays from CUDA graphs: each transformer layer's passes (its forward,
#: backward and recomputation, and the attention core selective recomputation re-runs)
GRAPHED_BLOCKS = ("layer", "attention")


@lru_cache(maxsize=1024)
def _op_count(shape: GptShape, kind: str, phase: str, accumulate: bool) -> int:
    """Operators (not collectives) among a block's steps."""
    return sum(isinstance(step, Op) for step in block_steps(shape, kind, phase, accumulate))


@lru_cache(maxsize=256)
def optimizer_steps(shape: GptShape, params: tuple[tuple[int, ...], ...]) -> tuple[Step, ...]:
    """The optimizer's steps over one stage's parameters (stages with the same shards share them)."""
    return tuple(gpt.optimizer_step(shape, list(params)))


@lru_cache(maxsize=256)
def block_steps(shape: GptShape, kind: str, phase: str, accumulate: bool) -> tuple[Step, ...]:
    """The steps of one block (embedding, layer, head) in one phase (forward, recompute, backward)."""
    if phase == "backward":
        return tuple(_BACKWARD_STEPS[kind](shape, accumulate))
    return tuple(_FORWARD_STEPS[kind](shape))  # forward or recompute


#: a chunk's forward pass, backward passes (first micro-batch, accumulating) and gradient buckets
_ChunkWork = tuple[PhaseWork, PhaseWork, PhaseWork, list[Bucket] | None]

#: what a :class:`WorkloadResolver` resolved, by what it depends on; runs that share it (a sweep's, through
#: :class:`~vtrain.simulate.run.SharedResolvers`) resolve each distinct block, optimizer step and bucket list once
ResolvedWork = dict[tuple[object, ...], object]


class WorkloadResolver:
    """Turns a run config into :class:`GraphInputs` using the op and collective resolvers.

    ``gaps``: the host-gap resolver, fitted, with ``ops`` calibrated, on the operators the profile's run places
    (:func:`~vtrain.simulate.run.resolve_work`: one rule for every command, shared by a sweep's runs); without it
    the resolver only says what the run places (:meth:`placed`, :meth:`ops_per_iteration`,
    :meth:`profile_stages`). ``resolved``: what runs resolved through the same resolvers resolved before (keyed by
    everything it depends on), shared with this one."""

    def __init__(self, config: RunConfig, ops: OpLatencyResolver, collectives: CollectiveResolver,
                 gaps: HostGapResolver | None = None, resolved: ResolvedWork | None = None) -> None:
        self.config = config
        self.shape = GptShape.from_config(config)
        self.ops = ops
        self.collectives = collectives
        self.gaps = gaps if gaps is not None else HostGapResolver(ops.profile, ops.device_type)
        # shared only with a shared gap resolver: its identity is part of every key
        self._resolved: ResolvedWork = resolved if resolved is not None and gaps is not None else {}
        self._per_stage = False  # the profile is this run's own: interference and gaps per pipeline stage
        layout = Layout.of(config)
        self._world = layout.world_size
        # everything else a resolution depends on (shapes, resolvers, tp and dp groups, bucket size), as one token
        # per distinct combination, so that a key is cheap to hash
        depends = (self.shape, id(self.ops), id(self.gaps), id(collectives), layout.group_stride("tp"),
                   layout.group_stride("dp"), self._tp_nodes(), config.parallelism.dp_bucket_mb)
        self._depends = self._resolved.setdefault(("depends", *depends), object())

    def _tp_nodes(self) -> int:
        """Nodes the widest tensor-parallel group spans (the blocks' collectives depend on it, not on the world)."""
        size, stride = Layout.of(self.config).group_stride("tp")
        return nodes_spanned(size, stride, self.config.hardware.gpus_per_node, self._world)

    def _key(self, *what: object) -> tuple[object, ...]:
        """The key of ``what`` in the resolved work shared with other runs."""
        return (*what, self._depends, self._per_stage)

    def resolve_step(self, step: Step, phase: str, stage: int | None = None, with_gap: bool = True) -> ResolvedStep:
        """Resolve one op (profile or device model, and, ``with_gap``, the gap before it in ``phase`` on
        ``stage``: not for the ops of a CUDA graph after its first) or collective (NCCL table or α-β)."""
        if isinstance(step, Op):
            resolution = self.ops.resolve(step, phase, stage)
            gap = self.gaps.resolve(phase, stage) if with_gap else None
            if gap is not None:  # said on the op, so that the predicted trace's operators say it
                resolution = replace(resolution, detail=f"{resolution.detail}; with a {gap.source} host gap of "
                                                        f"{gap.latency_us:.1f} us before it ({phase})")
            return ResolvedStep(step, resolution, gap)
        group, stride = self._group(step.purpose)
        return ResolvedStep(step, self.collectives.resolve(step.op, group, step.bytes, stride, self._world))

    def _group(self, purpose: str) -> tuple[int, int]:
        """Group size and rank stride of a tp/dp/pp group (tp ranks adjacent, then dp, then pp)."""
        return Layout.of(self.config).group_stride(purpose)

    def _block(self, kind: str, phase: str, layer: int | None, stage: int, accumulate: bool = False) -> BlockWork:
        where = stage if self._per_stage else None
        graphed = self.config.cuda_graphs and kind in GRAPHED_BLOCKS
        key = self._key("block", kind, phase, accumulate, where, graphed)
        if key not in self._resolved:
            steps = block_steps(self.shape, kind, phase, accumulate)
            launch = next((i for i, step in enumerate(steps) if isinstance(step, Op)), None)  # a graph's first op
            rate, collective_us = self._issue_rate(phase, where)
            resolved = tuple(self.resolve_step(step, phase, where,
                                               with_gap=rate is None and (not graphed or i == launch))
                             for i, step in enumerate(steps))
            if rate is not None:
                resolved = issued(resolved, rate, phase, launch if graphed else None,
                                  self._outside_graph(kind, phase, accumulate) if graphed else 0, collective_us)
            tp = sum(r.latency_us for r in resolved if isinstance(r.step, Collective))
            compute = sum(r.latency_us for r in resolved if not isinstance(r.step, Collective))
            self._resolved[key] = (resolved, compute, tp, sum(r.gap_us for r in resolved))
        resolved, compute, tp, host = self._resolved[key]  # type: ignore[misc]
        return BlockWork(kind, phase, layer, resolved, compute, tp, host)

    def _issue_rate(self, phase: str, where: int | None) -> tuple[IssueRate | None, float]:
        """How the host issues ``phase``'s operators on a GPU rank, and its time per collective: the rate measured
        in the profile's timeline (its collectives' time is in its operators'), else the device model's host terms
        (a fitted device's: measured in a recording's timeline or fitted to iteration times). ``None`` for CPU
        ranks, which keep the gaps measured before each operator, and for devices without host time (the
        datasheet: the launch is folded into each kernel's time)."""
        measured = self.gaps.issue(phase, where)
        if measured is not None:
            return measured, 0.0
        device = self.ops.device
        host = device.host_op_us()
        if host <= 0.0 or self.config.hardware.device.lower() == "cpu":
            return None, 0.0
        detail = f"the device model's host time per operator ({device.provenance.get('host', 'fitted')})"
        rate = IssueRate(Resolution(host, MODELLED, detail), device_gap_us=0.0)
        return rate, device.host_collective_us(self._group("tp")[0])

    def profile_stages(self) -> dict[int, int] | None:
        """The pipeline stage of each rank of the profile's timeline, from its ``vtrain/forward stage=S`` spans,
        when the profile has as many ranks and stages as this run (its own recording), else ``None``: another
        run's stages say nothing about this one's."""
        profile, par = self.ops.profile, self.config.parallelism
        if profile is None or profile.metadata.get("world_size") != par.world_size:
            return None
        stages: dict[int, set[int]] = {}
        for rank, name in profile.digest.forward_spans:
            parsed = parse_span_name(name)
            if parsed is not None and parsed[1].get("stage", "").isdigit():
                stages.setdefault(rank, set()).add(int(parsed[1]["stage"]))
        if len(stages) != par.world_size or any(len(found) != 1 for found in stages.values()):
            return None
        stage_of = {rank: found.pop() for rank, found in stages.items()}
        return stage_of if set(stage_of.values()) == set(range(par.pp)) else None

    def placed(self, chunks: list[list[Chunk]]) -> set[tuple[str, str, str]]:
        """Signatures of every operator the run places (what the host gaps are measured between), read from one
        stage of each shape."""
        stages = {tuple(chunk.shape for chunk in stage_chunks): stage_chunks for stage_chunks in chunks}.values()
        kinds = {kind for stage_chunks in stages for chunk in stage_chunks for kind, _ in chunk.forward_blocks()}
        steps = [step for kind in kinds for phase, accumulate in (("forward", False), ("backward", False),
                                                                  ("backward", True))
                 for step in block_steps(self.shape, kind, phase, accumulate)]
        steps += [step for params in {tuple(stage_parameters(self.shape, stage_chunks)) for stage_chunks in stages}
                  for step in optimizer_steps(self.shape, params)]
        return {step.signature for step in steps if isinstance(step, Op)}

    def ops_per_iteration(self, chunks: list[list[Chunk]]) -> dict[str, float]:
        """Operators the host issues one by one per rank and iteration, by phase (and ``all``), the mean over the
        run's stages (not those replayed from CUDA graphs): what a profile of this run spreads the host's measured
        time per operator over (:class:`HostGapResolver`)."""
        par = self.config.parallelism
        recomputed = {"full": "layer", "selective": "attention"}.get(par.recompute)

        def ops(kind: str, phase: str, accumulate: bool = False) -> int:
            if self.config.cuda_graphs and kind in GRAPHED_BLOCKS:  # one replay, timed apart, and what it leaves out
                return self._outside_graph(kind, phase, accumulate)
            return _op_count(self.shape, kind, phase, accumulate)

        counts = dict.fromkeys(("forward", "recompute", "backward", "optimizer"), 0.0)
        m = par.micro_batches
        for stage_chunks in chunks:
            for chunk in stage_chunks:
                for kind, _ in chunk.forward_blocks():
                    counts["forward"] += m * ops(kind, "forward")
                    counts["backward"] += ops(kind, "backward") + (m - 1) * ops(kind, "backward", True)
                    if recomputed and kind == "layer":
                        counts["recompute"] += m * ops(recomputed, "recompute")
            params = tuple(stage_parameters(self.shape, stage_chunks))
            counts["optimizer"] += sum(isinstance(step, Op) for step in optimizer_steps(self.shape, params))
        per_stage = {phase: n / len(chunks) for phase, n in counts.items() if n}
        return {**per_stage, ALL: sum(per_stage.values())}

    def _outside_graph(self, kind: str, phase: str, accumulate: bool) -> int:
        """Operators of a block replayed from a CUDA graph that the host still issues one by one: adding a
        micro-batch's gradients to the ones before (autograd accumulates into ``.grad`` after the replay)."""
        if not accumulate:
            return 0
        return max(_op_count(self.shape, kind, phase, True) - _op_count(self.shape, kind, phase, False), 0)

    def forward(self, chunk: Chunk) -> PhaseWork:
        """One micro-batch's forward pass through a chunk."""
        return PhaseWork(tuple(self._block(kind, "forward", layer, chunk.stage) for kind, layer in chunk.forward_blocks()))

    def backward(self, chunk: Chunk, accumulate: bool) -> PhaseWork:
        """One micro-batch's backward pass through a chunk, blocks in reverse order; with recomputation each
        layer's forward (full) or its attention core (selective) is re-run just before its backward."""
        recomputed = {"full": "layer", "selective": "attention"}.get(self.config.parallelism.recompute)
        blocks: list[BlockWork] = []
        for kind, layer in reversed(chunk.forward_blocks()):
            if recomputed and kind == "layer":
                blocks.append(self._block(recomputed, "recompute", layer, chunk.stage))
            blocks.append(self._block(kind, "backward", layer, chunk.stage, accumulate))
        return PhaseWork(tuple(blocks))

    def optimizer(self, chunks: list[Chunk]) -> PhaseWork:
        """Adam over the parameter shards of a stage."""
        where = chunks[0].stage if self._per_stage else None
        # the parameters depend on the blocks a stage holds, not on which layers they are
        key = self._key("optimizer", tuple((c.layers, c.has_embedding, c.has_head) for c in chunks), where)
        if key not in self._resolved:
            params = tuple(stage_parameters(self.shape, chunks))
            rate, collective_us = self._issue_rate("optimizer", where)
            resolved = tuple(self.resolve_step(s, "optimizer", where, with_gap=rate is None)
                             for s in (*self._tied_reduction(chunks), *optimizer_steps(self.shape, params)))
            if rate is not None:
                resolved = issued(resolved, rate, "optimizer", collective_us=collective_us)
            self._resolved[key] = (resolved, sum(r.latency_us for r in resolved), sum(r.gap_us for r in resolved))
        resolved, compute, host = self._resolved[key]  # type: ignore[misc]
        return PhaseWork((BlockWork("optimizer", "optimizer", None, resolved, compute, 0.0, host),))

    def _tied_reduction(self, chunks: list[Chunk]) -> list[Step]:
        """The tied word embedding's gradient all-reduce on a stage that holds the embedding or the output
        projection, where the pipeline splits them (:func:`~vtrain.model.megatron.tied_embedding_reduction`)."""
        if not (self.shape.tied and self.config.parallelism.pp > 1
                and any(chunk.has_embedding or chunk.has_head for chunk in chunks)):
            return []
        return megatron.tied_embedding_reduction(self.shape, state_bytes(self.config)[1])

    def comm(self, purpose: str, op: str, nbytes: int) -> CommWork:
        """A pipeline transfer or data-parallel all-reduce of ``nbytes``."""
        group, stride = self._group(purpose)
        resolution = self.collectives.resolve(op, group, nbytes, stride, self._world)
        return CommWork(op, nbytes, group, resolution.latency_us, resolution)

    def pipeline_transfer(self) -> CommWork:
        """A stage's hand-off of one micro-batch to the next (:func:`~vtrain.model.gpt.pipeline_handoff`), its
        collectives one after the other: the send, and with Megatron's scatter-gather the receivers' all-gather."""
        done = [self.comm(step.purpose, step.op, step.bytes) for step in gpt.pipeline_handoff(self.shape)]
        if len(done) == 1:
            return done[0]
        latency = sum(comm.latency_us for comm in done)
        source = max((comm.resolution.source for comm in done), key=SOURCES.index)
        detail = " then ".join(f"{comm.op} of {comm.bytes:,} bytes over {comm.group_size}: {comm.resolution.detail}"
                               for comm in done)
        return CommWork(done[0].op, done[0].bytes, done[0].group_size, latency, Resolution(latency, source, detail))

    def buckets(self, backward: PhaseWork) -> list[Bucket]:
        """Gradient buckets of a chunk, as PyTorch DDP and Megatron fill them: parameters in reverse order of
        definition, a bucket closing once it holds ``dp_bucket_mb`` MiB. A bucket can be reduced once the
        backward of the block holding its last parameter is done (an index into ``backward.blocks``). The
        buckets are one chain of reductions: replicas' straggler wait counts once, on the last
        (:func:`~vtrain.simulate.collective_latency.wait_once`). Each chunk gets its own objects (a task's work is
        counted by its identity: :func:`~vtrain.simulate.summary.coverage`)."""
        key = self._key("buckets", tuple((block.kind, block.phase) for block in backward.blocks))
        if key not in self._resolved:
            self._resolved[key] = [(bucket.after_block, bucket.comm, bucket.gather)
                                   for bucket in self._buckets(backward)]
        return [Bucket(after, _copy(comm), _copy(gather) if gather is not None else None)
                for after, comm, gather in self._resolved[key]]  # type: ignore[attr-defined]

    def _buckets(self, backward: PhaseWork) -> list[Bucket]:
        limit = self.config.parallelism.dp_bucket_mb * 2**20
        parameter, gradient, _ = state_bytes(self.config)
        sizes: list[tuple[int, int]] = []  # (after block, parameters)
        filled = 0
        last_block = 0
        with_embedding = any(block.kind == "embedding" for block in backward.blocks)
        for index, block in enumerate(backward.blocks):
            if block.phase != "backward":
                continue
            last_block = index
            for param in reversed(kind_parameters(self.shape, block.kind, with_embedding)):
                filled += math.prod(param)
                if filled * gradient >= limit:
                    sizes.append((index, filled))
                    filled = 0
        if filled:
            sizes.append((last_block, filled))
        sharded = self.shape.optimizer_shards > 1
        reductions = _chain([self.comm("dp", "reduce_scatter" if sharded else "all_reduce", n * gradient)
                             for _, n in sizes])
        gathers = (_chain([self.comm("dp", "all_gather", n * parameter) for _, n in sizes]) if sharded
                   else [None] * len(sizes))
        return [Bucket(after, comm, gather) for (after, _), comm, gather in zip(sizes, reductions, gathers)]

    def graph_inputs(self, chunks: list[list[Chunk]], *, by_shape: bool = False) -> GraphInputs:
        """Resolved work for every (stage, chunk) of the partition.

        ``by_shape``: chunks that hold the same blocks (on the same stage when the gaps are per stage) share one
        forward pass, backward passes and gradient buckets, and stages of the same chunks one optimizer step, made
        for the first of them (their blocks name its layers): the same durations and resolutions, for callers that
        read only those (the plan's timeline and coverage); a pipeline of p one-layer stages makes three shapes,
        not p."""
        par = self.config.parallelism
        stage_of = self.profile_stages()
        self._per_stage = stage_of is not None
        inputs = GraphInputs(forward={}, backward={}, optimizer={}, pp_transfer=None)
        if par.pp > 1:
            inputs.pp_transfer = self.pipeline_transfer()
        chunk_work: dict[tuple[object, ...], _ChunkWork] = {}
        optimizer: dict[tuple[object, ...], PhaseWork] = {}
        for stage_chunks in chunks:
            for chunk in stage_chunks:
                shape = self._chunk_shape(chunk)
                if not by_shape or shape not in chunk_work:
                    chunk_work[shape] = self._chunk_work(chunk)
                key = (chunk.stage, chunk.chunk)
                inputs.forward[key], inputs.backward[(*key, False)], inputs.backward[(*key, True)], buckets = \
                    chunk_work[shape]
                if buckets is not None:
                    inputs.dp_buckets[key] = buckets
            shape = tuple(self._chunk_shape(chunk) for chunk in stage_chunks)
            if not by_shape or shape not in optimizer:
                optimizer[shape] = self.optimizer(stage_chunks)
            inputs.optimizer[stage_chunks[0].stage] = optimizer[shape]
        return inputs

    def _chunk_work(self, chunk: Chunk) -> _ChunkWork:
        """A chunk's forward pass, backward passes (of the first micro-batch, then accumulating) and gradient
        buckets (``None`` without data parallelism)."""
        par = self.config.parallelism
        forward = self.forward(chunk)
        backward = (self.backward(chunk, False), self.backward(chunk, True))
        buckets = self.buckets(backward[par.micro_batches > 1]) if par.dp > 1 else None
        return forward, *backward, buckets

    def _chunk_shape(self, chunk: Chunk) -> tuple[object, ...]:
        """What a chunk's resolved work depends on besides the run: its blocks, and its stage when the gaps are
        per stage."""
        return chunk.shape, chunk.stage if self._per_stage else None


def _chain(comms: list[CommWork]) -> list[CommWork]:
    """Collectives issued back to back, the straggler wait counted once (:func:`wait_once`)."""
    chain = wait_once([comm.resolution for comm in comms])
    return [replace(comm, latency_us=resolution.latency_us, resolution=resolution)
            for comm, resolution in zip(comms, chain)]


def _copy(comm: CommWork) -> CommWork:
    """A collective's work as an object of its own (a task's work is counted by its identity)."""
    return CommWork(comm.op, comm.bytes, comm.group_size, comm.latency_us, comm.resolution)
