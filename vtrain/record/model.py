"""The GPT decoder in plain torch, Megatron-LM layout, split by tensor and pipeline parallelism.

Per transformer layer, on one tensor-parallel rank (b micro-batch, s seq, h hidden, a heads, t tp, d = h/a)::

    ln1 = layer_norm(x)                              qkv = linear(copy_to_tp(ln1), W_qkv[3h/t, h], b_qkv)
    q, k, v = split(qkv) -> [b*a/t, s, d]            scores = bmm(q, k^T) * 1/sqrt(d)
    probs = softmax(masked_fill(scores, causal, -inf))   ctx = bmm(probs, v) -> [b, s, h/t]
    (``attention: flash``: ctx = scaled_dot_product_attention(q, k, v, causal) on [b, a/t, s, d] views, no scores)
    x = x + reduce_from_tp(linear(ctx, W_o[h, h/t])) + b_o
    ln2 = layer_norm(x)                              u = gelu(linear(copy_to_tp(ln2), W_1[4h/t, h], b_1))
    x = x + reduce_from_tp(linear(u, W_2[h, 4h/t])) + b_2

With ``kv_heads`` (grouped-query attention) the QKV projection yields, per key/value head, its g = a/kv query
heads, its key and its value (Megatron's layout); the eager core repeats each key and value for its g queries, the
fused one takes them as they are. With ``ffn_hidden`` the MLP is that wide instead of 4h; with ``mlp: swiglu``
fc1 yields the gate and the up projection together (2·ffn/t) and u = silu(gate) * up.

The first pipeline stage adds the vocabulary-parallel token embedding and the position embedding; the last adds
the final layer norm, vocabulary-parallel logits (untied from the input embedding) and the cross-entropy.

Weights are drawn for the *whole* model from a generator seeded by the run seed and the parameter's name, then
sliced to this rank's shard (as Megatron's ``use_cpu_initialization``): any tp/pp/dp split of the same model
and seed starts from the same weights, which is what lets the tests compare losses across splits.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from vtrain.record.process_groups import TensorParallel
from vtrain.record.recompute import full_recompute
from vtrain.record.spans import backward_span, close_on_backward, current, open_on_backward, span
from vtrain.record.tensor_parallel import (
    copy_to_tp,
    reduce_from_tp,
    vocab_parallel_cross_entropy,
    vocab_parallel_embedding,
)
from vtrain.partition import partition
from vtrain.runconfig import ModelConfig, RunConfig

INIT_STD = 0.02


class Init:
    """Draws full-model weights deterministically and hands out this rank's shards."""

    def __init__(self, seed: int, tp: TensorParallel, dtype: torch.dtype, device: torch.device) -> None:
        self.seed, self.tp, self.dtype, self.device = seed, tp, dtype, device

    def normal(self, name: str, shape: tuple[int, ...], std: float = INIT_STD,
               split_dim: int | None = None) -> nn.Parameter:
        """N(0, std) weights for the whole tensor ``name``; split along ``split_dim`` over the TP group."""
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.seed}:{name}".encode()))
        full = torch.randn(shape, generator=generator) * std
        if split_dim is not None:
            full = full.chunk(self.tp.size, dim=split_dim)[self.tp.rank]
        return self._param(full)

    def gated(self, name: str, shape: tuple[int, int]) -> nn.Parameter:
        """A gated MLP's fc1: the gate's and the up projection's weights (each ``shape``, drawn whole), each split
        over the TP group by rows, this rank's two shards stacked (gate first), as Megatron's ``--swiglu``."""
        gate, up = (self.normal(f"{name}.{part}", shape, split_dim=0) for part in ("gate", "up"))
        return self._param(torch.cat([gate.detach(), up.detach()]))

    def constant(self, value: float, size: int) -> nn.Parameter:
        """A vector of ``value`` (layer-norm weights and biases, linear biases)."""
        return self._param(torch.full((size,), value))

    def _param(self, tensor: torch.Tensor) -> nn.Parameter:
        return nn.Parameter(tensor.to(device=self.device, dtype=self.dtype).contiguous())


class Embedding(nn.Module):
    """Vocabulary-parallel token embedding plus learned position embedding."""

    def __init__(self, model: ModelConfig, init: Init) -> None:
        super().__init__()
        self.vocab, self.tp = model.vocab, init.tp
        self.token = init.normal("embedding.token", (model.vocab, model.hidden), split_dim=0)
        self.position = init.normal("embedding.position", (model.seq, model.hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``[b, s]`` to hidden states ``[b, s, h]``."""
        here = current()
        with span("embedding", **here.fields()):
            tracker = backward_span("embedding", 2, **here.fields(phase="backward"))
            token = close_on_backward(tracker, self.token)
            position = close_on_backward(tracker, self.position)
            x = vocab_parallel_embedding(ids, token, self.vocab, self.tp) + position
            return open_on_backward(tracker, x)


class TransformerLayer(nn.Module):
    """One decoder layer with Megatron tensor parallelism; ``index`` is its global layer number; ``flash``: its
    attention core is PyTorch's fused ``scaled_dot_product_attention`` (no scores held)."""

    def __init__(self, model: ModelConfig, index: int, init: Init, flash: bool = False) -> None:
        super().__init__()
        self.flash = flash
        h, t, f = model.hidden, init.tp.size, model.ffn
        self.index, self.tp, self.gated = index, init.tp, model.mlp == "swiglu"
        self.hidden, self.local_heads, self.head_dim = h, model.heads // t, h // model.heads
        self.local_groups, self.group = model.query_groups // t, model.heads // model.query_groups
        out_std = INIT_STD / math.sqrt(2.0 * model.layers)
        name = f"layer{index}"
        self.ln1_weight, self.ln1_bias = init.constant(1.0, h), init.constant(0.0, h)
        qkv_rows = model.query_groups * (self.group + 2) * self.head_dim
        self.qkv_weight = init.normal(f"{name}.qkv_weight", (qkv_rows, h), split_dim=0)
        self.qkv_bias = init.constant(0.0, qkv_rows // t)
        self.proj_weight = init.normal(f"{name}.proj_weight", (h, h), out_std, split_dim=1)
        self.proj_bias = init.constant(0.0, h)
        self.ln2_weight, self.ln2_bias = init.constant(1.0, h), init.constant(0.0, h)
        self.fc1_weight = (init.gated(f"{name}.fc1_weight", (f, h)) if self.gated
                           else init.normal(f"{name}.fc1_weight", (f, h), split_dim=0))
        self.fc1_bias = init.constant(0.0, (2 if self.gated else 1) * f // t)
        self.fc2_weight = init.normal(f"{name}.fc2_weight", (h, f), out_std, split_dim=1)
        self.fc2_bias = init.constant(0.0, h)
        causal = torch.ones(model.seq, model.seq, dtype=torch.bool, device=init.device).triu(1)
        self.register_buffer("causal_mask", causal, persistent=False)
        self.graphed: Callable[[torch.Tensor], torch.Tensor] | None = None  # see vtrain.record.cuda_graphs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[b, s, h]`` through attention and MLP, each with its residual (the replay of the
        layer's CUDA graphs when it has them: the layer's spans stay outside the graph)."""
        here = current()
        with span("layer", **here.fields(layer=self.index)):
            tracker = backward_span("layer", 1, **here.fields(phase="backward", layer=self.index))
            x = close_on_backward(tracker, x)
            x = (self.graphed or self.block)(x)
            return open_on_backward(tracker, x)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        """Attention and MLP with their residuals, without the layer's spans: what a CUDA graph captures."""
        x = x + self._attention(x)
        return x + self._mlp(x)

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        heads, d = self.local_heads, self.head_dim
        ln = F.layer_norm(x, (self.hidden,), self.ln1_weight, self.ln1_bias)
        qkv = F.linear(copy_to_tp(ln, self.tp, layer=self.index), self.qkv_weight, self.qkv_bias)
        if self.group == 1:
            q, k, v = qkv.view(b, s, heads, 3, d).unbind(dim=3)
        else:  # each key/value head's queries, key and value: [b, s, groups, g + 2, d]
            q, k, v = qkv.view(b, s, self.local_groups, self.group + 2, d).split([self.group, 1, 1], dim=3)
            q, k, v = q.reshape(b, s, heads, d), k.squeeze(3), v.squeeze(3)
        if self.flash:
            q, k, v = (t.permute(0, 2, 1, 3) for t in (q, k, v))
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.group > 1)
            context = context.permute(0, 2, 1, 3).reshape(b, s, -1)
        else:
            context = self._scores_attention(q, k, v)
        y = F.linear(context, self.proj_weight)
        return reduce_from_tp(y, self.tp, layer=self.index) + self.proj_bias

    def _scores_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core with its scores in memory (``attention: eager``): [b, s, a/t, d] queries and [b, s,
        kv/t, d] keys and values in (each key and value repeated for its g queries), the context [b, s, h/t] out."""
        b, s, heads, d = q.shape
        q = q.permute(0, 2, 1, 3).reshape(b * heads, s, d)
        k, v = (self._repeated(t) for t in (k, v))
        scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(d))
        scores = scores.masked_fill(self.causal_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.bmm(probs, v).view(b, heads, s, d).permute(0, 2, 1, 3).reshape(b, s, heads * d)

    def _repeated(self, x: torch.Tensor) -> torch.Tensor:
        """[b, s, kv/t, d] keys (values) as [b·a/t, s, d], each repeated for its g queries (copied once)."""
        b, s, groups, d = x.shape
        x = x.permute(0, 2, 1, 3)
        if self.group > 1:
            x = x[:, :, None].expand(b, groups, self.group, s, d)
        return x.reshape(b * groups * self.group, s, d)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        ln = F.layer_norm(x, (self.hidden,), self.ln2_weight, self.ln2_bias)
        u = F.linear(copy_to_tp(ln, self.tp, layer=self.index), self.fc1_weight, self.fc1_bias)
        if self.gated:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u)
        y = F.linear(u, self.fc2_weight)
        return reduce_from_tp(y, self.tp, layer=self.index) + self.fc2_bias


class Head(nn.Module):
    """Final layer norm, vocabulary-parallel logits and cross-entropy (mean over the micro-batch's tokens)."""

    def __init__(self, model: ModelConfig, init: Init) -> None:
        super().__init__()
        self.hidden, self.vocab, self.tp = model.hidden, model.vocab, init.tp
        self.ln_weight, self.ln_bias = init.constant(1.0, model.hidden), init.constant(0.0, model.hidden)
        self.output = init.normal("head.output", (model.vocab, model.hidden), split_dim=0)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean next-token loss of hidden states ``[b, s, h]`` against ``labels`` ``[b, s]``."""
        here = current()
        with span("head", **here.fields()):
            tracker = backward_span("head", 1, **here.fields(phase="backward"))
            x = close_on_backward(tracker, x)
            ln = F.layer_norm(x, (self.hidden,), self.ln_weight, self.ln_bias)
            logits = F.linear(copy_to_tp(ln, self.tp), self.output)
            if logits.dtype != torch.float32:
                logits = logits.float()
            loss = vocab_parallel_cross_entropy(logits, labels, self.vocab, self.tp).mean()
            return open_on_backward(tracker, loss)


class ModelChunk(nn.Module):
    """The contiguous block of the model one pipeline stage runs for one model chunk (virtual stage)."""

    def __init__(self, model: ModelConfig, layers: range, first: bool, last: bool, init: Init,
                 recompute: bool = False, flash: bool = False) -> None:
        super().__init__()
        self.embedding = Embedding(model, init) if first else None
        self.layers = nn.ModuleList(TransformerLayer(model, index, init, flash) for index in layers)
        self.head = Head(model, init) if last else None
        self.recompute = recompute

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states out, or the loss on the last virtual stage (``labels`` required there)."""
        if self.embedding is not None:
            x = self.embedding(x)
        for layer in self.layers:
            x = full_recompute(layer, x) if self.recompute else layer(x)
        if self.head is not None:
            assert labels is not None, "the last pipeline stage needs labels"
            return self.head(x, labels)
        return x


def build_chunks(config: RunConfig, stage: int, init: Init, recompute: bool = False) -> list[ModelChunk]:
    """This stage's model chunks, holding the layers the simulator places there
    (:func:`vtrain.partition.partition`)."""
    return [ModelChunk(config.model, chunk.layer_ids, first=chunk.has_embedding, last=chunk.has_head, init=init,
                       recompute=recompute, flash=config.attention == "flash") for chunk in partition(config)[stage]]
