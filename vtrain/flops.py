"""The FLOPs of one training iteration of a GPT, as Narayanan et al. count them (SC21, Eq. 3): the model's
(forward, and backward at twice the forward), and the hardware's, which adds what activation recomputation runs
again.

Per layer and sample, the forward pass multiplies ``24·s·h²`` for its four GEMMs and ``4·s²·h`` for the attention
scores and their use; the logits ``2·s·h·V``. So the three passes of an iteration of ``B`` samples are
``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``; full recomputation adds each layer's forward again (Eq. 3:
``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``), selective recomputation (Korthikanti et al.) the attention scores
and their use, ``4·B·l·s²·h``. Published achieved TFLOP/s per GPU (Megatron-LM's weak-scaling table, MT-NLG)
count the hardware's FLOPs; model FLOPs utilisation counts the model's.
"""

from __future__ import annotations


def model_flops(batch: float, seq: float, layers: float, hidden: float, vocab: float) -> float:
    """FLOPs of one iteration of ``batch`` samples without recomputation."""
    b, s, l, h, v = batch, seq, layers, hidden, vocab
    return 72.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))


def recomputed_flops(batch: float, seq: float, layers: float, hidden: float, recompute: str) -> float:
    """The FLOPs activation recomputation runs again in one iteration (``none``, ``selective`` or ``full``)."""
    b, s, l, h = batch, seq, layers, hidden
    if recompute == "full":
        return 24.0 * b * s * l * h * h * (1 + s / (6 * h))
    if recompute == "selective":
        return 4.0 * b * l * s * s * h
    return 0.0


def hardware_flops(batch: float, seq: float, layers: float, hidden: float, vocab: float, recompute: str) -> float:
    """FLOPs the GPUs run in one iteration: the model's and the recomputed ones."""
    return model_flops(batch, seq, layers, hidden, vocab) + recomputed_flops(batch, seq, layers, hidden, recompute)
