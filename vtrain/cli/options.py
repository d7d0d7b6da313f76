"""Command-line options that several commands share, each defined once: the same flag, default, bounds and help
wherever it appears. `vtrain cluster` and `vtrain size` plan on the same hardware options and write a report
folder the same way."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer

from vtrain.limits import MAX_DEVICE_MEMORY_GIB, MAX_MICRO_BATCH_TRIED, REAL_BOUNDS
from vtrain.runconfig import (
    ATTENTIONS,
    FRAMEWORKS,
    MLPS,
    NORMS,
    POSITIONS,
    RECOMPUTE,
    framework_named,
    word_named,
)


def profile_option() -> Any:
    """``--profile``: the profile folder whose tables and device model time the plans."""
    return typer.Option(None, "--profile", help="Profile folder (latency tables, device model).")


def force_option() -> Any:
    """``--force``: replace a report folder vtrain wrote."""
    return typer.Option(False, "--force", help="Replace the report folder if vtrain wrote it.")


def device_option() -> Any:
    """``--device``: the GPU type."""
    return typer.Option("A100", "--device", help="GPU type.")


def gpus_per_node_option() -> Any:
    """``--gpus-per-node``."""
    return typer.Option(8, "--gpus-per-node", min=1, max=1024, help="GPUs per node.")


def inter_node_gbps_option() -> Any:
    """``--inter-node-gbps``: the network rate per node, replacing the profile's."""
    low, high = REAL_BOUNDS["inter_node_gbps"]  # the run config's own bounds: 0.001 passed here, refused there
    return real_option(None, "--inter-node-gbps", low, high,
                       f"Network bandwidth per node, Gbit/s, above {low:g} (default: the profile's).", above=True)


def device_memory_option() -> Any:
    """``--device-memory``: GiB per GPU, replacing the device's (finite: ``inf`` would let every plan fit)."""
    return real_option(None, "--device-memory", 0.1, MAX_DEVICE_MEMORY_GIB, "GiB per GPU (default: the device's).")


def framework_option(help_text: str = "Whose kernels, mixed precision and optimizer states the jobs run with: ",
                     default: str | None = "megatron") -> Any:
    """``--framework``: whose kernels and memory the studied jobs (or the measured runs) run with; a word that is
    none of :data:`~vtrain.runconfig.FRAMEWORKS` is a usage error. ``default`` None: a command that tells whether
    it was given (``validate`` takes it only with ``--measurements``)."""
    return typer.Option(default, "--framework", callback=_one_framework, help=help_text + (
        "megatron (Megatron-LM's, as the vTrain paper's studies and the runs profiles/a100 was fitted to) or "
        "reference (vtrain record's model)."))


def _one_framework(value: str | None) -> str | None:
    return _one_word(value, framework_named(value), FRAMEWORKS)


def _one_word(value: str | None, named: object, words: tuple[str, ...]) -> str | None:
    """The word ``value`` names (``named``, as the run config reads it), a usage error when it is none of
    ``words``; None when the option was not given."""
    if value is None:
        return None
    if named not in words:
        raise typer.BadParameter(f"must be one of {', '.join(words)} (got {value!r})")
    return str(named)


def attention_option(help_text: str = "How attention runs: ") -> Any:
    """``--attention``: how the jobs' (or the measured runs') attention runs; a word that is none of
    :data:`~vtrain.runconfig.ATTENTIONS` is a usage error. None when not given."""
    return typer.Option(None, "--attention", callback=_one_attention, help=help_text + (
        "eager (the scores in memory) or flash (PyTorch's fused FlashAttention); default: the run config's, else "
        "eager."))


def _one_attention(value: str | None) -> str | None:
    return _one_word(value, word_named(value), ATTENTIONS)


def ffn_hidden_option() -> Any:
    """``--ffn-hidden``: the MLP's width (default 4 x hidden)."""
    return typer.Option(None, "--ffn-hidden", min=1, help="MLP width (default 4 x hidden; LLaMA 2 7B: 11008).")


def kv_heads_option() -> Any:
    """``--kv-heads``: key and value heads, grouped-query attention (default: as many as heads)."""
    return typer.Option(None, "--kv-heads", min=1, help="Key/value heads, grouped-query attention (default: "
                                                        "--heads; LLaMA 3 70B: 8).")


def mlp_option() -> Any:
    """``--mlp``: gelu or swiglu (a word that is neither is a usage error)."""
    return typer.Option("gelu", "--mlp", callback=_one_mlp,
                        help="The MLP: gelu, or swiglu (gated: LLaMA, Mistral).")


def _one_mlp(value: str | None) -> str | None:
    return _one_word(value, word_named(value), MLPS)


def norm_option() -> Any:
    """``--norm``: layernorm or rmsnorm."""
    return typer.Option("layernorm", "--norm", callback=lambda value: _one_word(value, word_named(value), NORMS),
                        help="The layers' norm: layernorm, or rmsnorm (LLaMA, Mistral).")


def position_option() -> Any:
    """``--position``: learned or rope."""
    return typer.Option("learned", "--position",
                        callback=lambda value: _one_word(value, word_named(value), POSITIONS),
                        help="Positions: learned (an embedding), or rope (rotary: LLaMA, Mistral).")


def tie_embeddings_option() -> Any:
    """``--tie-embeddings/--untie-embeddings``: whether the output projection is the word embedding."""
    return typer.Option(None, "--tie-embeddings/--untie-embeddings",
                        help="Whether the output projection is the word embedding (default: Megatron's tie, GPT's; "
                             "LLaMA: --untie-embeddings).")


def dropout_option() -> Any:
    """``--dropout/--no-dropout``: whether Megatron's attention and hidden dropout run."""
    return typer.Option(None, "--dropout/--no-dropout",
                        help="Whether Megatron's attention and hidden dropout run (default: its 0.1, GPT's; LLaMA's "
                             "recipes: --no-dropout, no masks kept).")


def bias_option() -> Any:
    """``--bias/--no-bias``: whether the linear layers add biases."""
    return typer.Option(True, "--bias/--no-bias", help="Whether the linear layers add biases (LLaMA: --no-bias).")


def max_micro_batch_option() -> Any:
    """``--max-micro-batch``: the largest micro-batch a plan may use."""
    return typer.Option(4, "--max-micro-batch", min=1, max=MAX_MICRO_BATCH_TRIED, help="Largest micro-batch tried.")


def recompute_option(help_text: str, default: str | None = "full") -> Any:
    """``--recompute``: the activation recomputation of measured runs whose row does not say (a word that is none
    of :data:`~vtrain.runconfig.RECOMPUTE` made every row unusable: `fit` ended in a traceback). ``default`` None:
    a command that tells whether it was given."""
    return typer.Option(default, "--recompute", callback=_one_recompute, help=help_text)


def _one_recompute(value: str | None) -> str | None:
    return _one_word(value, value, RECOMPUTE)


def real_option(default: Any, flag: str, low: float, high: float, help_text: str, above: bool = False) -> Any:
    """A real-valued option from ``low`` to ``high`` (inclusive, or above ``low`` where ``above``; ``high`` may be
    infinity). ``nan`` is "not a number" (typer's own bounds said that it "should be less than or equal to" the
    largest value: NaN compares false with every number); ``min`` and ``max`` only show the range in the help, which
    the parser checks."""
    return typer.Option(default, flag, parser=_real_between(low, high, above), min=None if above else low,
                        max=None if math.isinf(high) else high, help=help_text)


def _real_between(low: float, high: float, above: bool = False) -> Callable[[str | float], float]:
    def parse(text: str | float) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number") from None
        if math.isnan(value):
            raise typer.BadParameter(f"{text!r} is not a number")
        if not (low < value if above else low <= value) or not value <= high:
            least = f"above {low:g}" if above else f"at least {low:g}"
            within = least if math.isinf(high) else f"{least} and at most {high:g}" if above \
                else f"between {low:g} and {high:g}"
            raise typer.BadParameter(f"must be {within} (got {text!r})")
        return value

    return parse
