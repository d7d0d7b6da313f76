"""Megatron-LM tensor parallelism: the communication functions and the vocabulary-parallel pieces.

* :func:`copy_to_tp` — forward identity, backward all-reduce of the input gradient (in front of a
  column-parallel linear).
* :func:`reduce_from_tp` — forward all-reduce, backward identity (after a row-parallel linear).
* :func:`vocab_parallel_embedding` — each rank holds ``vocab / tp`` rows; out-of-range tokens are masked and
  the partial lookups are summed over the group.
* :func:`vocab_parallel_cross_entropy` — cross-entropy over logits split by vocabulary (all-reduce max, the
  target logit and the sum of exponentials).

Every all-reduce runs inside a ``vtrain/comm purpose=tp op=all_reduce ...`` span carrying the phase, stage,
micro-batch and (inside a transformer layer) the global layer index. With ``tp == 1`` nothing is communicated
and no comm span is written.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from vtrain.naming import span_name
from vtrain.record.process_groups import TensorParallel
from vtrain.record.spans import current


def _all_reduce(tensor: torch.Tensor, tp: TensorParallel, name: str,
                op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> None:
    with torch.profiler.record_function(name):
        dist.all_reduce(tensor, op=op, group=tp.group)


def _comm_name(phase: str | None = None, **fields: Any) -> str:
    here = current().fields(**fields)
    if phase is not None:
        here["phase"] = phase
    return span_name("comm", purpose="tp", op="all_reduce", **here)


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, backward_name: str) -> torch.Tensor:
        ctx.tp, ctx.name = tp, backward_name
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        _all_reduce(grad, ctx.tp, ctx.name)
        return grad, None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, tp: TensorParallel, name: str) -> torch.Tensor:
        _all_reduce(x, tp, name)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


def copy_to_tp(x: torch.Tensor, tp: TensorParallel, **fields: Any) -> torch.Tensor:
    """Identity in forward; all-reduce of the gradient over the TP group in backward."""
    if tp.size == 1:
        return x
    return _CopyToTP.apply(x, tp, _comm_name(phase="backward", **fields))


def reduce_from_tp(x: torch.Tensor, tp: TensorParallel, **fields: Any) -> torch.Tensor:
    """All-reduce (sum) over the TP group in forward, in place; identity in backward."""
    if tp.size == 1:
        return x
    return _ReduceFromTP.apply(x, tp, _comm_name(**fields))


def vocab_range(vocab: int, tp: TensorParallel) -> tuple[int, int]:
    """The ``[start, end)`` token ids held by this TP rank."""
    per_rank = vocab // tp.size
    return tp.rank * per_rank, (tp.rank + 1) * per_rank


def vocab_parallel_embedding(ids: torch.Tensor, weight: torch.Tensor, vocab: int,
                             tp: TensorParallel) -> torch.Tensor:
    """Token embedding with the table split by rows (``weight`` is ``[vocab / tp, hidden]``)."""
    if tp.size == 1:
        return F.embedding(ids, weight)
    start, end = vocab_range(vocab, tp)
    outside = (ids < start) | (ids >= end)
    local = (ids - start).masked_fill(outside, 0)
    partial = F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
    return reduce_from_tp(partial, tp)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron-LM's ``_VocabParallelCrossEntropy``: per-token loss from vocabulary-split logits."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, vocab: int,
                tp: TensorParallel, names: tuple[str, str, str]) -> torch.Tensor:
        max_name, target_name, sum_name = names
        logits_max = logits.max(dim=-1)[0]
        if tp.size > 1:
            _all_reduce(logits_max, tp, max_name, dist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)

        start, end = vocab_range(vocab, tp)
        outside = (target < start) | (target >= end)
        local_target = (target - start).masked_fill(outside, 0)
        logits_2d = logits.view(-1, logits.size(-1))
        rows = torch.arange(logits_2d.size(0), device=logits.device)
        target_logits = logits_2d[rows, local_target.view(-1)].view_as(target).masked_fill(outside, 0.0)
        if tp.size > 1:
            _all_reduce(target_logits, tp, target_name)

        exp_logits = logits.exp_()
        sum_exp = exp_logits.sum(dim=-1)
        if tp.size > 1:
            _all_reduce(sum_exp, tp, sum_name)
        loss = torch.log(sum_exp) - target_logits

        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax
        grad_2d = grad.view(-1, grad.size(-1))
        rows = torch.arange(grad_2d.size(0), device=grad.device)
        grad_2d[rows, local_target.view(-1)] -= 1.0 - outside.view(-1).to(grad.dtype)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab: int,
                                 tp: TensorParallel) -> torch.Tensor:
    """Per-token cross-entropy ``[b, s]`` from logits ``[b, s, vocab / tp]`` split over the TP group."""
    names = (_comm_name(), _comm_name(), _comm_name())
    return _VocabParallelCrossEntropy.apply(logits, target, vocab, tp, names)

