"""A tiny real 2-rank gloo job on CPU, profiled with torch.profiler: `python gloo_job.py OUT_DIR`.

Used by the ingest tests to check CPU-only traces (no device kernels, gloo collectives).
"""

from __future__ import annotations

import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function, schedule


def run(rank: int, world_size: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    x = torch.randn(8, 16, 64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 schedule=schedule(wait=0, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank-{rank}.json")) as prof:
        for _ in range(3):
            with record_function("vtrain/forward stage=0 mb=0"):
                loss = torch.nn.functional.gelu(linear(x)).sum()
            loss.backward()
            buffer = torch.ones(1000)
            dist.all_reduce(buffer)
            gathered = torch.empty(2000)
            dist.all_gather_into_tensor(gathered, buffer)
            prof.step()
    # both ranks done (each writes its trace at the last step, one slower than the other) before the group is torn
    # down, as `vtrain record` does: without it a rank destroyed the group while the other was still in it, and
    # gloo aborted ("terminate called without an active exception", SIGABRT; 2 of about 10 fresh-clone CI runs)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(run, args=(2, f"{tmp}/store", sys.argv[1]), nprocs=2)
