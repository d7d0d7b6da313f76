"""Full activation recomputation (Megatron's ``--recompute-granularity full``, one checkpoint per layer).

The layer's forward runs without keeping activations; its input is saved. When backward reaches the layer, the
forward is run again (spans ``vtrain/recompute ... layer=L`` around ``vtrain/layer phase=recompute ...``), then
backpropagated through. The model has no dropout, so no random state needs restoring.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vtrain.record.spans import Position, at, current, span


class _FullRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, layer: nn.Module, position: Position, x: torch.Tensor) -> torch.Tensor:
        ctx.layer, ctx.position = layer, position
        ctx.save_for_backward(x)
        return layer(x)  # autograd is off inside Function.forward: no activations are kept

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        (saved,) = ctx.saved_tensors
        x = saved.detach().requires_grad_(True)
        where = ctx.position
        with at(phase="recompute", stage=where.stage, chunk=where.chunk, mb=where.mb) as here:
            with span("recompute", stage=here.stage, chunk=here.chunk, mb=here.mb, layer=ctx.layer.index):
                with torch.enable_grad():
                    out = ctx.layer(x)
        torch.autograd.backward(out, grad)
        return None, None, x.grad


def full_recompute(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Run ``layer(x)`` keeping only ``x``; the forward is re-run at the start of the layer's backward."""
    if not torch.is_grad_enabled():
        return layer(x)
    return _FullRecompute.apply(layer, current(), x)
