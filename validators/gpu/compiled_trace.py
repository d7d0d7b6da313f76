"""A Kineto trace made outside ``vtrain record``: a small GPT trained under ``torch.compile(mode="reduce-overhead")``.

Run on a machine with a CUDA GPU (torch only)::

    python3 validators/gpu/compiled_trace.py OUT_DIR

Inductor fuses the model's element-wise work into Triton kernels and, in "reduce-overhead" mode, replays the
compiled forward and backward from CUDA graphs (its "cudagraph trees"): a trace of kernels vtrain's own model never
launches, released by graph launches, with no ``vtrain/...`` spans, as users bring them. Three warm-up iterations
(compilation and graph recording) run before the profiler's window of two skipped and three recorded iterations
(``ProfilerStep#N``); the trace is written as ``OUT_DIR/rank-0.json.gz`` (gzip, Kineto's JSON).
"""

from __future__ import annotations

import gzip
import shutil
import sys
from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

LAYERS, HIDDEN, HEADS, SEQ, VOCAB, BATCH = 4, 1024, 16, 1024, 32000, 4


class Gpt(nn.Module):
    """Token and position embeddings, pre-norm decoder layers (PyTorch's own), final norm and tied logits."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(SEQ, HIDDEN)
        layer = nn.TransformerEncoderLayer(HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.layers = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(HIDDEN)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.token(ids) + self.position.weight
        x = self.norm(self.layers(x, mask=self.causal, is_causal=True))
        logits = x @ self.token.weight.t()
        return nn.functional.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))


def main() -> None:
    """Compile, warm up, profile three iterations, write the trace."""
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    model = Gpt().to(device=device, dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = torch.compile(model, mode="reduce-overhead")
    generator = torch.Generator(device=device).manual_seed(0)

    def iteration() -> float:
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=device, generator=generator)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), device=device, generator=generator)
        loss = step(ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(3):
        iteration()
    torch.cuda.synchronize()
    plain = out / "rank-0.json"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=0, warmup=2, active=3, repeat=1),
                 on_trace_ready=lambda done: done.export_chrome_trace(str(plain))) as prof:
        for _ in range(5):
            loss = iteration()
            torch.cuda.synchronize()
            prof.step()
    with plain.open("rb") as source, gzip.open(out / "rank-0.json.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    plain.unlink()
    print(f"{out}: torch {torch.__version__} on {torch.cuda.get_device_name(0)}, last loss {loss:.4f}")


if __name__ == "__main__":
    main()
