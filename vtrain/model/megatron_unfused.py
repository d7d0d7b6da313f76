"""Megatron's layers without its fused kernels (``framework: megatron`` with ``fused_kernels: false``): the
PyTorch operators Megatron-core's local layer spec runs where :mod:`vtrain.model.megatron` has a fused kernel.

That is what Megatron-core runs without apex and Transformer Engine, or with ``--no-masked-softmax-fusion
--no-bias-gelu-fusion --no-bias-dropout-fusion``: PyTorch's LayerNorm, the QKV and fc1 biases added after their
GEMMs, the causal mask filled into the scores in place and PyTorch's softmax in the scores' precision
(``attention_softmax_in_fp32`` off, the scale folded into the scores' ``baddbmm``), bias, dropout and residual
add as three operators, GeLU after its bias; weight gradients added into fp32 main gradients; and Megatron's
mixed-precision optimizer over ``torch.optim.AdamW`` (its ``foreach`` path) on fp32 master weights, with a
gradient norm per parameter and the master weights copied back one by one. Activations are ``[s, b, h]``.

Every operator and signature below is one that megatron-core 0.16.1 ran on an H200 (the traces in
``traces/gpu/h200-mcore-*``, ``validators/gpu/megatron_core_runs.py``), including the copies the backward of the
in-place mask makes of the scores: four and a zeroed buffer per layer and micro-batch.
"""

from __future__ import annotations

import math

from vtrain.model.gpt import GptShape
from vtrain.model.ops import PRECISION_DTYPE, Op, Step, make_op

FP32 = PRECISION_DTYPE["fp32"]


def _rows(shape: GptShape, width: int, outside: bool) -> list[int]:
    """The ``[s, b, width]`` dims of an activation: outside the tensor-parallel regions (``outside``) a
    sequence-parallel rank's part of the sequence."""
    return [(shape.outside_tokens if outside else shape.tokens) // shape.b, shape.b, width]


def layer_norm(shape: GptShape) -> Op:
    """PyTorch's LayerNorm (``aten::native_layer_norm``), or its RMSNorm."""
    rows, h, x = _rows(shape, shape.h, True), shape.h, shape.dtype
    if shape.norm == "rmsnorm":
        return make_op("aten::_fused_rms_norm", [rows, [], [h], []], [x, "ScalarList", x, ""])
    return make_op("aten::native_layer_norm", [rows, [], [h], [h], []], [x, "ScalarList", x, x, "Scalar"])


def layer_norm_backward(shape: GptShape) -> Op:
    """Its backward: the input's, the weight's and the bias's gradients, from the saved mean and deviation."""
    rows, h, x = _rows(shape, shape.h, True), shape.h, shape.dtype
    saved = [*rows[:2], 1]
    if shape.norm == "rmsnorm":
        return make_op("aten::_fused_rms_norm_backward", [rows, rows, [], saved, [h], []],
                       [x, x, "ScalarList", FP32, x, "ScalarList"])
    return make_op("aten::native_layer_norm_backward", [rows, rows, [], saved, saved, [h], [h], []],
                   [x, x, "ScalarList", FP32, FP32, x, x, "ScalarList"])


def bias_add(shape: GptShape, width: int, outside: bool = False) -> list[Step]:
    """A linear layer's bias added after its GEMM (none without the bias)."""
    x = shape.dtype
    return [make_op("aten::add", [_rows(shape, width, outside), [width], []], [x, x, "Scalar"])] * shape.bias


def qkv_projection(shape: GptShape) -> list[Step]:
    """The QKV projection's GEMM, then its bias."""
    n, h, qkv, x = shape.tokens, shape.h, shape.qkv_width, shape.dtype
    steps: list[Step] = [make_op("aten::mm", [[n, h], [h, qkv]], [x, x])]
    if shape.qkv_bias:
        steps.append(make_op("aten::add", [_rows(shape, qkv, False), [qkv], []], [x, x, "Scalar"]))
    return steps


def bias_dropout_add(shape: GptShape) -> list[Step]:
    """The attention output's or fc2's bias, the dropout and the residual add, an operator each."""
    rows, x = _rows(shape, shape.h, True), shape.dtype
    return [*bias_add(shape, shape.h, outside=True),
            *[make_op("aten::native_dropout", [rows, [], []], [x, "Scalar", "Scalar"])] * shape.dropout,
            make_op("aten::add", [rows, rows, []], [x, x, "Scalar"])]


def bias_dropout_add_backward(shape: GptShape) -> list[Step]:
    """The dropout's backward and the bias gradient (a sum over tokens)."""
    rows, x = _rows(shape, shape.h, True), shape.dtype
    return [*[make_op("aten::native_dropout_backward", [rows, rows, []], [x, "bool", "Scalar"])] * shape.dropout,
            *[make_op("aten::sum", [rows, [], [], []], [x, "ScalarList", "Scalar", ""])] * shape.bias]


def residual_gradient(shape: GptShape) -> Op:
    """The residual branch's gradient added into the layer input's (in place)."""
    rows, x = _rows(shape, shape.h, True), shape.dtype
    return make_op("aten::add_", [rows, rows, []], [x, x, "Scalar"])


def bias_activation(shape: GptShape) -> list[Step]:
    """fc1's bias, then GeLU; or SwiGLU as PyTorch's SiLU of the gate times the up projection."""
    x, f = shape.dtype, shape.ffn
    rows = _rows(shape, f, False)
    steps = bias_add(shape, shape.fc1_width)
    if shape.mlp == "swiglu":
        return [*steps, make_op("aten::silu", [rows], [x]), make_op("aten::mul", [rows, rows], [x, x])]
    return [*steps, make_op("aten::gelu", [rows, []], [x, ""])]


def bias_activation_backward(shape: GptShape) -> list[Step]:
    """The activation's backward, then fc1's bias gradient."""
    x, fc1 = shape.dtype, shape.fc1_width
    rows = _rows(shape, shape.ffn, False)
    if shape.mlp == "swiglu":
        steps: list[Step] = [make_op("aten::mul", [rows, rows], [x, x]), make_op("aten::mul", [rows, rows], [x, x]),
                             make_op("aten::silu_backward", [rows, rows], [x, x])]
    else:
        steps = [make_op("aten::gelu_backward", [rows, rows, []], [x, x, ""])]
    wide = _rows(shape, fc1, False)
    return steps + [make_op("aten::sum", [wide, [], [], []], [x, "ScalarList", "Scalar", ""])] * shape.bias


def _scores(shape: GptShape) -> tuple[list[int], list[int], list[int]]:
    """The scores as ``[b, heads, s, s]``, as the ``[b·heads, s, s]`` batches of their GEMMs, and the mask's dims."""
    s, heads = shape.s, shape.a // shape.t
    return [shape.b, heads, s, s], [shape.b * heads, s, s], [1, 1, s, s]


def attention_core(shape: GptShape) -> list[Step]:
    """The scores (``baddbmm`` into Megatron's buffer, the scale as its alpha), the causal mask filled in place,
    PyTorch's softmax, the attention dropout, the product with the values and the result made contiguous
    (:func:`context`): what Megatron-core's selective recomputation re-runs (its ``core_attention``)."""
    scores, batches, mask = _scores(shape)
    s, d, x = shape.s, shape.d, shape.dtype
    return [make_op("aten::baddbmm", [batches, [batches[0], s, d], [batches[0], d, s], [], []],
                    [x, x, x, "Scalar", "Scalar"]),
            make_op("aten::masked_fill_", [scores, mask, []], [x, "bool", "Scalar"]),
            make_op("aten::_softmax", [scores, [], []], [x, "Scalar", "Scalar"]),
            *[make_op("aten::native_dropout", [scores, [], []], [x, "Scalar", "Scalar"])] * shape.dropout,
            make_op("aten::bmm", [batches, [batches[0], s, d]], [x, x]),
            context(shape)]


def attention_core_backward(shape: GptShape) -> list[Step]:
    """The backward of :func:`attention_core` as autograd runs it: the values' and the probabilities' gradients,
    the dropout's and the softmax's backward, the copies and the zeroed buffer the in-place mask's backward makes
    of the scores, the mask's zeros, then the queries' and keys' gradients, each scaled."""
    scores, batches, mask = _scores(shape)
    s, d, x = shape.s, shape.d, shape.dtype
    heads = batches[0]
    copy = make_op("aten::copy_", [scores, scores, []], [x, x, "Scalar"])
    return [make_op("aten::bmm", [batches, [heads, s, d]], [x, x]),
            make_op("aten::bmm", [[heads, s, d], [heads, d, s]], [x, x]),
            *[make_op("aten::native_dropout_backward", [scores, scores, []], [x, "bool", "Scalar"])] * shape.dropout,
            make_op("aten::mul", [scores, scores], [x, x]),
            make_op("aten::_softmax_backward_data", [scores, scores, [], []], [x, x, "Scalar", "Scalar"]),
            make_op("aten::fill_", [[math.prod(scores)], []], [x, "Scalar"]),
            copy, make_op("aten::copy_", [batches, batches, []], [x, x, "Scalar"]), copy, copy,
            make_op("aten::masked_fill_", [scores, mask, []], [x, "bool", "Scalar"]),
            copy,
            make_op("aten::bmm", [batches, [heads, s, d]], [x, x]),
            make_op("aten::mul", [[heads, s, d], []], [x, "double"]),
            make_op("aten::bmm", [[heads, d, s], batches], [x, x]),
            make_op("aten::mul", [[heads, d, s], []], [x, "double"])]


def context(shape: GptShape) -> Op:
    """The attention's output made contiguous as ``[s, b, heads, d]`` for the output projection."""
    x = shape.dtype
    dims = [shape.s, shape.b, shape.a // shape.t, shape.d]
    return make_op("aten::copy_", [dims, dims, []], [x, x, "Scalar"])


def qkv_gradients_joined(shape: GptShape) -> Op:
    """The queries', keys' and values' gradients joined into the QKV projection's output gradient (the backward
    of its split: a ``cat``, by key-value group)."""
    s, b, d = shape.s, shape.b, shape.d
    groups, heads = shape.kv_per_rank, shape.a // shape.t
    parts = [[s, b, groups, heads // groups * d], [s, b, groups, d], [s, b, groups, d]]
    if groups == heads:
        parts = [[s, b, heads, d]] * 3
    return make_op("aten::cat", [parts, []], ["TensorList", "Scalar"], list_element_bytes=shape.element_bytes)


def accumulate(shape: GptShape, params: list[tuple[int, ...]]) -> list[Step]:
    """Each weight's gradient added into its fp32 main gradient (Megatron-core's gradient buffer)."""
    return [make_op("aten::add_", [list(p), list(p), []], [FP32, shape.dtype, "Scalar"]) for p in params]


#: torch.optim.AdamW's foreach update over the fp32 master weights, one multi-tensor operator each (the weight
#: decay's and the second moment's scaling two ``_foreach_mul_``), by their inputs' types
_ADAMW = (("aten::_foreach_mul_", ["TensorList", "Scalar"]),
          ("aten::_foreach_lerp_", ["TensorList", "TensorList", "Scalar"]),
          ("aten::_foreach_mul_", ["TensorList", "Scalar"]),
          ("aten::_foreach_addcmul_", ["TensorList", "TensorList", "TensorList", "Scalar"]),
          ("aten::_foreach_sqrt", ["TensorList"]),
          ("aten::_foreach_div_", ["TensorList", ""]),
          ("aten::_foreach_add_", ["TensorList", "Scalar"]),
          ("aten::_foreach_addcdiv_", ["TensorList", "TensorList", "TensorList", ""]))


def optimizer_step(shape: GptShape, params: list[tuple[int, ...]]) -> list[Step]:
    """Megatron's mixed-precision optimizer over ``torch.optim.AdamW``: the fp32 gradient buffer zeroed (the whole
    of it), with fp16 the gradients unscaled and checked for inf/NaN, a norm per gradient (clipping), AdamW's
    foreach update and each master weight copied back to the model's precision; with the distributed optimizer
    (``shape.optimizer_shards`` = d) each over this rank's 1/d of every parameter."""
    x, shards = shape.dtype, shape.optimizer_shards
    count = sum(math.prod(p) for p in params)
    mine = [[math.ceil(math.prod(p) / shards)] if shards > 1 else list(p) for p in params]
    steps: list[Step] = [make_op("aten::fill_", [[count], []], [FP32, "Scalar"])]
    if x == "c10::Half":
        steps.append(make_op("aten::_amp_foreach_non_finite_check_and_unscale_", [mine, [], []],
                             ["TensorList", FP32, FP32], list_element_bytes=4))
    steps += [make_op("aten::linalg_vector_norm", [p, [], [], [], []], [FP32, "Scalar", "", "Scalar", ""])
              for p in mine]
    steps += [make_op(name, [mine if kind == "TensorList" else [] for kind in types], types, list_element_bytes=4)
              for name, types in _ADAMW]
    return steps + [make_op("aten::copy_", [p, p, []], [x, FP32, "Scalar"]) for p in mine]
