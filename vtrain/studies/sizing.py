"""Compute-optimal model sizing: for a budget of GPUs and days, which model shape and how many tokens give the
lowest loss, when each shape's speed is its best plan's (not a fixed share of peak FLOP/s).

Loss model: the parametric form of Hoffmann et al., "Training Compute-Optimal Large Language Models"
(NeurIPS 2022, arXiv:2203.15556), Section 3.3 / Eq. (2): ``L(N, D) = E + A / N^α + B / D^β``, N parameters and D
training tokens. Minimising it under ``C = 6·N·D`` gives their closed form (Eq. 4):
``N_opt = G·(C/6)^a``, ``D_opt = G⁻¹·(C/6)^b`` with ``G = (αA / (βB))^(1/(α+β))``, ``a = β/(α+β)``,
``b = α/(α+β)``. Two sets of constants (:data:`LOSS_MODELS`): by default (``chinchilla``) Besiroglu et al.'s refit
of Chinchilla's own data (arXiv:2404.10102: E = 1.8172, A = 482.01, B = 2085.43, α = 0.3478, β = 0.3658), whose
optimum is Chinchilla's ~20 tokens per parameter (its 70B model on 1.4T tokens); and the constants the paper
printed (``chinchilla-published``: E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28), whose optimum at the same
budgets is 50 to 120 tokens per parameter and a model about half the size: the paper's own approaches 1 and 2
disagree with it, and the refit found the printed constants cannot be what its Approach 3 fitted.

A shape's training tokens are its predicted speed × the budget's seconds on all the GPUs: for a fixed model the
loss only falls with more tokens, so every shape trains for the whole budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from vtrain.architectures import family
from vtrain.model.memory import model_parameter_count
from vtrain.runconfig import ModelConfig
from vtrain.studies.throughput import Prediction, Throughput, Workload



@dataclass(frozen=True)
class LossModel:
    """A parametric loss ``L(N, D) = E + A/N^α + B/D^β`` (Hoffmann et al., 2022, Eq. 2) and where its constants come
    from."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str

    def loss(self, parameters: float, tokens: float) -> float:
        """Predicted loss of a model of ``parameters`` trained on ``tokens``."""
        return self.E + self.A / parameters ** self.alpha + self.B / tokens ** self.beta

    def optimum(self, flops: float) -> tuple[float, float]:
        """The loss-minimising (parameters, tokens) for ``flops`` training FLOPs, with C = 6·N·D (Eq. 4)."""
        alpha, beta = self.alpha, self.beta
        g = (alpha * self.A / (beta * self.B)) ** (1 / (alpha + beta))
        a, b = beta / (alpha + beta), alpha / (alpha + beta)
        return g * (flops / 6) ** a, (flops / 6) ** b / g


#: `vtrain size --loss-model NAME` -> its constants (the module's docstring says why two)
LOSS_MODELS = {
    "chinchilla": LossModel(1.8172, 482.01, 2085.43, 0.3478, 0.3658, (
        "Chinchilla's loss L(N, D) = E + A/N^α + B/D^β (Hoffmann et al., 2022, Eq. 2) with Besiroglu et al.'s refit "
        "of its data (2024, arXiv:2404.10102): E=1.8172, A=482.01, B=2085.43, α=0.3478, β=0.3658, an optimum of "
        "about 20 tokens per parameter")),
    "chinchilla-published": LossModel(1.69, 406.4, 410.7, 0.34, 0.28, (
        "Chinchilla's loss L(N, D) = E + A/N^α + B/D^β with the constants the paper printed (Hoffmann et al., 2022, "
        "arXiv:2203.15556, Eq. 2): E=1.69, A=406.4, B=410.7, α=0.34, β=0.28, an optimum of 50-120 tokens per "
        "parameter, which the paper's other approaches do not give")),
}

#: GPT shapes trained in practice (layers, hidden, heads): GPT-3's family (Brown et al., 2020, Table 2.1),
#: OPT-30B and OPT-66B (Zhang et al., 2022, Table 1), Megatron's 39B–530B (Narayanan et al., SC21, Table 1); their
#: output projection is the word embedding (tied)
PRACTICE_SHAPES: tuple[tuple[int, int, int], ...] = (
    (24, 2048, 16), (32, 2560, 32), (32, 4096, 32), (40, 5120, 40), (48, 7168, 56), (48, 8192, 64),
    (60, 10240, 80), (64, 9216, 72), (80, 12288, 96), (96, 12288, 96), (96, 16384, 128), (105, 20480, 128),
)
#: LLaMA shapes trained in practice (layers, hidden, heads, key/value heads, MLP width): the LLaMA family's published
#: architectures (:mod:`vtrain.architectures`: LLaMA 2 7B, 13B and 70B, Code Llama 34B, LLaMA 3 8B, 70B and 405B),
#: each shape once; each with RMSNorm, rotary positions, a SwiGLU MLP, no biases and its own output projection
LLAMA_SHAPES: tuple[tuple[int, int, int, int, int], ...] = tuple(dict.fromkeys(
    (a.model.layers, a.model.hidden, a.model.heads, a.model.query_groups, a.model.ffn) for a in family("llama")))
#: the shape families a study searches (`vtrain size --family`)
FAMILIES = ("gpt", "llama")



def parameter_count(model: ModelConfig) -> int:
    """Parameters of a shape a study searches, embeddings included (:func:`~vtrain.model.memory.model_parameter_count`):
    its output projection counted as the word embedding unless the shape says it is its own (``tie_embeddings:
    false``, LLaMA's), so a GPT's are ``12·l·h² + 13·l·h + (V + s)·h + 2·h`` whichever framework trains it."""
    return model_parameter_count(replace(model, tie_embeddings=model.tie_embeddings is not False))


@dataclass(frozen=True)
class Sized:
    """One shape under the budget: its speed, the tokens it gets through and the loss it reaches."""

    model: ModelConfig
    parameters: int
    prediction: Prediction | None  # None: no plan runs it on the budget's GPUs
    tokens: float
    loss: float

    def to_dict(self) -> dict[str, object]:
        m = self.model
        return {"parameters": self.parameters, "tokens": self.tokens, "layers": m.layers, "hidden": m.hidden,
                "heads": m.heads, "kv_heads": m.query_groups, "ffn_hidden": m.ffn, "seq": m.seq, "vocab": m.vocab,
                "loss": self.loss,
                "tokens_per_s": self.prediction.tokens_per_s if self.prediction else None,
                "plan": dict(self.prediction.plan) if self.prediction else None,
                "plan_label": self.prediction.label if self.prediction else None}


@dataclass(frozen=True)
class Budget:
    """GPUs for some time, and the FLOP/s one GPU peaks at."""

    gpus: int
    days: float
    peak_flops: float

    @property
    def seconds(self) -> float:
        return self.days * 86400

    def flops(self, mfu: float) -> float:
        """Training FLOPs the budget buys at a model FLOPs utilisation ``mfu``."""
        return self.gpus * self.peak_flops * mfu * self.seconds


def size_with_plans(shapes: Sequence[ModelConfig], budget: Budget, throughput: Throughput,
                    global_batch: int, loss_model: LossModel) -> list[Sized]:
    """Every shape's tokens and loss (``loss_model``'s) when it trains at its best plan's speed on the budget's
    GPUs."""
    results = []
    for model in shapes:
        prediction = throughput(Workload(model, global_batch), budget.gpus)
        tokens = prediction.tokens_per_s * budget.seconds if prediction is not None else 0.0
        parameters = parameter_count(model)
        loss = loss_model.loss(parameters, tokens) if tokens > 0 else math.inf
        results.append(Sized(model, parameters, prediction, tokens, loss))
    return results


def size_with_fixed_mfu(shapes: Sequence[ModelConfig], budget: Budget, mfu: float,
                        loss_model: LossModel) -> list[Sized]:
    """Every shape's tokens and loss (``loss_model``'s) when any model runs at ``mfu`` of peak: D = C / (6·N)."""
    flops = budget.flops(mfu)
    results = []
    for model in shapes:
        parameters = parameter_count(model)
        tokens = flops / (6 * parameters)
        results.append(Sized(model, parameters, None, tokens, loss_model.loss(parameters, tokens)))
    return results


def best(sized: Sequence[Sized]) -> Sized | None:
    """The lowest-loss shape (None when no shape runs)."""
    runnable = [s for s in sized if math.isfinite(s.loss)]
    return min(runnable, key=lambda s: s.loss) if runnable else None


def practice_shapes(seq: int, vocab: int, family: str = "gpt") -> list[ModelConfig]:
    """The shapes of ``family`` (:data:`PRACTICE_SHAPES`, :data:`LLAMA_SHAPES`) as models of sequence length ``seq``
    and vocabulary ``vocab``."""
    if family == "llama":
        return [ModelConfig(layers=l, hidden=h, heads=a, seq=seq, vocab=vocab, kv_heads=kv, ffn_hidden=f, mlp="swiglu",
                            norm="rmsnorm", position="rope", bias=False, tie_embeddings=False, dropout=False)
                for l, h, a, kv, f in LLAMA_SHAPES]
    return [ModelConfig(layers=l, hidden=h, heads=a, seq=seq, vocab=vocab) for l, h, a in PRACTICE_SHAPES]
