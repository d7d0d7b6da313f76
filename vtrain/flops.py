"""The FLOPs of one training iteration of a GPT, as Narayanan et al. count them (SC21, Eq. 3): the model's
(forward, and backward at twice the forward), and the hardware's, which adds what activation recomputation runs
again.

Per layer and sample, the forward pass multiplies ``24·s·h²`` for its four GEMMs and ``4·s²·h`` for the attention
scores and their use; the logits ``2·s·h·V``. So the three passes of an iteration of ``B`` samples are
``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``; full recomputation adds each layer's forward again (Eq. 3:
``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``), selective recomputation (Korthikanti et al.) the attention scores
and their use, ``4·B·l·s²·h``. Published achieved TFLOP/s per GPU (Megatron-LM's weak-scaling table, MT-NLG)
count the hardware's FLOPs; model FLOPs utilisation counts the model's. A layer of another shape
(:class:`LayerShape`: another MLP width, grouped-query attention, a gated MLP) counts its own GEMMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vtrain.runconfig import ModelConfig


@dataclass(frozen=True)
class LayerShape:
    """What a layer's GEMMs depend on beyond the hidden size: the MLP's width (None: 4h), the share of key/value
    heads (grouped-query attention: kv/a) and whether the MLP is gated (SwiGLU: fc1 computes gate and up)."""

    ffn: float | None = None
    kv_share: float = 1.0
    gated: bool = False

    @classmethod
    def of(cls, model: ModelConfig) -> LayerShape:
        """The layer of a run config's model."""
        return cls(ffn=model.ffn, kv_share=model.query_groups / model.heads, gated=model.mlp == "swiglu")


GPT = LayerShape()


def layer_gemm_flops(seq: float, hidden: float, layer: LayerShape = GPT) -> float:
    """Forward FLOPs of one layer's GEMMs for one sample, the attention scores and their use aside: the QKV
    projection ``2·s·h·(h + 2·h·kv/a)``, the output projection ``2·s·h²`` and the MLP ``2·s·h·ffn`` per GEMM (three
    when gated); ``24·s·h²`` for GPT-3's layer."""
    s, h = seq, hidden
    f = layer.ffn or 4 * h
    return 2 * s * h * h * (2 + 2 * layer.kv_share) + 2 * s * h * f * (3 if layer.gated else 2)


def model_flops(batch: float, seq: float, layers: float, hidden: float, vocab: float,
                layer: LayerShape = GPT) -> float:
    """FLOPs of one iteration of ``batch`` samples without recomputation."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab
    return 3.0 * b * (l * (layer_gemm_flops(s, h, layer) + 4 * s * s * h) + 2 * s * h * v)


def model_flops_per_iteration(model: ModelConfig, global_batch: int) -> float:
    """Model FLOPs of one iteration of a run config's model without recomputation (:func:`model_flops`)."""
    return model_flops(global_batch, model.seq, model.layers, model.hidden, model.vocab, LayerShape.of(model))


def mfu(model: ModelConfig, global_batch: int, iteration_s: float, gpus: int, peak_flops: float) -> float:
    """Model FLOPs utilisation: the model's FLOPs of one iteration (:func:`model_flops_per_iteration`) over what
    ``gpus`` GPUs of ``peak_flops`` each could run in ``iteration_s``."""
    return model_flops_per_iteration(model, global_batch) / (iteration_s * gpus * peak_flops)


def recomputed_flops(batch: float, seq: float, layers: float, hidden: float, recompute: str,
                     layer: LayerShape = GPT) -> float:
    """The FLOPs activation recomputation runs again in one iteration (``none``, ``selective`` or ``full``)."""
    b, s, l, h = batch, seq, layers, hidden
    if recompute == "full":
        return b * l * (layer_gemm_flops(s, h, layer) + 4 * s * s * h)
    if recompute == "selective":
        return 4.0 * b * l * s * s * h
    return 0.0


def hardware_flops(batch: float, seq: float, layers: float, hidden: float, vocab: float, recompute: str,
                   layer: LayerShape = GPT) -> float:
    """FLOPs the GPUs run in one iteration: the model's and the recomputed ones."""
    return (model_flops(batch, seq, layers, hidden, vocab, layer)
            + recomputed_flops(batch, seq, layers, hidden, recompute, layer))
