"""``simulate()``: from a run config and a profile to a predicted iteration."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vtrain.devices import DeviceModel
from vtrain.fit.device import device_for_run
from vtrain.graph.build import ExecutionGraph, build_graph
from vtrain.model.gpt import GptShape
from vtrain.model.memory import StageMemory, stage_memory
from vtrain.model.partition import partition
from vtrain.runconfig import RunConfig
from vtrain.simulate.collectives import CollectiveResolver
from vtrain.simulate.latency import SOURCES, OpLatencyResolver
from vtrain.simulate.scheduler import Schedule, critical_path, schedule
from vtrain.simulate.summary import CATEGORIES, StageSummary, coverage, describe_task, stage_summaries
from vtrain.simulate.workload import WorkloadResolver
from vtrain.tables.store import Profile


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
        tasks, result = self.graph.tasks, self.schedule
        return {
            "iteration_time_ms": self.iteration_us * ms,
            "breakdown_ms": {key: value * ms for key, value in self.breakdown_us.items()},
            "coverage": self.coverage_share,
            "coverage_ms": {key: value * ms for key, value in self.coverage_us.items()},
            "distinct_signatures": self.distinct_sources,
            "parallelism": {"tp": par.tp, "pp": par.pp, "dp": par.dp, "micro_batches": par.micro_batches,
                            "micro_batch": par.micro_batch, "global_batch": par.global_batch,
                            "schedule": par.schedule, "virtual_stages": par.virtual_stages,
                            "recompute": par.recompute, "dp_overlap": par.dp_overlap},
            "device": {"name": self.device.name, "provenance": self.device.provenance},
            "profile": self.profile_path,
            "stages": [
                {"stage": s.stage, "rank": s.rank, "busy_ms": s.busy_us * ms, "idle_ms": s.idle_us * ms,
                 "breakdown_ms": {k: v * ms for k, v in s.breakdown_us.items()},
                 "memory_gib": _memory_gib(m)}
                for s, m in zip(self.stages, self.memory)
            ],
            "critical_path": [
                {"task": describe_task(tasks[i]), "start_ms": result.start_us[i] * ms,
                 "duration_ms": tasks[i].duration_us * ms}
                for i in self.critical_path
            ],
            "graph": {"tasks": len(tasks), "edges": self.graph.graph.number_of_edges(),
                      "streams": len(self.graph.streams)},
        }


def _memory_gib(memory: StageMemory) -> dict[str, float]:
    gib = 1 / 2**30
    return {"parameters": memory.parameter_bytes * gib, "gradients": memory.gradient_bytes * gib,
            "optimizer": memory.optimizer_bytes * gib, "activations": memory.activation_bytes * gib,
            "total": memory.total_bytes * gib}


def simulate(config: RunConfig, profile: Profile | None = None, device: DeviceModel | None = None,
             source: str | None = None) -> Simulation:
    """Predict one training iteration of ``config``.

    Operator latencies come from ``profile`` when it has them (measured, else interpolated) and from
    ``device`` otherwise (default: the profile's fitted device model on the config's links, else the datasheet
    model of the config's device: :func:`~vtrain.fit.device.device_for_run`). ``source`` names the config file
    in errors.
    """
    config.validate(source)
    with _gc_paused():
        return _simulate(config, profile, device or device_for_run(config, profile, source))


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


def _simulate(config: RunConfig, profile: Profile | None, device: DeviceModel) -> Simulation:
    device_type = "cpu" if config.hardware.device.lower() == "cpu" else "cuda"
    ops = OpLatencyResolver(profile, device, device_type)
    collectives = CollectiveResolver(profile, device, device_type, config.hardware.gpus_per_node)
    workload = WorkloadResolver(config, ops, collectives)
    chunks = partition(config)
    graph = build_graph(config, workload.graph_inputs(chunks))
    result = schedule(graph)
    par = config.parallelism
    ranks = [stage * par.tp * par.dp for stage in range(par.pp)]
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
