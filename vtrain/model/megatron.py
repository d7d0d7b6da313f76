"""The kernels Megatron-DeepSpeed (2022) launches for a GPT on one tensor-parallel rank (``framework: megatron``),
and Megatron-LM's for the LLaMA-like layers Megatron-DeepSpeed did not train.

Where the reference model (:mod:`vtrain.model.gpt`) runs one aten operator per step, Megatron fuses:

- apex's fused LayerNorm (one kernel forward, one backward);
- the attention scores as one ``baddbmm`` (scale folded in, no copies of q, k, v: strided batched GEMMs), then
  the fused causal scale-mask-softmax (``scaled_upper_triang_masked_softmax``) where its kernel takes the shape
  (:func:`fused_softmax_available`; else PyTorch's softmax in fp32, five operators) and the attention dropout;
- bias + GeLU (the bias of the first MLP GEMM is not added by the GEMM) and bias + dropout + residual add (after
  the attention output and second MLP GEMMs), each one kernel, with the bias gradient a reduction in backward;
- the vocabulary-parallel cross-entropy in fp32 (as the reference model's head, which follows it);
- with sequence parallelism (Korthikanti et al.; ``sequence_parallel: true``, t > 1) the ops between the
  tensor-parallel regions (layer norms, bias-dropout-add, the embedding's dropout) run on this rank's 1/t of the
  sequence, and each region is entered by an all-gather and left by a reduce-scatter instead of an all-reduce
  (backward: the other way round). Megatron overlaps the backward's re-gathering of a column-parallel GEMM's input
  (for its weight gradient) with the input-gradient GEMM: it is not a step here;
- Megatron-LM's (2023 on) for what Megatron-DeepSpeed had not: with ``mlp: swiglu`` (``--swiglu``) its fused
  bias + SwiGLU in place of bias + GeLU, fc1 twice as wide; with ``kv_heads`` (``--group-query-attention``) the QKV
  projection's groups and, in the eager core, each key and value head repeated for its queries (a copy each, their
  gradients summed back); with ``norm: rmsnorm`` apex's fused RMSNorm, with ``position: rope`` Megatron-core's
  fused rotary embedding of the queries and keys (and no position embedding), without biases
  (``--disable-bias-linear``, ``--add-qkv-bias`` for the QKV projection alone) the same fused kernels without
  theirs and no bias gradients. Modelled from the kernels' bytes: no trace of them was at hand;
- fp16 training with fp32 master weights: every micro-batch adds each weight gradient into its main gradient
  buffer; the step copies gradients to fp32, unscales them and checks for inf/NaN (loss scaling), takes the
  gradient norm, runs Adam on the fp32 master weights (apex multi-tensor apply) and copies them back to fp16.

Fused kernels are named after the function that launches them (``apex::``, ``megatron::``); their bytes are those
of the tensors they read and write, so the memory-bound kernel model prices them as any other kernel. Without them
(``fused_kernels: false``: Megatron-core's local layers without apex or Transformer Engine) each helper below gives
PyTorch's operators instead, from :mod:`vtrain.model.megatron_unfused`.
Notation as in :mod:`vtrain.model.gpt`: n = b·s tokens, hp = h/t, f = 4h/t, Vt vocabulary rows per rank.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from vtrain.model import gpt
from vtrain.model import megatron_unfused as unfused
from vtrain.model.gpt import LONG, GptShape
from vtrain.model.ops import Collective, Op, Step, make_op

#: bytes per parameter of one optimizer step (fp16 gradients, fp32 master weights and Adam moments):
#: gradient fp16 -> fp32 copy (2 + 4), unscale and inf check (4 + 4), gradient norm (4), Adam (read weight,
#: gradient and both moments, write weight and moments: 16 + 12), master -> fp16 weights (4 + 2), zeroing the
#: gradient buffer (2)
OPTIMIZER_BYTES = {"megatron::main_grads_from_model_grads": 6, "aten::_amp_foreach_non_finite_check_and_unscale_": 8,
                   "apex::multi_tensor_l2norm": 4, "apex::multi_tensor_adam": 28, "apex::multi_tensor_scale": 6,
                   "aten::zero_": 2}
#: the steps over the whole gradient buffer, whatever share of the optimizer states a rank holds
_WHOLE_BUFFER = ("aten::zero_",)
#: the longest sequence Megatron's fused causal softmax takes (``is_kernel_available``: 16 < sk <= 4096)
FUSED_SOFTMAX_MAX_SEQ = 4096


def _layer_norm(shape: GptShape) -> Op:
    """A fused layer norm, or RMSNorm (apex's ``FusedRMSNorm``: a weight, no bias); PyTorch's without fusions."""
    if not shape.fused:
        return unfused.layer_norm(shape)
    n, h, x = shape.outside_tokens, shape.h, shape.dtype
    if shape.norm == "rmsnorm":
        return make_op("apex::fused_rms_norm", [[n, h], [h]], [x, x])
    return make_op("apex::fused_layer_norm", [[n, h], [h], [h]], [x, x, x])


def _layer_norm_backward(shape: GptShape) -> Op:
    """Its backward: the input's and the weight's gradients (and the bias's), from the saved statistics (RMSNorm
    keeps one a token, the layer norm two)."""
    if not shape.fused:
        return unfused.layer_norm_backward(shape)
    n, h, x = shape.outside_tokens, shape.h, shape.dtype
    if shape.norm == "rmsnorm":
        return make_op("apex::fused_rms_norm_backward", [[n, h], [n, h], [n], [h]], [x, x, "float", x])
    return make_op("apex::fused_layer_norm_backward", [[n, h], [n, h], [n], [n], [h]], [x, x, "float", "float", x])


def _rotary(shape: GptShape, backward: bool = False) -> list[Step]:
    """Rotary position embeddings (Megatron-core's fused RoPE, ``apply_rope_fusion``): the queries and the keys of
    this rank rotated by the [s, d] angles, a kernel each (their gradients rotated back in backward); nothing with
    learned positions."""
    if shape.position != "rope":
        return []
    x, heads = shape.dtype, shape.a // shape.t
    name = "megatron::fused_rope_backward" if backward else "megatron::fused_rope"
    return [make_op(name, [[shape.s, shape.b, count, shape.d], [shape.s, 1, 1, shape.d]], [x, "float"])
            for count in (heads, shape.kv_per_rank)]


def _residual_add(shape: GptShape) -> Op:
    """The residual branch's gradient added into the layer input's."""
    if not shape.fused:
        return unfused.residual_gradient(shape)
    n, h, x = shape.outside_tokens, shape.h, shape.dtype
    return make_op("aten::add", [[n, h], [n, h], []], [x, x, "Scalar"])


def _bias_dropout_add(shape: GptShape) -> list[Step]:
    """The linear layer's bias, dropout and the residual add, one kernel (without biases: dropout and the add)."""
    if not shape.fused:
        return unfused.bias_dropout_add(shape)
    n, h, x = shape.outside_tokens, shape.h, shape.dtype
    if not shape.bias:
        return [make_op("megatron::dropout_add", [[n, h], [n, h]], [x, x])]
    return [make_op("megatron::bias_dropout_add", [[n, h], [h], [n, h]], [x, x, x])]


def _bias_dropout_add_backward(shape: GptShape) -> list[Step]:
    """Dropout backward (gradient times mask) and the bias gradient (a reduction over tokens)."""
    if not shape.fused:
        return unfused.bias_dropout_add_backward(shape)
    n, h = shape.outside_tokens, shape.h
    return [*_dropout_backward(shape, [n, h]), *_bias_gradient(shape, [n, h], shape.bias)]


def _bias_gradient(shape: GptShape, dims: list[int], present: bool) -> list[Step]:
    """A linear layer's bias gradient, a reduction over tokens (none without the bias)."""
    return [make_op("aten::sum", [dims, [], [], []], [shape.dtype, "ScalarList", "Scalar", ""])] * present


def _enter_region(shape: GptShape) -> list[Step]:
    """Into a tensor-parallel region, forward: nothing (every rank has the whole input), or with sequence
    parallelism the all-gather of the sequence."""
    return [Collective("tp", "all_gather", shape.activation_bytes, shape.dtype)] if shape.sequence_parallel else []


def _leave_region(shape: GptShape) -> list[Step]:
    """Out of a tensor-parallel region, forward: the all-reduce of the partial outputs, or with sequence
    parallelism their reduce-scatter along the sequence."""
    if shape.sequence_parallel:
        return [Collective("tp", "reduce_scatter", shape.activation_bytes, shape.dtype)]
    return gpt._tp_all_reduce(shape, shape.activation_bytes)


def _leave_region_backward(shape: GptShape) -> list[Step]:
    """The gradient into a region's end (backward of :func:`_leave_region`): nothing, or the all-gather."""
    return _enter_region(shape)


def _enter_region_backward(shape: GptShape) -> list[Step]:
    """The input gradient out of a region's start (backward of :func:`_enter_region`): the all-reduce, or the
    reduce-scatter."""
    return _leave_region(shape)


def _dropout(shape: GptShape, dims: list[int]) -> list[Op]:
    """A dropout of ``dims``, where the run drops out (a probability of 0 runs none: PyTorch's dropout returns its
    input, and keeps no mask)."""
    return [make_op("aten::native_dropout", [dims, [], []], [shape.dtype, "double", "bool"])] * shape.dropout


def _dropout_backward(shape: GptShape, dims: list[int]) -> list[Op]:
    """The backward of :func:`_dropout` (the gradient times its mask)."""
    return [make_op("aten::native_dropout_backward", [dims, dims, []], [shape.dtype, "bool", "double"])
            ] * shape.dropout


def _accumulate(shape: GptShape, params: list[tuple[int, ...]]) -> list[Step]:
    """Megatron's main-gradient hook: every micro-batch adds each weight's gradient into its buffer."""
    if not shape.fused:
        return unfused.accumulate(shape, params)
    x = shape.dtype
    return [make_op("aten::add_", [list(p), list(p), []], [x, x, "Scalar"]) for p in params]


def pipeline_handoff(shape: GptShape) -> list[Collective]:
    """Megatron's scatter-gather between stages (Narayanan et al., SC21, §4.1; DeepSpeed's pipeline engine
    partitions the same way): each of the t ranks sends its 1/t of the activation to its peer, and the receiving
    ranks all-gather it over their node's links, instead of every rank sending all of it over the network. With
    sequence parallelism the activation is already split (1/t of the sequence) and goes as it is."""
    if shape.t == 1 or shape.sequence_parallel:
        return [Collective("pp", "send", shape.pipeline_bytes, shape.dtype)]
    return [Collective("pp", "send", shape.pipeline_bytes // shape.t, shape.dtype),
            Collective("tp", "all_gather", shape.pipeline_bytes, shape.dtype)]


def layer_forward(shape: GptShape) -> list[Step]:
    """One transformer layer's forward on one TP rank."""
    h, x = shape.h, shape.dtype
    n, hp = shape.tokens, h // shape.t
    steps: list[Step] = [
        _layer_norm(shape),
        *_enter_region(shape),
        *_qkv_projection(shape),
        *_rotary(shape),
        *_repeated_keys_and_values(shape),
        *gpt.attention_core(shape),  # with flash attention the fused kernel, else this module's
        *_context(shape),
        make_op("aten::mm", [[n, hp], [hp, h]], [x, x]),
    ]
    steps += _leave_region(shape)
    f, fc1 = shape.ffn, shape.fc1_width
    steps += [*_bias_dropout_add(shape), _layer_norm(shape), *_enter_region(shape),
              make_op("aten::mm", [[n, h], [h, fc1]], [x, x]),
              *_bias_activation(shape),
              make_op("aten::mm", [[n, f], [f, h]], [x, x])]
    steps += _leave_region(shape)
    return steps + _bias_dropout_add(shape)


def _context(shape: GptShape) -> list[Step]:
    """The attention's output made contiguous for the output projection (``permute(...).contiguous()``): without
    fusions the eager core's last step (:func:`~vtrain.model.megatron_unfused.attention_core`)."""
    if not shape.fused:
        return [unfused.context(shape)] if shape.attention == "flash" else []
    n, hp, x = shape.tokens, shape.h // shape.t, shape.dtype
    return [make_op("aten::copy_", [[n, hp], [n, hp], []], [x, x, "Scalar"])]


def _qkv_projection(shape: GptShape) -> list[Step]:
    """The QKV projection: its GEMM with the bias added (``addmm``), or without a bias; without fusions the
    GEMM, then the bias."""
    n, h, qkv, x = shape.tokens, shape.h, shape.qkv_width, shape.dtype
    if not shape.fused:
        return unfused.qkv_projection(shape)
    if not shape.qkv_bias:
        return [make_op("aten::mm", [[n, h], [h, qkv]], [x, x])]
    return [make_op("aten::addmm", [[qkv], [n, h], [h, qkv], [], []], [x, x, x, "Scalar", "Scalar"])]


def _bias_activation(shape: GptShape) -> list[Step]:
    """fc1's bias and the activation, one kernel: bias + GeLU, or Megatron-LM's bias + SwiGLU
    (``--swiglu``: ``bias_swiglu_impl``, the SiLU of the gate times the up projection, [n, 2f] in, [n, f] out);
    without biases (``--disable-bias-linear``) the same kernels without one."""
    n, fc1, x = shape.tokens, shape.fc1_width, shape.dtype
    if not shape.fused:
        return unfused.bias_activation(shape)
    if not shape.bias:
        return [make_op(_activation_kernel(shape), [[n, fc1]], [x])]
    return [make_op(_activation_kernel(shape), [[n, fc1], [fc1]], [x, x])]


def _activation_kernel(shape: GptShape, backward: bool = False) -> str:
    """The fused activation's name: ``megatron::bias_gelu``, ``megatron::swiglu_backward``, ..."""
    return (f"megatron::{'bias_' if shape.bias else ''}{'swiglu' if shape.mlp == 'swiglu' else 'gelu'}"
            f"{'_backward' if backward else ''}")


def _bias_activation_backward(shape: GptShape) -> list[Step]:
    """Its backward (the gradient of fc1's output from that of the activation's) and the bias gradient."""
    if not shape.fused:
        return unfused.bias_activation_backward(shape)
    n, f, fc1, x = shape.tokens, shape.ffn, shape.fc1_width, shape.dtype
    name = _activation_kernel(shape, backward=True)
    if not shape.bias:
        return [make_op(name, [[n, f], [n, fc1]], [x, x])]
    return [make_op(name, [[n, f], [n, fc1], [fc1]], [x, x, x]), *_bias_gradient(shape, [n, fc1], True)]


def _repeated_keys_and_values(shape: GptShape) -> list[Step]:
    """With grouped-query attention and the eager core, Megatron-LM repeats each key and value head for its g
    queries (``repeat_interleave`` on the heads: a copy each); the fused attention takes them as they are."""
    groups, heads = shape.kv_per_rank, shape.a // shape.t
    if groups == heads or shape.attention == "flash":
        return []
    dims = [shape.tokens, groups, heads // groups, shape.d]
    return [make_op("aten::copy_", [dims, dims, []], [shape.dtype, shape.dtype, "Scalar"])] * 2


def _repeated_keys_and_values_backward(shape: GptShape) -> list[Step]:
    """The keys' and values' gradients summed over each head's g queries (the backward of the repetition)."""
    groups, heads = shape.kv_per_rank, shape.a // shape.t
    if groups == heads or shape.attention == "flash":
        return []
    dims = [shape.tokens, groups, heads // groups, shape.d]
    return [make_op("aten::sum", [dims, [], [], []], [shape.dtype, "ScalarList", "Scalar", ""])] * 2


def attention_core(shape: GptShape) -> list[Step]:
    """Scores (one ``baddbmm``), the causal scale-mask-softmax, the attention dropout and the product with the
    values: what Megatron's selective recomputation (``--recompute-granularity selective``) re-runs."""
    if not shape.fused:
        return unfused.attention_core(shape)
    s, d, x = shape.s, shape.d, shape.dtype
    heads = shape.b * (shape.a // shape.t)
    return [make_op("aten::baddbmm", [[heads, s, d], [heads, d, s]], [x, x]),
            *_softmax(shape),
            *_dropout(shape, [heads, s, s]),
            make_op("aten::bmm", [[heads, s, s], [heads, s, d]], [x, x])]


def fused_softmax_available(shape: GptShape) -> bool:
    """Whether Megatron runs its fused causal scale-mask-softmax kernel for this shape
    (``FusedScaleMaskSoftmax.is_kernel_available``): half-precision scores, 16 < s <= 4,096 and a multiple of 4,
    and the rank's score matrices (micro-batch x heads per rank) a multiple of 4 and of the kernel's batches per
    thread block (8 for sequences up to 128, else 4). Otherwise it runs PyTorch's softmax: 16 heads over t = 8 at
    micro-batch 1 are 2 score matrices, and do."""
    s, batches = shape.s, shape.b * (shape.a // shape.t)
    per_block = 8 if s <= 128 else 4
    return (shape.dtype != "float" and 16 < s <= FUSED_SOFTMAX_MAX_SEQ and s % 4 == 0 and batches % 4 == 0
            and batches % per_block == 0)


def _softmax(shape: GptShape) -> list[Step]:
    """The causal scale-mask-softmax of the scores: the fused kernel, or Megatron's ``forward_torch_softmax`` in
    fp32 (query-key layer scaling forces the softmax to fp32): the scores converted, scaled, masked in place,
    softmax, converted back."""
    s, x = shape.s, shape.dtype
    scores = [shape.b * (shape.a // shape.t), s, s]
    if fused_softmax_available(shape):
        return [make_op("megatron::scaled_upper_triang_masked_softmax", [scores, []], [x, "Scalar"])]
    mask = [shape.b, 1, s, s]
    return [*_cast(shape, scores, to_fp32=True),
            make_op("aten::mul", [scores, []], ["float", "double"]),
            make_op("aten::masked_fill_", [scores, mask, []], ["float", "bool", "Scalar"]),
            make_op("aten::_softmax", [scores, [], []], ["float", "Scalar", "Scalar"]),
            *_cast(shape, scores, to_fp32=False)]


def _softmax_backward(shape: GptShape) -> list[Step]:
    """The backward of :func:`_softmax`: the fused kernel's, or autograd's through PyTorch's ops in reverse (the
    gradient to fp32, softmax backward, the mask's zeros, the scale, back to half precision)."""
    s, x = shape.s, shape.dtype
    scores = [shape.b * (shape.a // shape.t), s, s]
    if fused_softmax_available(shape):
        return [make_op("megatron::scaled_upper_triang_masked_softmax_backward", [scores, scores, []],
                        [x, x, "Scalar"])]
    return [*_cast(shape, scores, to_fp32=True),
            make_op("aten::_softmax_backward_data", [scores, scores, [], []], ["float", "float", "Scalar", "Scalar"]),
            make_op("aten::masked_fill", [scores, [shape.b, 1, s, s], []], ["float", "bool", "Scalar"]),
            make_op("aten::mul", [scores, []], ["float", "double"]),
            *_cast(shape, scores, to_fp32=False)]


def _cast(shape: GptShape, dims: list[int], to_fp32: bool) -> list[Step]:
    """The copy of a half-precision tensor to fp32 (``to_fp32``) or back; none in an fp32 run."""
    x = shape.dtype
    if x == "float":
        return []
    destination, source = ("float", x) if to_fp32 else (x, "float")
    return [make_op("aten::copy_", [dims, dims, []], [destination, source, "Scalar"])]


def layer_backward(shape: GptShape) -> list[Step]:
    """One transformer layer's backward on one TP rank, weight gradients added into the main gradients."""
    h, x = shape.h, shape.dtype
    n, hp, f, fc1, qkv = shape.tokens, h // shape.t, shape.ffn, shape.fc1_width, shape.qkv_width
    w = gpt.layer_parameters(shape)
    steps: list[Step] = [*_bias_dropout_add_backward(shape), *_leave_region_backward(shape),
                         make_op("aten::mm", [[n, h], [h, f]], [x, x]),  # fc2 input gradient
                         make_op("aten::mm", [[h, n], [n, f]], [x, x]),  # fc2 weight gradient
                         *_bias_activation_backward(shape),
                         make_op("aten::mm", [[n, fc1], [fc1, h]], [x, x]),  # fc1 input gradient
                         make_op("aten::mm", [[fc1, n], [n, h]], [x, x])]  # fc1 weight gradient
    steps += _enter_region_backward(shape)
    steps += [_layer_norm_backward(shape), _residual_add(shape)]
    steps += [*_bias_dropout_add_backward(shape), *_leave_region_backward(shape),
              make_op("aten::mm", [[n, h], [h, hp]], [x, x]),  # attention output input gradient
              make_op("aten::mm", [[h, n], [n, hp]], [x, x]),  # its weight gradient
              *[make_op("aten::copy_", [[n, hp], [n, hp], []], [x, x, "Scalar"])] * shape.fused,
              *_attention_core_backward(shape),
              *_repeated_keys_and_values_backward(shape),
              *_rotary(shape, backward=True),
              _qkv_gradients_joined(shape),
              *_bias_gradient(shape, [n, qkv], shape.qkv_bias),
              make_op("aten::mm", [[n, qkv], [qkv, h]], [x, x]),
              make_op("aten::mm", [[qkv, n], [n, h]], [x, x])]
    steps += _enter_region_backward(shape)
    steps += [_layer_norm_backward(shape), _residual_add(shape)]
    return steps + _accumulate(shape, w)


def _qkv_gradients_joined(shape: GptShape) -> Op:
    """The queries', keys' and values' gradients joined into the QKV projection's output gradient."""
    if not shape.fused:
        return unfused.qkv_gradients_joined(shape)
    n, qkv, x = shape.tokens, shape.qkv_width, shape.dtype
    return make_op("aten::copy_", [[n, qkv], [n, qkv], []], [x, x, "Scalar"])


def _attention_core_backward(shape: GptShape) -> list[Step]:
    """The backward of :func:`attention_core`: the product with the values, the dropout, the softmax and the
    scores; with flash attention its fused backward."""
    if shape.attention == "flash":
        return [gpt.flash_attention_backward(shape)]
    if not shape.fused:
        return unfused.attention_core_backward(shape)
    s, d, x = shape.s, shape.d, shape.dtype
    heads = shape.b * (shape.a // shape.t)
    return [make_op("aten::bmm", [[heads, s, d], [heads, d, s]], [x, x]),  # grad probs
            make_op("aten::bmm", [[heads, s, s], [heads, s, d]], [x, x]),  # grad v
            *_dropout_backward(shape, [heads, s, s]),
            *_softmax_backward(shape),
            make_op("aten::bmm", [[heads, s, s], [heads, s, d]], [x, x]),  # grad q
            make_op("aten::bmm", [[heads, s, s], [heads, s, d]], [x, x])]  # grad k


def embedding_forward(shape: GptShape) -> list[Step]:
    """Vocabulary-parallel word embedding (masked lookup, TP all-reduce), position embedding and their sum (none
    with rotary positions: the layers rotate their queries and keys), the [s, b, h] transpose and the embedding
    dropout (with sequence parallelism on this rank's part of the sequence, split off without communication)."""
    n, h, x = shape.tokens, shape.h, shape.dtype
    steps: list[Step] = gpt._mask_ids(shape) if shape.t > 1 else []
    steps += [make_op("aten::embedding", [[n, h], [n]], [x, LONG])]
    if shape.t > 1:
        steps += [make_op("aten::masked_fill_", [[n, h], [n, 1], []], [x, "bool", "Scalar"])]
    steps += gpt._tp_all_reduce(shape, shape.activation_bytes)
    if shape.position == "learned":
        steps += [make_op("aten::embedding", [[n, h], [n]], [x, LONG]),
                  make_op("aten::add", [[n, h], [n, h], []], [x, x, "Scalar"])]
    steps += [make_op("aten::copy_", [[n, h], [n, h], []], [x, x, "Scalar"]),
              *_dropout(shape, [shape.outside_tokens, h])]
    return steps


def embedding_backward(shape: GptShape) -> list[Step]:
    """Dropout backward (with sequence parallelism on this rank's part, then the all-gather of the sequence),
    the position (with learned positions) and word embedding gradients (each into a zeroed table)."""
    n, h, x = shape.tokens, shape.h, shape.dtype
    local = shape.outside_tokens
    w = gpt.embedding_parameters(shape)
    steps: list[Step] = [*_dropout_backward(shape, [local, h]), *_leave_region_backward(shape),
                         make_op("aten::copy_", [[n, h], [n, h], []], [x, x, "Scalar"])]
    for rows, _ in reversed(w):  # the position embedding's first, then the words'
        steps += [make_op("aten::zero_", [[rows, h]], [x]),
                  make_op("aten::embedding_dense_backward", [[n, h], [n]], [x, LONG])]
    return steps + _accumulate(shape, w)


def head_forward(shape: GptShape) -> list[Step]:
    """Fused final LayerNorm (with sequence parallelism on this rank's part, then the all-gather of the sequence),
    the logits and Megatron's vocabulary-parallel cross-entropy (fp32)."""
    return [_layer_norm(shape), *_enter_region(shape), *gpt.head_loss_forward(_reference_head(shape))]


def head_backward(shape: GptShape) -> list[Step]:
    """Cross-entropy and logits backward as the reference model (the input gradient's all-reduce a reduce-scatter
    with sequence parallelism), then the fused final LayerNorm backward."""
    return [*gpt.head_loss_backward(_reference_head(shape)), *_enter_region_backward(shape),
            _layer_norm_backward(shape), *_accumulate(shape, gpt.head_parameters(shape))]


def _reference_head(shape: GptShape) -> GptShape:
    """The shape the head's logits and cross-entropy are timed at: the reference model's (its vocabulary rows)."""
    return replace(shape, framework="reference", sequence_parallel=False)


def tied_embedding_reduction(shape: GptShape, gradient_bytes: int) -> list[Step]:
    """Megatron's all-reduce of the word embedding's gradients between the first stage (the embedding) and the last
    (the output projection, a copy of it) before the optimizer step (``_allreduce_word_embedding_grads``), where
    they are tied; on the stages that hold either."""
    return [Collective("embedding", "all_reduce", shape.vocab_per_rank * shape.h * gradient_bytes, shape.dtype)]


def optimizer_step(shape: GptShape, params: list[tuple[int, ...]]) -> list[Step]:
    """Megatron's fp16 optimizer step over this rank's parameters (multi-tensor kernels over all of them); with the
    distributed optimizer (``shape.optimizer_shards`` = d) over its 1/d of them, but for zeroing the whole gradient
    buffer; without fusions :func:`~vtrain.model.megatron_unfused.optimizer_step`."""
    if not shape.fused:
        return unfused.optimizer_step(shape, params)
    count = sum(math.prod(p) for p in params)
    shard = math.ceil(count / shape.optimizer_shards)
    steps: list[Step] = []
    for name, per_param in OPTIMIZER_BYTES.items():
        elements = count if name in _WHOLE_BUFFER else shard
        steps.append(Op(name, json.dumps([[[elements]]]), json.dumps(["TensorList"]), 0.0, float(per_param * elements)))
    return steps

