"""The one place the studies ask `vtrain plan` for a speed: the best plan of a workload on a number of GPUs.

Each (workload, GPUs) is searched once and kept. The studies search hundreds of (model, GPU count) pairs, so they
search a part of `vtrain plan`'s design space (:func:`study_candidates`): every (t, d, p) and micro-batch up to
``max_micro_batch``, with 1F1B and the gradient all-reduce overlapped (when d > 1), and recomputation only where
the plan does not fit without it (recomputing never makes an iteration faster). Everything else is `vtrain
plan`'s: its enumeration and validity rules (:mod:`vtrain.plan.space`), its memory model, its timing of a plan
(:func:`vtrain.plan.evaluate.time_plan`, `vtrain simulate`'s iteration time from the profile, through one
set of latency resolvers for every plan) and its cost
(:func:`vtrain.plan.cost.plan_cost`). With the GPU count fixed, the fastest plan is the cheapest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vtrain.plan.space import Candidate
from vtrain.runconfig import HardwareConfig, ModelConfig, ParallelConfig, RunConfig
from vtrain.simulate.run import SharedResolvers
from vtrain.studies.throughput import Prediction, Workload
from vtrain.tables.store import Profile


@dataclass(frozen=True)
class Cluster:
    """The machines the workloads run on (as a run config's hardware section)."""

    device: str = "A100"
    gpus_per_node: int = 8
    inter_node_gbps: float | None = None  # Gbit/s per node; None: the profile's own
    device_memory_gib: float | None = None  # None: the device's
    precision: str = "fp16"


@dataclass
class PlanThroughput:
    """A :data:`~vtrain.studies.throughput.Throughput` backed by `vtrain plan` sweeps, one per (workload, GPUs).

    ``max_micro_batch`` bounds the sweep (the plan command's default is 8; the studies sweep hundreds of
    (model, GPU count) pairs, and larger micro-batches rarely win at the batch sizes they use)."""

    profile: Profile | None
    cluster: Cluster = field(default_factory=Cluster)
    max_micro_batch: int = 4
    sweeps: int = 0  # how many sweeps ran (each (workload, GPUs) once)
    _cache: dict[tuple[Workload, int], Prediction | None] = field(default_factory=dict)
    _shared: dict[str, SharedResolvers] = field(default_factory=dict)

    def __call__(self, workload: Workload, gpus: int) -> Prediction | None:
        key = (workload, gpus)
        if key not in self._cache:
            self._cache[key] = self._best(workload, gpus)
        return self._cache[key]

    def _best(self, workload: Workload, gpus: int) -> Prediction | None:
        from vtrain.plan.report import label

        self.sweeps += 1
        base = self.base_config(workload, gpus)
        rows = best_plan_rows(base, study_candidates(base, gpus, self.max_micro_batch, self.memory_gib(base)),
                              self._resolvers(base))
        if not rows:
            return None
        best = max(rows, key=lambda row: row["tokens_per_s"])
        return Prediction(tokens_per_s=best["tokens_per_s"], plan=best, label=label(best))

    def _resolvers(self, base: RunConfig) -> SharedResolvers:
        """One set of latency resolvers for every plan timed (they depend on the profile and device only), on the
        device every prediction uses (:func:`~vtrain.fit.device.device_for_run`)."""
        from vtrain.fit.device import device_for_run

        device = device_for_run(base, self.profile)
        if device.name not in self._shared:
            self._shared[device.name] = SharedResolvers(self.profile, device)
        return self._shared[device.name]

    def memory_gib(self, base: RunConfig) -> float:
        """GiB per GPU a plan may use: the cluster's, else the device's."""
        if self.cluster.device_memory_gib is not None:
            return self.cluster.device_memory_gib
        from vtrain.devices import device_for_config
        from vtrain.model.memory import GIB

        memory = device_for_config(base).memory_bytes
        if memory is None:
            raise ValueError(f"the device {base.hardware.device} has no memory size: give the device memory")
        return memory / GIB

    def base_config(self, workload: Workload, gpus: int) -> RunConfig:
        """The run config a sweep of ``workload`` on ``gpus`` GPUs starts from."""
        c = self.cluster
        hardware = replace(HardwareConfig(), device=c.device, device_count=gpus, gpus_per_node=c.gpus_per_node,
                           inter_node_gbps=c.inter_node_gbps)
        return RunConfig(model=workload.model, parallelism=ParallelConfig(global_batch=workload.global_batch),
                         precision=c.precision, hardware=hardware)


def study_candidates(base: RunConfig, gpus: int, max_micro_batch: int,
                     memory_gib: float) -> list[tuple[Candidate, float]]:
    """The valid plans of the studies' part of the design space that fit in ``memory_gib``, with their memory."""
    from vtrain.model.memory import GIB, peak_stage_memory
    from vtrain.plan.space import candidates, invalid_reason

    chosen: dict[tuple[int, int, int], tuple[Candidate, float]] = {}
    for candidate in candidates(base, gpus, max_micro_batch, divisible=True):  # the rest are invalid anyway
        key = (candidate.tp, candidate.pp, candidate.micro_batch)
        if candidate.schedule != "1f1b" or candidate.dp_overlap != (candidate.dp > 1) or key in chosen:
            continue  # "none" comes before "full" recomputation: the first that fits is kept
        if invalid_reason(candidate, base) is not None:
            continue
        need = peak_stage_memory(candidate.config(base)).total_bytes / GIB
        if need <= memory_gib:
            chosen[key] = (candidate, need)
    return list(chosen.values())


def best_plan_rows(base: RunConfig, plans: list[tuple[Candidate, float]],
                   shared: SharedResolvers) -> list[dict[str, Any]]:
    """Each plan timed as `vtrain plan` times it, with its speed, MFU and where its latencies came from."""
    from vtrain.model.ops import PRECISION_DTYPE
    from vtrain.plan.cost import Pricing, plan_cost
    from vtrain.plan.evaluate import time_plan

    peak = shared.device.peak_for(PRECISION_DTYPE[base.precision])
    rows = []
    for candidate, memory in plans:
        timing = time_plan(candidate.config(base), shared)
        iteration_s = timing.iteration_us / 1e6
        cost = plan_cost(iteration_s, candidate.gpus, base.model, base.parallelism.global_batch, Pricing(), peak)
        rows.append({**candidate.as_row(), "memory_gib": memory, "iteration_ms": iteration_s * 1e3,
                     "tokens_per_s": cost.tokens_per_s, "mfu": cost.mfu, **timing.coverage})
    return rows


def plan_throughput(profile_dir: Path | None, cluster: Cluster, max_micro_batch: int = 4) -> PlanThroughput:
    """A :class:`PlanThroughput` on the profile folder ``profile_dir`` (None: every latency modelled)."""
    from vtrain.tables.store import load_profile

    return PlanThroughput(load_profile(profile_dir) if profile_dir is not None else None, cluster, max_micro_batch)


def describe(cluster: Cluster) -> str:
    """``A100, 8 GPUs per node, 1600 Gbit/s per node`` for a report."""
    network = f"{cluster.inter_node_gbps:g} Gbit/s per node" if cluster.inter_node_gbps else "the profile's network"
    memory = f", {cluster.device_memory_gib:g} GiB per GPU" if cluster.device_memory_gib else ""
    return f"{cluster.device}, {cluster.gpus_per_node} GPUs per node, {network}{memory}"


def peak_flops(cluster: Cluster) -> float:
    """Peak FLOP/s of one of the cluster's GPUs at its precision (the device's datasheet)."""
    from vtrain.devices import device_for_config
    from vtrain.model.ops import PRECISION_DTYPE

    config = RunConfig(model=ModelConfig(layers=1, hidden=64, heads=1, seq=1), precision=cluster.precision,
                       hardware=replace(HardwareConfig(), device=cluster.device))
    return device_for_config(config).peak_for(PRECISION_DTYPE[cluster.precision])
