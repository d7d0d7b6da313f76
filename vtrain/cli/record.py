"""`vtrain record ... -o traces/NAME`: train a GPT with real 3D parallelism and record one Kineto trace per rank."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import typer

from vtrain.cli.errors import user_errors, warn
from vtrain.cli.options import attention_option, ffn_hidden_option, kv_heads_option, mlp_option
from vtrain.errors import InputError
from vtrain.limits import MAX_RECORD_STEPS, MAX_RECORD_THREADS, MAX_RECORD_WARMUP, shown_count
from vtrain.runconfig import ModelConfig, ParallelConfig, RunConfig

EXIT_RANK_FAILED = 1


@user_errors
def record_command(
    layers: int = typer.Option(..., "--layers", help="Transformer layers."),
    hidden: int = typer.Option(..., "--hidden", help="Hidden size."),
    heads: int = typer.Option(..., "--heads", help="Attention heads."),
    seq: int = typer.Option(..., "--seq", help="Sequence length."),
    vocab: int = typer.Option(..., "--vocab", help="Vocabulary size (divisible by --tp)."),
    ffn_hidden: int | None = ffn_hidden_option(),
    kv_heads: int | None = kv_heads_option(),
    mlp: str = mlp_option(),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel size."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel size."),
    micro_batch: int = typer.Option(..., "--micro-batch", help="Sequences per micro-batch."),
    global_batch: int = typer.Option(..., "--global-batch", help="Sequences per iteration, all replicas."),
    schedule: str = typer.Option("1f1b", "--schedule", help="Pipeline schedule: 1f1b, gpipe or interleaved."),
    virtual_stages: int = typer.Option(1, "--virtual-stages", help="Model chunks per stage (interleaved)."),
    recompute: str = typer.Option("none", "--recompute",
                                  help="Activation recomputation: none or full (selective: only simulated)."),
    dp_overlap: bool = typer.Option(False, "--dp-overlap/--no-dp-overlap",
                                    help="Overlap the gradient all-reduce with the last backward."),
    dp_bucket_mb: float = typer.Option(25.0, "--dp-bucket-mb", help="Gradient all-reduce bucket size (MB)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32 or bf16."),
    attention: str | None = attention_option("How each layer runs attention: "),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda (auto: cuda when available)."),
    steps: int = typer.Option(3, "--steps", help="Profiled iterations."),
    warmup: int = typer.Option(1, "--warmup", help="Iterations run under the profiler before recording."),
    seed: int = typer.Option(1234, "--seed", help="Seed of the weights and the synthetic data."),
    threads: int | None = typer.Option(None, "--threads", help="Intra-op threads per rank (default: the cores "
                                       "shared evenly among the ranks); recorded in run.yaml."),
    cuda_graphs: bool = typer.Option(False, "--cuda-graphs", help="Replay every layer's forward and backward "
                                     "from CUDA graphs (one GPU, 1f1b, no recomputation)."),
    output: Path = typer.Option(..., "-o", "--output", help="Trace folder to write (rank-N.json.gz, run.yaml)."),
    force: bool = typer.Option(False, "--force", help="Replace the output folder if it exists."),
) -> None:
    """Train a GPT with real tensor, pipeline and data parallelism and record one Kineto trace per rank."""
    _check_counts(steps, warmup, threads)
    config = RunConfig(
        model=ModelConfig(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn_hidden=ffn_hidden,
                          kv_heads=kv_heads, mlp=mlp),
        parallelism=ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch,
                                   schedule=schedule, virtual_stages=virtual_stages, recompute=recompute,
                                   dp_overlap=dp_overlap, dp_bucket_mb=dp_bucket_mb),
        precision=precision,
        attention=attention or "eager",
        cuda_graphs=cuda_graphs,
    )
    from vtrain.record.cuda_graphs import check_graphable  # torch: only when recording
    from vtrain.record.launcher import RankFailure, record, resolve_device

    if resolve_device(device) == "cpu":
        if config.cuda_graphs:
            check_graphable(config, "cpu")  # says that graphs need a CUDA device
        _check_fits_in_memory(config)
    try:
        result = record(config, output, steps=steps, warmup=warmup, seed=seed, device=device, force=force,
                        threads=threads)
    except RankFailure as exc:
        print(f"error: {output}: {exc}", file=sys.stderr)
        raise typer.Exit(EXIT_RANK_FAILED) from None
    if result is None:  # a torchrun rank other than 0
        return
    hw = result.config.hardware
    loss = " -> ".join(f"{x:.4f}" for x in (result.losses[0], result.losses[-1])) if result.losses else "n/a"
    print(f"{result.path}: {hw.device_count} rank(s) on {hw.device} ({hw.cores} cores), "
          f"{steps} profiled step(s) after {warmup} warm-up, loss {loss}, {result.seconds:.1f} s")


def _check_counts(steps: int, warmup: int, threads: int | None) -> None:
    """An error for more iterations or threads than :mod:`vtrain.limits` allows a recording (10^8 steps ran
    without end, 10^5 threads exhausted the process limit); a warning for more threads than this machine has
    cores. The lower bounds are the recorder's (:func:`vtrain.record.launcher.check_recordable`)."""
    for flag, value, high in (("--steps", steps, MAX_RECORD_STEPS), ("--warmup", warmup, MAX_RECORD_WARMUP),
                              ("--threads", threads, MAX_RECORD_THREADS)):
        if value is not None and value > high:
            raise InputError(f"{flag} must be at most {high:,} (got {shown_count(value)})")
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        warn(f"--threads {threads} is more than this machine's {cores} cores: each rank's threads will share them")


def _check_fits_in_memory(config: RunConfig) -> None:
    """An error for a CPU recording whose ranks need more memory, by the memory model (parameters, gradients,
    optimizer state, activations; no framework overhead, so less than they will use), than the machine has
    available: a typo (``--hidden 65536``) would otherwise start allocating hundreds of GB and bring the machine
    into swap or the out-of-memory killer."""
    from vtrain.model.memory import GIB, peak_stage_memory

    ranks = config.parallelism.world_size
    config = replace(config, hardware=replace(config.hardware, device_count=ranks))  # one device a rank, as recorded
    config.validate()  # the memory model needs a consistent run
    available = _available_memory_bytes()
    needed = peak_stage_memory(config).total_bytes * ranks
    if available is not None and needed > available:
        raise InputError(f"the {ranks} rank(s) need at least {needed / GIB:,.1f} GiB (memory model: parameters, "
                         f"gradients, optimizer state, activations); this machine has {available / GIB:,.1f} GiB "
                         f"available")


def _available_memory_bytes() -> int | None:
    """Memory available to new processes without swapping (Linux's MemAvailable), None where not known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
