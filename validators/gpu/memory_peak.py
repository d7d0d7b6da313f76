"""What a GPU holds at its peak during the reference model's training steps, by the code that allocated it.

Run on a machine with a CUDA GPU, from the repository root (needs only torch, numpy and PyYAML)::

    PYTHONPATH=. python3 validators/gpu/memory_peak.py RUN_YAML OUT.json [--ops]

``--ops`` records C++ frames too and lists every block of 1 MiB or more live at the peak with the operators
(torch's dispatcher calls, autograd nodes) that allocated it: what the Python frame of a backward call cannot say.

Builds the model of ``RUN_YAML`` (one rank: tp = pp = 1) as ``vtrain record`` does, runs two training steps
(every micro-batch's forward and backward, then Adam) with torch's allocator recording every allocation and
free (``torch.cuda.memory._record_memory_history``), replays that record to the moment the allocated bytes peak,
and writes the blocks live then, grouped by the innermost vtrain (or torch.nn) frame that allocated them, with
``torch.cuda.max_memory_allocated`` beside the replayed peak. The memory model's terms
(:mod:`vtrain.model.memory`) are checked against such a breakdown.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from vtrain.record.model import Init, build_chunks
from vtrain.record.process_groups import TensorParallel
from vtrain.record.worker import DTYPES
from vtrain.runconfig import load_run_config


def _where(frames: list[dict]) -> str:
    """The innermost frame in vtrain's code (else torch's autograd or optimizer) of an allocation."""
    for frame in frames:
        name = frame.get("filename", "")
        if "/vtrain/" in name or "torch/optim" in name:
            return f"{name.split('/')[-1]}:{frame.get('line')} {frame.get('name')}"
    return "other (autograd engine, allocator workspace)"


def _train(config_path: Path) -> None:
    config = load_run_config(config_path)
    model, par = config.model, config.parallelism
    device = torch.device("cuda", 0)
    init = Init(1234, TensorParallel(), DTYPES[config.precision], device)
    (chunk,) = build_chunks(model, 0, 1, 1, init, recompute=par.recompute == "full")
    optimizer = torch.optim.Adam(chunk.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(0)
    shape = (par.micro_batch, model.seq)
    for _ in range(2):
        for _ in range(par.micro_batches):
            ids = torch.randint(0, model.vocab, shape, generator=generator).to(device)
            labels = torch.randint(0, model.vocab, shape, generator=generator).to(device)
            (chunk(ids, labels) / par.micro_batches).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _operators(frames: list[dict]) -> list[str]:
    """The dispatcher calls and autograd nodes among an allocation's C++ frames, innermost first, each once."""
    found: list[str] = []
    for frame in frames:
        name = frame.get("name", "")
        if ("_ops::" in name and "::call" in name) or "Backward" in name:
            short = name.split("(")[0]
            if short not in found:
                found.append(short)
    return found[:6]


def main() -> None:
    """Train, replay the allocator's record to its peak, write the live blocks by allocating frame."""
    config_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    with_ops = "--ops" in sys.argv[3:]
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="all" if with_ops else "python")
    _train(config_path)
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, tuple[int, str, list[str]]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, str, list[str]]] = {}
    for trace in snapshot["device_traces"]:
        for entry in trace:
            if entry["action"] == "alloc":
                frames = entry.get("frames", [])
                live[entry["addr"]] = (entry["size"], _where(frames),
                                       _operators(frames) if with_ops and entry["size"] >= 2**20 else [])
                total += entry["size"]
                if total > peak:
                    peak, at_peak = total, dict(live)
            elif entry["action"] == "free_completed" and entry["addr"] in live:
                total -= live.pop(entry["addr"])[0]
    by_frame: dict[str, list[int]] = defaultdict(list)
    for size, where, _ in at_peak.values():
        by_frame[where].append(size)
    rows = sorted(({"where": where, "blocks": len(sizes), "bytes": sum(sizes), "largest": max(sizes)}
                   for where, sizes in by_frame.items()), key=lambda row: -row["bytes"])
    blocks = sorted(({"bytes": size, "where": where, "operators": ops} for size, where, ops in at_peak.values()
                     if with_ops and size >= 2**20), key=lambda row: -row["bytes"])
    out.write_text(json.dumps({"config": str(config_path), "replayed_peak_bytes": peak,
                               "max_memory_allocated": torch.cuda.max_memory_allocated(), "live_at_peak": rows,
                               **({"blocks_at_peak": blocks} if with_ops else {})}, indent=1))
    print(f"{config_path}: peak {peak / 2**30:.3f} GiB replayed, "
          f"{torch.cuda.max_memory_allocated() / 2**30:.3f} GiB max_memory_allocated")
    for row in rows[:12]:
        print(f"  {row['bytes'] / 2**20:10.1f} MiB in {row['blocks']:4d} blocks  {row['where']}")


if __name__ == "__main__":
    main()
