"""Kineto traces made the way users make them, outside ``vtrain record``: one CUDA GPU, torch only.

Run on a machine with a CUDA GPU::

    python3 validators/gpu/user_traces.py OUT_DIR            # every run below, each in its own process
    python3 validators/gpu/user_traces.py OUT_DIR --run NAME  # one of them

Each run trains a small GPT (PyTorch's own decoder layers) with the habits of common training scripts, which
vtrain's recorder never has, and writes its traces under ``OUT_DIR/NAME/``:

- ``amp-ddp``: DistributedDataParallel over NCCL (a world of one rank: its gradient all-reduce still launches NCCL
  kernels), fp16 autocast with a ``GradScaler`` (an inf check and a ``.item()`` per step), fused AdamW, the profiler
  with ``profile_memory``, ``with_stack`` and a repeating schedule written by ``tensorboard_trace_handler``: two
  trace files for the same rank, one per profiler cycle, named ``HOST_PID.TIMESTAMP.pt.trace.json``.
- ``ckpt-accum``: bf16 autocast, activation checkpointing (``torch.utils.checkpoint``, non-reentrant) in every
  layer, four micro-batches of gradient accumulation per step, ``loss.item()`` after every micro-batch and a
  ``torch.cuda.synchronize()`` per step; ``export_chrome_trace`` to ``rank-0.json``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.utils.checkpoint
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, BATCH = 4, 512, 8, 512, 8192, 8
RUNS = ("amp-ddp", "ckpt-accum")


class Gpt(nn.Module):
    """Token and position embeddings, pre-norm decoder layers (PyTorch's own), final norm and logits."""

    def __init__(self, checkpointed: bool = False) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(SEQ, HIDDEN)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(HIDDEN, HEADS, 4 * HIDDEN, dropout=0.1, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.checkpointed = checkpointed
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for layer in self.layers:
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(layer, x, self.causal, None, True, use_reentrant=False)
            else:
                x = layer(x, self.causal, is_causal=True)
        return self.head(self.norm(x))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda")
    return tokens[:, :-1], tokens[:, 1:]


def amp_ddp(out: Path) -> None:
    """DDP over NCCL (one rank), fp16 autocast with a GradScaler, traces of two profiler cycles."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    model = nn.parallel.DistributedDataParallel(Gpt().cuda(), device_ids=[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = nn.CrossEntropyLoss()
    plan = schedule(wait=1, warmup=1, active=2, repeat=2)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], schedule=plan, record_shapes=True,
                 profile_memory=True, with_stack=True, on_trace_ready=tensorboard_trace_handler(str(out))) as prof:
        for _ in range(9):
            tokens, targets = _batch()
            with torch.autocast("cuda", dtype=torch.float16):
                loss = loss_fn(model(tokens).flatten(0, 1), targets.flatten())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            print(f"loss {loss.item():.4f}", flush=True)
            prof.step()
    torch.distributed.destroy_process_group()


def ckpt_accum(out: Path) -> None:
    """bf16 autocast, activation checkpointing, four micro-batches accumulated per step."""
    model = Gpt(checkpointed=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                 schedule=schedule(wait=1, warmup=1, active=3)) as prof:
        for _ in range(5):
            for _ in range(4):
                tokens, targets = _batch()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = loss_fn(model(tokens).flatten(0, 1), targets.flatten()) / 4
                loss.backward()
                print(f"loss {loss.item():.4f}", flush=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            prof.step()
    prof.export_chrome_trace(str(out / "rank-0.json"))


def main(argv: list[str]) -> int:
    """Every run in a child process (one failing does not stop the others), or the one ``--run`` names."""
    out = Path(argv[0])
    if len(argv) == 3 and argv[1] == "--run":
        name = argv[2]
        (out / name).mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        {"amp-ddp": amp_ddp, "ckpt-accum": ckpt_accum}[name](out / name)
        print(f"{out / name}: torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
        return 0
    failed = 0
    for name in RUNS:
        code = subprocess.call([sys.executable, __file__, str(out), "--run", name])
        print(f"{name}: exit {code}", flush=True)
        failed += code != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
