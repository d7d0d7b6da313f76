"""Workload steps: operators (keyed by the signature the profiler records) and collectives.

An :class:`Op` is one launching operator as ``torch.profiler`` records it with ``record_shapes=True``: the aten
name, the input dims and the input dtypes, both as the JSON text that is also the key of the ``op_latency``
table. Its cost (FLOPs and bytes moved) is derived from the signature alone by :func:`op_cost`, so the same
function sizes both the workload's ops and any row of a measured profile (needed to scale one into the other).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from vtrain.kineto import ATTENTION_OPS, dtype_bytes, first_dtype


#: the 16-bit floating-point dtype strings: the precision of every kernel the importers read
HALF_DTYPES = ("c10::Half", "c10::BFloat16")

#: the trace's dtype string for each run precision
PRECISION_DTYPE = {"fp32": "float", "fp16": "c10::Half", "bf16": "c10::BFloat16"}

#: matrix-multiply operators: cost is FLOPs, scaled by GEMM efficiency
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                      "aten::_scaled_mm", "aten::addbmm"})

#: the rows and columns of the score tiles a FlashAttention kernel skips or computes whole (FlashAttention-2's
#: 128-row blocks): causal attention computes the tiles on and below the diagonal
ATTENTION_TILE = 128

#: operators that write their first input in place without reading it (copy/fill style; ``masked_fill_`` reads
#: it: an element keeps its value where the mask is false)
_WRITE_ONLY_FIRST = frozenset({"aten::copy_", "aten::fill_", "aten::zero_", "aten::index_put_",
                               "aten::_index_put_impl_"})


#: operators that reduce their one tensor input (along dimensions, or whole) to a much smaller output: they read
#: the input and write little (``aten::max`` of two tensors is element-wise, and counted as such)
_REDUCTIONS = frozenset({"aten::sum", "aten::mean", "aten::max", "aten::min", "aten::amax", "aten::amin",
                         "aten::argmax", "aten::argmin", "aten::prod", "aten::norm", "aten::linalg_vector_norm",
                         "aten::std", "aten::var", "aten::logsumexp", "aten::all", "aten::any"})


@dataclass(frozen=True)
class Op:
    """One launching operator of the workload, keyed as the ``op_latency`` table keys it.

    ``elements`` is set where the signature does not say how many elements the operator touches: a gather or
    scatter through an index (``logits[rows, targets]``) touches the indexed elements, not the tensor's."""

    name: str
    input_dims: str  # JSON text, e.g. "[[256, 64], [64, 192]]"
    input_types: str  # JSON text, e.g. '["float", "float"]'
    flops: float
    bytes: float
    elements: int | None = None

    @property
    def is_gemm(self) -> bool:
        return self.name in GEMM_OPS

    @property
    def is_attention(self) -> bool:
        """A fused attention operator (:data:`~vtrain.kineto.ATTENTION_OPS`): timed by the GEMMs it fuses."""
        return self.name in ATTENTION_OPS

    @property
    def signature(self) -> tuple[str, str, str]:
        return (self.name, self.input_dims, self.input_types)


@dataclass(frozen=True)
class Collective:
    """One collective (or point-to-point transfer) inside a block, e.g. a tensor-parallel all-reduce."""

    purpose: str  # tp | pp | dp
    op: str  # all_reduce | send | recv | ...
    bytes: int
    dtype: str  # trace dtype string of the payload


Step = Op | Collective


#: bytes an indexed element moves beyond its value's read and write: its 64-bit index
INDEX_BYTES = 8


def make_op(name: str, dims: list[Any], types: list[str], *, indexed: int | None = None,
            list_element_bytes: int = 4) -> Op:
    """Build an :class:`Op` from python dims/types lists (serialised exactly as the profiler's JSON text).
    ``indexed``: for a gather or scatter through an index, the elements it reads or writes (each read, written
    and found through its index), which its signature does not tell. ``list_element_bytes``: the element size of
    its tensor lists, which their signature does not tell either."""
    if indexed is None:
        flops, nbytes = op_cost(name, dims, types, list_element_bytes)
        return Op(name, json.dumps(dims), json.dumps(types), flops, nbytes)
    element = dtype_bytes(types[0]) or 4
    return Op(name, json.dumps(dims), json.dumps(types), 0.0, float(indexed * (2 * element + INDEX_BYTES)), indexed)


def op_cost(name: str, dims: list[Any], types: list[str], list_element_bytes: int = 4) -> tuple[float, float]:
    """FLOPs and bytes moved by one call of operator ``name`` with these input dims and dtypes (a tensor list's
    elements of ``list_element_bytes`` each).

    GEMMs count 2·M·N·K FLOPs (per batch); every operator counts the bytes of its tensor inputs plus one
    output the size of its largest input (in-place copy/fill style operators do not re-read their target), but a
    reduction of one tensor, whose output is that tensor without its longest dimension.
    """
    flops = _gemm_flops(name, dims) or _attention_flops(name, dims)
    tensors = [(shape, dtype) for shape, dtype in zip(dims, types) if _is_tensor(shape, dtype)]
    sizes = [_tensor_bytes(shape, dtype, list_element_bytes) for shape, dtype in tensors]
    if not sizes:
        return flops, 0.0
    reads = sum(sizes)
    if name in _WRITE_ONLY_FIRST:
        reads -= sizes[0]
    written = max(sizes)
    if name in _REDUCTIONS and len(tensors) == 1 and isinstance(tensors[0][0], list) and tensors[0][0]:
        written //= max(max(tensors[0][0]), 1)
    return flops, float(reads + written)


def _gemm_flops(name: str, dims: list[Any]) -> float:
    if name not in GEMM_OPS:
        return 0.0
    mats = [d for d in dims if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d)]
    if len(mats) < 2:
        return 0.0
    a, b = mats[-2], mats[-1]
    if name in ("aten::addmm",) or len(a) == 2 and len(b) == 2:
        return 2.0 * a[-2] * a[-1] * b[-1]
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _attention_flops(name: str, dims: list[Any]) -> float:
    """FLOPs of a causal fused attention call: those of the GEMMs it fuses (:func:`attention_gemms`) on the score
    tiles it computes; 0 for any other operator."""
    if name not in ATTENTION_OPS:
        return 0.0
    gemms, share = _attention_work(name, dims)
    return share * sum(2.0 * batch * m * k * n for batch, m, k, n in gemms)


def causal_share(seq: int) -> float:
    """The share of a causal attention's s x s score tiles a FlashAttention kernel computes: the n(n + 1)/2 tiles
    of :data:`ATTENTION_TILE` rows on and below the diagonal of n x n (about half for long sequences)."""
    tiles = max(math.ceil(seq / ATTENTION_TILE), 1)
    return (tiles + 1) / (2 * tiles)


def attention_gemms(op: Op) -> tuple[list[Op], float]:
    """The batched GEMMs a fused attention call does, as ``aten::bmm`` operators of its dtype, whole, and the share
    of their score tiles a causal kernel computes (:func:`causal_share`): forward the scores (q·kᵀ) and their
    product with the values; backward the scores again, then the gradients of the values, of the probabilities,
    of the queries and of the keys (FlashAttention-2's backward: five). No GEMMs for another operator."""
    dtype = first_dtype(op.input_types, "float") or "float"
    gemms, share = _attention_work(op.name, json.loads(op.input_dims))
    return [make_op("aten::bmm", [[batch, m, k], [batch, k, n]], [dtype, dtype]) for batch, m, k, n in gemms], share


def _attention_work(name: str, dims: list[Any]) -> tuple[list[tuple[int, int, int, int]], float]:
    """(batch, m, k, n) of the GEMMs of :func:`attention_gemms`, from the query's and the key's [b, heads, s, d]
    (the gradient of the output comes first in a backward's inputs), and their causal share (1 without GEMMs)."""
    first = 1 if name.endswith("_backward") else 0
    tensors = [d for d in dims[first:first + 2] if isinstance(d, list) and len(d) == 4
               and all(isinstance(x, int) for x in d)]
    if len(tensors) < 2:
        return [], 1.0
    (b, heads, s, d), keys = tensors[0], tensors[1][2]
    batch = b * heads
    if not first:
        return [(batch, s, d, keys), (batch, s, keys, d)], causal_share(s)
    return ([(batch, s, d, keys), (batch, keys, s, d), (batch, s, d, keys), (batch, s, keys, d), (batch, keys, s, d)],
            causal_share(s))


def _is_tensor(shape: Any, dtype: str) -> bool:
    return dtype_bytes(dtype) is not None or dtype == "TensorList" or (isinstance(shape, list) and shape != []
                                                             and dtype not in ("Scalar", "ScalarList", ""))


def _tensor_bytes(shape: Any, dtype: str, list_element_bytes: int) -> int:
    if dtype == "TensorList":  # a list of shapes, its element size not in the signature
        return sum(list_element_bytes * math.prod(s) for s in shape if isinstance(s, list))
    if not isinstance(shape, list):
        return 0
    return (dtype_bytes(dtype) or 4) * math.prod(shape)


def gemm_dims(op: Op) -> tuple[int, int, int, int]:
    """Batch, m, k and n of a GEMM operator (its last two matrix inputs: [..., m, k] x [..., k, n])."""
    mats = [d for d in json.loads(op.input_dims)
            if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d)]
    if len(mats) < 2:
        raise ValueError(f"{op.name} {op.input_dims} has no two matrix inputs")
    a, b = mats[-2], mats[-1]
    batch = math.prod(a[:-2]) if len(a) > 2 and not (len(a) == 2 and len(b) == 2) else 1
    return batch, a[-2], a[-1], b[-1]


def largest_elements(op: Op) -> int:
    """Elements of the operator's largest tensor input (a tensor list counts all its tensors)."""
    sizes = [sum(math.prod(s) for s in shape if isinstance(s, list)) if dtype == "TensorList" else math.prod(shape)
             for shape, dtype in zip(json.loads(op.input_dims), json.loads(op.input_types))
             if isinstance(shape, list) and shape and _is_tensor(shape, dtype)]
    return max(sizes, default=0)


def row_length(op: Op) -> int:
    """Length of the last dimension of the operator's first input (the row a norm or softmax reduces)."""
    dims = json.loads(op.input_dims)
    first = dims[0] if dims else []
    return int(first[-1]) if isinstance(first, list) and first and isinstance(first[-1], int) else 1


