"""The one place the studies ask `vtrain plan` for a speed: the best plan of a workload on a number of GPUs.

Each (workload, GPUs) is searched once and kept, by `vtrain plan`'s sweep (:func:`vtrain.plan.sweep.sweep`). The
studies search hundreds of (model, GPU count) pairs, so they sweep a part of the design space: every (t, d, p)
and micro-batch up to ``max_micro_batch``, with 1F1B and the gradient all-reduce overlapped (when d > 1)
(:func:`studied`), and recomputation only where the plan does not fit without it (:func:`first_that_fits`:
recomputing never makes an iteration faster). Everything else is the sweep's: enumeration and validity rules,
memory model, timing (`vtrain simulate`'s iteration time from the profile, through one set of latency resolvers
for every sweep) and cost. With the GPU count fixed, the fastest plan is the cheapest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from vtrain.errors import InputError
from vtrain.plan.space import Candidate
from vtrain.runconfig import FRAMEWORKS, HardwareConfig, ModelConfig, ParallelConfig, RunConfig
from vtrain.simulate.latency import SOURCES
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
    framework: str = "megatron"  # whose kernels, mixed precision and optimizer states (a run config's framework)
    attention: str = "eager"  # eager or flash (a run config's attention)

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise InputError(f"--framework must be one of {', '.join(FRAMEWORKS)} (got {self.framework!r})")


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
        from vtrain.plan.sweep import sweep

        self.sweeps += 1
        base = self.base_config(workload, gpus)
        table = sweep(base, [gpus], self.profile, divisible=True, device_memory_gib=self.memory_gib(base),
                      max_micro_batch=self.max_micro_batch, within=studied, select=first_that_fits,
                      shared=self._resolvers(base))
        rows = [{key: row[key] for key in _PLAN_KEYS} for row in table.simulated().iter_rows(named=True)]
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
            raise InputError(f"the device {base.hardware.device} has no memory size: give --device-memory")
        return memory / GIB

    def base_config(self, workload: Workload, gpus: int) -> RunConfig:
        """The run config a sweep of ``workload`` on ``gpus`` GPUs starts from."""
        c = self.cluster
        hardware = replace(HardwareConfig(), device=c.device, device_count=gpus, gpus_per_node=c.gpus_per_node,
                           inter_node_gbps=c.inter_node_gbps)
        return RunConfig(model=workload.model, parallelism=ParallelConfig(global_batch=workload.global_batch),
                         precision=c.precision, hardware=hardware, framework=c.framework, attention=c.attention)


#: what a prediction says of its plan: the plan table's columns for the point, its memory, time, speed and sources
_PLAN_KEYS = ("gpus", "tp", "dp", "pp", "micro_batch", "schedule", "virtual_stages", "recompute", "dp_overlap",
              "memory_gib", "iteration_ms", "tokens_per_s", "mfu", *SOURCES)


#: the studies' part of the design space, in words, for their reports and JSON (:func:`studied`)
STUDIED_SPACE = ("A best plan here is the best of the vTrain paper's design space: every (t, d, p) and micro-batch, "
                 "1F1B with the gradient all-reduce overlapped, recomputation none or full; not interleaving, "
                 "selective recomputation, sequence parallelism or the distributed optimizer, which `vtrain plan` "
                 "searches too and which can be faster.")


def studied(candidate: Candidate) -> bool:
    """The studies' part of the design space, the vTrain paper's: 1F1B, the gradient all-reduce overlapped when
    there is one, recomputation none or full, no sequence parallelism nor distributed optimizer (the divisible
    points only: the sweep is asked for them)."""
    return (candidate.schedule == "1f1b" and candidate.dp_overlap == (candidate.dp > 1)
            and candidate.recompute != "selective" and not candidate.sequence_parallel
            and not candidate.distributed_optimizer)


def first_that_fits(fitting: list[Candidate]) -> list[Candidate]:
    """Of the plans that fit, per (t, p, micro-batch), the first in enumeration order: without recomputation
    when that fits, else with it."""
    chosen: dict[tuple[int, int, int], Candidate] = {}
    for candidate in fitting:
        chosen.setdefault((candidate.tp, candidate.pp, candidate.micro_batch), candidate)
    return list(chosen.values())


def plan_throughput(profile_dir: Path | None, cluster: Cluster, max_micro_batch: int = 4) -> PlanThroughput:
    """A :class:`PlanThroughput` on the profile folder ``profile_dir`` (None: every latency modelled)."""
    from vtrain.tables.store import load_profile

    return PlanThroughput(load_profile(profile_dir) if profile_dir is not None else None, cluster, max_micro_batch)


def describe(cluster: Cluster) -> str:
    """``A100, 8 GPUs per node, 1600 Gbit/s per node`` for a report."""
    network = f"{cluster.inter_node_gbps:g} Gbit/s per node" if cluster.inter_node_gbps else "the profile's network"
    memory = f", {cluster.device_memory_gib:g} GiB per GPU" if cluster.device_memory_gib else ""
    return (f"{cluster.device}, {cluster.gpus_per_node} GPUs per node, {network}{memory}, {cluster.framework}'s "
            f"kernels, {cluster.attention} attention")


def peak_flops(cluster: Cluster) -> float:
    """Peak FLOP/s of one of the cluster's GPUs at its precision (the device's datasheet)."""
    from vtrain.devices import device_for_config
    from vtrain.model.ops import PRECISION_DTYPE

    config = RunConfig(model=ModelConfig(layers=1, hidden=64, heads=1, seq=1), precision=cluster.precision,
                       hardware=replace(HardwareConfig(), device=cluster.device))
    return device_for_config(config).peak_for(PRECISION_DTYPE[cluster.precision])
