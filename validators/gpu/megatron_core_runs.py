"""GPT runs trained by NVIDIA's Megatron-core itself on one GPU: traces made outside vtrain, and measured peaks for
the memory model of ``framework: megatron``.

Run on a machine with one CUDA GPU, from the repository root, with megatron-core 0.16.1 (the PyPI wheel, installed
without its optional dependencies: no Transformer Engine, no apex) beside torch, numpy and PyYAML::

    pip install --no-deps --target /tmp/site megatron_core-0.16.1-*.whl
    PYTHONPATH=/tmp/site:. python3 validators/gpu/megatron_core_runs.py OUT [--only NAME,...] [--steps N] [--cpu-smoke]

Each run below trains a GPT as Megatron-LM's ``pretrain_gpt.py`` does on one GPU (t = p = d = 1): the local
(pure PyTorch) layer spec, ``GPTModel`` with tied embeddings and learned positions, bf16 parameters in
``Float16Module``, Megatron's ``DistributedDataParallel`` (fp32 gradient buffer), its mixed-precision optimizer
(fp32 master weights and Adam moments, gradient clipping at 1.0), the no-pipelining schedule of
``get_forward_backward_func`` and ``finalize_model_grads``. Dropout is Megatron's default (0.1 on the hidden states
and on the attention probabilities). What differs from ``pretrain_gpt.py``'s defaults, for want of apex and
Transformer Engine: the softmax is PyTorch's (``masked_softmax_fusion`` off: Megatron-LM's fused kernel comes with
apex), in bf16 as Megatron-LM's default (``attention_softmax_in_fp32=False``); bias-GeLU and bias-dropout-add are
unfused (TransformerConfig's defaults: Megatron-LM would ``torch.compile`` them); Adam is torch's ``AdamW``, which
Megatron-core falls back to (``recording.optimizer_class``), not apex's fused one.

Each run writes ``OUT_DIR/NAME/rank-0.json.gz`` (the torch profiler's Kineto trace of iterations 1 and 2, CPU and
CUDA activities, shapes recorded, ``ProfilerStep#1`` and ``#2``; iteration 0 is the warm-up) and
``OUT_DIR/NAME/run.yaml`` in vtrain's run-config schema (``framework: megatron``, ``fused_kernels: false``) with
the loss and wall time of every iteration and the peak ``torch.cuda.max_memory_allocated`` of the two profiled
iterations. Its summary line puts beside the peak the prediction of ``vtrain.model.memory.peak_stage_memory`` for
the written run.yaml. A run that fails is said on one line with its traceback and the others go on; the last line
says how many were recorded.

``--cpu-smoke`` runs a tiny model for one iteration on the CPU (gloo): process groups, model-parallel state,
``GPTModel`` on the local spec in ``Float16Module``, the forward step and loss function through Megatron's own
``forward_step`` and ``backward_step``, the profiler, trace and run.yaml. What it leaves out, Megatron-core being
CUDA-only there: ``model_parallel_cuda_manual_seed`` and the CUDA RNG tracker (the smoke run uses Megatron's
inference tracker, whose dropout needs no CUDA RNG state; full and selective recomputation save CUDA RNG states,
so the smoke run has none), ``DistributedDataParallel`` (CUDA grad buffers), ``get_megatron_optimizer``'s
mixed-precision optimizer (CUDA parameter types only), the ``get_forward_backward_func`` loop (a CUDA token
counter) and ``finalize_model_grads``. It points ``torch.cuda.current_device`` at the CPU for Megatron's attention
buffer (``GlobalMemoryBuffer``). Those parts were checked on a CPU with torch.cuda's entry points pointed at the
CPU (a throwaway shim, not kept): every run's path, recomputation included, ran three iterations.

Written for vtrain to check its Megatron memory model and to ingest traces it did not record, from megatron-core
0.16.1's own sources (``megatron/core``): every call below is that version's API.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import os
import platform
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml
from torch.profiler import ProfilerActivity, profile, schedule

from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.package_info import __version__ as MEGATRON_VERSION
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.pipeline_parallel.schedules import backward_step, forward_step
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import Float16Module

SEED = 1234
LR = 1e-4
WARMUP = 1
PORT = 29561
GIB = 2**30


class Run(NamedTuple):
    """A GPT and how it is trained: ``micro_batches`` micro-batches of ``micro_batch`` sequences an iteration."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int  # already a multiple of 128 (Megatron-LM's make_vocab_size_divisible_by): not padded again
    micro_batch: int
    micro_batches: int
    recompute: str  # none | full (uniform, one layer a checkpoint) | selective (Megatron-core's "core_attn")


RUNS = {
    "mcore-gpt1.3b-none": Run(24, 2048, 16, 2048, 51200, 4, 2, "none"),
    "mcore-gpt1.3b-full": Run(24, 2048, 16, 2048, 51200, 4, 2, "full"),
    "mcore-gpt1.3b-selective": Run(24, 2048, 16, 2048, 51200, 4, 2, "selective"),
    "mcore-6l-h4096-none": Run(6, 4096, 32, 2048, 51200, 2, 2, "none"),
    "mcore-12l-h1024-s1024": Run(12, 1024, 16, 1024, 51200, 8, 2, "none"),
}
#: --cpu-smoke: one iteration of this, no warm-up
SMOKE_RUN = Run(2, 64, 4, 32, 256, 2, 2, "none")

#: recompute -> TransformerConfig's settings for it
RECOMPUTE = {
    "none": {},
    "full": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    "selective": {"recompute_granularity": "selective"},  # recompute_modules defaults to ["core_attn"]
}


def transformer_config(run: Run, cpu: bool) -> TransformerConfig:
    """Megatron-core's config of the run: bf16, 4h MLP, GeLU, LayerNorm, biases, dropout 0.1 (its defaults)."""
    return TransformerConfig(
        num_layers=run.layers, hidden_size=run.hidden, num_attention_heads=run.heads,
        bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        hidden_dropout=0.1, attention_dropout=0.1, attention_softmax_in_fp32=False,
        use_cpu_initialization=cpu, **RECOMPUTE[run.recompute])


def build_model(config: TransformerConfig, run: Run, cpu: bool) -> torch.nn.Module:
    """``GPTModel`` on the local spec, in ``Float16Module`` and, on a GPU, Megatron's DDP (as Megatron-LM's
    ``get_model``: ``.cuda()``, then the bf16 wrapper, then DDP)."""
    model: torch.nn.Module = GPTModel(
        config, get_gpt_layer_local_spec(), vocab_size=run.vocab, max_sequence_length=run.seq,
        pre_process=True, post_process=True, share_embeddings_and_output_weights=True,
        position_embedding_type="learned_absolute")
    if not cpu:
        model.cuda(torch.cuda.current_device())
    model = Float16Module(config, model)
    if cpu:
        return model
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    return DistributedDataParallel(config, ddp_config, module=model)


def build_optimizer(model: torch.nn.Module) -> Any:
    """Megatron's mixed-precision Adam (bf16 parameters, fp32 main gradients, master weights and moments)."""
    config = OptimizerConfig(optimizer="adam", lr=LR, bf16=True, params_dtype=torch.bfloat16,
                             use_distributed_optimizer=False, clip_grad=1.0)
    return get_megatron_optimizer(config, [model])


def optimizer_class(optimizer: Any) -> str:
    """The optimizer's wrappers down to the torch optimizer that steps, e.g. ``Float16OptimizerWithFloat16Params >
    torch.optim.adam.AdamW``."""
    names = []
    while optimizer is not None:
        cls = type(optimizer)
        names.append(cls.__name__ if cls.__module__.startswith("megatron") else f"{cls.__module__}.{cls.__name__}")
        chained = getattr(optimizer, "chained_optimizers", None)
        optimizer = chained[0] if chained else getattr(optimizer, "optimizer", None)
    return " > ".join(names)


def micro_batches(run: Run, iteration: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Random tokens (seeded by iteration) in ``pretrain_gpt.py``'s batch layout: tokens, labels (the next
    tokens), loss mask, position ids and the causal mask (True where a token may not attend)."""
    generator = torch.Generator().manual_seed(SEED + iteration)
    causal = torch.tril(torch.ones(run.seq, run.seq, device=device)).view(1, 1, run.seq, run.seq) < 0.5
    positions = torch.arange(run.seq, device=device).unsqueeze(0).expand(run.micro_batch, -1)
    batches = []
    for _ in range(run.micro_batches):
        text = torch.randint(0, run.vocab, (run.micro_batch, run.seq + 1), generator=generator).to(device)
        batches.append({"tokens": text[:, :-1].contiguous(), "labels": text[:, 1:].contiguous(),
                        "loss_mask": torch.ones(run.micro_batch, run.seq, device=device),
                        "position_ids": positions, "attention_mask": causal})
    return batches


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``pretrain_gpt.py``'s: the summed token losses and the token count (the schedule divides one by the other
    and by the micro-batches), and both for reporting."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    tokens = mask.sum().to(torch.int)
    return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.detach().float()])}


def forward_step_func(data_iterator: Iterator[dict[str, torch.Tensor]], model: torch.nn.Module
                      ) -> tuple[torch.Tensor, Callable]:
    """One micro-batch through the model, which returns the per-token losses [b, s] (labels given)."""
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


def mean_loss(reports: list[dict[str, torch.Tensor]]) -> float:
    """The iteration's loss per token, from the loss function's reports."""
    total = torch.stack([report["lm loss"] for report in reports]).sum(dim=0)
    return float(total[0] / total[1])


def train_iteration(model: torch.nn.Module, optimizer: Any, run: Run, batches: list[dict[str, torch.Tensor]]
                    ) -> float:
    """One iteration as Megatron-LM's ``train_step``: zero the grad buffer and the optimizer, forward and backward
    every micro-batch (``get_forward_backward_func``, which ends with ``finalize_model_grads``), step."""
    model.zero_grad_buffer()
    optimizer.zero_grad()
    reports = get_forward_backward_func()(
        forward_step_func=forward_step_func, data_iterator=iter(batches), model=[model],
        num_microbatches=run.micro_batches, seq_length=run.seq, micro_batch_size=run.micro_batch,
        forward_only=False)
    optimizer.step()
    return mean_loss(reports)


def smoke_iteration(model: torch.nn.Module, run: Run, batches: list[dict[str, torch.Tensor]]) -> float:
    """The CPU stand-in of :func:`train_iteration`: the same loop as ``forward_backward_no_pipelining``, through
    Megatron's own ``forward_step`` and ``backward_step``; no DDP, no optimizer."""
    config, data, reports = model.config, iter(batches), []
    for index in range(run.micro_batches):
        output, _ = forward_step(forward_step_func, data, model, run.micro_batches, None, reports, config,
                                 cp_group_size=1, is_first_microbatch=index == 0, current_microbatch=index)
        backward_step(None, output, None, model.module.model_type, config)
    return mean_loss(reports)


def trace_profiler(trace: Path, warmup: int, steps: int, cuda: bool) -> profile:
    """The profiler as ``vtrain record`` sets it (``vtrain/record/profiling.py``): ``steps`` iterations kept after
    ``warmup``, written gzipped to ``trace`` when done. Call ``.step()`` after every iteration."""

    def export(prof: profile) -> None:
        if cuda:
            torch.cuda.synchronize()
        plain = trace.with_name(f".{trace.name}.json")
        prof.export_chrome_trace(str(plain))
        with open(plain, "rb") as source, gzip.open(trace, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target, 1 << 20)
        plain.unlink()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    return profile(activities=activities, record_shapes=True,
                   schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1), on_trace_ready=export)


class Measured(NamedTuple):
    """What one run measured: the loss and wall time of every iteration, the profiled iterations' peak memory
    (``None`` on the CPU) and the optimizer that stepped."""

    losses: list[float]
    iteration_ms: list[float]
    peak_bytes: int | None
    optimizer_class: str


def train_and_profile(run: Run, folder: Path, cpu: bool, steps: int) -> Measured:
    """Build the run's model and optimizer in fresh model-parallel state, train it under the profiler and measure
    it; the state (and its attention buffer) is destroyed after, whatever happens."""
    parallel_state.initialize_model_parallel(1, 1)
    try:
        return _train_and_profile(run, folder, cpu, steps)
    finally:
        gc.collect()
        if not cpu:
            torch.cuda.empty_cache()
        parallel_state.destroy_model_parallel()


def _train_and_profile(run: Run, folder: Path, cpu: bool, steps: int) -> Measured:
    if cpu:  # the dropout's RNG fork without CUDA RNG states
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(SEED)
    torch.manual_seed(SEED)
    device = torch.device("cpu" if cpu else "cuda")
    config = transformer_config(run, cpu)
    model = build_model(config, run, cpu)
    optimizer = None if cpu else build_optimizer(model)
    if optimizer is not None:  # as Megatron-LM's train(): the loss goes through the optimizer's scale
        config.grad_scale_func = optimizer.scale_loss
        config.finalize_model_grads_func = finalize_model_grads
    warmup, steps = (0, 1) if cpu else (WARMUP, steps)
    batches = [micro_batches(run, iteration, device) for iteration in range(warmup + steps)]
    losses, times = [], []
    with trace_profiler(folder / "rank-0.json.gz", warmup, steps, not cpu) as prof:
        for iteration, iteration_batches in enumerate(batches):
            if not cpu and iteration == warmup:
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            if optimizer is None:
                losses.append(smoke_iteration(model, run, iteration_batches))
            else:
                losses.append(train_iteration(model, optimizer, run, iteration_batches))
                torch.cuda.synchronize()
            times.append((time.perf_counter() - started) * 1e3)
            prof.step()
    peak = None if cpu else torch.cuda.max_memory_allocated()
    return Measured(losses, times, peak, optimizer_class(optimizer) if optimizer is not None else "none")


def run_yaml(run: Run, measured: Measured, cpu: bool, steps: int) -> dict[str, Any]:
    """vtrain's run config of the run, as ``vtrain record`` writes it, with what was measured."""
    cuda = not cpu
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else None
    warmup, steps = (0, 1) if cpu else (WARMUP, steps)
    return {
        "model": {"layers": run.layers, "hidden": run.hidden, "heads": run.heads, "seq": run.seq, "vocab": run.vocab},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": run.micro_batch,
                        "global_batch": run.micro_batch * run.micro_batches, "schedule": "1f1b",
                        "virtual_stages": 1, "recompute": run.recompute, "dp_overlap": False, "dp_bucket_mb": 25.0,
                        "sequence_parallel": False},
        "precision": "bf16",
        "hardware": {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "device_count": 1,
                     "gpus_per_node": 1, "cores": os.cpu_count(), "intra_node_gbps": None, "inter_node_gbps": None},
        "framework": "megatron",
        "fused_kernels": False,  # no apex, no Transformer Engine: PyTorch's LayerNorm, softmax, bias adds, AdamW
        "software": {"vtrain": "0.1.0", "torch": str(torch.__version__), "python": platform.python_version(),
                     "cuda": torch.version.cuda, "nccl": nccl, "backend": "gloo" if cpu else "nccl",
                     "megatron_core": MEGATRON_VERSION},
        "recording": {"steps": steps, "warmup": warmup, "seed": SEED, "optimizer": "adam", "lr": LR,
                      "threads": torch.get_num_threads(), "loss": [round(loss, 6) for loss in measured.losses],
                      "peak_memory_bytes": [measured.peak_bytes] if measured.peak_bytes is not None else None,
                      "made_by": f"validators/gpu/megatron_core_runs.py (megatron-core {MEGATRON_VERSION}, "
                                 "local spec)",
                      "optimizer_class": measured.optimizer_class,
                      "iteration_ms": [round(ms, 3) for ms in measured.iteration_ms]},
    }


def predicted_bytes(run_yaml_path: Path) -> int | None:
    """vtrain's peak for the run (``peak_stage_memory``), or None where vtrain's memory model does not import."""
    try:
        from vtrain.model.memory import peak_stage_memory
        from vtrain.runconfig import load_run_config
    except ImportError:
        return None
    return peak_stage_memory(load_run_config(run_yaml_path)).total_bytes


def record_one(name: str, run: Run, out: Path, cpu: bool, steps: int) -> None:
    """Train, profile and describe one run into ``out/name``; print its summary line."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    measured = train_and_profile(run, folder, cpu, steps)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(run_yaml(run, measured, cpu, steps), sort_keys=False))
    predicted = predicted_bytes(path)
    line = f"{name}: {time.perf_counter() - started:.1f} s, loss {[round(x, 4) for x in measured.losses]}"
    if measured.peak_bytes is not None:
        line += f", peak {measured.peak_bytes / GIB:.2f} GiB"
    if predicted is None:
        line += ", model: vtrain.model.memory does not import here"
    else:
        line += f", model {predicted / GIB:.2f} GiB"
        if measured.peak_bytes:
            line += f" ({100 * (predicted - measured.peak_bytes) / measured.peak_bytes:+.1f} %)"
    print(f"{line}, {measured.optimizer_class}", flush=True)


def init_distributed(cpu: bool) -> None:
    """One process group for every run: a world of one rank (NCCL on the GPU, gloo for the smoke run)."""
    if not cpu:
        torch.cuda.set_device(0)
    else:  # Megatron's attention buffer (GlobalMemoryBuffer) asks torch.cuda for its device
        torch.cuda.current_device = lambda: "cpu"
    torch.distributed.init_process_group("gloo" if cpu else "nccl", world_size=1, rank=0,
                                         init_method=f"tcp://127.0.0.1:{PORT}")


def main() -> int:
    """Record every run (or those named by ``--only``); the number that failed is the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default=",".join(RUNS))
    parser.add_argument("--cpu-smoke", action="store_true", help="one iteration of a tiny model on the CPU")
    parser.add_argument("--steps", type=int, default=2, help="profiled iterations after the warm-up one")
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(RUNS)
    if unknown:
        parser.error(f"no run named {', '.join(sorted(unknown))}; the runs: {', '.join(RUNS)}")
    runs = {"smoke-cpu": SMOKE_RUN} if args.cpu_smoke else {name: RUNS[name] for name in args.only.split(",")}
    device = "cpu" if args.cpu_smoke else torch.cuda.get_device_name(0)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, megatron-core {MEGATRON_VERSION}, {device}",
          flush=True)
    init_distributed(args.cpu_smoke)
    failed = 0
    for name, run in runs.items():
        try:
            record_one(name, run, args.out, args.cpu_smoke, args.steps)
        except Exception:  # one line per failed run; the others go on
            failed += 1
            print(f"{name}: FAILED", file=sys.stderr, flush=True)
            traceback.print_exc()
    torch.distributed.destroy_process_group()
    print(f"{len(runs) - failed} recorded, {failed} failed", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
