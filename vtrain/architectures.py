"""Published model architectures by name: what ``vtrain simulate llama-3-70b``, ``vtrain plan gpt-3-175b`` and a
measurement table's ``model`` column (``LLAMA3_70B``, NeMo's way) stand for.

Each entry is the shape its authors published (layers, widths, heads, key/value heads, MLP, norm, positions,
biases, tied embeddings, vocabulary, and the sequence it was pretrained at), with where it was published; counted
as :func:`vtrain.model.memory.model_parameter_count` counts, each has its published parameters (LLaMA's to the
weight: ``tests/test_architectures.py``). GPT-3's output projection is its word embedding, as GPT-2's and
Megatron's are. Names
are matched without regard to case, punctuation or a Hugging Face organisation (``meta-llama/Llama-2-7b-hf``,
``LLAMA2_7B`` and ``llama-2-7b`` are one model).

Left out where vtrain would place the layer otherwise than it ran: GPT-3 XL (1.3B) and GPT-3 13B, whose published
heads times head width differ from their width (24 x 128 for 2,048; 40 x 128 for 5,140); BLOOM (ALiBi positions),
Mistral (sliding-window attention), mixtures of experts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vtrain.runconfig import ModelConfig


@dataclass(frozen=True)
class Architecture:
    """A published model: its name, family (``gpt`` or ``llama``: :data:`vtrain.studies.sizing.FAMILIES`), shape,
    where that was published, and the precision it trained in (GPT-3's generation fp16, LLaMA's bf16)."""

    name: str
    family: str
    model: ModelConfig
    source: str
    precision: str = "fp16"

    @property
    def attention(self) -> str:
        """How it ran its attention: LLaMA's family with FlashAttention (its papers), GPT-3's generation before it
        with the scores in memory (``eager``)."""
        return "flash" if self.family == "llama" else "eager"


def _gpt3(name: str, layers: int, hidden: int, heads: int) -> Architecture:
    return Architecture(name, "gpt", ModelConfig(layers=layers, hidden=hidden, heads=heads, seq=2048, vocab=50257,
                                                 tie_embeddings=True), "Brown et al., 2020 (GPT-3), Table 2.1")


def _llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, vocab: int,
           source: str) -> Architecture:
    return Architecture(name, "llama", ModelConfig(
        layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn_hidden=ffn, kv_heads=kv_heads,
        mlp="swiglu", norm="rmsnorm", position="rope", bias=False, qkv_bias=False, tie_embeddings=False,
        dropout=False), source,
        "bf16")


_LLAMA2 = "Touvron et al., 2023 (Llama 2), Table 1, and its config.json"
_LLAMA3 = "Llama Team, 2024 (The Llama 3 Herd of Models), Table 3, and its config.json"
#: every architecture vtrain knows by name, smallest first within a family
ARCHITECTURES: tuple[Architecture, ...] = (
    _gpt3("gpt-3-125m", 12, 768, 12),
    _gpt3("gpt-3-350m", 24, 1024, 16),
    _gpt3("gpt-3-760m", 24, 1536, 16),
    _gpt3("gpt-3-2.7b", 32, 2560, 32),
    _gpt3("gpt-3-6.7b", 32, 4096, 32),
    _gpt3("gpt-3-175b", 96, 12288, 96),
    Architecture("mt-nlg-530b", "gpt", ModelConfig(layers=105, hidden=20480, heads=128, seq=2048, vocab=50257,
                                                   tie_embeddings=True),
                 "Smith et al., 2022 (Megatron-Turing NLG 530B), Section 3"),
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 4096, 32000, _LLAMA2),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 8192, 128256, _LLAMA3),
    _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 4096, 32000, _LLAMA2),
    _llama("codellama-34b", 48, 8192, 64, 8, 22016, 16384, 32000, "Roziere et al., 2023 (Code Llama), its config.json"),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 4096, 32000, _LLAMA2),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 8192, 128256, _LLAMA3),
    _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 8192, 128256, _LLAMA3),
)
#: other names of an architecture: LLaMA 3.1's 8B and 70B are LLaMA 3's layers pretrained at the same length
_ALIASES = {"llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b", "llama-3-405b": "llama-3.1-405b"}


def _key(name: str) -> str:
    """A name as names are compared: its last path part (a Hugging Face repository's), a trailing ``-hf`` and a
    leading ``Meta-`` (``Meta-Llama-3-70B``) left out, letters and digits only, lower case."""
    last = name.strip().rsplit("/", 1)[-1].lower()
    return re.sub(r"[^a-z0-9]", "", re.sub(r"^meta[-_ ]?(?=llama)|[-_]hf$", "", last))


_BY_KEY = {_key(a.name): a for a in ARCHITECTURES} | {_key(alias): next(a for a in ARCHITECTURES if a.name == name)
                                                       for alias, name in _ALIASES.items()}


def architecture(name: str) -> Architecture | None:
    """The published architecture ``name`` names (:data:`ARCHITECTURES`, :data:`_ALIASES`), else None."""
    return _BY_KEY.get(_key(name))


def known_names() -> str:
    """The names vtrain knows, for an error message."""
    return ", ".join(a.name for a in ARCHITECTURES)


def family(name: str) -> tuple[Architecture, ...]:
    """The architectures of one family (``gpt``, ``llama``)."""
    return tuple(a for a in ARCHITECTURES if a.family == name)
