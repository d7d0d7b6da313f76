"""Peak memory of one GPU of a pipeline stage: model states, stored activations and communication buffers.

**Model states** per parameter (no optimizer sharding), as Megatron-LM's own table counts them (its distributed
optimizer's documentation: 20 bytes for fp16, 18 for bf16): Megatron's fp16 runs keep fp16 parameters and
gradients (2 + 2 bytes), fp32 master weights (4) and Adam's two fp32 moments (4 + 4): 16 bytes, and the optimizer
step copies the gradients to fp32 beside them (4 more while it runs: the step's moment below); bf16 runs accumulate
the gradients in fp32 (Megatron forces ``accumulate_allreduce_grads_in_fp32`` for bf16), 2 + 4 + 12 = 18 bytes,
which the step reads in place.
fp32 runs keep fp32 parameters, gradients and moments (4 + 4 + 8): 16 bytes, no master copy. The reference model
that ``vtrain record`` trains in bf16 is bf16 throughout (torch's Adam keeps its moments in the parameters' dtype):
2 + 2 + 4 = 8 bytes.

**Activations** are Korthikanti et al.'s per-layer formula ("Reducing Activation Recomputation in Large
Transformer Models", 2022, Eq. 2 and Table 2), in bytes, for one micro-batch and e-byte activations (S = sbh, one
[b, s, h] tensor; tensors outside the tensor-parallel regions hold S/t with sequence parallelism)::

    4·e·S          LayerNorm 1 input (the layer input), QKV input, LayerNorm 2 input, fc1 input
    2·S            Megatron with dropout only: the two hidden dropout masks (one byte an element)
    12·e·S/t       q, k, v (3), attention context (1), GELU input (4), GELU output = fc2 input (4)
                   (a ffn_hidden other than 4h: GELU's two tensors are 2·e·sb·ffn/t; a gated MLP keeps 4·e·sb·ffn/t,
                   fc1's gate and up, the gate's SiLU and the product; the fused attention with grouped-query
                   attention keeps the QKV output, e·S/t·(1 + 2·kv/a), where the eager core's copies are 3·e·S/t;
                   rotary positions keep the rotated queries and keys beside it, e·S/t·(1 + kv/a))
    e·as²b/t       the softmax output (kept for its own backward and for probs @ v)
    (e+1)·as²b/t   Megatron with dropout only: the attention dropout's mask and output

For fp16 Megatron that is the paper's sbh(10 + 24/t + 5as/(ht)) (sbh(34/t + 5as/(ht)) with sequence
parallelism). With flash attention (``attention: flash``) the last two rows are the fp32 log-sum-exp of each score
row, 4·ab·s/t bytes: the scores are never held (measured on CPU like the rest: ``tests/test_memory_model.py``).
The reference model vtrain records (``vtrain/model/gpt.py``, ``vtrain/record/model.py``) has no
dropout, so its layers keep no masks and no dropped-out probabilities (``tests/test_memory_model.py`` measures it);
nor does Megatron with a dropout of 0 (``dropout: false``: LLaMA's recipes), where PyTorch's dropout returns its input.
With full recomputation a layer keeps only its input (e·S, or e·S/t), and the layer being recomputed holds its
full set once; with selective recomputation it keeps all but the attention scores (the last two rows), which its
re-run attention core holds once. The head keeps its LayerNorm input and output (2·sbh) and the fp32 softmax of the
vocabulary-parallel cross-entropy (b·s·V/t floats, computed in place over the fp32 logits).

**Micro-batches in flight**: the schedule's peak of forwards whose backward has not run yet on the stage: all m
for GPipe, ``min(p − stage, m)`` for 1F1B, Megatron's warm-up count + 1 model-chunk passes for interleaved 1F1B
(``tests/test_memory_model.py`` checks each against a walk of the schedule's own order).

**Communication buffers**: pipeline send and receive buffers of one [b, s, h] activation each way (4 when
p > 1) and, with data parallelism, two gradient buckets of ``dp_bucket_mb`` (the one being reduced and the one
being filled).

**The peak moment.** What a stage keeps is not all it holds: the peak is the largest of four moments. The optimizer
step holds its temporaries beside the model states (:func:`optimizer_step_bytes`); the other three hold each with
every other pass in flight beside it: the head's forward (its cross-entropy holds the fp32 logits twice,
:func:`head_transient_bytes`), a layer's backward start (the layer's full set, recomputed with full
recomputation) and its softmax backward (:func:`attention_backward_bytes`: the probabilities with their gradient
and the scores' gradient, and on GPUs the softmax backward's own temporary). Measured against torch's allocator (``tests/test_memory_model.py`` on CPU, exact to
2 %; ``tests/test_gpu_recordings.py`` against ``torch.cuda.max_memory_allocated`` of GPU recordings).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from vtrain.model.gpt import GptShape, embedding_parameters, head_parameters, layer_parameters
from vtrain.model.megatron import fused_softmax_available
from vtrain.partition import Chunk, partition
from vtrain.parallel import peak_passes_in_flight
from vtrain.runconfig import ModelConfig, RunConfig

GIB = 2**30
FP32_BYTES = 4
#: the model's error against measured peak memory (model / measured - 1), in % (lowest, highest): Megatron-core
#: 0.16.1's own training on one H200, five runs (``tests/test_megatron_core_traces.py``); a run the model fits by
#: less than that may not fit
MEASURED_ERROR_PCT = (-8.4, -0.9)


def measured_peak_range(need_bytes: float) -> tuple[float, float]:
    """The lowest and highest measured peak a modelled need stands for (the model's error against measured peaks,
    :data:`MEASURED_ERROR_PCT`)."""
    low, high = MEASURED_ERROR_PCT
    return need_bytes / (1 + high / 100), need_bytes / (1 + low / 100)


#: what :func:`fit_risk` says of a need
WOULD_NOT_FIT, MAY_NOT_FIT = "would not fit", "may not fit"


def fit_risk(need_bytes: float, capacity_bytes: float) -> str | None:
    """Whether a modelled need fits ``capacity_bytes`` as the measured peaks it stands for would: ``"would not
    fit"`` (even the lowest of them is over it), ``"may not fit"`` (the highest is), ``None`` (all fit, or no
    capacity is known)."""
    least, most = measured_peak_range(need_bytes)
    if not capacity_bytes or most <= capacity_bytes:
        return None
    return WOULD_NOT_FIT if least > capacity_bytes else MAY_NOT_FIT


def measured_miss(need: float, capacity: float) -> tuple[bool, float]:
    """Whether a modelled need fits ``capacity`` (any unit, the same for both) as plans take it: unless even the
    lowest measured peak it stands for is over (:func:`fit_risk` says it would not fit; a plan pruned only on the
    model's own need had been the cheapest while warned as one that would not fit: an audit); and by how much that
    lowest peak is over (0 where it is not)."""
    least, _ = measured_peak_range(need)
    return fit_risk(need, capacity) != WOULD_NOT_FIT, max(0.0, least - capacity)


def fit_risk_sentence(need_bytes: float, capacity_bytes: float) -> str:
    """The measured peaks a need stands for and the model's error, as a warning says them: ``"37.6-40.6 GiB as
    measured (the model is -8.4 to -0.9 % of measured peaks)"``."""
    low, high = MEASURED_ERROR_PCT
    least, most = measured_peak_range(need_bytes)
    measured = (f"{least / GIB:,.1f} GiB or more" if least > capacity_bytes
                else f"{least / GIB:,.1f}-{most / GIB:,.1f} GiB")
    return f"{measured} as measured (the model is {low:+.1f} to {high:+.1f} % of measured peaks)"

#: precision -> bytes per parameter of (parameters, gradients, fp32 master weights + Adam's two moments), for
#: Megatron's mixed precision; with its distributed optimizer each data-parallel rank holds 1/d of the third part
#: (Megatron-LM's docs/distrib_optimizer.md: 4 + 16/d bytes for fp16, 6 + 12/d for bf16, with the step's copies)
STATE_BYTES = {"fp32": (4, 4, 8), "fp16": (2, 2, 12), "bf16": (2, 4, 12)}
#: precision -> bytes per parameter Megatron's optimizer step adds beside the states: fp16 gradients copied to fp32
#: (``main_grads_from_model_grads``); bf16 and fp32 gradients are read where they are
MEGATRON_STEP_BYTES = {"fp32": 0, "fp16": 4, "bf16": 0}
#: the same for the reference model, whose 16-bit runs keep no fp32 copy (torch's Adam on 16-bit parameters)
REFERENCE_STATE_BYTES = {"fp32": (4, 4, 8), "fp16": (2, 2, 4), "bf16": (2, 2, 4)}


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by one GPU of a pipeline stage at its peak."""

    stage: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int  # fp32 master weights (mixed precision) and Adam's two moments
    activation_bytes: int  # activations at the passes' largest moment (the module docstring)
    buffer_bytes: int  # pipeline send/receive buffers and gradient buckets
    in_flight: int  # micro-batches (model-chunk passes, interleaved) whose activations are held at the peak
    step_bytes: int = 0  # the optimizer step's temporaries, held when the activations are not

    @property
    def total_bytes(self) -> int:
        return (self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes
                + max(self.activation_bytes, self.step_bytes) + self.buffer_bytes)

    def gib(self) -> dict[str, float]:
        """Each part and the total in GiB."""
        return {"parameters": self.parameter_bytes / GIB, "gradients": self.gradient_bytes / GIB,
                "optimizer": self.optimizer_bytes / GIB, "activations": self.activation_bytes / GIB,
                "optimizer step": self.step_bytes / GIB, "buffers": self.buffer_bytes / GIB,
                "total": self.total_bytes / GIB}


def stage_parameters(shape: GptShape, chunks: list[Chunk]) -> list[tuple[int, ...]]:
    """Parameter shapes of a stage (all its chunks), in registration order."""
    params: list[tuple[int, ...]] = []
    for chunk in chunks:
        params += block_parameters(shape, chunk)
    return params


def block_parameters(shape: GptShape, chunk: Chunk) -> list[tuple[int, ...]]:
    """Parameter shapes of one chunk, in registration order (a tied output projection counted with the word
    embedding where the chunk holds both)."""
    params: list[tuple[int, ...]] = []
    for kind, _ in chunk.forward_blocks():
        params += kind_parameters(shape, kind, chunk.has_embedding)
    return params


def kind_parameters(shape: GptShape, kind: str, with_embedding: bool = False) -> list[tuple[int, ...]]:
    """Parameter shapes of one block of ``kind`` (embedding, layer, head: the head's in a chunk that holds the
    embedding too, ``with_embedding``)."""
    if kind == "head":
        return head_parameters(shape, with_embedding)
    return {"embedding": embedding_parameters, "layer": layer_parameters}[kind](shape)


@lru_cache(maxsize=1024)
def block_parameter_count(shape: GptShape, kind: str, with_embedding: bool = False) -> int:
    """Parameters of one block (embedding, layer or head) on one tensor-parallel rank (the head's in a chunk that
    holds the embedding too: ``with_embedding``)."""
    return sum(math.prod(p) for p in kind_parameters(shape, kind, with_embedding))


def model_parameter_count(model: ModelConfig) -> int:
    """Parameters of a whole model as its weights hold them (one rank, the vocabulary unpadded): its embedding,
    layers and head, the output projection counted once where it is the word embedding (``tie_embeddings``: GPT's,
    so 12·l·h² + 13·l·h + (V + s)·h + 2·h as Narayanan et al. count, SC21 §5.1, with the position embedding and the
    final norm); a LLaMA-like layer's own (``tests/test_llama_layers.py``: published counts)."""
    shape = GptShape.from_config(RunConfig(model=model))  # one rank; the reference model pads no vocabulary
    return (block_parameter_count(shape, "embedding") + model.layers * block_parameter_count(shape, "layer")
            + block_parameter_count(shape, "head", with_embedding=True))


def stage_parameter_count(shape: GptShape, chunks: list[Chunk]) -> int:
    """Parameters of a stage (all its chunks) on one tensor-parallel rank."""
    return sum(chunk.layers * block_parameter_count(shape, "layer")
               + chunk.has_embedding * block_parameter_count(shape, "embedding")
               + chunk.has_head * block_parameter_count(shape, "head", chunk.has_embedding) for chunk in chunks)


def layer_activation_bytes(shape: GptShape, recompute: str) -> int:
    """Bytes one layer keeps for its backward, for one micro-batch (Korthikanti et al.; the module docstring): with
    full recomputation its input; with selective recomputation all but the attention scores (re-run)."""
    e, dropout = shape.element_bytes, shape.framework == "megatron" and shape.dropout
    outside = shape.outside_tokens * shape.h  # a [b, s, h] tensor outside the TP regions
    if recompute == "full":
        return outside * e
    inside = qkv_kept_elements(shape) + shape.tokens * shape.h // shape.t + mlp_kept_elements(shape)
    kept = 4 * e * outside + (2 * outside if dropout else 0) + e * inside
    return kept if recompute == "selective" else kept + attention_score_bytes(shape)


def qkv_kept_elements(shape: GptShape) -> int:
    """Elements of the queries, keys and values a layer keeps for one micro-batch: the eager core's three
    [b·a/t, s, d] copies (with grouped-query attention the keys and values repeated for their queries), or the QKV
    projection's output the fused attention reads them from (smaller with grouped-query attention). With rotary
    positions the rotated queries and keys are new tensors kept beside that output (the values, a view of it, keep
    it alive)."""
    rotated = shape.tokens * (shape.a // shape.t + shape.kv_per_rank) * shape.d if shape.position == "rope" else 0
    if shape.attention == "flash":
        return shape.tokens * shape.qkv_width + rotated
    if shape.framework == "megatron":  # strided views of the QKV output, and the repeated keys and values
        repeated = 2 * shape.tokens * shape.h // shape.t if shape.kv_per_rank < shape.a // shape.t else 0
        return shape.tokens * shape.qkv_width + repeated + rotated
    return 3 * shape.tokens * shape.h // shape.t


def mlp_kept_elements(shape: GptShape) -> int:
    """Elements the MLP keeps for one micro-batch: GELU's input and output (fc2's input), or a gated MLP's fc1
    output (gate and up, 2·ffn) and fc2's input, and in the reference model the gate's SiLU too (Megatron's fused
    bias + SwiGLU recomputes it in its backward)."""
    if shape.mlp != "swiglu":
        return 2 * shape.tokens * shape.ffn
    return shape.tokens * shape.ffn * (3 if shape.framework == "megatron" else 4)


def score_elements(shape: GptShape) -> int:
    """Elements of one layer's attention scores on one tensor-parallel rank, for one micro-batch: a·b·s²/t."""
    return (shape.a // shape.t) * shape.b * shape.s * shape.s


def attention_score_bytes(shape: GptShape) -> int:
    """Bytes of one layer's attention scores on one tensor-parallel rank, for one micro-batch: the softmax output,
    and with Megatron's attention dropout its mask and output (the softmax output in fp32 where Megatron's fused
    kernel does not take the shape and PyTorch's softmax runs in fp32). Flash attention keeps none: only the fp32
    log-sum-exp of each score row (a·b·s/t floats; its output is the context, counted with the layer)."""
    e = shape.element_bytes
    if shape.attention == "flash":
        return score_elements(shape) // shape.s * FP32_BYTES
    if shape.framework != "megatron":
        return score_elements(shape) * e
    softmax = e if fused_softmax_available(shape) else FP32_BYTES
    return score_elements(shape) * (softmax + (e + 1 if shape.dropout else 0))


def head_activation_bytes(shape: GptShape) -> int:
    """Bytes the head keeps for one micro-batch: LayerNorm input and output, the fp32 softmax over the
    vocabulary shard."""
    return 2 * shape.tokens * shape.h * shape.element_bytes + shape.tokens * shape.vocab_per_rank * FP32_BYTES


def in_flight_micro_batches(config: RunConfig, stage: int) -> int:
    """Peak number of forward passes (model-chunk passes for interleaved 1F1B) whose activations a stage holds."""
    par = config.parallelism
    return peak_passes_in_flight(par.schedule, par.pp, par.micro_batches, stage, par.virtual_stages)


def head_transient_bytes(shape: GptShape) -> int:
    """Bytes the head holds for a moment beyond what it keeps, at its peak in the forward: the reference model's
    cross-entropy subtracts the maximum into a copy of the fp32 logits (the copy becomes the kept softmax), so it
    holds the fp32 logits twice (measured: ``tests/test_memory_model.py``, ``tests/test_gpu_recordings.py``);
    Megatron subtracts in place but casts its 16-bit logits to fp32 beside them (modelled)."""
    logits = shape.tokens * shape.vocab_per_rank
    return logits * (shape.element_bytes if shape.framework == "megatron" else FP32_BYTES)


def attention_backward_bytes(shape: GptShape) -> int:
    """Bytes a layer holds at its softmax's backward, its peak in the backward (its MLP and output projection are
    done, their tensors freed): its input and the QKV input, q, k and v, the kept attention scores, the gradients
    of the probabilities and of the scores (torch's softmax backward writes a new tensor; Megatron's fused softmax
    writes in place, but its dropout's backward writes one: two gradients in both) and, on GPUs, the softmax
    backward's own temporary (:func:`softmax_backward_temporary_bytes`). Flash attention holds no scores: beside
    the inputs, q, k, v and the log-sum-exp, its backward writes the gradients of q, k and v (on GPUs FlashAttention-2
    also accumulates the queries' gradient in fp32)."""
    e = shape.element_bytes
    qkv = e * qkv_kept_elements(shape)
    inputs = 2 * shape.outside_tokens * shape.h * e + qkv
    if shape.attention == "flash":  # the gradients of q, k and v are the size of q, k and v
        accumulator = FP32_BYTES * shape.tokens * shape.h // shape.t if shape.device_type != "cpu" else 0
        return inputs + attention_score_bytes(shape) + qkv + accumulator
    return (inputs + attention_score_bytes(shape) + 2 * e * score_elements(shape)
            + softmax_backward_temporary_bytes(shape))


def softmax_backward_temporary_bytes(shape: GptShape) -> int:
    """The temporary torch's CUDA softmax backward holds beside its inputs and output: the gradient times the
    probabilities, one scores-sized tensor, when its rows are too long for the one-pass ("persistent") kernel
    (more than 1,024 elements or 4 KiB: sequences over 1,024 tokens; fp32 at 1,024 fits). Measured on an H200
    (``traces/gpu/h200-peak-*-ops.json``, ``validators/gpu/memory_peak.py --ops``): at the peak of a 2,048-token
    layer's backward, a ``mul`` inside ``_softmax_backward_data`` holds one, in fp32 and bf16 alike. CPUs and
    Megatron's fused softmax (in place) hold none."""
    if shape.device_type == "cpu" or shape.framework == "megatron":
        return 0
    e = shape.element_bytes
    if shape.s <= 1024 and shape.s * e <= 4096:
        return 0
    return score_elements(shape) * e


def state_bytes(config: RunConfig) -> tuple[int, int, int]:
    """Bytes per parameter of the run's parameters, gradients and optimizer states (:data:`STATE_BYTES` for
    Megatron, :data:`REFERENCE_STATE_BYTES` for the reference model): what its buffers hold and its gradient
    buckets reduce (Megatron's bf16 runs reduce fp32 gradients)."""
    return (STATE_BYTES if config.framework == "megatron" else REFERENCE_STATE_BYTES)[config.precision]


def stage_memory(config: RunConfig, shape: GptShape, chunks: list[Chunk]) -> StageMemory:
    """Peak memory of one GPU of the stage holding ``chunks``: model states, buffers, the activations of the passes'
    largest moment and the optimizer step's temporaries (the larger of the two counts: the module docstring)."""
    par = config.parallelism
    params = stage_parameter_count(shape, chunks)
    parameter, gradient, optimizer = state_bytes(config)
    in_flight = in_flight_micro_batches(config, chunks[0].stage)
    buffers = (4 * shape.pipeline_bytes if par.pp > 1 else 0) \
        + (2 * int(par.dp_bucket_mb * 2**20) if par.dp > 1 else 0)
    shards = shape.optimizer_shards
    return StageMemory(
        stage=chunks[0].stage, parameter_bytes=params * parameter, gradient_bytes=params * gradient,
        optimizer_bytes=math.ceil(params / shards) * optimizer,
        activation_bytes=int(_peak_activation_bytes(config, shape, chunks)), buffer_bytes=buffers,
        in_flight=in_flight, step_bytes=optimizer_step_bytes(config, shape, chunks),
    )


def optimizer_step_bytes(config: RunConfig, shape: GptShape, chunks: list[Chunk]) -> int:
    """Temporaries of one Adam step: torch's Adam (the reference model) takes the square root of the second moments
    into new tensors, all of them at once on GPUs (its multi-tensor path: the parameters' bytes again, measured on
    an H200 as the peak of a run whose parameters outweigh its activations, ``traces/gpu/``), one parameter at a time
    on CPUs (the largest parameter, twice: the root, then its quotient); Megatron's fused Adam updates in place,
    beside the fp32 copies of fp16 gradients (:data:`MEGATRON_STEP_BYTES`), of its 1/d of them with the
    distributed optimizer."""
    if config.framework == "megatron":
        return MEGATRON_STEP_BYTES[config.precision] * math.ceil(stage_parameter_count(shape, chunks)
                                                                 / shape.optimizer_shards)
    element = REFERENCE_STATE_BYTES[config.precision][0]
    if shape.device_type == "cpu":
        return 2 * element * max((math.prod(p) for p in stage_parameters(shape, chunks)), default=0)
    return element * stage_parameter_count(shape, chunks)


def _peak_activation_bytes(config: RunConfig, shape: GptShape, chunks: list[Chunk]) -> float:
    """Activations at the stage's largest moment: the head's forward (every pass in flight, the heads kept and the
    head's transient), a layer's backward start (its full set recomputed, with full recomputation) or its softmax
    backward (:func:`attention_backward_bytes`), each beside the other passes in flight."""
    par = config.parallelism
    layers = sum(chunk.layers for chunk in chunks)
    kept_layer = layer_activation_bytes(shape, par.recompute)
    in_flight = in_flight_micro_batches(config, chunks[0].stage)
    if par.schedule != "interleaved" or par.virtual_stages == 1:
        in_flight_chunks = in_flight * len(chunks)
    else:
        in_flight_chunks = in_flight
    kept = layers * kept_layer / len(chunks) * in_flight_chunks
    has_head = any(chunk.has_head for chunk in chunks)
    head = head_activation_bytes(shape) if has_head else 0
    heads_kept = in_flight if par.schedule == "gpipe" else 1  # else the head's backward follows at once
    moments = [kept + head * heads_kept + (head_transient_bytes(shape) if has_head else 0)]
    if layers:
        others = kept - kept_layer + head * (heads_kept - 1)  # the layer in its backward, beside the rest
        moments += [others + layer_activation_bytes(shape, "none"), others + attention_backward_bytes(shape)]
    return max(moments)


def peak_stage_memory(config: RunConfig) -> StageMemory:
    """The stage that needs the most memory in a consistent ``config``: the first, the last, or one holding more
    layers than the first (uneven ``stage_layers``: BLOOM's 5 6 ... 6 5 keeps 11 micro-batches of 6 layers on its
    second stage against 12 of 5 on its first). No other can be it: it holds no embedding or head, no more layers
    than the first, and no more micro-batches in flight."""
    chunks = partition(config)
    shape = GptShape.from_config(config)
    first_layers = _layers(chunks[0])
    candidates = [stage_chunks for index, stage_chunks in enumerate(chunks)
                  if index in (0, len(chunks) - 1) or _layers(stage_chunks) > first_layers]
    return max((stage_memory(config, shape, stage_chunks) for stage_chunks in candidates),
               key=lambda m: m.total_bytes)


def _layers(stage_chunks: list[Chunk]) -> int:
    """The transformer layers a stage holds, over its chunks."""
    return sum(chunk.layers for chunk in stage_chunks)
