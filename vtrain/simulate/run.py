"""``simulate()``: from a run config and a profile to a predicted iteration."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from vtrain.devices import DeviceModel
from vtrain.errors import warn_input
from vtrain.fit.device import device_for_run, latencies_apply
from vtrain.graph.build import ExecutionGraph, build_graph
from vtrain.graph.work import GraphInputs, steps_of
from vtrain.kineto import ATTENTION_OPS, FUSED_ATTENTION, UNFUSED_ATTENTION
from vtrain.model.gpt import GptShape
from vtrain.model.memory import StageMemory, measured_miss, stage_memory
from vtrain.model.ops import Op
from vtrain.partition import Chunk, partition
from vtrain.parallel import Layout
from vtrain.runconfig import RunConfig
from vtrain.simulate.collective_latency import CollectiveResolver
from vtrain.simulate.latency import SOURCES, HostGapResolver, OpLatencyResolver
from vtrain.simulate.list_scheduler import Schedule, critical_path, schedule
from vtrain.simulate.summary import CATEGORIES, StageSummary, coverage, describe_task, stage_summaries
from vtrain.simulate.workload import ResolvedWork, WorkloadResolver
from vtrain.tables.store import Profile


#: the share of a timeline's kernel time in operators a run does not place beyond which that is said
#: (:func:`unplaced_kernel_time`; vtrain's own GPU recordings: under 1 %; Megatron-core without apex under
#: ``framework: megatron``: 28-29 %)
UNPLACED_SHARE = 0.1


@dataclass
class Simulation:
    """A predicted iteration: the graph, when each task ran, and what it adds up to."""

    config: RunConfig
    device: DeviceModel
    graph: ExecutionGraph
    schedule: Schedule
    stages: list[StageSummary]
    coverage_us: dict[str, float]
    critical_path: list[int]
    memory: list[StageMemory]
    profile_path: str | None
    distinct_sources: dict[str, int]  # distinct op/collective signatures resolved from each source

    @property
    def iteration_us(self) -> float:
        return self.schedule.makespan_us

    @cached_property
    def operator_names(self) -> frozenset[str]:
        """The names of the operators the run places (every pass, block and optimizer step)."""
        return frozenset(resolved.step.name for work in self.graph.works for resolved in steps_of(work)
                         if isinstance(resolved.step, Op))  # type: ignore[attr-defined]

    @property
    def vocab_rows(self) -> int:
        """The rows of the embedding and output layer, the vocabulary padded as the framework pads it
        (:attr:`~vtrain.model.gpt.GptShape.vocab_per_rank`: Megatron to a multiple of 128·t)."""
        return GptShape.from_config(self.config).vocab_per_rank * self.config.parallelism.tp

    @property
    def largest_stage_bytes(self) -> int:
        """Memory per GPU of the pipeline stage that needs the most (the memory model)."""
        return max((memory.total_bytes for memory in self.memory), default=0)

    @property
    def fits_device(self) -> bool | None:
        """Whether the largest stage fits the device's memory as plans take it (unless even the lowest measured peak
        its need stands for is over: :func:`~vtrain.model.memory.measured_miss`); ``None``: the device's memory is not
        known."""
        capacity = self.device.memory_bytes
        return None if not capacity else measured_miss(self.largest_stage_bytes, capacity)[0]

    @cached_property
    def breakdown_us(self) -> dict[str, float]:
        """Mean over stages of each stage's breakdown (sums to the iteration time)."""
        n = len(self.stages)
        return {key: sum(s.breakdown_us[key] for s in self.stages) / n for key in CATEGORIES}

    @property
    def coverage_share(self) -> dict[str, float]:
        """Share of predicted device time that was measured / interpolated / modelled."""
        total = sum(self.coverage_us.values())
        return {key: (value / total if total > 0 else 0.0) for key, value in self.coverage_us.items()}

    def to_dict(self) -> dict[str, Any]:
        """The JSON summary (``vtrain simulate --json``)."""
        ms = 1e-3
        par = self.config.parallelism
        graph, result = self.graph, self.schedule
        return {
            "iteration_time_ms": self.iteration_us * ms,
            "breakdown_ms": {key: value * ms for key, value in self.breakdown_us.items()},
            "coverage": self.coverage_share,
            "coverage_ms": {key: value * ms for key, value in self.coverage_us.items()},
            "distinct_signatures": self.distinct_sources,
            "model": {**asdict(self.config.model), "ffn": self.config.model.ffn,
                      "kv_heads": self.config.model.query_groups, "vocab_rows": self.vocab_rows},
            "parallelism": {"tp": par.tp, "pp": par.pp, "dp": par.dp, "micro_batches": par.micro_batches,
                            "micro_batch": par.micro_batch, "global_batch": par.global_batch,
                            "schedule": par.schedule, "virtual_stages": par.virtual_stages,
                            "recompute": par.recompute, "dp_overlap": par.dp_overlap,
                            "sequence_parallel": par.sequence_parallel,
                            "distributed_optimizer": par.distributed_optimizer,
                            "stage_layers": list(par.stage_layers) if par.stage_layers else None},
            "cuda_graphs": self.config.cuda_graphs,
            "precision": self.config.precision,
            "framework": self.config.framework,
            "fused_kernels": self.config.fused_kernels,
            "attention": self.config.attention,
            "device": {"name": self.device.name, "provenance": self.device.provenance},
            "profile": self.profile_path,
            "stages": [
                {"stage": s.stage, "rank": s.rank, "busy_ms": s.busy_us * ms, "idle_ms": s.idle_us * ms,
                 "breakdown_ms": {k: v * ms for k, v in s.breakdown_us.items()},
                 "memory_gib": m.gib()}
                for s, m in zip(self.stages, self.memory)
            ],
            "critical_path": [
                {"task": describe_task(task), "start_ms": start * ms, "duration_ms": task.duration_us * ms}
                for task, start in zip(graph.tasks_at(self.critical_path),
                                       result.start_us[self.critical_path].tolist())
            ],
            "graph": {"tasks": len(graph), "edges": graph.edge_count, "streams": len(graph.streams)},
        }


def simulate(config: RunConfig, profile: Profile | None = None, device: DeviceModel | None = None,
             source: str | None = None, *, shared: SharedResolvers | None = None) -> Simulation:
    """Predict one training iteration of ``config``.

    Operator latencies come from ``profile`` when it has them (measured, else interpolated) and from
    ``device`` otherwise (default: the profile's fitted device model on the config's links, else the datasheet
    model of the config's device: :func:`~vtrain.fit.device.device_for_run`). ``source`` names the config file
    in errors. ``shared``: resolvers of the same ``profile`` and ``device`` that earlier runs were resolved
    through (a table of runs: :func:`~vtrain.simulate.measured_runs.predict_runs`): the same prediction, without
    resolving again what they share; ``distinct_sources`` then counts every signature resolved through them.
    """
    config.validate(source)
    with _gc_paused():
        return _simulate(config, profile, device or device_for_run(config, profile, source), shared)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the graph is built: its tens of thousands of small objects
    (no cycles among them; reference counting frees them) would otherwise trigger full collections that cost
    more than the simulation itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def resolve_work(config: RunConfig, profile: Profile | None, device: DeviceModel,
                 shared: SharedResolvers | None = None, *, by_shape: bool = False,
                 ) -> tuple[list[list[Chunk]], GraphInputs, OpLatencyResolver, CollectiveResolver]:
    """The partition of a consistent ``config`` and every task's resolved work (what the graph is built from),
    with the resolvers that resolved it (from ``shared`` when given: a sweep's runs share them). ``by_shape``:
    chunks of the same shape share their work (:meth:`~vtrain.simulate.workload.WorkloadResolver.graph_inputs`),
    for callers that read only durations and resolutions."""
    shared = shared or SharedResolvers(profile, device)
    chunks = partition(config)
    collectives = shared.collectives(config)
    placed = WorkloadResolver(config, shared.bare_ops(config), collectives)
    stage_of = placed.profile_stages()
    # what the profile's timeline is measured between: its own run's operators (this run's if it does not say)
    signatures, per_iteration = shared.traced_run() or (frozenset(placed.placed(chunks)),
                                                        placed.ops_per_iteration(chunks))
    ops, gaps = shared.ops(config, signatures, stage_of, per_iteration)
    inputs = WorkloadResolver(config, ops, collectives, gaps, shared.work).graph_inputs(chunks, by_shape=by_shape)
    return chunks, inputs, ops, collectives


class SharedResolvers:
    """The latency resolvers of one profile and device model, shared by every run resolved through it.

    Collective latencies depend only on the collective, group, bytes and rank stride, so one resolver serves all
    runs with the same node size. Operator latencies are calibrated (interference factors, host gaps) on the
    calls of the operators a run places that the profile's timeline holds, so runs share an operator resolver
    when those are the same signatures on the same profile stages; and they share what was resolved with those
    (:attr:`work`: blocks, optimizer steps, gradient buckets). Every run resolved through it gets what a fresh
    :func:`resolve_work` would give it.
    """

    def __init__(self, profile: Profile | None, device: DeviceModel) -> None:
        self.profile = profile if latencies_apply(profile, device.name) else None  # not another GPU's latencies
        self.device = device
        self._collectives: dict[tuple[str, int], CollectiveResolver] = {}
        self._bare: dict[str, OpLatencyResolver] = {}
        self._timeline: frozenset[tuple[str, str, str]] | None = None
        self._traced: tuple[frozenset[tuple[str, str, str]], dict[str, float]] | tuple[()] | None = None
        self._ops: dict[tuple[str, frozenset[tuple[str, str, str]], tuple[tuple[int, int], ...] | None],
                        tuple[OpLatencyResolver, HostGapResolver]] = {}
        self.work: ResolvedWork = {}

    def held(self) -> int:
        """How much it holds (calibrated operator resolvers and resolved blocks, steps and buckets), for callers that
        resolve an unbounded number of runs through it: past a bound, a fresh one costs less than the memory."""
        return len(self._ops) + len(self.work)

    def collectives(self, config: RunConfig) -> CollectiveResolver:
        """The collective resolver for the config's device type and node size."""
        key = (_device_type(config), config.hardware.gpus_per_node)
        if key not in self._collectives:
            self._collectives[key] = CollectiveResolver(self.profile, self.device, *key)
        return self._collectives[key]

    def bare_ops(self, config: RunConfig) -> OpLatencyResolver:
        """An uncalibrated operator resolver, never resolved with (to ask a workload what it places)."""
        device_type = _device_type(config)
        if device_type not in self._bare:
            self._bare[device_type] = OpLatencyResolver(self.profile, self.device, device_type)
        return self._bare[device_type]

    def ops(self, config: RunConfig, placed: frozenset[tuple[str, str, str]], stage_of: dict[int, int] | None,
            per_iteration: dict[str, float]) -> tuple[OpLatencyResolver, HostGapResolver]:
        """The operator resolver and host-gap resolver calibrated for these placed signatures and stages, the
        traced run placing ``per_iteration`` operators per rank and iteration in each phase."""
        device_type = _device_type(config)
        placed = placed & self._timeline_signatures()  # the calibration sees only calls in the timeline
        key = (device_type, placed, tuple(sorted(stage_of.items())) if stage_of is not None else None,
               tuple(sorted(per_iteration.items())))
        if key not in self._ops:
            ops = OpLatencyResolver(self.profile, self.device, device_type)
            gaps = HostGapResolver(self.profile, device_type)
            gaps.fit(set(placed), stage_of, per_iteration)
            ops.calibrate(gaps.events, stage_of)
            self._ops[key] = (ops, gaps)
        return self._ops[key]

    def traced_run(self) -> tuple[frozenset[tuple[str, str, str]], dict[str, float]] | None:
        """What the model places in the run the profile's timeline recorded, when the profile describes that run
        (:meth:`~vtrain.tables.store.Profile.traced_run`): its operators' signatures and how many it places per
        rank and iteration in each phase; ``None`` otherwise.

        The profile's host gaps and interference are measured between the operators the model places *in the
        traced run*: everything else there is time between them. Measured between another run's signatures
        instead, every operator of the traced run whose shape differs (a wider layer, another vocabulary) would
        count as gap, and a profile of a small run would add the whole of its own compute to a larger one's
        host time."""
        if self._traced is None:
            traced = self.profile.traced_run() if self.profile is not None else None
            if traced is None:
                self._traced = ()
            else:
                resolver = WorkloadResolver(traced, self.bare_ops(traced), self.collectives(traced))
                chunks = partition(traced)
                self._traced = (frozenset(resolver.placed(chunks)), resolver.ops_per_iteration(chunks))
                self._check_traced(traced, self._traced[0])
                self._check_attention(traced)
        return self._traced or None

    def _check_traced(self, traced: RunConfig, placed: frozenset[tuple[str, str, str]]) -> None:
        """Warn when fewer than half the operator signatures of the run the profile says it recorded are in its
        timeline (61-100 % in the recordings shipped; a run.yaml of another run beside the traces, e.g. another
        width, 21 %; Megatron-core without apex, whose attention is not the fused one ``framework: megatron``
        places, 30 %): the timeline's host time is then measured between the wrong operators. The warning names
        the operators the model does not place that hold the most kernel time: they say which of the two it is."""
        timeline = self._timeline_signatures()
        found = len(placed & timeline)
        if timeline and placed and found < len(placed) / 2:
            assert self.profile is not None
            model = traced.model
            unplaced = unplaced_kernel_time(self.profile, {signature[0] for signature in placed})
            warn_input(f"the run the profile says it recorded (metadata.json's run: {model.layers} layers, hidden "
                       f"{model.hidden}, sequence {model.seq}) places only {found} of its {len(placed)} operator "
                       f"signatures where its timeline has calls{', and ' + unplaced if unplaced else ''}: is it the "
                       f"run these traces are of, and framework {traced.framework}'s operators the ones that ran? "
                       f"Host time measured between the wrong operators is wrong", self.profile.path)

    def _check_attention(self, traced: RunConfig) -> None:
        """Warn when the profile's timeline and the run it says it recorded disagree on attention
        (:func:`attention_mismatch`)."""
        assert self.profile is not None
        said = attention_mismatch(self._timeline_signatures(), traced)
        if said:
            warn_input(said, self.profile.source)

    def _timeline_signatures(self) -> frozenset[tuple[str, str, str]]:
        """Signatures of the operator calls in the profile's timeline (CPU ops and GPU kernels' launching ops)."""
        if self._timeline is None:
            self._timeline = self.profile.digest.timeline if self.profile is not None else frozenset()
        return self._timeline


def attention_mismatch(timeline: Iterable[tuple[str, str, str]], run: RunConfig) -> str | None:
    """Why a timeline (operator signatures) is not of ``run``'s attention: fused attention operators
    (:data:`~vtrain.kineto.FUSED_ATTENTION`, not :data:`~vtrain.kineto.UNFUSED_ATTENTION`) where the run computes
    its scores, or none where it fuses them (a timeline with no operators says nothing); ``None`` when they agree.
    Either way its attention would be predicted with operators that did not run. Only operators count (``aten::...``,
    ``flash_attn::...``): a user's span or a module named for flash attention
    (``record_function("flash_attention_block")``) runs no kernel."""
    names = {name for name, _, _ in timeline if name and "::" in name}
    fused = sorted(name for name in names if FUSED_ATTENTION.search(name) and not UNFUSED_ATTENTION.search(name))
    if fused and run.attention == "eager":
        shown = ", ".join(fused[:2]) + (", ..." if len(fused) > 2 else "")
        said = f"the traces run fused attention ({shown}) but the run computes its scores (attention eager): "
        if ATTENTION_OPS.isdisjoint(fused):
            return said + ("vtrain places fused attention only as PyTorch's FlashAttention operators (attention: "
                           "flash), which these are not: their time is predicted as the scores' operators")
        return said + "say attention: flash in its run config"
    if names and not fused and run.attention == "flash":
        return ("the run fuses its attention (attention: flash) but the traces have no fused attention operator: "
                "say attention: eager in its run config")
    return None


def unplaced_kernel_time(profile: Profile, names: Iterable[str]) -> str:
    """``"28% of the timeline's kernel time is in operators the model does not place (aten::_softmax 7%, ...)"``:
    the share of the timeline's computation kernels launched by operators whose names are not among ``names`` (the
    operators a run places), and the three that hold most; ``""`` when that share is under a tenth. Kernels
    without a launching operator, and those a CUDA graph's launch released (the graph's module names them), are
    left out: no name says what they are."""
    import polars as pl  # only when a check is due: the prediction path does not import polars

    from vtrain.tables.schema import COMPUTATION

    kernels = profile.tables.get("kernels")
    if kernels is None or kernels.is_empty():
        return ""
    kernels = kernels.filter((pl.col("kernel_class") == COMPUTATION) & pl.col("cpu_op").is_not_null())
    launches = profile.tables.get("graph_launches")
    if launches is not None and launches.height:
        kernels = kernels.filter(~pl.col("correlation").is_in(launches["correlation"].implode()))
    total = kernels["dur"].sum() if kernels.height else 0.0
    unplaced = kernels.filter(~pl.col("cpu_op").is_in(sorted(set(names)))).group_by("cpu_op").agg(
        pl.col("dur").sum())
    if not total or unplaced["dur"].sum() < UNPLACED_SHARE * total:
        return ""
    top = unplaced.sort(["dur", "cpu_op"], descending=[True, False]).head(3)
    named = ", ".join(f"{op} {dur / total:.0%}" for op, dur in top.iter_rows())
    return (f"{unplaced['dur'].sum() / total:.0%} of the timeline's kernel time is in operators the model does not "
            f"place ({named}, ...)")


def _device_type(config: RunConfig) -> str:
    return "cpu" if config.hardware.device.lower() == "cpu" else "cuda"


def _simulate(config: RunConfig, profile: Profile | None, device: DeviceModel,
              shared: SharedResolvers | None = None) -> Simulation:
    chunks, inputs, ops, collectives = resolve_work(config, profile, device, shared)
    graph = build_graph(config, inputs)
    result = schedule(graph)
    layout = Layout.of(config)
    ranks = [layout.rank(stage, 0, 0) for stage in range(layout.pp)]
    shape = GptShape.from_config(config)
    distinct = Counter(r.source for r in (*ops.resolved(), *collectives.resolved()))
    return Simulation(
        config=config, device=device, graph=graph, schedule=result,
        stages=stage_summaries(graph, result, result.makespan_us, ranks),
        coverage_us=coverage(graph), critical_path=critical_path(graph, result),
        memory=[stage_memory(config, shape, stage_chunks) for stage_chunks in chunks],
        profile_path=str(profile.path) if profile is not None and profile.path is not None else None,
        distinct_sources={key: distinct.get(key, 0) for key in SOURCES},
    )
