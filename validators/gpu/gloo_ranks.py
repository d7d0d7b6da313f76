"""Kineto traces of "one rank of many": data parallelism over gloo, every rank on the same GPU; torch only.

NCCL refuses two ranks on one GPU, and the GPU machines we borrow have one. gloo takes CUDA tensors too (it copies
them through host memory), so WORLD processes can all train on ``cuda:0`` with ``backend="gloo"``: each writes a
real CUDA trace of one rank of a world of 2 or 4, with gloo collectives (``record_param_comms``,
``gloo:all_reduce``) where a real job has NCCL kernels. ``--device cpu`` makes the same traces with no GPU (a tiny
model, CPU activity only), to try the script and vtrain's reading of them anywhere.

Run::

    python3 validators/gpu/gloo_ranks.py OUT_DIR                                  # world of 4, every rank's trace
    python3 validators/gpu/gloo_ranks.py OUT_DIR --world 2
    python3 validators/gpu/gloo_ranks.py OUT_DIR --world 4 --profile-ranks 2      # a folder of one rank of four
    python3 validators/gpu/gloo_ranks.py OUT_DIR --device cpu                     # no GPU needed

Each rank trains the small GPT of ``user_traces.py`` (PyTorch's own decoder layers) with DistributedDataParallel,
bf16 autocast on CUDA (fp32 on CPU) and AdamW, under the profiler (CPU and CUDA activity, ``record_shapes``, a
schedule of wait 1, warmup 1, active 2). Only the ranks ``--profile-ranks`` lists run the profiler, each writing
``OUT_DIR/rank-RANK.json`` with ``export_chrome_trace``; the others train unprofiled, as when a user profiles one
rank of a job. Rank 0 prints one line per rank with its steps' times.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, str(Path(__file__).resolve().parent))
import user_traces  # after the path: its Gpt reads the sizes from the module's globals when built

WAIT, WARMUP, ACTIVE = 1, 1, 2
STEPS = WAIT + WARMUP + ACTIVE
# (layers, hidden, heads, seq, vocab, batch): user_traces.py's sizes on CUDA, a tiny model on a small CPU.
SIZES = {"cuda": (4, 512, 8, 512, 8192, 8), "cpu": (2, 256, 4, 128, 1024, 4)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, device: str, out: str, profiled: list[int]) -> None:
    """One rank: gloo process group, DDP, STEPS training steps, this rank's trace if it is profiled."""
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
    if device == "cpu":
        torch.set_num_threads(1)
    layers, hidden, heads, seq, vocab, batch = SIZES[device]
    user_traces.LAYERS, user_traces.HIDDEN, user_traces.HEADS = layers, hidden, heads
    user_traces.SEQ, user_traces.VOCAB = seq, vocab
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    model = nn.parallel.DistributedDataParallel(user_traces.Gpt().to(dev), device_ids=None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    torch.manual_seed(1 + rank)  # each rank its own data
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device == "cuda" else contextlib.nullcontext
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    prof = (profile(activities=activities, record_shapes=True,
                    schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))
            if rank in profiled else contextlib.nullcontext())
    times = []
    with prof:
        for _ in range(STEPS):
            start = time.perf_counter()
            tokens = torch.randint(0, vocab, (batch, seq + 1), device=dev)
            with autocast():
                loss = loss_fn(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if rank in profiled:
                prof.step()
    if rank in profiled:
        prof.export_chrome_trace(str(Path(out) / f"rank-{rank}.json"))
    lines = [None] * world
    line = (f"rank {rank}/{world} on {dev}{' (traced)' if rank in profiled else ''}: loss {loss.item():.4f}, "
            f"steps (ms) " + " ".join(f"{1e3 * t:.1f}" for t in times))
    dist.all_gather_object(lines, line)
    if rank == 0:
        print("\n".join(lines), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for rank-RANK.json")
    parser.add_argument("--world", type=int, default=4, help="number of ranks (processes), default 4")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: every rank on cuda:0")
    parser.add_argument("--profile-ranks", default="all",
                        help="comma-separated ranks whose traces are written, or 'all' (default)")
    args = parser.parse_args(argv)
    profiled = (list(range(args.world)) if args.profile_ranks == "all"
                else sorted({int(r) for r in args.profile_ranks.split(",")}))
    if not profiled or not all(0 <= r < args.world for r in profiled):
        parser.error(f"--profile-ranks {args.profile_ranks}: ranks must lie in 0..{args.world - 1}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here (use --device cpu)")
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    start = time.perf_counter()
    mp.spawn(_worker, args=(args.world, args.device, str(args.out), profiled), nprocs=args.world, join=True)
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"{args.out}: world {args.world}, traced ranks {profiled}, torch {torch.__version__} on {where}, "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
