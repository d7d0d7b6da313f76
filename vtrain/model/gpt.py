"""The ops of the reference GPT model on one tensor-parallel rank, as ``torch.profiler`` records them.

Each block (one transformer layer, the embedding, the head = final norm + logits + loss) is a list of steps in
execution order: launching operators (:class:`~vtrain.model.ops.Op`, keyed by the exact aten signature torch
2.13 records) and tensor-parallel collectives (:class:`~vtrain.model.ops.Collective`). Only operators that do
work appear (those that launch a kernel on a GPU); views, allocations and scalar conversions do not.

With ``framework: megatron`` in the run config, each public function here returns Megatron-DeepSpeed's kernels
instead (:mod:`vtrain.model.megatron`).

The sequences follow the reference model that ``vtrain record`` trains (``vtrain/record/model.py``) as torch
2.13 records it; ``tests/test_model_signatures.py`` records it, ingests the traces and checks that the profile
has these signatures. Notation: b micro-batch, s sequence, h hidden, a heads, t tensor parallel, d = h/a,
N = b·s tokens, f = 4h/t, Vt = vocabulary rows per rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType

from vtrain.kineto import FLASH_OPS, dtype_bytes
from vtrain.model.ops import HALF_DTYPES, PRECISION_DTYPE, Collective, Op, Step, make_op
from vtrain.runconfig import RunConfig

LONG = "long int"


@dataclass(frozen=True)
class GptShape:
    """The shapes one tensor-parallel rank sees for one micro-batch."""

    b: int  # micro-batch size
    s: int  # sequence length
    h: int  # hidden size
    a: int  # attention heads
    t: int  # tensor-parallel size
    vocab: int  # vocabulary size (unpadded)
    dtype: str = "float"  # trace dtype string of activations and weights
    device_type: str = "cpu"  # cpu | cuda: a few CPU kernels do extra copies
    framework: str = "reference"  # reference | megatron: whose kernels the run launches
    fused: bool = True  # megatron: its fused kernels (apex, fused softmax, bias-GeLU, ...), else PyTorch's
    attention: str = "eager"  # eager (scores in memory) | flash (one fused kernel each way)
    sequence_parallel: bool = False  # Megatron's: the ops outside the tensor-parallel regions split the sequence
    optimizer_shards: int = 1  # the data-parallel ranks the optimizer states are split over (Megatron's distributed
    #                            optimizer, ZeRO-1: d), else 1
    ffn_hidden: int | None = None  # the MLP's width (None: 4h)
    kv_heads: int | None = None  # key and value heads, grouped-query attention (None: a)
    mlp: str = "gelu"  # gelu | swiglu (fc1 to twice the width, SiLU of one half times the other)
    norm: str = "layernorm"  # layernorm | rmsnorm (a weight, no bias)
    position: str = "learned"  # learned (a position embedding) | rope (queries and keys rotated in every layer)
    bias: bool = True  # the attention output's and the MLP's linear layers add a bias
    qkv_bias: bool = True  # the QKV projection adds a bias
    tied: bool = False  # the output projection is the word embedding (where a stage holds both, one matrix)
    dropout: bool = True  # megatron: its attention and hidden dropout run (a probability above 0)

    @property
    def d(self) -> int:
        return self.h // self.a

    @property
    def tokens(self) -> int:
        return self.b * self.s

    @property
    def ffn(self) -> int:
        """Feed-forward width per rank (4h/t, or the model's ``ffn_hidden``/t)."""
        return (self.ffn_hidden or 4 * self.h) // self.t

    @property
    def fc1_width(self) -> int:
        """fc1's outputs per rank: the feed-forward width, twice it for a gated MLP (gate and up in one GEMM)."""
        return 2 * self.ffn if self.mlp == "swiglu" else self.ffn

    @property
    def kv_per_rank(self) -> int:
        """Key (and value) heads per rank: a/t, fewer with grouped-query attention."""
        return (self.kv_heads or self.a) // self.t

    @property
    def qkv_width(self) -> int:
        """The QKV projection's outputs per rank: the queries' h/t and the keys' and values' heads."""
        return (self.a // self.t + 2 * self.kv_per_rank) * self.d

    @property
    def vocab_per_rank(self) -> int:
        """Vocabulary rows per rank: Megatron pads the vocabulary to a multiple of 128·t (its default
        ``--make-vocab-size-divisible-by 128``: GPT-2's 50,257 words are 50,304 rows at t = 1); the reference
        model pads the same way only where V % t != 0."""
        if self.vocab % self.t == 0 and self.framework != "megatron":
            return self.vocab // self.t
        multiple = 128 * self.t
        return math.ceil(self.vocab / multiple) * multiple // self.t

    @property
    def element_bytes(self) -> int:
        return dtype_bytes(self.dtype) or 4  # self.dtype is one of PRECISION_DTYPE's

    @property
    def activation_bytes(self) -> int:
        """Bytes of one [b, s, h] activation (the payload of TP all-reduces)."""
        return self.tokens * self.h * self.element_bytes

    @property
    def outside_tokens(self) -> int:
        """Tokens of the ops outside the tensor-parallel regions (layer norms, dropout, residual adds): all of
        them, or with sequence parallelism this rank's 1/t of the sequence."""
        return self.tokens // self.t if self.sequence_parallel else self.tokens

    @property
    def pipeline_bytes(self) -> int:
        """Bytes of the activation a stage sends the next one (with sequence parallelism, this rank's part)."""
        return self.outside_tokens * self.h * self.element_bytes

    @classmethod
    def from_config(cls, config: RunConfig) -> GptShape:
        m, p = config.model, config.parallelism
        device_type = "cpu" if config.hardware.device.lower() == "cpu" else "cuda"
        return cls(b=p.micro_batch, s=m.seq, h=m.hidden, a=m.heads, t=p.tp, vocab=m.vocab,
                   dtype=PRECISION_DTYPE[config.precision], device_type=device_type, framework=config.framework,
                   fused=config.fused_kernels, attention=config.attention,
                   sequence_parallel=p.sequence_parallel and p.tp > 1,
                   optimizer_shards=p.dp if p.distributed_optimizer else 1,
                   ffn_hidden=m.ffn_hidden, kv_heads=m.kv_heads, mlp=m.mlp, norm=m.norm, position=m.position,
                   bias=m.bias, qkv_bias=m.has_qkv_bias, tied=config.ties_embeddings, dropout=m.dropout is not False)

    def norm_parameters(self) -> list[tuple[int, ...]]:
        """One norm's parameters: a layer norm's weight and bias, an RMSNorm's weight."""
        return [(self.h,)] * (1 if self.norm == "rmsnorm" else 2)


def _megatron(shape: GptShape) -> ModuleType | None:
    """:mod:`vtrain.model.megatron` when ``shape`` is a Megatron run, else None (imported here: it builds on
    this module)."""
    if shape.framework != "megatron":
        return None
    from vtrain.model import megatron
    return megatron


def _tp_all_reduce(shape: GptShape, nbytes: int) -> list[Step]:
    """A tensor-parallel all-reduce, absent when t = 1 (Megatron skips it)."""
    if shape.t == 1:
        return []
    return [Collective("tp", "all_reduce", nbytes, shape.dtype)]


def _bias_copy(shape: GptShape, rows: int, cols: int) -> list[Step]:
    """CPU ``addmm`` first copies the broadcast bias into the output (cuBLASLt fuses it on GPUs)."""
    if shape.device_type != "cpu":
        return []
    x = shape.dtype
    return [make_op("aten::copy_", [[rows, cols], [rows, cols], []], [x, x, "Scalar"])]


def _layer_norm(shape: GptShape) -> Op:
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    return make_op("aten::native_layer_norm", [[b, s, h], [], [h], [h], []], [x, "ScalarList", x, x, "Scalar"])


def _layer_norm_backward(shape: GptShape) -> Op:
    """The saved mean and reciprocal deviation are fp32 for fp16 and bf16 inputs on GPUs (torch's CUDA layer norm
    keeps its statistics in the accumulation type: the traces say ``float``); its CPU kernel keeps them in the input's
    type (a bf16 recording on CPU says ``c10::BFloat16``: ``tests/test_flash_attention.py``)."""
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    stats = "float" if x in HALF_DTYPES and shape.device_type != "cpu" else x
    return make_op("aten::native_layer_norm_backward",
                   [[b, s, h], [b, s, h], [], [b, s, 1], [b, s, 1], [h], [h], []],
                   [x, x, "ScalarList", stats, stats, x, x, "ScalarList"])


def _mm(shape: GptShape, m: int, k: int, n: int) -> Op:
    return make_op("aten::mm", [[m, k], [k, n]], [shape.dtype, shape.dtype])


def _bmm(shape: GptShape, batch: int, m: int, k: int, n: int) -> Op:
    return make_op("aten::bmm", [[batch, m, k], [batch, k, n]], [shape.dtype, shape.dtype])


def _sum_rows(shape: GptShape, dims: list[int]) -> Op:
    """``aten::sum`` over leading dims (bias gradients)."""
    return make_op("aten::sum", [dims, [], [], []], [shape.dtype, "ScalarList", "Scalar", ""])


def _accumulate(shape: GptShape, param: tuple[int, ...], accumulate: bool) -> list[Step]:
    """Gradient accumulation into ``.grad`` (micro-batches after the first)."""
    if not accumulate:
        return []
    x = shape.dtype
    return [make_op("aten::add_", [list(param), list(param), []], [x, x, "Scalar"])]


def _mask_ids(shape: GptShape) -> list[Step]:
    """The vocabulary-range mask of token ids: ``outside = (ids < start) | (ids >= end)``, then
    ``(ids - start).masked_fill(outside, 0)``."""
    b, s = shape.b, shape.s
    return [
        make_op("aten::lt", [[b, s], []], [LONG, "Scalar"]),
        make_op("aten::ge", [[b, s], []], [LONG, "Scalar"]),
        make_op("aten::bitwise_or", [[b, s], [b, s]], ["bool", "bool"]),
        make_op("aten::sub", [[b, s], [], []], [LONG, LONG, "Scalar"]),
        make_op("aten::copy_", [[b, s], [b, s], []], [LONG, LONG, "Scalar"]),
        make_op("aten::masked_fill_", [[b, s], [b, s], []], [LONG, "bool", "Scalar"]),
    ]


# --------------------------------------------------------------------------------------------- transformer layer

def layer_parameters(shape: GptShape) -> list[tuple[int, ...]]:
    """Parameter shapes of one layer on one TP rank, in registration order (GPT's layer: both norms' weights and
    biases, every linear layer's weight and bias; fewer with RMSNorm or without biases)."""
    h, t, f, qkv, fc1 = shape.h, shape.t, shape.ffn, shape.qkv_width, shape.fc1_width
    norm = shape.norm_parameters()
    bias = shape.bias
    return [*norm, (qkv, h), *[(qkv,)] * shape.qkv_bias, (h, h // t), *[(h,)] * bias,
            *norm, (fc1, h), *[(fc1,)] * bias, (h, f), *[(h,)] * bias]


def pipeline_handoff(shape: GptShape) -> list[Collective]:
    """What a stage's rank does to hand one micro-batch's activation (backward: its gradient) to the rank of the
    same tensor-parallel index in the next stage, in order: the reference model sends it whole from every rank."""
    if _megatron(shape):
        return _megatron(shape).pipeline_handoff(shape)
    return [Collective("pp", "send", shape.pipeline_bytes, shape.dtype)]


def layer_forward(shape: GptShape) -> list[Step]:
    """One transformer layer's forward on one TP rank (2 TP all-reduces)."""
    if _megatron(shape):
        return _megatron(shape).layer_forward(shape)
    b, s, h, d, x = shape.b, shape.s, shape.h, shape.d, shape.dtype
    n, hp, ap, f = shape.tokens, h // shape.t, shape.a // shape.t, shape.ffn
    qkv = shape.qkv_width
    steps: list[Step] = [_layer_norm(shape)]
    steps += _bias_copy(shape, n, qkv)
    steps += [make_op("aten::addmm", [[qkv], [n, h], [h, qkv], [], []], [x, x, x, "Scalar", "Scalar"])]
    eager = shape.attention != "flash"  # flash attention reads q, k, v and writes its output in place: no copies
    steps += _eager_inputs(shape) if eager else []
    steps += attention_core(shape)
    steps += [make_op("aten::copy_", [[b, s, ap, d], [b, s, ap, d], []], [x, x, "Scalar"])] * eager
    steps += [_mm(shape, n, hp, h)]
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [
        make_op("aten::add", [[b, s, h], [h], []], [x, x, "Scalar"]),
        make_op("aten::add", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]),
        _layer_norm(shape),
    ]
    fc1 = shape.fc1_width
    steps += _bias_copy(shape, n, fc1)
    steps += [make_op("aten::addmm", [[fc1], [n, h], [h, fc1], [], []], [x, x, x, "Scalar", "Scalar"])]
    if shape.mlp == "swiglu":
        steps += [make_op("aten::silu", [[b, s, f]], [x]), make_op("aten::mul", [[b, s, f], [b, s, f]], [x, x])]
    else:
        steps += [make_op("aten::gelu", [[b, s, f], []], [x, ""])]
    steps += [_mm(shape, n, f, h)]
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [
        make_op("aten::add", [[b, s, h], [h], []], [x, x, "Scalar"]),
        make_op("aten::add", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]),
    ]
    return steps


def _eager_inputs(shape: GptShape) -> list[Step]:
    """The eager core's queries, keys and values copied to [b·a/t, s, d] (with grouped-query attention each key
    and value repeated for its g = a/kv queries as it is copied)."""
    b, s, d, x = shape.b, shape.s, shape.d, shape.dtype
    ap, groups = shape.a // shape.t, shape.kv_per_rank
    q = [b, ap, s, d]
    kv = q if groups == ap else [b, groups, ap // groups, s, d]
    return [make_op("aten::copy_", [dims, dims, []], [x, x, "Scalar"]) for dims in (q, kv, kv)]


def attention_core(shape: GptShape) -> list[Step]:
    """The attention core of one layer's forward: scores, causal mask and softmax, their product with the values
    (what selective recomputation re-runs before the layer's backward); with flash attention, its one fused kernel."""
    if shape.attention == "flash":
        return [flash_attention(shape)]
    if _megatron(shape):
        return _megatron(shape).attention_core(shape)
    s, d, x = shape.s, shape.d, shape.dtype
    heads = shape.b * (shape.a // shape.t)
    return [
        _bmm(shape, heads, s, d, s),
        make_op("aten::mul", [[heads, s, s], []], [x, "double"]),
        make_op("aten::copy_", [[heads, s, s], [heads, s, s], []], [x, x, "Scalar"]),
        make_op("aten::masked_fill_", [[heads, s, s], [s, s], []], [x, "bool", "Scalar"]),
        make_op("aten::_softmax", [[heads, s, s], [], []], [x, "Scalar", "Scalar"]),
        _bmm(shape, heads, s, s, d),
    ]


def flash_attention(shape: GptShape) -> Op:
    """One layer's fused attention forward (PyTorch's FlashAttention operator of the device type) on [b, a/t, s, d]
    queries, keys and values: its signature as ingest keeps it, the [b, heads, s, d] tensors
    (:func:`~vtrain.kineto.fused_attention_signature`; its other arguments vary across PyTorch versions)."""
    x, q, kv = shape.dtype, _heads_first(shape), _heads_first(shape, shape.kv_per_rank)
    return make_op(FLASH_OPS[shape.device_type][0], [q, kv, kv], [x, x, x])


def flash_attention_backward(shape: GptShape) -> Op:
    """The fused attention's backward: the output's gradient, q, k, v and the output (as :func:`flash_attention`,
    its [b, heads, s, d] tensors)."""
    x, q, kv = shape.dtype, _heads_first(shape), _heads_first(shape, shape.kv_per_rank)
    return make_op(FLASH_OPS[shape.device_type][1], [q, q, kv, kv, q], [x] * 5)


def _heads_first(shape: GptShape, heads: int | None = None) -> list[int]:
    """[b, a/t, s, d]: the queries' (output's; keys' and values' with ``heads``) shape as the fused attention
    takes them."""
    return [shape.b, heads or shape.a // shape.t, shape.s, shape.d]


def layer_backward(shape: GptShape, accumulate: bool = False) -> list[Step]:
    """One transformer layer's backward on one TP rank (2 TP all-reduces of input gradients).

    ``accumulate`` adds the ``.grad`` accumulation of micro-batches after the first.
    """
    if _megatron(shape):
        return _megatron(shape).layer_backward(shape)
    b, s, h, d, x = shape.b, shape.s, shape.h, shape.d, shape.dtype
    n, hp, ap, f = shape.tokens, h // shape.t, shape.a // shape.t, shape.ffn
    heads = b * ap
    w = layer_parameters(shape)

    def acc(index: int) -> list[Step]:
        return _accumulate(shape, w[index], accumulate)

    steps: list[Step] = [_sum_rows(shape, [b, s, h]), *acc(11)]  # fc2 bias
    steps += [_mm(shape, h, n, f), _mm(shape, n, h, f), *acc(10)]  # fc2 weight, fc2 input
    steps += _activation_backward(shape)
    fc1 = shape.fc1_width
    steps += [_mm(shape, n, fc1, h), _mm(shape, fc1, n, h), _sum_rows(shape, [n, fc1]), *acc(9), *acc(8)]  # fc1
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [_layer_norm_backward(shape),
              make_op("aten::add", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]), *acc(7), *acc(6)]
    steps += [_sum_rows(shape, [b, s, h]), *acc(5)]  # attention output bias
    steps += [_mm(shape, h, n, hp), _mm(shape, n, h, hp), *acc(4)]  # attention output projection
    if shape.attention == "flash":
        steps += [flash_attention_backward(shape)]
    else:
        steps += [
            make_op("aten::copy_", [[b, ap, s, d], [b, ap, s, d], []], [x, x, "Scalar"]),
            _bmm(shape, heads, s, s, d),  # grad v
            _bmm(shape, heads, s, d, s),  # grad probs
            make_op("aten::_softmax_backward_data", [[heads, s, s], [heads, s, s], [], []],
                    [x, x, "Scalar", "Scalar"]),
            make_op("aten::copy_", [[heads, s, s], [heads, s, s], []], [x, x, "Scalar"]),
            make_op("aten::masked_fill_", [[heads, s, s], [s, s], []], [x, "bool", "Scalar"]),
            make_op("aten::mul", [[heads, s, s], []], [x, "double"]),
            _bmm(shape, heads, d, s, s),  # grad k
            _bmm(shape, heads, s, s, d),  # grad q
        ]
    qkv = shape.qkv_width
    steps += _repeat_backward(shape) if shape.attention != "flash" else []
    steps += [
        _qkv_split_backward(shape),
        _mm(shape, n, qkv, h), _mm(shape, qkv, n, h), _sum_rows(shape, [n, qkv]), *acc(3), *acc(2),
    ]
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [_layer_norm_backward(shape),
              make_op("aten::add_", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]), *acc(1), *acc(0)]
    return steps


def _activation_backward(shape: GptShape) -> list[Step]:
    """The MLP activation's backward: GELU's, or the gated product's and SiLU's, the gate's and the up
    projection's gradients joined as fc1's output gradient."""
    b, s, f, x = shape.b, shape.s, shape.ffn, shape.dtype
    if shape.mlp != "swiglu":
        return [make_op("aten::gelu_backward", [[b, s, f], [b, s, f], []], [x, x, ""])]
    half = [b, s, f]
    return [make_op("aten::mul", [half, half], [x, x]), make_op("aten::mul", [half, half], [x, x]),
            make_op("aten::silu_backward", [half, half], [x, x]),
            make_op("aten::cat", [[half, half], []], ["TensorList", "Scalar"])]


def _repeat_backward(shape: GptShape) -> list[Step]:
    """With grouped-query attention, the eager core's key and value gradients summed over each head's g queries
    (the backward of their repetition, :func:`_eager_inputs`)."""
    ap, groups = shape.a // shape.t, shape.kv_per_rank
    if groups == ap:
        return []
    dims = [shape.b, groups, ap // groups, shape.s, shape.d]
    return [make_op("aten::sum", [dims, [], [], []], [shape.dtype, "ScalarList", "Scalar", ""])] * 2


def _qkv_split_backward(shape: GptShape) -> Op:
    """The gradients of the queries, keys and values joined as the QKV projection's output gradient: three
    [b, s, a/t, d] (with grouped-query attention, per key/value head its g queries', its key's and value's)."""
    b, s, d = shape.b, shape.s, shape.d
    ap, groups = shape.a // shape.t, shape.kv_per_rank
    parts = [[b, s, ap, d]] * 3 if groups == ap else [[b, s, groups, ap // groups, d], *[[b, s, groups, 1, d]] * 2]
    return make_op("aten::cat", [parts, []], ["TensorList", "Scalar"])


# --------------------------------------------------------------------------------------------- embedding

def embedding_parameters(shape: GptShape) -> list[tuple[int, ...]]:
    """Token embedding rows of this rank and the position embedding (none with rotary positions)."""
    return [(shape.vocab_per_rank, shape.h), *[(shape.s, shape.h)] * (shape.position == "learned")]


def embedding_forward(shape: GptShape) -> list[Step]:
    """Vocabulary-parallel token embedding (masked lookup, TP all-reduce) plus the position embedding."""
    if _megatron(shape):
        return _megatron(shape).embedding_forward(shape)
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    steps: list[Step] = _mask_ids(shape) if shape.t > 1 else []
    steps += [make_op("aten::index_select", [[shape.vocab_per_rank, h], [], [shape.tokens]],
                      [x, "Scalar", LONG])]
    if shape.t > 1:
        steps += [make_op("aten::copy_", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]),
                  make_op("aten::masked_fill_", [[b, s, h], [b, s, 1], []], [x, "bool", "Scalar"])]
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [make_op("aten::add", [[b, s, h], [s, h], []], [x, x, "Scalar"])]
    return steps


def embedding_backward(shape: GptShape, accumulate: bool = False) -> list[Step]:
    """Gradients of the position and token embeddings."""
    if _megatron(shape):
        return _megatron(shape).embedding_backward(shape)
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    w = embedding_parameters(shape)
    steps: list[Step] = [_sum_rows(shape, [b, s, h])]
    if shape.t > 1:
        steps += [make_op("aten::copy_", [[b, s, h], [b, s, h], []], [x, x, "Scalar"]),
                  make_op("aten::masked_fill_", [[b, s, h], [b, s, 1], []], [x, "bool", "Scalar"])]
    steps += [make_op("aten::embedding_dense_backward", [[b, s, h], [b, s], [], [], []],
                      [x, LONG, "Scalar", "Scalar", "Scalar"]),
              *_accumulate(shape, w[1], accumulate), *_accumulate(shape, w[0], accumulate)]
    return steps


# --------------------------------------------------------------------------------------------- head

def head_parameters(shape: GptShape, with_embedding: bool = False) -> list[tuple[int, ...]]:
    """Final norm and the vocabulary-parallel output projection, but where the head's chunk holds the embedding
    too (``with_embedding``) and the two are tied: then the projection is the word embedding's, counted there."""
    projection = [] if with_embedding and shape.tied else [(shape.vocab_per_rank, shape.h)]
    return [*shape.norm_parameters(), *projection]


def head_forward(shape: GptShape) -> list[Step]:
    """Final LayerNorm, vocabulary-parallel logits and Megatron's vocabulary-parallel cross-entropy (in fp32:
    half-precision logits are converted first)."""
    if _megatron(shape):
        return _megatron(shape).head_forward(shape)
    return [_layer_norm(shape), *head_loss_forward(shape)]


def head_loss_forward(shape: GptShape) -> list[Step]:
    """The head after its LayerNorm: vocabulary-parallel logits and cross-entropy (Megatron's too)."""
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    n, vt = shape.tokens, shape.vocab_per_rank
    f32 = "float"
    small = n * 4
    steps: list[Step] = [_mm(shape, n, h, vt)]
    if x != f32:
        steps += [make_op("aten::copy_", [[b, s, vt], [b, s, vt], []], [f32, x, "Scalar"])]
    steps += [make_op("aten::max", [[b, s, vt], [], []], [f32, "Scalar", "Scalar"])]
    steps += _tp_all_reduce(shape, small)  # max over the vocabulary shards
    steps += [make_op("aten::sub", [[b, s, vt], [b, s, 1], []], [f32, f32, "Scalar"])]
    steps += _mask_ids(shape)
    steps += [
        make_op("aten::index", [[n, vt], []], [f32, ""], indexed=n),  # each token's target logit
        make_op("aten::copy_", [[b, s], [b, s], []], [f32, f32, "Scalar"]),
        make_op("aten::masked_fill_", [[b, s], [b, s], []], [f32, "bool", "Scalar"]),
    ]
    steps += _tp_all_reduce(shape, small)  # target logits
    steps += [
        make_op("aten::exp_", [[b, s, vt]], [f32]),
        make_op("aten::sum", [[b, s, vt], [], [], []], [f32, "ScalarList", "Scalar", ""]),
    ]
    steps += _tp_all_reduce(shape, small)  # sum of exponentials
    steps += [
        make_op("aten::log", [[b, s]], [f32]),
        make_op("aten::sub", [[b, s], [b, s], []], [f32, f32, "Scalar"]),
        make_op("aten::div_", [[b, s, vt], [b, s, 1]], [f32, f32]),
        make_op("aten::sum", [[b, s], [], [], [], []], [f32, "ScalarList", "Scalar", "Scalar", f32]),  # mean
    ]
    return steps


def head_backward(shape: GptShape, accumulate: bool = False) -> list[Step]:
    """Cross-entropy backward (softmax minus one-hot), logits GEMMs, final LayerNorm backward."""
    if _megatron(shape):
        return _megatron(shape).head_backward(shape)
    w = head_parameters(shape)
    steps = head_loss_backward(shape, accumulate)
    steps += _tp_all_reduce(shape, shape.activation_bytes)
    steps += [_layer_norm_backward(shape), *_accumulate(shape, w[1], accumulate),
              *_accumulate(shape, w[0], accumulate)]
    return steps


def head_loss_backward(shape: GptShape, accumulate: bool = False) -> list[Step]:
    """Backward of :func:`head_loss_forward` up to the gradient of the LayerNorm's output (before its tensor-
    parallel reduction): cross-entropy backward (softmax minus one-hot) and the logits GEMMs."""
    b, s, h, x = shape.b, shape.s, shape.h, shape.dtype
    n, vt = shape.tokens, shape.vocab_per_rank
    f32 = "float"
    w = head_parameters(shape)
    steps: list[Step] = [
        make_op("aten::div", [[b, s], []], [f32, LONG]),  # mean backward
        make_op("aten::copy_", [[n], [n], []], [f32, "bool", "Scalar"]),
        make_op("aten::sub", [[], [n], []], ["double", f32, "Scalar"]),
        make_op("aten::index", [[n, vt], []], [f32, ""], indexed=n),
        make_op("aten::sub_", [[n], [n], []], [f32, f32, "Scalar"]),
        make_op("aten::_index_put_impl_", [[n, vt], [], [n], [], []], [f32, "", f32, "Scalar", "Scalar"],
                indexed=n),  # minus one at each token's target
        make_op("aten::mul_", [[b, s, vt], [b, s, 1]], [f32, f32]),
    ]
    if x != f32:
        steps += [make_op("aten::copy_", [[b, s, vt], [b, s, vt], []], [x, f32, "Scalar"])]
    return steps + [_mm(shape, vt, n, h), _mm(shape, n, vt, h), *_accumulate(shape, w[-1], accumulate)]


# --------------------------------------------------------------------------------------------- optimizer

def optimizer_step(shape: GptShape, params: list[tuple[int, ...]]) -> list[Step]:
    """``torch.optim.Adam.step`` over this rank's parameter shards.

    CPU tensors take Adam's per-tensor loop; CUDA tensors take its default ``foreach`` path (one multi-tensor
    operator per update over the whole list).
    """
    if _megatron(shape):
        return _megatron(shape).optimizer_step(shape, params)
    x = shape.dtype
    if shape.device_type == "cpu":
        steps: list[Step] = []
        for p in params:
            dims = list(p)
            steps += [
                make_op("aten::lerp_", [dims, dims, []], [x, x, "Scalar"]),
                make_op("aten::mul_", [dims, []], [x, "double"]),
                make_op("aten::addcmul_", [dims, dims, dims, []], [x, x, x, "Scalar"]),
                make_op("aten::sqrt", [dims], [x]),
                make_op("aten::div", [dims, []], [x, "double"]),
                make_op("aten::add_", [dims, [], []], [x, "double", "Scalar"]),
                make_op("aten::addcdiv_", [dims, dims, dims, []], [x, x, x, "Scalar"]),
            ]
        return steps
    tl = [list(p) for p in params]
    e = shape.element_bytes  # parameters, gradients and moments all in the parameters' dtype
    return [
        make_op("aten::_foreach_lerp_", [tl, tl, []], ["TensorList", "TensorList", "Scalar"], list_element_bytes=e),
        make_op("aten::_foreach_mul_", [tl, []], ["TensorList", "Scalar"], list_element_bytes=e),
        make_op("aten::_foreach_addcmul_", [tl, tl, tl, []], ["TensorList", "TensorList", "TensorList", "Scalar"],
                list_element_bytes=e),
        make_op("aten::_foreach_sqrt", [tl], ["TensorList"], list_element_bytes=e),
        make_op("aten::_foreach_div_", [tl, []], ["TensorList", "ScalarList"], list_element_bytes=e),
        make_op("aten::_foreach_add_", [tl, []], ["TensorList", "Scalar"], list_element_bytes=e),
        make_op("aten::_foreach_addcdiv_", [tl, tl, tl, []],
                ["TensorList", "TensorList", "TensorList", "ScalarList"], list_element_bytes=e),
    ]
