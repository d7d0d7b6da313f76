"""The run a set of traces shows, read off its operators' shapes: for traces recorded without a ``run.yaml``.

A GPT-style training step leaves its shape in the ``Input Dims`` of a few operators of every iteration:

- the word embedding, ``aten::embedding`` on the largest table: its tokens are ``[micro-batch, sequence]``, its
  table ``[vocabulary's share of one tensor-parallel rank, hidden]`` where its output is reduced over those ranks
  before the first attention (Megatron's vocabulary-parallel embedding), else ``[vocabulary, hidden]`` (a table
  whole on every rank, said), and its calls per iteration the micro-batches (of an iteration whose every lookup is
  back-propagated: an evaluation's forwards are no micro-batches);
- the attention: the scores ``[b, a, s, s]`` (or ``[b x a, s, s]``) and their product with the values ``[b x a, s,
  d]``, or a fused attention's query and key ``[b, a, s, d]`` (``[b, s, a, d]`` for
  ``aten::_flash_attention_forward`` and the flash-attn package's ``flash_attn::_flash_attn_forward``, ``[tokens,
  a, d]`` for its packed sequences): the heads a rank holds and their width (hidden / (heads x width) is the
  tensor parallelism), a key with fewer heads grouped-query attention (or keys repeated to as many heads before
  it: Hugging Face's and torchtitan's ``repeat_kv``, ``repeat_interleave``); its backward runs once a layer and
  micro-batch (the layers), its forward more often where layers are recomputed;
- the norms (``aten::native_layer_norm``; ``aten::_fused_rms_norm``, or none: RMSNorm written out of elementwise
  operators, as Hugging Face's LLaMA does): recomputed with the layer (full recomputation) or not (selective); a
  norm over a tensor-parallel share of the tokens is sequence parallelism;
- the MLP's activation (``aten::gelu``, ``aten::silu``, Megatron's fused ones by name): its width's share, gated
  where its output is multiplied by a tensor of its shape; ``aten::linear`` without a bias: linear layers without
  biases.

The pipeline stages are Megatron's process group of that name where the traces list it, else the number of rank
files over those holding the embedding when every rank is traced, else one when a traced rank holds both the
embedding and the loss; the data parallelism is what the world size leaves. The schedule is interleaved with v
virtual stages where the first stage sends 2v - 1 times a micro-batch, GPipe where it runs every forward before a
backward, else 1F1B. The gradients' all-reduces (flat buckets; a tensor-parallel all-reduce is an activation), or
their reduce-scatters (Megatron's distributed optimizer; ZeRO's stages 1 and 2, which the reference model prices as
all-reduces: as many bytes), are overlapped with the backward pass where one is issued before the embedding's
backward (the last computed) begins, and their buckets are the median's MiB (PyTorch DDP's: the smallest but its
first, closed at 1 MiB, and the last). The output layer is the word
embedding's where the optimizer's lists of parameters hold one matrix of its shape, its own where they hold two.
What the shapes do not show is said: the gradient all-reduce is taken as not overlapped where no all-reduce's dims
were recorded, the output layer as tied (Megatron's default; the reference model's own) where no list shows it,
positions as learned unless a rotary operator runs, Megatron's kernels for a layer other than GPT's where the
traces do not show Megatron's (vtrain's reference model has GPT's layer only); so is what is placed otherwise than
it ran (some layers or only the MLPs recomputed, gradients reduced in every micro-batch, PyTorch's
ZeroRedundancyOptimizer's broadcasts not simulated). Traces of anything else
(no word embedding, no attention, shapes that do not divide, FSDP's sharded data parallelism, layers compiled by
torch.compile into fused kernels that record none of their shapes) give no run, with the reason.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from vtrain import kineto
from vtrain.kineto import BACKWARD_OP_PREFIX, COMPILED_REGION, compiled_markers
from vtrain.runconfig import HardwareConfig, ModelConfig, ParallelConfig, RunConfig

_EMBEDDING, _EMBEDDING_BACKWARD = "aten::embedding", "aten::embedding_dense_backward"
#: a process group as :func:`vtrain.kineto.process_groups` reads it: its ``pg_config`` entry and the ranks it lists
_Group = tuple[dict[str, Any], tuple[int, ...]]
#: forward operators of the norms
_LAYER_NORM, _RMS_NORM = "aten::native_layer_norm", "aten::_fused_rms_norm"
#: apex's fused norms (Megatron's), by the names of their autograd functions: no operator records their shapes
_APEX_NORMS = ((re.compile(r"FusedLayerNorm|FastLayerNorm"), "layernorm"), (re.compile(r"FusedRMSNorm"), "rmsnorm"))
#: a norm written out of element-wise operators: each token's statistic, ``[..., 1]``, under a (reciprocal) square
#: root (Hugging Face's LlamaRMSNorm: ``rsqrt`` of its mean square); a LayerNorm's also subtracts each token's mean
#: from its ``[..., hidden]`` row first
_ROOTS, _SUBTRACT = ("aten::rsqrt", "aten::sqrt"), "aten::sub"
#: fused attention operators whose query and key are [b, a, s, d]
_FUSED_ATTENTION = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu")
#: fused attention operators whose query and key are [b, s, a, d] (PyTorch's own flash kernel; the flash-attn
#: package's, as Hugging Face's ``flash_attention_2`` runs it), or [tokens, a, d] (the package's packed sequences)
_SEQUENCE_FIRST = ("aten::_flash_attention_forward", "flash_attn::_flash_attn_forward")
_PACKED = ("flash_attn::_flash_attn_varlen_forward",)
#: every fused attention's forward -> (its query's and key's dims, the axis of their heads)
_HEAD_AXIS = {**dict.fromkeys(_FUSED_ATTENTION, (4, 1)), **dict.fromkeys(_SEQUENCE_FIRST, (4, 2)),
              **dict.fromkeys(_PACKED, (3, 1))}
#: each attention's backward, once a layer and micro-batch whatever is recomputed
_ATTENTION_BACKWARD = ("aten::_softmax_backward_data", *(f"{name}_backward" for name in _FUSED_ATTENTION),
                       "aten::_flash_attention_backward", "flash_attn::_flash_attn_backward",
                       "flash_attn::_flash_attn_varlen_backward")
_SCORES = ("aten::_softmax",)
_PRODUCTS = ("aten::bmm", "aten::baddbmm", "aten::matmul")
#: Megatron's fused kernels (its fused softmax, apex's norms): a Megatron run without them ran PyTorch's operators
_FUSED_KERNELS = re.compile(r"ScaledUpperTriangMaskedSoftmax|ScaledMaskedSoftmax|FusedLayerNormAffine|FusedRMSNorm")
#: operator names only Megatron's layers run (its tensor-parallel linear layers, fused softmax and norms)
_MEGATRON = re.compile(rf"LinearWithGradAccumulation|{_FUSED_KERNELS.pattern}")
#: sharded data parallelism (PyTorch's FSDP, FSDP2's fully_shard): its all-gathers are not simulated
_SHARDED = re.compile(r"FullyShardedDataParallel|^FSDP::|fully_shard")
#: PyTorch's ZeroRedundancyOptimizer, by the span its step records (``Optimizer.step#ZeroRedundancyOptimizer.step``):
#: each rank updates its share of the parameters and broadcasts it to the others, which vtrain does not simulate
_ZERO_OPTIMIZER = re.compile(r"ZeroRedundancyOptimizer")
#: a broadcast: a backend's event (its time spent), else c10d's
_BACKEND_BROADCAST, _BROADCAST = r"^(?:nccl|gloo|ucc|mpi|xccl):broadcast$", r"^c10d::broadcast_$"
_ROTARY = re.compile(r"(?i:rotary|\brope\b|fused_?rope)")
#: rotary positions written out of element-wise operators (Hugging Face's LLaMA, its ``rotate_half``): each head's
#: two halves concatenated, swapped, ``aten::cat`` of two ``[b, a, s, d / 2]`` tensors; where only part of the head
#: is rotated (GPT-NeoX's ``rotary_pct``), the rotated part and the rest concatenated back into ``d``
_CAT = "aten::cat"
#: a rotary embedding that turns each pair of a head's width as a complex number (Meta's LLaMA, torchtitan): the
#: queries and keys viewed as ``[..., width / 2, 2]`` complex numbers
_COMPLEX = "aten::view_as_complex"
#: all-to-all exchanges: tokens sent to experts on other ranks (a mixture of experts) or sequences split over ranks
#: (Ulysses), neither of which vtrain simulates; c10d's, its functional collectives' and the backends' operators
#: (not a user's span that names one: ``record_function("log_all_to_all_stats")``)
_ALL_TO_ALL = re.compile(r"^(?:c10d::alltoall|_c10d_functional::all_to_all|(?:nccl|gloo|ucc|mpi):all_to_all)")
#: the loss: a rank that computes it holds the last stage
_LOSS = re.compile(r"(?i:nll_loss|cross_?entropy)")
_BACKEND_SEND = r"^(?:nccl|gloo|ucc|mpi):send$"
#: a gradient all-reduce: a backend's event (its tensors' elements and types), else c10d's (its flat buckets'
#: elements); ``_coalesced``: a list of buckets issued together (Megatron-core's ``_coalescing_manager``)
_BACKEND_ALL_REDUCE = r"^(?:nccl|gloo|ucc|mpi|xccl):all_reduce(?:_coalesced)?$"
_ALL_REDUCE = r"^c10d::allreduce_(?:coalesced_)?$"
_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}
#: a reduce-scatter, c10d's (its output's and its input's dims: a flat input is a gradient bucket, as Megatron's
#: distributed optimizer and ZeRO's stages 1 and 2 reduce them): of one tensor, or of a list of them issued together
#: (``[[[out], ...], [[in], ...], ...]``: Megatron-core's buckets in its ``_coalescing_manager``)
_REDUCE_SCATTER = r"^c10d::(?:_reduce_scatter_base_|reduce_scatter_tensor_coalesced_)$"
#: an all-gather, c10d's or a backend's
_ALL_GATHER = (r"^c10d::(?:_allgather_base_|allgather_|allgather_into_tensor_coalesced_)$|"
               r"^(?:nccl|gloo|ucc|mpi|xccl):(?:_all_gather_base|all_gather|all_gather_into_tensor_coalesced)$")
_PRECISIONS = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32"}
#: the MLP's activation, by the function it is: Megatron's fused ones first (autograd functions whose kernels record
#: no operator: their input's last dim is the MLP's share, twice it for a gated one, whose two halves are multiplied),
#: then PyTorch's, first found first: SiLU, GELU, GELU written out of element-wise operators with tanh (Hugging Face's
#: GPT-2, ``gelu_new``), ReLU (OPT's). A gated MLP of a PyTorch activation multiplies its output by a tensor of its
#: shape (:func:`_gated`). vtrain simulates SwiGLU (gated) and GELU MLPs; another is placed as the one with its GEMMs
_FUSED_ACTIVATIONS = {"GeLUFunction": ("GELU", False), "SwiGLUFunction": ("SiLU", True),
                      "BiasSwiGLUFunction": ("SiLU", True), "GeGLUFunction": ("GELU", True),
                      "BiasGeGLUFunction": ("GELU", True)}
_ACTIVATIONS = {"aten::silu": "SiLU", "aten::gelu": "GELU", "aten::tanh": "GELU", "aten::relu": "ReLU"}
_WRITTEN_GELU = "aten::tanh"  # its formula multiplies tensors of the activation's shape: no gating read from it
_MULTIPLY, _DROPOUT = "aten::mul", "aten::dropout"
#: an optimizer step over a list of parameters, one call a group (PyTorch's fused and foreach Adam): which matrices
#: the model trains
_PARAMETER_LISTS = ("aten::_fused_adamw_", "aten::_fused_adam_", "aten::_foreach_lerp_", "aten::_foreach_addcmul_")
_LINEAR = "aten::linear"
#: a GEMM that adds a bias
_BIASED_GEMM = "aten::addmm"
#: how grouped-query attention repeats its keys and values for an attention that takes as many as it has queries:
#: (operator, its input's layout, ``kv`` where the key/value heads are, ``1`` the axis repeated): Hugging Face's
#: ``repeat_kv`` and torchtitan's expand, Megatron's ``repeat_interleave`` on dim 2, others' on dim 1
_EXPAND, _REPEAT_INTERLEAVE = "aten::expand", "aten::repeat_interleave"
_REPEATS = ((_EXPAND, ("b", "kv", 1, "s", "d")), (_EXPAND, ("b", "s", "kv", 1, "d")),
            (_REPEAT_INTERLEAVE, ("s", "b", "kv", "d")), (_REPEAT_INTERLEAVE, ("b", "kv", "s", "d")))
#: the operators whose shapes are read (the others are only searched by name)
_READ = frozenset({_EMBEDDING, _EMBEDDING_BACKWARD, _LAYER_NORM, _RMS_NORM, *_ROOTS, _SUBTRACT, _CAT, _COMPLEX,
                   *_HEAD_AXIS,
                   *_ATTENTION_BACKWARD, *_SCORES, *_PRODUCTS, *_FUSED_ACTIVATIONS, *_ACTIVATIONS, _MULTIPLY, _DROPOUT,
                   *_PARAMETER_LISTS, _LINEAR,
                   _EXPAND, _REPEAT_INTERLEAVE})


#: where a run read off the traces comes from, as warnings and reports say it
INFERRED = "read off the traces' shapes"


@dataclass(frozen=True)
class InferredRun:
    """A run read off the traces (``config``, and what of it was assumed: ``assumed``), or why none could be
    (``reason``)."""

    config: RunConfig | None
    reason: str | None = None
    assumed: str = ""
    #: what of ``config`` the traces do not show for sure (``layers``, ``seq``, ``micro-batch``): taken as one rank's
    #: stage for all, or one length for micro-batches of several
    unsure: frozenset[str] = frozenset()

    def describe(self) -> str:
        """The inferred run on one line (empty without one)."""
        if self.config is None:
            return ""
        run, layout = self.config, self.config.parallelism
        when = "overlapped with the backward pass" if layout.dp_overlap else "after the backward pass"
        how = "reduce-scatter (distributed optimizer)" if layout.distributed_optimizer else "all-reduce"
        reduced = f", gradient {how} {when} in buckets of {layout.dp_bucket_mb:g} MiB" if layout.dp > 1 else ""
        return (f"{run.model.describe()}; t{layout.tp} d{layout.dp} p{layout.pp}, micro-batch {layout.micro_batch}, "
                f"global batch {layout.global_batch}, recompute {layout.recompute}{reduced}"
                f"{', sequence parallel' if layout.sequence_parallel else ''}, {run.precision}, {run.framework}'s "
                f"{'kernels' if run.fused_kernels else 'layers without fused kernels'}, {run.attention} attention, "
                f"on {run.hardware.device}")


#: the kinds of accelerator a trace's device activities tell (vtrain.kineto.accelerator), standing for a GPU the
#: trace does not name
UNNAMED_GPUS = ("cuda", "rocm", "mtia")


def infer_run(cpu_ops: pl.DataFrame | pl.LazyFrame, world_size: int | None, device: str | None,
              process_groups: object = None) -> InferredRun:
    """The run the CPU operators of a trace set (ingest's ``cpu_ops`` table, every traced rank; a lazy frame is
    read for the few operators of one iteration a rank that tell the run) show: see the module's description.
    ``device`` is the traces' GPU name (None or ``cpu``: a CPU run; an accelerator's kind, ``cuda``, ``rocm`` or
    ``mtia``: a GPU the traces do not name, whose run is not read); ``process_groups`` the ``pg_config`` of a
    rank's ``distributedInfo`` (Megatron names its groups), read as ingest and the replay read it
    (:func:`vtrain.kineto.process_groups`: a group is the ranks it lists, and one beyond the job is none)."""
    if device in UNNAMED_GPUS:
        return InferredRun(None, reason=f"its device activities ran on a GPU ({device}) the traces do not name (no "
                                        "deviceProperties, which Kineto writes on every GPU): the run's GPU is unknown")
    try:
        groups = kineto.process_groups(process_groups, world_size)
        ops = _telling(cpu_ops.lazy())
        if ops.is_empty() and _unmarked_embedding(cpu_ops.lazy()):
            raise _NotShown("no iteration marks (ProfilerStep#N spans, which torch.profiler's step() writes): the "
                            "micro-batches of one iteration cannot be counted")
        inferred = _said_lengths(_inferred(ops, world_size or 1, device, groups), cpu_ops.lazy())
    except _NotShown as missing:
        return InferredRun(None, reason=str(missing))
    except (ValueError, TypeError, IndexError, KeyError, AttributeError, ArithmeticError) as odd:  # no run's dims
        return InferredRun(None, reason=f"the operators' shapes do not make a run ({type(odd).__name__}: {odd})")
    problems = inferred.config.constraint_errors() if inferred.config is not None else []
    if problems:  # shapes beyond what a run can be (a hostile trace)
        return InferredRun(None, reason=f"the run its shapes make is none: {problems[0]}")
    return inferred


def _said_lengths(inferred: InferredRun, cpu_ops: pl.LazyFrame) -> InferredRun:
    """``inferred``, saying where the traced iterations' micro-batches embed tokens of other shapes than the one it
    was read off (batches padded to their longest sample, as Hugging Face's collators pad them): one length is
    simulated for all."""
    if inferred.config is None:
        return inferred
    texts = (cpu_ops.filter((pl.col("name").cast(pl.String) == _EMBEDDING) & pl.col("iteration").is_not_null())
             .select(pl.col("input_dims").cast(pl.String).unique()).collect()["input_dims"].to_list())
    shapes = sorted({tuple(tokens) for _, tokens in _word_lookups(map(_parsed, texts))})
    if len(shapes) < 2:
        return inferred
    batches = {shape[0] for shape in shapes if len(shape) == 2}
    if len(batches) == 1 and all(len(shape) == 2 for shape in shapes):
        which = f"sequences of {shapes[0][1]} to {shapes[-1][1]} tokens, {batches.pop()} a micro-batch"
    else:
        which = f"tokens of {len(shapes)} shapes, {', '.join(str(list(shape)) for shape in shapes[:4])}" \
                f"{', ...' if len(shapes) > 4 else ''}"
    said = (f"every micro-batch {inferred.config.model.seq} tokens long, as in one iteration (its micro-batches "
            f"embed {which}: one length is simulated)")
    return replace(inferred, assumed=f"{said}, {inferred.assumed}" if inferred.assumed else said,
                   unsure=inferred.unsure | {"seq", "micro-batch"})


class _NotShown(Exception):
    """What the traces do not show, for the reason no run is inferred."""


def _hidden(ranks: list[_Rank], missing: str) -> _NotShown:
    """A layer's shapes ``missing`` from ``ranks``; where their step ran compiled, that is why."""
    compiled = compiled_markers(name for one in ranks for name in one.names)
    if not compiled:
        return _NotShown(missing)
    return _NotShown(f"the model runs compiled ({', '.join(compiled)}: torch.compile), its layers as fused kernels "
                     f"that record none of their shapes ({missing}); --config gives the run")


@dataclass(frozen=True)
class _Rank:
    """One traced rank's telling operators of one iteration (:func:`_telling`): those whose shapes are read
    (:data:`_READ`), by name, with their input dims and types parsed; and the names of all of them."""

    rank: int
    ops: dict[str, list[tuple[list[Any], list[Any]]]]
    names: frozenset[str]
    embedding_order: list[str]  # the embedding's forward and backward calls, in the order they ran
    sends: int  # point-to-point sends (c10d's, else a backend's: nccl:send, gloo:send)
    all_reduces: list[tuple[float, list[Any] | None, int]]  # (issued at, dims, bytes each) a backend's, else c10d's
    reduce_scatters: list[tuple[float, list[Any] | None, int]]  # (issued at, the input's dims, bytes each)
    last_embedding_backward: float | None  # when the iteration's last embedding backward began
    first_embedding_backward: float | None  # when its first began
    gathers_in_backward: bool  # whether flat tensors (parameters) are all-gathered during the backward pass
    first_lookup: float | None  # when the iteration's first embedding lookup began
    first_attention: float | None  # when its first attention's forward began (scores, their product or fused)
    broadcasts: list[float]  # each broadcast's time (µs): a backend's, else c10d's

    def calls(self, name: str) -> list[tuple[list[Any], list[Any]]]:
        return self.ops.get(name, [])

    def count(self, name: str) -> int:
        return len(self.ops.get(name, []))


def _inferred(ops: pl.DataFrame, world: int, device: str | None, groups: list[_Group]) -> InferredRun:
    ranks = _ranks(ops)
    first = [rank for rank in ranks if _word_embedding(rank)]
    if not first:
        raise _hidden(ranks, "no word embedding (aten::embedding with its input dims) in any traced iteration: not "
                      "a language model's training, or recorded without record_shapes")
    if not any(name.startswith(BACKWARD_OP_PREFIX) for one in ranks for name in one.names):
        raise _NotShown("no backward pass (no autograd operator in any traced iteration): inference or evaluation, "
                        "where vtrain simulates training")
    exchanged = next((name for one in ranks for name in sorted(one.names) if _ALL_TO_ALL.search(name)), None)
    if exchanged:
        raise _NotShown(f"all-to-all exchanges in the training step ({exchanged}): experts on other ranks (a mixture "
                        f"of experts) or sequences split over ranks, which vtrain does not simulate")
    sharded = next((name for one in ranks for name in sorted(one.names) if _SHARDED.search(name)), None) or next(
        ("parameters all-gathered in the backward pass" for one in ranks if one.gathers_in_backward), None)
    if sharded:
        raise _NotShown(f"a sharded data-parallel run ({sharded}): vtrain does not simulate FSDP's or ZeRO-3's "
                        f"gathers")
    rank = first[0]
    table, hidden, tokens = _word_embedding(rank)
    micro_batches = len([dims for dims, _ in rank.calls(_EMBEDDING) if _shape(dims[0] if dims else None, 2)
                         and dims[0][0] == table])
    _back_propagated(rank)
    batch, seq = (tokens[0], tokens[1]) if len(tokens) == 2 else (1, tokens[0])
    heads_here, width, kv_here = _attention(rank, batch, seq)
    packed = _packed_sequences(rank)
    repacked = packed > batch  # documents packed into one row, attended to each on its own: shorter sequences
    if packed > batch * seq:
        raise _NotShown(f"its attention packs {packed:,} sequences into a row of {batch * seq:,} tokens")
    if repacked:
        batch, seq = packed, batch * seq // packed
    if hidden % (heads_here * width):
        raise _NotShown(f"hidden size {hidden} is no multiple of the {heads_here} attention heads of width {width} "
                        f"a rank holds")
    tp = hidden // (heads_here * width)
    pp = _stages(ranks, first, world, groups)
    if world % (tp * pp):
        raise _NotShown(f"{world} ranks do not divide into tensor parallelism {tp} x {pp} pipeline stages")
    dp = world // (tp * pp)
    layers, stages_said = _layers(ranks, rank, micro_batches, pp, tp * dp, world)
    mlp, ffn_share, placed, activations = _mlp(rank)
    position = _positions(rank, table, width)
    norm_kind = _norm(rank, hidden)
    norm = _LAYER_NORM if norm_kind == "layernorm" else _RMS_NORM
    split = tp == 1 or _vocabulary_parallel(rank)  # the table a share of the vocabulary, else all of it
    model = ModelConfig(layers=layers, hidden=hidden, heads=heads_here * tp, seq=seq, vocab=table * tp if split
                        else table,
                        ffn_hidden=ffn_share * tp if ffn_share * tp != 4 * hidden else None, mlp=mlp,
                        norm=norm_kind or "rmsnorm",
                        kv_heads=kv_here * tp if kv_here != heads_here else None, bias=_biased(rank),
                        position=position or "learned")
    normed = [dims[0] for dims, _ in rank.calls(norm) if dims and _shape(dims[0], 2, 3)]
    schedule, virtual = _schedule(rank, micro_batches, pp)
    recompute, recomputed = _recompute(rank, norm, micro_batches, activations)
    megatron = any(_MEGATRON.search(name) for one in ranks for name in one.names) or any(
        "TENSOR_MODEL_PARALLEL" in str(group.get("pg_desc")) for group, _ in groups)
    framework = "megatron" if megatron or not model.is_gpt else "reference"
    overlap, bucket, scattered = (_gradient_reduction(rank, tp, ddp=framework == "reference") if dp > 1
                                  else (None, None, False))
    every_micro_batch = _reduced_every_micro_batch(rank, tp, micro_batches) if dp > 1 else ""
    tied = _tied(rank, table, hidden) if pp == 1 else None
    if framework == "megatron":
        model = replace(model, tie_embeddings=tied)
    parallel = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch=batch, global_batch=micro_batches * batch * dp,
                              schedule=schedule, virtual_stages=virtual, dp_overlap=bool(overlap),
                              dp_bucket_mb=bucket or ParallelConfig.dp_bucket_mb,
                              recompute=recompute,
                              sequence_parallel=tp > 1 and bool(normed) and math.prod(normed[0][:-1]) * tp
                              == batch * seq, distributed_optimizer=scattered and framework == "megatron")
    gpu = device if device and device.lower() != "cpu" else "cpu"
    attention = "flash" if _fused(rank) else "eager"
    config = RunConfig(model=model, parallelism=parallel, precision=_precision(rank),
                       framework=framework,
                       attention=attention,
                       fused_kernels=not megatron or attention == "flash" or _fused_kernels(ranks),
                       hardware=HardwareConfig(device=gpu, device_count=world,
                                               gpus_per_node=min(world, HardwareConfig().gpus_per_node)))
    assumed = ", ".join(([f"the {packed} sequences packed in a micro-batch of one length ({seq} tokens: the "
                          f"trace holds their count, not their lengths)"] if repacked else [])
                        + ([] if overlap is not None or dp == 1 else ["the gradient all-reduce not overlapped"])
                        + ([f"buckets of {ParallelConfig.dp_bucket_mb:g} MiB"] if dp > 1 and not bucket else [])
                        + (["its gradients reduce-scattered and parameters all-gathered (ZeRO's stages 1 and 2) taken "
                            "as all-reduced, as many bytes (the reference model's optimizer is not sharded)"]
                           if scattered and framework != "megatron" else [])
                        + ([] if split else [_whole_vocabulary(table, tp)])
                        + ([_zero_optimizer(rank, dp)] if any(_ZERO_OPTIMIZER.search(name) for name in rank.names)
                           else [])
                        + ([] if norm_kind else [_unknown_norm(ranks)])
                        + ([] if position else ["learned positions (none seen: no position embedding looked up, no "
                                                "rotary operator)"])
                        + ([placed] if placed else []) + ([recomputed] if recomputed else [])
                        + ([every_micro_batch] if every_micro_batch else [])
                        + ([stages_said] if stages_said else [])
                        + _said_head(tied, framework))
    if not megatron and not model.is_gpt:  # vtrain's reference model has GPT's layer only
        assumed += ", Megatron's kernels for a layer other than GPT's"
    unsure = {"seq", "micro-batch"} if repacked else set()
    return InferredRun(config, assumed=assumed, unsure=frozenset(unsure | ({"layers"} if stages_said else set())))


#: operator names searched for (the others of an iteration are not read)
_SEARCHED = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in (_MEGATRON, _ROTARY, _LOSS, _SHARDED,
                                                                          _ZERO_OPTIMIZER,
                                                                          _ALL_TO_ALL, COMPILED_REGION,
                                                                          *(apex for apex, _ in _APEX_NORMS)))
                       + rf"|^c10d::send$|{_BACKEND_SEND}|{_BACKEND_ALL_REDUCE}|{_ALL_REDUCE}|{_ALL_GATHER}"
                       + rf"|{_REDUCE_SCATTER}|{_BACKEND_BROADCAST}|{_BROADCAST}|^{_BIASED_GEMM}$"
                       + rf"|^{BACKWARD_OP_PREFIX}")


def _telling(cpu_ops: pl.LazyFrame) -> pl.DataFrame:
    """The operators that tell the run, of each rank's middle training iteration (its first may hold the start-up;
    :func:`_training_iterations`): those whose shapes are read, and those searched by name; columns ``rank, name,
    input_dims, input_types, ts, dur``."""
    timed = cpu_ops.filter(pl.col("iteration").is_not_null())
    middle = (_training_iterations(timed).sort("rank", "iteration").group_by("rank")
              .agg(pl.col("iteration").get(pl.len() // 2)))
    name = pl.col("name").cast(pl.String)
    return (timed.join(middle, on=["rank", "iteration"])
            .filter(name.is_in(list(_READ)) | name.str.contains(_SEARCHED.pattern))
            .select("rank", name.alias("name"), pl.col("input_dims").cast(pl.String),
                    pl.col("input_types").cast(pl.String), "ts", "dur")
            .collect(engine="streaming"))


def _training_iterations(timed: pl.LazyFrame) -> pl.LazyFrame:
    """Each rank's iterations (``rank, iteration``) whose every embedding lookup is back-propagated, where it has
    any: an evaluation run in a traced step (nanoGPT's ``estimate_loss``) embeds micro-batches it never
    back-propagates, which would count as the training's. Every iteration of a rank that back-propagates no lookup
    (no embedding, or a frozen one) or none of whose iterations is clean (then :func:`_inferred` says so)."""
    name = pl.col("name").cast(pl.String)
    counts = timed.group_by("rank", "iteration").agg(looked_up=(name == _EMBEDDING).sum(),
                                                     propagated=(name == _EMBEDDING_BACKWARD).sum())
    clean = pl.col("looked_up") == pl.col("propagated")
    return (counts.filter(clean.any().over("rank").not_() | (pl.col("propagated").max().over("rank") == 0) | clean)
            .select("rank", "iteration"))


def _unmarked_embedding(cpu_ops: pl.LazyFrame) -> bool:
    """Whether the traces embed tokens but mark no iteration (no operator lies in one)."""
    found = cpu_ops.select(marked=pl.col("iteration").is_not_null().any(),
                           embeds=(pl.col("name").cast(pl.String) == _EMBEDDING).any()).collect()
    return bool(found["embeds"].item()) and not found["marked"].item()


def _ranks(ops: pl.DataFrame) -> list[_Rank]:
    """Each traced rank's telling operators (:func:`_telling`)."""
    ranks = []
    for (rank,), one in sorted(ops.group_by("rank"), key=lambda item: item[0][0]):
        by_name: dict[str, list[tuple[list[Any], list[Any]]]] = {}
        read = one.filter(pl.col("name").is_in(list(_READ)) & pl.col("input_dims").is_not_null()).sort("ts")
        for name, dims, types in read.select("name", "input_dims", "input_types").iter_rows():
            by_name.setdefault(name, []).append((_parsed(dims), _parsed(types)))
        order = read.filter(pl.col("name").is_in([_EMBEDDING, _EMBEDDING_BACKWARD]))["name"].to_list()
        names = one["name"]
        sends = int((names == "c10d::send").sum()) or int(names.str.contains(_BACKEND_SEND).sum())
        backward = one.filter(pl.col("name") == _EMBEDDING_BACKWARD)["ts"]
        last, first = backward.max(), backward.min()
        ranks.append(_Rank(int(rank), by_name, frozenset(names.unique().to_list()), order, sends,
                           _all_reduces(one), _reduce_scatters(one), float(last) if last is not None else None,
                           float(first) if first is not None else None, _gathers_in_backward(one, last),
                           _first(read, [_EMBEDDING]), _first(read, [*_SCORES, *_HEAD_AXIS, *_PRODUCTS]),
                           _broadcasts(one)))
    return ranks


def _first(read: pl.DataFrame, names: list[str]) -> float | None:
    """When the first of the operators ``names`` began (``read``: a rank's, with their dims), if any ran."""
    began = read.filter(pl.col("name").is_in(names))["ts"].min()
    return float(began) if began is not None else None  # type: ignore[arg-type]


def _broadcasts(one: pl.DataFrame) -> list[float]:
    """Each of a rank's broadcasts' time (µs): its backend's events, else c10d's."""
    backend = one.filter(pl.col("name").str.contains(_BACKEND_BROADCAST))
    calls = backend if backend.height else one.filter(pl.col("name").str.contains(_BROADCAST))
    return [float(dur or 0.0) for dur in calls["dur"].to_list()]


def _all_reduces(one: pl.DataFrame) -> list[tuple[float, list[Any] | None, int]]:
    """A rank's all-reduced tensors in the order issued: (when, the tensor's dims if recorded, bytes an element),
    one for each tensor of a call: its backend's events (``gloo:all_reduce [[n], [m]] float float``), else c10d's
    (``c10d::allreduce_ [[[n]], ...]``, ``c10d::allreduce_coalesced_ [[[n], [m]], ...]``, type not said: 4
    bytes)."""
    backend = one.filter(pl.col("name").str.contains(_BACKEND_ALL_REDUCE))
    calls = (backend if backend.height else one.filter(pl.col("name").str.contains(_ALL_REDUCE))).sort("ts")
    reduces = []
    for dims, types, ts in calls.select("input_dims", "input_types", "ts").iter_rows():
        dims, types = _parsed(dims), _parsed(types)
        tensors = _tensors(dims[0] if dims and _listed(dims[0]) else dims)
        kinds = types if len(types) == len(tensors) else [next(iter(types), None)] * len(tensors)
        reduces += [(float(ts), tensor, _element_bytes(kind)) for tensor, kind in zip(tensors, kinds)]
    return reduces


def _reduce_scatters(one: pl.DataFrame) -> list[tuple[float, list[Any] | None, int]]:
    """A rank's reduce-scattered tensors in the order issued: (when, the input's dims, bytes an element) of c10d's
    ``_reduce_scatter_base_ [[out], [in], ...]``, and of each input of its ``reduce_scatter_tensor_coalesced_
    [[[out], ...], [[in], ...], ...]`` (a ``TensorList``, type not said: 4 bytes)."""
    scatters = []
    for dims, types, ts in one.filter(pl.col("name").str.contains(_REDUCE_SCATTER)).sort("ts").select(
            "input_dims", "input_types", "ts").iter_rows():
        dims, types = _parsed(dims), _parsed(types)
        kind = types[1] if len(types) > 1 else None
        inputs = dims[1] if len(dims) > 1 and isinstance(dims[1], list) else None
        scatters += [(float(ts), tensor, _element_bytes(kind))
                     for tensor in (_tensors(inputs) if inputs is not None and _listed(inputs) else [inputs])]
    return scatters


def _listed(dims: Any) -> bool:
    """Whether ``dims`` are a list of tensors' dims (``[[n], [m]]``), not one tensor's (``[n]``) nor anything
    else."""
    return isinstance(dims, list) and bool(dims) and all(isinstance(each, list) for each in dims)


def _tensors(dims: list[Any]) -> list[list[Any] | None]:
    """Each tensor's dims of a list of tensors' (``[[n], [m]]``): a non-empty list, else ``None`` (not recorded);
    one ``None`` for an empty list."""
    return [each if isinstance(each, list) and each else None for each in dims] or [None]


def _element_bytes(kind: Any) -> int:
    """Bytes of one element of a collective's tensor type as the trace writes it (4 where it says none)."""
    return _BYTES.get(kind, 4) if isinstance(kind, str) else 4


def _gathers_in_backward(one: pl.DataFrame, last_embedding_backward: Any) -> bool:
    """Whether a flat tensor is all-gathered between the first backward operator and the last embedding backward:
    parameters gathered again for the backward pass, as FSDP and ZeRO-3 shard them (a sequence-parallel gather is
    an activation's; a distributed optimizer gathers its parameters after the step or in the next forward)."""
    begun = one.filter(pl.col("name").str.starts_with(BACKWARD_OP_PREFIX))["ts"].min()
    if begun is None or last_embedding_backward is None:
        return False
    gathers = one.filter(pl.col("name").str.contains(_ALL_GATHER) & (pl.col("ts") >= begun)
                         & (pl.col("ts") < last_embedding_backward))
    return any(_shape(_tensor_dims(_parsed(dims)), 1) for dims in gathers["input_dims"].to_list())


def _tensor_dims(dims: list[Any]) -> list[Any] | None:
    """The dims of an all-reduce's one tensor: ``[[n]]`` (a backend's) or ``[[[n]], ...]`` (c10d's list of
    tensors); ``None`` where they are not recorded."""
    first = dims[0] if dims else None
    if isinstance(first, list) and len(first) == 1 and isinstance(first[0], list):
        first = first[0]
    return first if isinstance(first, list) and first else None


def _parsed(text: str | None) -> list[Any]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _word_embedding(rank: _Rank) -> tuple[int, int, list[int]] | None:
    """(rows and width of the rank's largest embedding table: the word embedding's, its tokens' dims), if any."""
    calls = _word_lookups(dims for dims, _ in rank.calls(_EMBEDDING))
    if not calls:
        return None
    table, tokens = calls[0]
    return int(table[0]), int(table[1]), [int(x) for x in tokens]


def _back_propagated(rank: _Rank) -> None:
    """Raises where the rank looks its embeddings up more often than it back-propagates them (and does so at all):
    forwards without a backward in every traced iteration (:func:`_training_iterations`), whose micro-batches
    cannot be told from the training's."""
    looked_up, propagated = rank.count(_EMBEDDING), rank.count(_EMBEDDING_BACKWARD)
    if propagated and looked_up > propagated:
        raise _NotShown(f"every traced iteration of rank {rank.rank} looks up its embeddings more often ({looked_up} "
                        f"times in one) than it back-propagates them ({propagated}): forwards without a backward (an "
                        f"evaluation among the training steps), whose micro-batches cannot be told from the "
                        f"training's; trace steps without one")


def _word_lookups(calls: Iterable[list[Any]]) -> list[tuple[list[int], list[int]]]:
    """(table dims, tokens dims) of the ``aten::embedding`` calls (their parsed input dims) into the largest table
    they look up: the word embedding's."""
    lookups = [(dims[0], dims[1]) for dims in calls if len(dims) >= 2 and _shape(dims[0], 2) and _shape(dims[1], 1, 2)]
    rows = max((table[0] for table, _ in lookups), default=0)
    return [(table, tokens) for table, tokens in lookups if table[0] == rows]


def _shape(dims: Any, *lengths: int) -> bool:
    return isinstance(dims, list) and len(dims) in lengths and all(isinstance(x, int) and x > 0 for x in dims)


def _attention(rank: _Rank, batch: int, seq: int) -> tuple[int, int, int]:
    """(heads a rank holds, head width, key/value heads it holds) from its fused attention's query and key, else
    its scores and their product; key/value heads repeated to as many as the queries before either
    (:func:`_repeated_key_values`) are the ones repeated."""
    heads, width, kv = _heads(rank, batch, seq)
    return heads, width, (_repeated_key_values(rank, batch, seq, heads, width) if kv == heads else kv)


def _heads(rank: _Rank, batch: int, seq: int) -> tuple[int, int, int]:
    """(heads, width, key/value heads) as the attention operator takes them."""
    for name, (rank_of, at) in _HEAD_AXIS.items():
        for dims, _ in rank.calls(name):
            query, key = (dims[0], dims[1]) if len(dims) > 1 else (None, None)
            if _shape(query, rank_of) and _shape(key, rank_of):
                return int(query[at]), int(query[-1]), int(key[at])
    heads = next((int(dims[0][1]) if len(dims[0]) == 4 else int(dims[0][0]) // batch
                  for name in _SCORES for dims, _ in rank.calls(name)
                  if dims and _shape(dims[0], 3, 4) and dims[0][-1] == dims[0][-2] == seq), None)
    widths = [int(operand[-1]) for name in _PRODUCTS for dims, _ in rank.calls(name)
              for operand in dims[1:2] if dims and _shape(dims[0], 3, 4) and dims[0][-1] == dims[0][-2] == seq
              and _shape(operand, 3, 4) and operand[-2] == seq]
    width = next((one for one in widths if one != seq), widths[0] if widths else None)  # heads as wide as s: s
    if not heads or not width:
        raise _hidden([rank], "no attention scores [b, heads, s, s] with their product by the values in the "
                      "embedding's rank")
    return heads, width, heads


def _repeated_key_values(rank: _Rank, batch: int, seq: int, heads: int, width: int) -> int:
    """The key/value heads that grouped-query attention repeats to ``heads`` before an attention that takes as many
    keys as queries (:data:`_REPEATS`), else ``heads``."""
    known = {"b": batch, "s": seq, "d": width, 1: 1}
    groups = [int(dims[0][layout.index("kv")]) for name, layout in _REPEATS for dims, _ in rank.calls(name)
              if dims and _shape(dims[0], len(layout))
              and all(size == known[axis] for size, axis in zip(dims[0], layout) if axis != "kv")]
    return next((kv for kv in groups if kv < heads and heads % kv == 0), heads)


def _packed_sequences(rank: _Rank) -> int:
    """The sequences a micro-batch packs where its attention takes them packed (flash-attn's varlen operator: their
    cumulative lengths, one more than their count, its fourth input), the median over its calls; else 0."""
    counts = sorted(int(dims[3][0]) - 1 for name in _PACKED for dims, _ in rank.calls(name)
                    if len(dims) > 3 and _shape(dims[3], 1) and dims[3][0] > 1)
    return counts[len(counts) // 2] if counts else 0


def _fused(rank: _Rank) -> bool:
    return any(rank.count(name) for name in _HEAD_AXIS)


def _stages(ranks: list[_Rank], first: list[_Rank], world: int, groups: list[_Group]) -> int:
    """Pipeline stages: the ranks Megatron's group of that name lists, else the rank files over those holding the
    embedding (every rank traced), else one where a rank with the embedding computes the loss too."""
    named = [len(listed) for group, listed in groups if group.get("pg_desc") == "PIPELINE_MODEL_PARALLEL_GROUP"]
    if named:
        return named[0]
    if len(ranks) == world and world % len(first) == 0:
        return world // len(first)
    if any(_LOSS.search(name) for name in first[0].names):
        return 1
    raise _NotShown("the pipeline stages: the traces hold some of the ranks and do not name the pipeline's group")


def _layers(ranks: list[_Rank], first: _Rank, micro_batches: int, pp: int, ranks_a_stage: int,
            world: int) -> tuple[int, str]:
    """Layers from the attentions' backward calls (one a layer and micro-batch, recomputed or not): those of
    ``first`` (a rank with the embedding) where there is one stage; over the ranks of every stage (``ranks_a_stage``
    each) where every rank is traced; else, where the traced ranks each hold as many, that many in each of the
    ``pp`` stages, said (the second part: a run of 4 layers traced on 4 of its 8 ranks was read as 2 layers)."""
    if pp == 1:
        return _calls_a_layer([first], micro_batches, 1), ""
    if len(ranks) == world:
        return _calls_a_layer(ranks, micro_batches, ranks_a_stage), ""
    each = {_calls_a_layer([one], micro_batches, 1) for one in ranks}
    if len(each) > 1:
        raise _NotShown(f"the layers: the traces hold {len(ranks)} of the {world} ranks, whose stages hold "
                        f"{', '.join(map(str, sorted(each)))} layers")
    held = each.pop()
    return held * pp, (f"each of the {pp} stages holding the {held} layers of the traced ranks' (the traces hold "
                       f"{len(ranks)} of the {world} ranks)")


def _calls_a_layer(ranks: list[_Rank], micro_batches: int, ranks_a_stage: int) -> int:
    """The attention backward calls of ``ranks`` over their micro-batches and the ranks of a stage among them."""
    calls = sum(rank.count(name) for rank in ranks for name in _ATTENTION_BACKWARD)
    if not calls or calls % (micro_batches * ranks_a_stage):
        raise _NotShown(f"{calls} attention backward calls are not one a layer for each of {micro_batches} "
                        f"micro-batches")
    return calls // (micro_batches * ranks_a_stage)


def _mlp(rank: _Rank) -> tuple[str, int, str, int]:
    """(the MLP as vtrain simulates it, its width on this rank, how it was placed where it is another: else empty,
    the activation's calls): the first of :data:`_FUSED_ACTIVATIONS`, then of :data:`_ACTIVATIONS`, the rank runs on
    a ``[tokens, width]`` or ``[b, s, width]`` tensor."""
    for name, (kind, gated) in _FUSED_ACTIVATIONS.items():
        calls = [dims[0] for dims, _ in rank.calls(name) if dims and _shape(dims[0], 2, 3)]
        if calls:
            return *_placed(kind, gated, int(calls[0][-1]) // (2 if gated else 1)), len(calls)
    for name, kind in _ACTIVATIONS.items():
        calls = [dims[0] for dims, _ in rank.calls(name) if dims and _shape(dims[0], 2, 3)]
        if calls:
            return *_placed(kind, name != _WRITTEN_GELU and _gated(rank, calls[0]), int(calls[0][-1])), len(calls)
    raise _hidden([rank], f"no MLP activation ({', '.join([*_ACTIVATIONS, *_FUSED_ACTIVATIONS])}) in the "
                  f"embedding's rank")


def _gated(rank: _Rank, activated: list[int]) -> bool:
    """Whether the rank multiplies two tensors of the ``activated`` shape other than a dropout's: a gated MLP's
    activation times its other projection (a plain MLP's activation and its backward multiply nothing of that
    shape). A dropout of that shape on the CPU multiplies its input by a mask and, in the backward, the gradient by
    it: two multiplications a call, not gating (on a GPU its kernel multiplies nothing the trace shows)."""
    multiplied = sum(1 for dims, _ in rank.calls(_MULTIPLY) if len(dims) >= 2 and dims[0] == dims[1] == activated)
    dropped = sum(1 for dims, _ in rank.calls(_DROPOUT) if dims and dims[0] == activated)
    return multiplied > 2 * dropped


def _placed(kind: str, gated: bool, width: int) -> tuple[str, int, str]:
    """An MLP of ``kind``'s activation, ``gated`` or not, ``width`` wide, as :func:`_mlp` gives it: SwiGLU where it
    is gated, else GELU, and how it was placed where its activation is another."""
    mlp, simulated = ("swiglu", "SiLU") if gated else ("gelu", "GELU")
    if kind == simulated:
        return mlp, width, ""
    return mlp, width, (f"its {'gated ' if gated else ''}{kind} MLP{'' if gated else ' (not gated)'} placed as a "
                        f"{'SwiGLU' if gated else 'GELU'} MLP of the same width (the same GEMMs)")


def _schedule(rank: _Rank, micro_batches: int, pp: int) -> tuple[str, int]:
    """(schedule, virtual stages) of the first stage: interleaved with v chunks where it sends 2v - 1 times a
    micro-batch (each chunk's activations, and every chunk's but the first's gradients), GPipe where it runs every
    micro-batch's forward before the first backward (more micro-batches than a 1F1B warm-up holds), else 1F1B."""
    if pp == 1:
        return "1f1b", 1
    sends = rank.sends
    chunks, rest = divmod(sends // micro_batches + 1, 2) if sends % micro_batches == 0 else (0, 1)
    if chunks >= 2 and not rest:
        return "interleaved", chunks
    order = rank.embedding_order
    if micro_batches <= pp or _EMBEDDING_BACKWARD not in order:
        return "1f1b", 1
    a_micro_batch = order.count(_EMBEDDING) / micro_batches  # the word's embedding, and the positions' if learned
    before = order[:order.index(_EMBEDDING_BACKWARD)].count(_EMBEDDING) / a_micro_batch
    return ("gpipe" if before >= micro_batches else "1f1b"), 1


#: all-reduces of fewer elements are no gradient bucket (a loss averaged for logging, a gradient norm, a found-inf)
_SCALARS = 1024


def _gradient_reduction(rank: _Rank, tp: int, ddp: bool) -> tuple[bool | None, float | None, bool]:
    """(whether the gradients are reduced during the backward pass, the buckets' MiB, whether they are
    reduce-scattered, as Megatron's distributed optimizer and ZeRO's stages 1 and 2 do: a rank that reduce-scatters
    flat tensors): overlapped where a gradient bucket is all-reduced before the last embedding backward begins (the
    embedding's gradient is the last computed). The buckets' MiB: PyTorch DDP's (``ddp``: the reference framework,
    all-reducing during the backward pass) as :func:`_ddp_bucket_cap` reads them; else the median complete bucket,
    one issued before that embedding backward, else one after it but the last (one bucket alone says its limit is at
    least its size: :func:`_alone`). A bucket is a flat tensor (DDP's, Megatron's gradient buffer), a
    tensor-parallel all-reduce an activation's ``[s, b, h]``; without tensor parallelism an all-reduce whose dims are
    not recorded is a bucket too. ``None`` for what the rank does not show."""
    begun = rank.last_embedding_backward
    buckets, scattered = _buckets(rank, tp)
    if begun is None or not buckets:
        return None, None, False
    before = [mib for ts, mib in buckets if ts < begun]
    after = [mib for ts, mib in buckets if ts >= begun]
    if ddp and before and not scattered:
        return True, _ddp_bucket_cap(rank, buckets, after), False
    sizes = sorted(mib for mib in (before or after[:-1]) if mib is not None)
    if sizes:
        return bool(before), round(sizes[len(sizes) // 2], 3), bool(scattered)
    return bool(before), _alone(after), bool(scattered)


def _ddp_bucket_cap(rank: _Rank, buckets: list[tuple[float, float | None]], after: list[float | None]) -> float | None:
    """PyTorch DDP's ``bucket_cap_mb`` as its buckets of one backward pass show it (``after``: those issued once the
    last embedding backward began). DDP closes its first bucket once it holds 1 MiB
    (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), which says nothing of the cap; every other bucket but the
    embedding's (the last) closed once it held the cap, so the cap is at most the smallest of them: that, rounded
    down (a bucket of it still closes). The backward pass is the first micro-batch's where the gradients are reduced
    in every micro-batch's (buckets issued before the first embedding backward), else the last's. ``None`` (the
    default) where no bucket but the first and the last says it, as :func:`_alone` reads the last."""
    first, last = rank.first_embedding_backward, rank.last_embedding_backward
    one_pass = [mib for ts, mib in buckets if first is not None and ts < first] or \
        [mib for ts, mib in buckets if last is not None and ts < last]
    complete = [mib for mib in one_pass[1:] if mib is not None]
    return math.floor(min(complete) * 1000) / 1000 if complete else _alone(after)


def _alone(after: list[float | None]) -> float | None:
    """The buckets' MiB where no complete bucket says it: the last bucket's where it is larger than the default (one
    bucket held every gradient left: the limit is at least their size), else ``None`` (the default)."""
    alone = after[-1] if after else None
    return round(alone, 3) if alone is not None and alone > ParallelConfig.dp_bucket_mb else None


def _buckets(rank: _Rank, tp: int) -> tuple[list[tuple[float, float | None]], bool]:
    """The rank's gradient buckets (issued at, MiB: None where the dims were not recorded) and whether they are
    reduce-scattered (:func:`_gradient_reduction`)."""
    reduced = [(ts, None if dims is None else dims[0] * size / 2**20) for ts, dims, size in rank.all_reduces
               if (dims is None and tp == 1) or (_shape(dims, 1) and dims[0] >= _SCALARS)]
    scattered = [(ts, dims[0] * size / 2**20) for ts, dims, size in rank.reduce_scatters
                 if _shape(dims, 1) and dims[0] >= _SCALARS]
    # a reduce-scatter can run as an all-reduce (gloo's), and Megatron all-reduces a few flat gradients beside its
    # distributed optimizer's buckets (tied embeddings, sequence-parallel norms)
    return scattered or reduced, bool(scattered)


def _reduced_every_micro_batch(rank: _Rank, tp: int, micro_batches: int) -> str:
    """What is said where the rank reduces its gradients in every micro-batch's backward pass (DDP without
    ``no_sync``: a bucket issued before the first micro-batch's embedding backward ends it), which vtrain simulates
    once an iteration; else empty."""
    first = rank.first_embedding_backward
    buckets = _buckets(rank, tp)[0]
    if micro_batches < 2 or first is None or not any(ts < first for ts, _ in buckets):
        return ""
    return (f"its gradients reduced in every micro-batch's backward pass ({len(buckets)} buckets for {micro_batches} "
            f"micro-batches: no no_sync) simulated as reduced once an iteration")


def _vocabulary_parallel(rank: _Rank) -> bool:
    """Whether the rank's word embedding is a share of the vocabulary (Megatron's vocabulary-parallel embedding, and
    vtrain's reference model's): its lookup's output is all-reduced over the tensor-parallel ranks (reduce-scattered
    with sequence parallelism) before the first attention runs. A whole table (PyTorch's ``parallelize_module``
    with the blocks split and the embedding left whole) is reduced first after the attention's output projection.
    A rank that records no all-reduce or reduce-scatter at all (a trace without collective events: an older
    PyTorch's, or one whose collectives were filtered out) does not say, and is taken as split, as Megatron's is."""
    begun, attended = rank.first_lookup, rank.first_attention
    reductions = (*rank.all_reduces, *rank.reduce_scatters)
    if not reductions:
        return True
    if begun is None:
        return False
    return any(begun <= ts and (attended is None or ts < attended) for ts, _, _ in reductions)


def _whole_vocabulary(table: int, tp: int) -> str:
    """What is said of a word embedding whole on every tensor-parallel rank (:func:`_vocabulary_parallel`)."""
    return (f"its word embedding whole on each of the {tp} tensor-parallel ranks ({table} rows; no all-reduce after "
            f"the lookup) placed as a vocabulary-parallel one, as vtrain's model splits it: {table // tp} rows a rank, "
            f"its output layer and loss likewise, with the all-reduces that splitting takes")


def _zero_optimizer(rank: _Rank, dp: int) -> str:
    """What is said of PyTorch's ZeroRedundancyOptimizer, which vtrain does not simulate: its parameters' broadcasts
    as the rank measured them, and its step over every parameter where each rank updates its share."""
    calls = rank.broadcasts
    return (f"its optimizer sharded over the {dp} data-parallel ranks (PyTorch's ZeroRedundancyOptimizer) simulated "
            f"as data parallelism without it: the parameters' broadcasts ({len(calls)} calls, {sum(calls) / 1e3:.1f} "
            f"ms a step as measured on rank {rank.rank}) not simulated, and each rank's optimizer step placed over "
            f"every parameter, not its share")


def _fused_kernels(ranks: list[_Rank]) -> bool:
    """Whether a Megatron run's eager layers ran its fused kernels (its fused softmax, apex's norms), not PyTorch's
    operators (Megatron-core's local layers without apex or Transformer Engine)."""
    return any(_FUSED_KERNELS.search(name) for one in ranks for name in one.names)


def _biased(rank: _Rank) -> bool:
    """Whether the linear layers add biases: a GEMM that adds one (``aten::addmm``: ``nn.Linear`` on a matrix,
    Hugging Face's ``Conv1D`` in GPT-2, whose only ``aten::linear`` is its bias-free output layer), else, where they
    run as ``aten::linear``, whether one is given a bias (Megatron's layers multiply and add on their own: taken as
    biased, GPT's way)."""
    if _BIASED_GEMM in rank.names:
        return True
    calls = [dims for dims, _ in rank.calls(_LINEAR) if len(dims) >= 2]
    return not calls or any(len(dims) >= 3 and dims[2] for dims in calls)


def _positions(rank: _Rank, table: int, width: int) -> str | None:
    """How the rank's tokens learn their positions: ``rope`` where an operator is named for rotary embeddings, two
    parts of a head are concatenated into one (:data:`_CAT`) or a head is viewed as complex numbers
    (:data:`_COMPLEX`), ``learned`` where a second embedding table is looked
    up; None where nothing shows any."""
    parts = [dims[0] for dims, _ in rank.calls(_CAT) if dims and isinstance(dims[0], list) and len(dims[0]) == 2
             and all(_shape(part, 4) for part in dims[0])]
    a_head = any(first[:3] == second[:3] and first[-1] + second[-1] == width for first, second in parts)
    turned = any(dims and isinstance(dims[0], list) and len(dims[0]) >= 3 and dims[0][-2:] == [width // 2, 2]
                 for dims, _ in rank.calls(_COMPLEX))
    if a_head or turned or any(_ROTARY.search(name) for name in rank.names):
        return "rope"
    tables = {dims[0][0] for dims, _ in rank.calls(_EMBEDDING) if dims and _shape(dims[0], 2)}
    return "learned" if tables - {table} else None


def _norm(rank: _Rank, hidden: int) -> str | None:
    """The layers' norm, ``layernorm`` or ``rmsnorm``, as the rank shows it: PyTorch's operators, apex's fused norms
    by name, or a norm written out (:data:`_ROOTS`: a LayerNorm where a token's mean is subtracted from its row of
    ``hidden``, else RMSNorm); None where nothing shows it."""
    if rank.count(_LAYER_NORM) or rank.count(_RMS_NORM):
        return "layernorm" if rank.count(_LAYER_NORM) else "rmsnorm"
    apex = next((kind for pattern, kind in _APEX_NORMS if any(pattern.search(name) for name in rank.names)), None)
    if apex:
        return apex
    rooted = any(dims and _shape(dims[0], 2, 3) and dims[0][-1] == 1 for name in _ROOTS for dims, _ in rank.calls(name))
    if not rooted:
        return None
    centred = any(len(dims) >= 2 and _shape(dims[0], 2, 3) and _shape(dims[1], 2, 3) and dims[0][-1] == hidden
                  and dims[1][-1] == 1 for dims, _ in rank.calls(_SUBTRACT))
    return "layernorm" if centred else "rmsnorm"


def _tied(rank: _Rank, table: int, hidden: int) -> bool | None:
    """Whether the output layer is the word embedding's matrix, as the optimizer's list of parameters shows it (one
    ``[table, hidden]`` matrix in it, or two: an output layer of its own); None where no optimizer step over a list
    ran (:data:`_PARAMETER_LISTS`; a loop over the parameters, an extension's kernel)."""
    for name in _PARAMETER_LISTS:
        lists = [dims[0] for dims, _ in rank.calls(name) if dims and _listed(dims[0])]
        if lists:
            matrices = sum(1 for parameters in lists for one in parameters if one == [table, hidden])
            return {1: True, 2: False}.get(matrices)
    return None


def _said_head(tied: bool | None, framework: str) -> list[str]:
    """What is said of the output layer: Megatron's layer ties it unless the traces show otherwise; vtrain's
    reference model has one of its own."""
    if framework == "megatron":
        return ["the output layer tied to the embedding"] if tied is None else []
    if tied is False:
        return []
    return [("its output layer, the word embedding's matrix, placed as one of its own" if tied else
             "the output layer its own (the traces do not show whether it is the word embedding's)")
            + " as vtrain's reference model has it"]


def _unknown_norm(ranks: list[_Rank]) -> str:
    """What is assumed of a norm no operator shows, and why none may."""
    compiled = compiled_markers(name for one in ranks for name in one.names)
    why = f"its model ran compiled ({', '.join(compiled)})" if compiled else \
        "a fused kernel of an extension, or written out of element-wise operators"
    return f"the layers' norm taken as RMSNorm (no norm operator recorded: {why})"


def _recompute(rank: _Rank, norm: str, micro_batches: int, activations: int) -> tuple[str, str]:
    """(the recomputation, what was placed otherwise than it ran: else empty): full when the layers run forward
    again in the backward pass (their norms and attention run more often than the attention's backward), selective
    when only the attention does; some layers' forward again (the others' not) or only the MLPs' is said, as what
    vtrain simulates (every layer or none)."""
    backward = sum(rank.count(name) for name in _ATTENTION_BACKWARD)
    forward = sum(rank.count(name) for name in (*_SCORES, *_HEAD_AXIS))
    if forward <= backward:
        mlps = (f"its MLPs recomputed ({activations} activations for {backward} layers' backward passes, a layer and "
                f"micro-batch each) simulated without recomputation")
        return "none", mlps if activations > backward else ""
    norms = rank.count(norm)
    kind = "full" if norms == 0 or norms > micro_batches * (2 * backward // micro_batches + 1) else "selective"
    if forward >= 2 * backward:
        return kind, ""
    return kind, (f"{forward - backward} of its {backward} layers' forward passes run again (a layer and "
                  f"micro-batch each: some layers recomputed) simulated as {kind} recomputation of every layer")


def _precision(rank: _Rank) -> str:
    """The precision of the attention's GEMMs (a norm may run in fp32 under autocast)."""
    for name in (*_HEAD_AXIS, *_PRODUCTS):
        for _, types in rank.calls(name):
            if types and types[0] in _PRECISIONS:
                return _PRECISIONS[types[0]]
    return "fp32"
