"""Operator classes for per-class errors: GEMM, attention, elementwise/norm, convolution, memory, one class per
collective type, and other.

An operator is classed by the name of the CPU operator that ran or launched it (``aten::addmm`` is a GEMM
whatever kernel cuBLAS picked); a device activity without a known launching operator is classed by its kernel
name.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vtrain.kineto import FUSED_ATTENTION

GEMM = "gemm"
ATTENTION = "attention"
ELEMENTWISE = "elementwise/norm"
CONVOLUTION = "convolution"
MEMORY = "memory"
OTHER = "other"
COMM_PREFIX = "comm:"

_GEMM_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|addmv|mv|dot|vdot|einsum|"
                       r"_addmm_activation|_scaled_mm|_int_mm|tensordot|linear_backward)$")
_CONV_OPS = re.compile(r"^aten::(_?convolution|conv\w*|cudnn_convolution\w*|mkldnn_convolution\w*|"
                       r"_slow_conv\w*|thnn_conv\w*|miopen_convolution\w*)")
_MEMORY_OPS = re.compile(r"^aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|_local_scalar_dense|item|"
                         r"index_select|gather|scatter\w*|embedding\w*|fill_|zero_|zeros\w*|ones\w*|empty\w*|"
                         r"new_\w+|resize_|set_|narrow_copy|split\w*|chunk|unbind|index|index_put_|"
                         r"masked_fill_?|_unsafe_view|view|reshape|t|transpose|permute|expand|select|slice|"
                         r"as_strided|detach|unsqueeze|squeeze|flatten)$")
_ELEMENTWISE_OPS = re.compile(r"(norm|softmax|gelu|relu|silu|sigmoid|tanh|dropout|add|mul|div|sub|exp|log|sqrt|"
                              r"rsqrt|pow|neg|clamp|where|max|min|sum|mean|var|std|abs|sign|erf|cos|sin|lerp|"
                              r"addcmul|addcdiv|threshold|hardtanh|leaky|elu|mse|nll|cross_entropy|argmax|"
                              r"_foreach|mask|eq|ne|lt|gt|le|ge|reciprocal|square|cumsum|prod|all|any|"
                              r"logsumexp|bias)", re.IGNORECASE)

#: GEMM kernels by name: cuBLAS and CUTLASS on every NVIDIA generation (``nvjet_*`` is cuBLAS's on Hopper and later,
#: ``nvjet_sm90_tst_128x256_..._bias``), rocBLAS and hipBLASLt's Tensile kernels on AMD (``Cijk_Alik_Bljk_...``),
#: and torch.compile's Triton templates (``triton_tem_fused_addmm_0``: max-autotune's matrix products; its
#: convolution templates are told by their name first)
_GEMM_KERNEL = re.compile(r"(gemm|cutlass|xmma|wgmma|cublas|matmul|_mma_|sm\d+_xmma|nvjet|^Cijk_|^triton_tem_)",
                          re.IGNORECASE)
_CONV_KERNEL = re.compile(r"(conv(?!ert)|implicit_gemm|winograd|fft2d|precomputed_convolve)",  # not cuDNN's convert_*
                          re.IGNORECASE)
_ATTENTION_KERNEL = re.compile(r"(flash|fmha|attention|attn)", re.IGNORECASE)
_ELEMENTWISE_KERNEL = re.compile(r"(elementwise|vectorized|reduce|norm|softmax|gelu|relu|silu|dropout|"
                                 r"pointwise|unrolled|foreach|multi_tensor|bn_|batch_norm|bias|adam|sgd|triton_)",
                                 re.IGNORECASE)
_MEMORY_KERNEL = re.compile(r"^(Memcpy|Memset|dma)|copy|fill|cat_|index|gather|scatter|embedding",
                            re.IGNORECASE)


def comm_class(collective: str | None) -> str:
    """``comm:all_reduce`` etc.; ``comm:unknown`` when the collective type is not known."""
    return f"{COMM_PREFIX}{collective or 'unknown'}"


@lru_cache(maxsize=65536)
def op_class(op: str | None, kernel: str | None = None) -> str:
    """The class of an operator named ``op`` (a CPU operator), falling back to the kernel name."""
    if op:
        if FUSED_ATTENTION.search(op):
            return ATTENTION
        if _GEMM_OPS.match(op):
            return GEMM
        if _CONV_OPS.match(op):
            return CONVOLUTION
        if op.startswith("aten::"):
            if _MEMORY_OPS.match(op):
                return MEMORY
            if _ELEMENTWISE_OPS.search(op[6:]):
                return ELEMENTWISE
        elif kernel is None:
            return _non_aten_class(op)
    if kernel:
        return kernel_class(kernel)
    return OTHER


_BACKWARD_NODE = re.compile(r"^(\w+?)Backward\d*$")
_NON_ATEN_GEMM = re.compile(r"^(mm|addmm|bmm|baddbmm|matmul|linear|mv|addmv|dot)$")
_NON_ATEN_ELEMENTWISE = re.compile(r"(norm|softmax|gelu|relu|silu|sigmoid|tanh|dropout|accumulategrad|crossentropy|"
                                   r"^add|^sub|^mul|^div|^exp|^log|^pow|^neg|^sqrt|^rsqrt|^mean|^sum)")


def _non_aten_class(op: str) -> str:
    """Autograd nodes (``MmBackward0``) and other non-aten operators on CPU runs, by their base name."""
    name = op.rsplit("::", 1)[-1]
    node = _BACKWARD_NODE.match(name)
    base = (node.group(1) if node else name).lower().lstrip("_")
    if _NON_ATEN_GEMM.match(base):
        return GEMM
    if _NON_ATEN_ELEMENTWISE.search(base):
        return ELEMENTWISE
    return OTHER


@lru_cache(maxsize=65536)
def kernel_class(kernel: str) -> str:
    """The class of a device activity from its name alone."""
    if kernel.startswith("nccl"):
        return comm_class(None)
    if _ATTENTION_KERNEL.search(kernel):
        return ATTENTION
    if _CONV_KERNEL.search(kernel):
        return CONVOLUTION
    if _GEMM_KERNEL.search(kernel):
        return GEMM
    if _MEMORY_KERNEL.search(kernel):
        return MEMORY
    if _ELEMENTWISE_KERNEL.search(kernel):
        return ELEMENTWISE
    return OTHER
