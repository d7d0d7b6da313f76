"""One rank of a recording: build its share of the model, train and profile, write its trace.

:func:`run_rank` is the entry point of every rank, whether started by :mod:`vtrain.record.launcher` (one
process per rank, ``torch.multiprocessing`` spawn, ``file://`` rendezvous) or by ``torchrun`` (``env://``).
Each rank writes ``rank-N.json.gz`` into the staging folder and a ``.rank-N.json`` with the mean micro-batch loss
per iteration (on the ranks that compute it: last pipeline stage, tensor-parallel rank 0) and, on GPUs, the rank's
peak memory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from vtrain.naming import rank_trace_file
from vtrain.parallel import Layout, stage_order
from vtrain.record.cuda_graphs import graph_layers
from vtrain.record.data import global_batch, replica_micro_batches
from vtrain.record.dataparallel import GradientBuckets
from vtrain.record.model import Init, build_chunks
from vtrain.record.process_groups import build_groups
from vtrain.record.pipeline import PipelineStage
from vtrain.record.profiling import trace_profiler
from vtrain.record.spans import span
from vtrain.runconfig import RunConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class RankJob:
    """Everything a rank needs to know; sent to each spawned process."""

    config: RunConfig
    staging: str  # folder receiving rank-N.json.gz and .rank-N.json
    init_method: str  # file://... (spawned) or env:// (torchrun)
    device: str  # cpu | cuda
    steps: int
    warmup: int
    seed: int
    threads: int  # intra-op threads per rank
    timeout_s: float = 600.0
    log_dir: str | None = None  # when set, the rank's stderr (profiler chatter, warnings) goes to rank-N.log

    @property
    def backend(self) -> str:
        """The torch.distributed backend: nccl on GPUs, gloo on CPUs."""
        return "nccl" if self.device == "cuda" else "gloo"


def result_name(rank: int) -> str:
    """File name of a rank's losses and peak memory (gathered into run.yaml, removed from the final folder)."""
    return f".rank-{rank}.json"


def run_rank(rank: int, job: RankJob) -> None:
    """Join the process group, train ``warmup + steps`` iterations under the profiler, write the trace."""
    if job.log_dir is not None:
        log = os.open(Path(job.log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 2)
        os.close(log)
    torch.set_num_threads(job.threads)
    device = torch.device("cpu")
    if job.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group(job.backend, init_method=job.init_method, rank=rank,
                            world_size=job.config.parallelism.world_size,
                            timeout=timedelta(seconds=job.timeout_s),
                            device_id=device if job.device == "cuda" else None)
    try:
        losses, peak = _train_and_profile(rank, job, device)
        Path(job.staging, result_name(rank)).write_text(
            json.dumps({"rank": rank, "losses": losses, "peak_memory_bytes": peak}))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _train_and_profile(rank: int, job: RankJob, device: torch.device) -> tuple[list[float], int | None]:
    """Train and profile; the mean loss per iteration (on the ranks that compute it, else empty) and, on a GPU,
    the peak of memory allocated from the first iteration to the last (``torch.cuda.max_memory_allocated``:
    parameters, gradients, optimizer state, activations and temporaries; not the caching allocator's spare)."""
    model, par = job.config.model, job.config.parallelism
    layout = Layout(tp=par.tp, pp=par.pp, dp=par.dp)
    chunks_per_stage = par.virtual_stages if par.schedule == "interleaved" else 1
    groups = build_groups(layout, rank, wrap_around=chunks_per_stage > 1)
    dtype = DTYPES[job.config.precision]
    init = Init(job.seed, groups.tp, dtype, device)
    chunks = build_chunks(job.config, groups.pp_rank, init, recompute=par.recompute == "full")
    buckets = []
    if par.dp > 1:
        buckets = [GradientBuckets(list(chunk.parameters()), groups.dp_group, par.dp, par.dp_bucket_mb,
                                   par.dp_overlap, groups.pp_rank, index if chunks_per_stage > 1 else None)
                   for index, chunk in enumerate(chunks)]
    schedule = stage_order(par.schedule, par.pp, par.micro_batches, groups.pp_rank, chunks_per_stage)
    activation_shape = (par.micro_batch, model.seq, model.hidden)
    if job.config.cuda_graphs:
        graph_layers(chunks, activation_shape, dtype, device)
    stage = PipelineStage(chunks, schedule, groups, activation_shape, dtype, device, buckets)
    optimizer = torch.optim.Adam([p for chunk in chunks for p in chunk.parameters()], lr=LEARNING_RATE)
    iterations = job.warmup + job.steps
    batches = [replica_micro_batches(global_batch(job.seed, step, par.global_batch, model.seq, model.vocab),
                                     groups.dp_rank, par.dp, par.micro_batch, device)
               for step in range(iterations)]
    cuda = device.type == "cuda"
    losses: list[list[torch.Tensor]] = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with trace_profiler(Path(job.staging, rank_trace_file(rank)), job.warmup, job.steps, cuda) as prof:
        for micro_batches in batches:
            mb_losses = stage.run(micro_batches)
            for bucket in buckets:
                bucket.finish()
            with span("optimizer", stage=groups.pp_rank):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            prof.step()
            losses.append(mb_losses)
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    if groups.tp.rank != 0 or not losses[0]:
        return [], peak
    return [sum(float(loss) for loss in step) / len(step) for step in losses], peak
