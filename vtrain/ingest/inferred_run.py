"""The run a set of traces shows, read off its operators' shapes: for traces recorded without a ``run.yaml``.

A GPT-style training step leaves its shape in the ``Input Dims`` of a few operators of every iteration:

- the word embedding, ``aten::embedding`` on the largest table: its tokens are ``[micro-batch, sequence]``, its
  rows the vocabulary's share of one tensor-parallel rank, and its calls per iteration the micro-batches;
- the layer norms (``aten::native_layer_norm``, ``aten::_fused_rms_norm``): their last dimension is the hidden size,
  their backward calls are two a layer and one for the final norm on the last stage, each micro-batch; forward
  calls beyond the backward ones are recomputed layers; a norm over a tensor-parallel share of the tokens is
  sequence parallelism;
- the attention: the scores ``[b, a, s, s]`` (or ``[b x a, s, s]``) and their product with the values ``[b x a, s,
  d]``, or a fused attention's query ``[b, a, s, d]`` (``[b, s, a, d]`` for ``aten::_flash_attention_forward``):
  the heads a rank holds, and the head width; hidden / (heads x width) is the tensor parallelism;
- the MLP's activation (``aten::gelu``, ``aten::silu``: a gated MLP): its width's share.

The pipeline stages are Megatron's process group of that name where the traces list it, else the number of rank
files over those holding the embedding when every rank is traced, else one when a traced rank holds both the
embedding and the final norm; the data parallelism is what the world size leaves. What the shapes do not show is
said in the description (the schedule is taken as 1F1B, the gradient all-reduce as not overlapped, positions as
learned unless a rotary operator runs). Traces of anything else (no word embedding, no norms, no attention, shapes
that do not divide) give no run, with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import polars as pl

from vtrain.runconfig import HardwareConfig, ModelConfig, ParallelConfig, RunConfig

_EMBEDDING = "aten::embedding"
#: forward and backward operators of a layer norm, by norm
_NORMS = {"layernorm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
          "rmsnorm": ("aten::_fused_rms_norm", "aten::_fused_rms_norm_backward")}
#: fused attention operators whose query is [b, a, s, d]; aten::_flash_attention_forward's is [b, s, a, d]
_FUSED_ATTENTION = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu")
_FLASH_FORWARD = "aten::_flash_attention_forward"
_SCORES = ("aten::_softmax",)
_PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::matmul")
#: operator names only Megatron's layers run (its tensor-parallel linear layers, fused softmax and norms)
_MEGATRON = re.compile(r"LinearWithGradAccumulation|ScaledUpperTriangMaskedSoftmax|ScaledMaskedSoftmax|"
                       r"FusedLayerNormAffine")
_ROTARY = re.compile(r"(?i)rotary|\brope\b|fused_?rope")
_PRECISIONS = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32"}
_ACTIVATIONS = {"aten::silu": "swiglu", "aten::gelu": "gelu"}
#: the operators whose shapes are read (the others are only searched by name)
_READ = frozenset({_EMBEDDING, *(name for pair in _NORMS.values() for name in pair), *_FUSED_ATTENTION,
                   _FLASH_FORWARD, *_SCORES, *_PRODUCTS, *_ACTIVATIONS, "aten::_softmax_backward_data"})


@dataclass(frozen=True)
class InferredRun:
    """A run read off the traces (``config``, and what of it was assumed: ``assumed``), or why none could be
    (``reason``)."""

    config: RunConfig | None
    reason: str | None = None
    assumed: str = ""

    def describe(self) -> str:
        """The inferred run on one line (empty without one)."""
        if self.config is None:
            return ""
        run, layout = self.config, self.config.parallelism
        return (f"{run.model.describe()}; t{layout.tp} d{layout.dp} p{layout.pp}, micro-batch {layout.micro_batch}, "
                f"global batch {layout.global_batch}, recompute {layout.recompute}"
                f"{', sequence parallel' if layout.sequence_parallel else ''}, {run.precision}, {run.framework}'s "
                f"kernels, {run.attention} attention, on {run.hardware.device}")


def infer_run(cpu_ops: pl.DataFrame, world_size: int | None, device: str | None,
              process_groups: list[dict[str, Any]] | None = None) -> InferredRun:
    """The run the CPU operators of a trace set (ingest's ``cpu_ops`` table, every traced rank) show: see the
    module's description. ``device`` is the traces' GPU name (None or ``cpu``: a CPU run); ``process_groups`` the
    ``pg_config`` of a rank's ``distributedInfo`` (Megatron names its groups)."""
    try:
        return _inferred(cpu_ops, world_size or 1, device, process_groups or [])
    except _NotShown as missing:
        return InferredRun(None, reason=str(missing))
    except (ValueError, TypeError, IndexError, ArithmeticError) as odd:  # dims no run has (text, 0, nested)
        return InferredRun(None, reason=f"the operators' shapes do not make a run ({type(odd).__name__}: {odd})")


class _NotShown(Exception):
    """What the traces do not show, for the reason no run is inferred."""


@dataclass(frozen=True)
class _Rank:
    """One traced rank's operators of one iteration: those whose shapes are read (:data:`_READ`), by name, with
    their input dims and types parsed; and the names of all."""

    rank: int
    ops: dict[str, list[tuple[list[Any], list[Any]]]]
    names: frozenset[str]

    def calls(self, name: str) -> list[tuple[list[Any], list[Any]]]:
        return self.ops.get(name, [])

    def count(self, name: str) -> int:
        return len(self.ops.get(name, []))


def _inferred(cpu_ops: pl.DataFrame, world: int, device: str | None,
              groups: list[dict[str, Any]]) -> InferredRun:
    ranks = _ranks(cpu_ops)
    first = [rank for rank in ranks if _word_embedding(rank)]
    if not first:
        raise _NotShown("no word embedding (aten::embedding with its input dims) in any traced iteration: not a "
                        "language model's training, or recorded without record_shapes")
    rank = first[0]
    table, tokens = _word_embedding(rank)
    micro_batches = len([dims for dims, _ in rank.calls(_EMBEDDING) if _shape(dims[0] if dims else None, 2)
                         and dims[0][0] == table])
    batch, seq = (tokens[0], tokens[1]) if len(tokens) == 2 else (1, tokens[0])
    norm, (forward, backward) = _norm_of(rank)
    hidden = int(rank.calls(forward)[0][0][0][-1])
    heads_here, width = _attention(rank, batch, seq)
    if hidden % (heads_here * width):
        raise _NotShown(f"hidden size {hidden} is no multiple of the {heads_here} attention heads of width {width} "
                        f"a rank holds")
    tp = hidden // (heads_here * width)
    pp = _stages(ranks, first, world, groups, backward, micro_batches)
    if world % (tp * pp):
        raise _NotShown(f"{world} ranks do not divide into tensor parallelism {tp} x {pp} pipeline stages")
    dp = world // (tp * pp)
    layers = _layers(ranks, backward, micro_batches, tp * dp, pp)
    mlp, ffn_share = _mlp(rank)
    model = ModelConfig(layers=layers, hidden=hidden, heads=heads_here * tp, seq=seq, vocab=table * tp,
                        ffn_hidden=ffn_share * tp if ffn_share * tp != 4 * hidden else None, mlp=mlp, norm=norm,
                        position="rope" if any(_ROTARY.search(name) for name in rank.names) else "learned")
    tokens_normed = _product(rank.calls(forward)[0][0][0][:-1])
    parallel = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=batch, global_batch=micro_batches * batch * dp,
                              recompute=_recompute(rank, forward, backward),
                              sequence_parallel=tp > 1 and tokens_normed * tp == batch * seq)
    megatron = any(_MEGATRON.search(name) for one in ranks for name in one.names) or any(
        "TENSOR_MODEL_PARALLEL" in str(group.get("pg_desc")) for group in groups)
    gpu = device if device and device.lower() != "cpu" else "cpu"
    config = RunConfig(model=model, parallelism=parallel, precision=_precision(rank),
                       framework="megatron" if megatron else "reference",
                       attention="flash" if _fused(rank) else "eager",
                       hardware=HardwareConfig(device=gpu, device_count=world,
                                               gpus_per_node=min(world, HardwareConfig().gpus_per_node)))
    assumed = "the schedule 1F1B, the gradient all-reduce not overlapped, the output layer tied to the embedding"
    return InferredRun(config, assumed=assumed)


def _ranks(cpu_ops: pl.DataFrame) -> list[_Rank]:
    """Each traced rank's operators of its middle iteration (its first may hold the start-up)."""
    ops = cpu_ops.filter(pl.col("iteration").is_not_null() & pl.col("input_dims").is_not_null())
    ranks = []
    for (rank,), frame in sorted(ops.group_by("rank"), key=lambda item: item[0][0]):
        iterations = sorted(frame["iteration"].unique().to_list())
        one = frame.filter(pl.col("iteration") == iterations[len(iterations) // 2])
        by_name: dict[str, list[tuple[list[Any], list[Any]]]] = {}
        read = one.filter(pl.col("name").is_in(list(_READ)))
        for name, dims, types in read.select("name", "input_dims", "input_types").iter_rows():
            by_name.setdefault(name, []).append((_parsed(dims), _parsed(types)))
        ranks.append(_Rank(int(rank), by_name, frozenset(one["name"].unique().to_list())))
    return ranks


def _parsed(text: str | None) -> list[Any]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _word_embedding(rank: _Rank) -> tuple[int, list[int]] | None:
    """(rows of the word embedding's table, its tokens' dims) of the rank's largest embedding table, if any."""
    calls = [(dims[0], dims[1]) for dims, _ in rank.calls(_EMBEDDING)
             if len(dims) >= 2 and _shape(dims[0], 2) and _shape(dims[1], 1, 2)]
    if not calls:
        return None
    table, tokens = max(calls, key=lambda call: call[0][0])
    return int(table[0]), [int(x) for x in tokens]


def _shape(dims: Any, *lengths: int) -> bool:
    return isinstance(dims, list) and len(dims) in lengths and all(isinstance(x, int) and x > 0 for x in dims)


def _norm_of(rank: _Rank) -> tuple[str, tuple[str, str]]:
    for norm, (forward, backward) in _NORMS.items():
        if rank.count(backward) and rank.calls(forward) and _shape(rank.calls(forward)[0][0][0], 2, 3):
            return norm, (forward, backward)
    raise _NotShown("no layer norm with its backward (aten::native_layer_norm, aten::_fused_rms_norm) in the "
                    "embedding's rank")


def _attention(rank: _Rank, batch: int, seq: int) -> tuple[int, int]:
    """(heads a rank holds, head width) from its fused attention's query, else its scores and their product."""
    for name in (*_FUSED_ATTENTION, _FLASH_FORWARD):
        for dims, _ in rank.calls(name):
            query = dims[0] if dims else None
            if _shape(query, 4):
                heads = query[2] if name == _FLASH_FORWARD else query[1]
                return int(heads), int(query[3])
    heads = next((int(dims[0][1]) if len(dims[0]) == 4 else int(dims[0][0]) // batch
                  for name in _SCORES for dims, _ in rank.calls(name)
                  if dims and _shape(dims[0], 3, 4) and dims[0][-1] == dims[0][-2] == seq), None)
    width = next((int(operand[-1]) for name in _PRODUCTS for dims, _ in rank.calls(name)
                  for operand in dims[1:2] if dims and _shape(dims[0], 3, 4) and dims[0][-1] == dims[0][-2] == seq
                  and _shape(operand, 3, 4) and operand[-2] == seq and operand[-1] != seq), None)
    if not heads or not width:
        raise _NotShown("no attention scores [b, heads, s, s] with their product by the values in the embedding's "
                        "rank")
    return heads, width


def _fused(rank: _Rank) -> bool:
    return any(rank.count(name) for name in (*_FUSED_ATTENTION, _FLASH_FORWARD))


def _stages(ranks: list[_Rank], first: list[_Rank], world: int, groups: list[dict[str, Any]], backward: str,
            micro_batches: int) -> int:
    named = [group.get("pg_size") for group in groups if group.get("pg_desc") == "PIPELINE_MODEL_PARALLEL_GROUP"]
    if named and isinstance(named[0], int) and named[0] > 0:
        return named[0]
    if len(ranks) == world and world % len(first) == 0:
        return world // len(first)
    if (first[0].count(backward) // max(micro_batches, 1)) % 2:  # the final norm: the last stage too
        return 1
    raise _NotShown("the pipeline stages: the traces hold some of the ranks and do not name the pipeline's group")


def _layers(ranks: list[_Rank], backward: str, micro_batches: int, per_stage: int, pp: int) -> int:
    """Layers from the norms' backward calls: two a layer and a final one, each micro-batch, over the stages."""
    counts = [rank.count(backward) for rank in ranks]
    norms = counts[0] if pp == 1 else sum(counts)
    ranks_counted = 1 if pp == 1 else per_stage
    if norms % (micro_batches * ranks_counted) or (norms // (micro_batches * ranks_counted)) % 2 == 0:
        raise _NotShown(f"{norms} layer-norm backward calls are not two a layer and a final one for each of "
                        f"{micro_batches} micro-batches")
    return (norms // (micro_batches * ranks_counted) - 1) // 2


def _mlp(rank: _Rank) -> tuple[str, int]:
    for name, mlp in _ACTIVATIONS.items():
        calls = [dims[0] for dims, _ in rank.calls(name) if dims and _shape(dims[0], 2, 3)]
        if calls:
            return mlp, int(calls[0][-1])
    raise _NotShown("no MLP activation (aten::gelu, aten::silu) in the embedding's rank")


def _recompute(rank: _Rank, forward: str, backward: str) -> str:
    if rank.count(forward) > rank.count(backward):
        return "full"
    scores = sum(rank.count(name) for name in _SCORES)
    return "selective" if scores > rank.count("aten::_softmax_backward_data") > 0 else "none"


def _precision(rank: _Rank) -> str:
    """The precision of the attention's GEMMs (a norm may run in fp32 under autocast)."""
    for name in (*_FUSED_ATTENTION, _FLASH_FORWARD, *_PRODUCTS):
        for _, types in rank.calls(name):
            if types and types[0] in _PRECISIONS:
                return _PRECISIONS[types[0]]
    return "fp32"


def _product(dims: list[Any]) -> int:
    total = 1
    for x in dims:
        total *= int(x)
    return total
