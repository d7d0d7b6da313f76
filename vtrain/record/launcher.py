"""Starting a recording: check the request, run the ranks, and publish the trace folder atomically.

The ranks write into a hidden staging folder next to the target (:func:`vtrain.outputs.staged`; under torchrun
``.NAME.partial-<run id>``, shared by the ranks); only when every rank
has finished, every trace carries its ``distributedInfo`` and ``run.yaml`` is written is the folder renamed to
the target. A rank that fails makes the whole recording fail with :class:`RankFailure` (the other ranks are
stopped), and the staging folder is removed.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

import vtrain
from vtrain.errors import InputError, warn_input
from vtrain.naming import ITERATION_PREFIX, rank_trace_file
from vtrain.outputs import RECORDER, TRACES, check_output, mark, publish, staged
from vtrain.record.cuda_graphs import check_graphable
from vtrain.record.worker import LEARNING_RATE, RankJob, result_name, run_rank
from vtrain.runconfig import HardwareConfig, RunConfig, save_run_config

DEVICES = ("auto", "cpu", "cuda")
PRELOAD = ("vtrain.record.worker", "torch._dynamo")


class RankFailure(Exception):
    """A rank of the recording died; the message is one line naming the rank and its error."""


@dataclass(frozen=True)
class Recording:
    """A finished recording: where it is, its run config, the loss per iteration and the wall time."""

    path: Path
    config: RunConfig
    losses: list[float]
    seconds: float


def resolve_device(requested: str) -> str:
    """``cpu`` or ``cuda`` for a ``--device`` value (``auto`` picks CUDA when available)."""
    if requested not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)} (got {requested!r})")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available to this torch build")
    return requested


def describe_run(config: RunConfig, device: str, steps: int, warmup: int, seed: int,
                 gpus_per_node: int | None = None, threads: int | None = None) -> RunConfig:
    """``config`` with hardware, software and recording filled in for this machine."""
    world = config.parallelism.world_size
    cuda = device == "cuda"
    hardware = HardwareConfig(
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        device_count=world,
        gpus_per_node=gpus_per_node or (torch.cuda.device_count() if cuda else world),
        cores=os.cpu_count(),
    )
    software = {
        "vtrain": vtrain.__version__,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "cuda": torch.version.cuda if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "backend": "nccl" if cuda else "gloo",
    }
    recording = {"steps": steps, "warmup": warmup, "seed": seed, "optimizer": "adam", "lr": LEARNING_RATE}
    if threads is not None:
        recording["threads"] = threads  # intra-op threads per rank (torch.set_num_threads)
    return replace(config, hardware=hardware, software=software, recording=recording)


def check_recordable(config: RunConfig, steps: int, warmup: int, device: str) -> None:
    """Raise :class:`InputError` for anything the recorder cannot run."""
    config.validate()
    m, p = config.model, config.parallelism
    if m.vocab % p.tp:
        raise InputError(f"vocab ({m.vocab}) is not divisible by tp ({p.tp}); the vocabulary-parallel "
                         f"embedding and logits split it evenly (Megatron pads 50257 to 50304)")
    if p.sequence_parallel:
        raise InputError("sequence_parallel is not recorded: the recorder's model is not Megatron's")
    if p.distributed_optimizer:
        raise InputError("distributed_optimizer is not recorded: the recorder's optimizer is not Megatron's")
    if p.recompute == "selective":
        raise InputError("recompute must be one of none, full to record: the recorder checkpoints whole layers "
                         "(selective recomputation is simulated, not recorded)")
    if config.precision == "fp16":
        raise InputError("precision fp16 needs loss scaling, which the recorder does not do; use fp32 or bf16")
    if steps < 1:
        raise InputError(f"--steps must be >= 1 (got {steps})")
    if warmup < 1:
        raise InputError(f"--warmup must be >= 1: the profiler needs a warm-up iteration (got {warmup})")
    if device == "cuda" and not _under_torchrun() and torch.cuda.device_count() < p.world_size:
        raise InputError(f"tp*pp*dp = {p.world_size} ranks need as many GPUs; this machine has "
                         f"{torch.cuda.device_count()} (run through torchrun for several nodes)")


def record(config: RunConfig, out: str | Path, *, steps: int = 3, warmup: int = 1, seed: int = 1234,
           device: str = "auto", force: bool = False, timeout_s: float = 600.0,
           threads: int | None = None) -> Recording | None:
    """Record ``config`` into the folder ``out``: one ``rank-N.json.gz`` per rank plus ``run.yaml``.

    Starts one process per rank, or, when this process was started by torchrun, runs as its rank (then only
    rank 0 publishes the folder and gets a :class:`Recording`; other ranks get ``None``). ``threads`` is the
    number of intra-op threads per rank (default: the machine's cores shared evenly among its ranks). A config
    with ``cuda_graphs`` replays every layer from CUDA graphs (:mod:`vtrain.record.cuda_graphs`).
    """
    started = time.perf_counter()
    device = resolve_device(device)
    world = config.parallelism.world_size
    config = replace(config, hardware=replace(config.hardware, device_count=world, device=device))  # cpu | cuda
    check_recordable(config, steps, warmup, device)
    if config.cuda_graphs:
        check_graphable(config, device)
    out = check_output(out, force=force, command=RECORDER)
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1 (got {threads})")
    threads = threads or max(1, (os.cpu_count() or 1) // _ranks_on_this_machine(world))
    _say_shared_cores(device, _ranks_on_this_machine(world))
    if _under_torchrun():
        if config.cuda_graphs:
            raise InputError("--cuda-graphs records one GPU; torchrun is for several")
        return _record_as_torchrun_rank(config, out, steps, warmup, seed, device, threads, timeout_s, started)

    with staged(out, TRACES, RECORDER) as staging:
        with tempfile.TemporaryDirectory(prefix="vtrain-rendezvous-") as rendezvous:
            job = RankJob(config=config, staging=str(staging), init_method=f"file://{rendezvous}/store",
                          device=device, steps=steps, warmup=warmup, seed=seed, threads=threads,
                          timeout_s=timeout_s, log_dir=rendezvous)
            _spawn(job, world)
        described = describe_run(config, device, steps, warmup, seed, threads=threads)
        recorded, losses = _finish(staging, described, world)
    return Recording(path=out, config=recorded, losses=losses, seconds=time.perf_counter() - started)


def _spawn(job: RankJob, world: int) -> None:
    """Start the ranks from a fork server that has already imported torch (and the dynamo modules that
    ``torch.optim`` pulls in): each rank then starts in a fraction of a second instead of re-importing."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(PRELOAD))
    try:
        mp.start_processes(run_rank, args=(job,), nprocs=world, join=True, start_method="forkserver")
    except mp.ProcessRaisedException as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise RankFailure(f"rank {exc.error_index} failed: {lines[-1].strip()}") from None
    except mp.ProcessExitedException as exc:
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        raise RankFailure(f"rank {exc.error_index} died ({how})") from None


def _finish(staging: Path, config: RunConfig, world: int) -> tuple[RunConfig, list[float]]:
    """Check the traces, gather the losses (and, on GPUs, each rank's peak memory) and write run.yaml into the
    staging folder."""
    for rank in range(world):
        _check_trace(staging / rank_trace_file(rank), rank, world)
    results = []
    for rank in range(world):
        path = staging / result_name(rank)
        if not path.exists():
            raise RankFailure(f"rank {rank} wrote no losses and peak memory ({path.name})")
        results.append(json.loads(path.read_text()))
        path.unlink()
    per_rank = [result["losses"] for result in results if result["losses"]]
    losses = [sum(step) / len(step) for step in zip(*per_rank)] if per_rank else []
    recording = {**config.recording, "loss": [round(x, 6) for x in losses]}
    peaks = [result["peak_memory_bytes"] for result in results]
    if all(peak is not None for peak in peaks):
        recording["peak_memory_bytes"] = peaks  # by rank: torch.cuda.max_memory_allocated over the iterations
    config = replace(config, recording=recording)
    save_run_config(config, staging / "run.yaml")
    return config, losses


def _check_trace(path: Path, rank: int, world: int) -> None:
    if not path.exists():
        raise RankFailure(f"rank {rank} wrote no trace ({path.name})")
    with gzip.open(path, "rt") as handle:
        trace = json.load(handle)
    info = trace.get("distributedInfo") or {}
    if info.get("rank") != rank or info.get("world_size") != world:
        raise RankFailure(f"{path.name}: distributedInfo says rank {info.get('rank')} of "
                          f"{info.get('world_size')}, expected rank {rank} of {world}")
    if not any(str(event.get("name", "")).startswith(ITERATION_PREFIX) for event in trace.get("traceEvents", [])):
        raise RankFailure(f"{path.name}: no ProfilerStep#N spans in the trace")


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def _say_shared_cores(device: str, ranks: int) -> None:
    """A warning when a CPU recording runs more ranks than this machine has cores: they take turns on them, and
    the recording times the waiting with the work (`vtrain validate`'s model is within 5 % of the recorded sets
    with one rank per core; t2p2d2, 8 ranks on 2 cores, +6.5 %)."""
    cores = os.cpu_count() or 1
    if device == "cpu" and ranks > cores:
        warn_input(f"{ranks} ranks on this machine's {cores} cores: they take turns on them, and the recording's "
                   f"times hold the turns as well as the work (fewer ranks, or a machine with a core each, time "
                   f"the work alone)")


def _ranks_on_this_machine(world: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world)) if _under_torchrun() else world


def _record_as_torchrun_rank(config: RunConfig, out: Path, steps: int, warmup: int, seed: int, device: str,
                             threads: int, timeout_s: float, started: float) -> Recording | None:
    """Run as the rank torchrun gave us; rank 0 publishes the folder once every rank has written its trace."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.parallelism.world_size:
        raise InputError(f"torchrun started {world} ranks but tp*pp*dp = {config.parallelism.world_size}")
    staging = out.parent / f".{out.name}.partial-{os.environ['TORCHELASTIC_RUN_ID']}"
    staging.mkdir(parents=True, exist_ok=True)
    job = RankJob(config=config, staging=str(staging), init_method="env://", device=device, steps=steps,
                  warmup=warmup, seed=seed, threads=threads, timeout_s=timeout_s)
    try:
        run_rank(rank, job)
    except Exception:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if rank != 0:
        return None
    try:
        described = describe_run(config, device, steps, warmup, seed,
                                 gpus_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)), threads=threads)
        recorded, losses = _finish(staging, described, world)
        mark(staging, TRACES, command=RECORDER)
        publish(out, staging)
        return Recording(path=out, config=recorded, losses=losses, seconds=time.perf_counter() - started)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
