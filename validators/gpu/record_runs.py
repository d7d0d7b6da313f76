"""The GPU recordings shipped in ``traces/gpu-*``: how they were made (``vtrain record`` on one GPU).

Run on a machine with one CUDA GPU, from the repository root, needing only torch, numpy and PyYAML (no vtrain
install)::

    PYTHONPATH=. python3 validators/gpu/record_runs.py OUT_DIR [--only NAME,...]

Each run below is recorded into ``OUT_DIR/NAME`` with :func:`vtrain.record.launcher.record` (the code behind
``vtrain record``; its flags are in the comment of each run) and its ``run.yaml`` holds, besides the config, the
loss per iteration and the peak memory ``torch.cuda.max_memory_allocated`` measured over the iterations.
A run that fails is said on one line and the others go on; the last line says how many were recorded.

* ``mem-*``: the memory model against measured peaks (``tests/test_gpu_recordings.py``): fp32 and the recorder's
  bf16 (bf16 parameters, gradients and Adam moments), without and with full recomputation, two shapes.
* ``val-*``: the predictor (``profiles/h200``, and profiles of the ``mem-*`` and ``small-*`` recordings) on
  training-sized layers of GPT-3 350M, 1.3B, 2.7B, 6.7B and 13B.
* ``small-eager`` and ``small-graphs``: one small model recorded eagerly and with every layer replayed from CUDA
  graphs (``--cuda-graphs``): real traces whose kernels are launched one by one and by ``cudaGraphLaunch``, with
  the same losses if the graphs replay the same kernels.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

from vtrain.record.launcher import record
from vtrain.runconfig import ModelConfig, ParallelConfig, RunConfig

#: name -> (model, micro-batch, global batch, recompute, precision, cuda graphs, profiled steps, warm-up)
RUNS = {
    # vtrain record --layers 6 --hidden 2048 --heads 16 --seq 2048 --vocab 32000 --micro-batch 4 --global-batch 8
    #   --precision fp32|bf16 --recompute none|full --steps 2 --warmup 1
    "mem-fp32-none": (ModelConfig(6, 2048, 16, 2048, 32000), 4, 8, "none", "fp32", False, 2, 1),
    "mem-fp32-full": (ModelConfig(6, 2048, 16, 2048, 32000), 4, 8, "full", "fp32", False, 2, 1),
    "mem-bf16-none": (ModelConfig(6, 2048, 16, 2048, 32000), 4, 8, "none", "bf16", False, 2, 1),
    "mem-bf16-full": (ModelConfig(6, 2048, 16, 2048, 32000), 4, 8, "full", "bf16", False, 2, 1),
    # vtrain record --layers 4 --hidden 4096 --heads 32 --seq 1024 --vocab 32000 --micro-batch 2 --global-batch 4
    #   --precision bf16 --steps 2 --warmup 1
    "mem-bf16-wide": (ModelConfig(4, 4096, 32, 1024, 32000), 2, 4, "none", "bf16", False, 2, 1),
    # vtrain record --layers 2 --hidden 1024 --heads 16 --seq 1024 --vocab 32000 --micro-batch 2 --global-batch 4
    #   --precision bf16 --steps 3 --warmup 2 [--cuda-graphs]
    "small-eager": (ModelConfig(2, 1024, 16, 1024, 32000), 2, 4, "none", "bf16", False, 3, 2),
    "small-graphs": (ModelConfig(2, 1024, 16, 1024, 32000), 2, 4, "none", "bf16", True, 3, 2),
    # the predictor on training-sized layers, none of them timed by layer_kernels.py's tables as such:
    # vtrain record --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 --micro-batch 4 --global-batch 8
    "val-gpt1.3b": (ModelConfig(24, 2048, 16, 2048, 51200), 4, 8, "none", "bf16", False, 2, 1),
    # vtrain record --layers 4 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 2 --global-batch 8
    "val-gpt6.7b-4l": (ModelConfig(4, 4096, 32, 2048, 51200), 2, 8, "none", "bf16", False, 2, 1),
    # vtrain record --layers 2 --hidden 5120 --heads 40 --seq 2048 --vocab 51200 --micro-batch 1 --global-batch 4
    #   --recompute full
    "val-gpt13b-2l": (ModelConfig(2, 5120, 40, 2048, 51200), 1, 4, "full", "bf16", False, 2, 1),
    # added in a later session, held out from every profile made before: a width no recording or kernel table has,
    # a long micro-batch of short sequences with full recomputation, and a small model bound by kernel launches
    # vtrain record --layers 4 --hidden 2560 --heads 32 --seq 2048 --vocab 51200 --micro-batch 2 --global-batch 8
    "val-gpt2.7b-4l": (ModelConfig(4, 2560, 32, 2048, 51200), 2, 8, "none", "bf16", False, 2, 1),
    # vtrain record --layers 8 --hidden 2048 --heads 16 --seq 1024 --vocab 51200 --micro-batch 8 --global-batch 16
    #   --recompute full
    "val-gpt1.3b-8l-mb8-full": (ModelConfig(8, 2048, 16, 1024, 51200), 8, 16, "full", "bf16", False, 2, 1),
    # vtrain record --layers 12 --hidden 1024 --heads 16 --seq 1024 --vocab 51200 --micro-batch 1 --global-batch 4
    #   --steps 3 --warmup 2
    "val-gpt350m-mb1": (ModelConfig(12, 1024, 16, 1024, 51200), 1, 4, "none", "bf16", False, 3, 2),
}


def _record_one(name: str, out: Path) -> None:
    model, micro_batch, global_batch, recompute, precision, graphs, steps, warmup = RUNS[name]
    config = RunConfig(model=model, precision=precision, cuda_graphs=graphs,
                       parallelism=ParallelConfig(micro_batch=micro_batch, global_batch=global_batch,
                                                  recompute=recompute))
    started = time.perf_counter()
    result = record(config, out / name, steps=steps, warmup=warmup, device="cuda", force=True)
    peak = result.config.recording.get("peak_memory_bytes")
    print(f"{name}: {time.perf_counter() - started:.1f} s, loss {result.losses}, peak {peak}", flush=True)


def main() -> int:
    """Record every run (or those named by ``--only``); the number that failed is the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default=",".join(RUNS))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}", flush=True)
    failed = 0
    for name in args.only.split(","):
        try:
            _record_one(name, args.out)
        except Exception:  # one line per failed run; the others go on
            failed += 1
            print(f"{name}: FAILED", file=sys.stderr)
            traceback.print_exc()
    print(f"{len(args.only.split(',')) - failed} recorded, {failed} failed", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
