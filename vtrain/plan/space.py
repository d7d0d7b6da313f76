"""The design space of a training run: every (t, d, p, micro-batch, schedule, virtual stages, recomputation,
gradient all-reduce overlap) for a number of GPUs, and which of them are valid.

Per GPU count N the grid is: t a power of two up to the GPUs of one node (tensor parallelism stays inside a
node, as in Megatron), p every divisor of N/t, d = N/(t·p); micro-batch 1 … ``max_micro_batch``; the schedule
1F1B or GPipe (one model chunk per stage) or interleaved 1F1B with v model chunks for every divisor v > 1 of
the layer count (a sweep over every count up to N takes only the divisible points: p dividing the layers, d the
global batch, the micro-batch the replica's batch, v the stage's layers); recomputation none or full; the
all-reduce overlapped or not (only when d > 1: without data parallelism there is nothing to overlap); for Megatron
runs, sequence parallelism with and without (t > 1), and, when asked (``vtrain plan --distributed-optimizer``),
Megatron's distributed optimizer with and without (d > 1). A point is *invalid* when the run config rejects it
(:meth:`vtrain.runconfig.RunConfig.constraint_errors`: heads, hidden or layers not divisible, global batch not
divisible by d·micro-batch, interleaved micro-batches not divisible by p), or when it asks for a pipeline
schedule without a pipeline (GPipe or interleaved with p = 1 is 1F1B).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from vtrain.errors import InputError
from vtrain.limits import INTEGER_BOUNDS, shown_count
from vtrain.runconfig import RECOMPUTE, RunConfig

#: the largest GPU count ``--gpus`` takes: a run config's bound on its device count
MOST_GPUS = INTEGER_BOUNDS["device_count"][1]

#: schedules with one model chunk per stage; interleaved takes each divisor v > 1 of the layers
FLAT_SCHEDULES = ("1f1b", "gpipe")


@dataclass(frozen=True)
class Candidate:
    """One point of the design space."""

    gpus: int
    tp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    virtual_stages: int
    recompute: str
    dp_overlap: bool
    sequence_parallel: bool = False
    distributed_optimizer: bool = False

    def config(self, base: RunConfig) -> RunConfig:
        """``base`` (model, precision, hardware, global batch) with this point's parallelism and GPU count; its
        layers split over the stages as ``base`` splits them where the point has ``base``'s stages (one chunk
        each), else evenly."""
        run = base.with_overrides(tp=self.tp, pp=self.pp, dp=self.dp, micro_batch=self.micro_batch,
                                  schedule=self.schedule, virtual_stages=self.virtual_stages,
                                  recompute=self.recompute, dp_overlap=self.dp_overlap,
                                  sequence_parallel=self.sequence_parallel,
                                  distributed_optimizer=self.distributed_optimizer)
        return replace(run, parallelism=replace(run.parallelism, stage_layers=self.stage_layers(base)),
                       hardware=replace(run.hardware, device_count=self.gpus))

    def stage_layers(self, base: RunConfig) -> tuple[int, ...] | None:
        """The layers of each stage where the point splits them unevenly: ``base``'s split at ``base``'s own depth
        with one chunk a stage, else None (an even split)."""
        return base.parallelism.stage_layers if _has_split(base, self.pp) and self.virtual_stages == 1 else None

    def as_row(self, base: RunConfig) -> dict[str, object]:
        """The point's columns in the plan table (``stage_layers``: an uneven split as text, ``5 6 ... 5``)."""
        split = self.stage_layers(base)
        return {"gpus": self.gpus, "tp": self.tp, "dp": self.dp, "pp": self.pp, "micro_batch": self.micro_batch,
                "schedule": self.schedule, "virtual_stages": self.virtual_stages, "recompute": self.recompute,
                "dp_overlap": self.dp_overlap, "sequence_parallel": self.sequence_parallel,
                "distributed_optimizer": self.distributed_optimizer,
                "stage_layers": " ".join(map(str, split)) if split else None}


def parse_gpus(spec: str, base: RunConfig) -> list[int]:
    """GPU counts from ``--gpus``: ``N[,N...]``, or ``..N`` for every count up to N that some valid
    (t, d, p) reaches (t a power of two within a node, p dividing the layers, d dividing the global batch)."""
    counts: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        upto = part.startswith("..")
        try:
            value = int(part[2:] if upto else part)
        except ValueError:
            raise InputError(f"--gpus: {part!r} is not a number of GPUs (N, N,M or ..N)") from None
        if value < 1:
            raise InputError(f"--gpus: {shown_count(value)} GPUs (must be >= 1)")
        if value > MOST_GPUS:
            raise InputError(f"--gpus: {shown_count(value)} GPUs (at most {MOST_GPUS:,}, the largest device count a "
                             f"run config takes)")
        counts.update(_reachable(value, base) if upto else {value})
    return sorted(counts)


def _has_split(base: RunConfig, stages: int) -> bool:
    """Whether ``base`` says how its layers split over ``stages`` pipeline stages (its ``stage_layers``)."""
    return len(base.parallelism.stage_layers or ()) == stages


def _stage_counts(base: RunConfig) -> list[int]:
    """The pipeline depths whose stages can hold ``base``'s layers: the divisors of the layers, and the depth of
    ``base``'s own uneven split."""
    split = base.parallelism.stage_layers
    return sorted(set(_divisors(base.model.layers)) | ({len(split)} if split else set()))


def _reachable(limit: int, base: RunConfig) -> set[int]:
    batch = base.parallelism.global_batch
    counts = set()
    for t in _powers_of_two(min(limit, max(base.hardware.gpus_per_node, 1))):  # t need not divide the limit
        for p in _stage_counts(base):
            for d in _divisors(batch):
                if t * p * d <= limit:
                    counts.add(t * p * d)
    return counts


def candidates(base: RunConfig, gpus: int, max_micro_batch: int = 8, divisible: bool = False,
               distributed: bool = False) -> Iterator[Candidate]:
    """Every grid point for ``gpus`` GPUs (valid or not). ``divisible``: only the points whose p divides the
    layers, d the global batch, micro-batch the replica's batch and v the stage's layers (the rest are invalid
    anyway; a sweep over every GPU count up to N enumerates only these). ``distributed``: each point with d > 1
    also with Megatron's distributed optimizer."""
    layers, batch = base.model.layers, base.parallelism.global_batch
    for t in _tensor_sizes(gpus, base.hardware.gpus_per_node):
        # Megatron's sequence parallelism, with and without, where there is a tensor-parallel group to split over
        sequence = (False, True) if t > 1 and base.framework == "megatron" else (False,)
        for p in _divisors(gpus // t):
            d = gpus // (t * p)
            if divisible and ((layers % p and not _has_split(base, p)) or batch % d):
                continue
            sharding = (False, True) if d > 1 and distributed else (False,)
            chunks = [v for v in _divisors(layers // p if divisible else layers) if v > 1]
            schedules = [(name, 1) for name in FLAT_SCHEDULES] + [("interleaved", v) for v in chunks]
            for micro_batch in range(1, max_micro_batch + 1):
                if divisible and (batch // d) % micro_batch:
                    continue
                for schedule, v in schedules:
                    for recompute in RECOMPUTE:
                        for overlap in ((False, True) if d > 1 else (False,)):
                            for split in sequence:
                                for sharded in sharding:
                                    yield Candidate(gpus, t, p, d, micro_batch, schedule, v, recompute, overlap,
                                                    split, sharded)


def invalid_reason(candidate: Candidate, base: RunConfig) -> str | None:
    """Why a point is invalid (the first broken constraint), or ``None``."""
    if candidate.pp == 1 and candidate.schedule != "1f1b":
        return f"{candidate.schedule} needs pp > 1 (with one stage it is 1f1b)"
    errors = candidate.config(base).constraint_errors()
    return errors[0] if errors else None


def _tensor_sizes(gpus: int, node: int) -> list[int]:
    """The tensor-parallel sizes of ``gpus`` GPUs: powers of two within a node that divide them."""
    return [t for t in _powers_of_two(min(gpus, max(node, 1))) if gpus % t == 0]


def _powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to ``limit``."""
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]
