"""Naming collectives, reading NCCL kernel names, and sizing messages."""

from __future__ import annotations

import json
import re
from functools import lru_cache

#: canonical collective names, from the spellings in Kineto args, NCCL kernel names and c10d/gloo annotations.
_ALIASES = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "all_gather": "all_gather", "_allgather_base": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather",
    "reducescatter": "reduce_scatter", "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "alltoallv": "all_to_all",
    "alltoall_base": "all_to_all",
    "send": "send", "recv": "recv", "sendrecv": "send_recv", "send_recv": "send_recv", "barrier": "barrier",
}

_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "NVLSTREE", "NVLS", "COLLNET", "RING", "TREE", "PAT")
_PROTOCOLS = ("LL128", "LL", "SIMPLE")



def canonical_collective(name: str | None) -> str | None:
    """``all_reduce`` for ``allreduce``, ``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::allreduce_`` ..."""
    if not name:
        return None
    key = name.split(":")[-1].strip().lower().rstrip("_")
    return _ALIASES.get(key)


@lru_cache(maxsize=None)
def parse_nccl_kernel(name: str) -> tuple[str | None, str | None, str | None]:
    """(collective, algorithm, protocol) from an NCCL kernel name; parts not in the name are ``None``.

    Both spellings are read: ``ncclKernel_AllReduce_RING_LL_Sum_float(...)`` (NCCL <= 2.18) and
    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` (NCCL >= 2.19).
    """
    match = _NCCL_KERNEL.match(name)
    if not match:
        return None, None, None
    collective = canonical_collective(match.group(1))
    tokens = name.split("(")[0].split("_")
    joined = "_".join(tokens)
    algorithm = next((a for a in _ALGORITHMS if f"_{a}_" in f"_{joined}_"), None)
    protocol = next((p for p in _PROTOCOLS if p in tokens), None)
    return collective, algorithm, protocol


@lru_cache(maxsize=65536)
def elements_from_dims(dims_json: str | None) -> int | None:
    """Total elements of the tensors in an ``Input Dims`` JSON text (nested lists for tensor lists)."""
    if not dims_json:
        return None
    try:
        dims = json.loads(dims_json)
    except json.JSONDecodeError:
        return None
    total = _count(dims)
    return total or None


def _count(node: object) -> int:
    if isinstance(node, list) and node and all(isinstance(x, int) for x in node):
        size = 1
        for x in node:
            size *= x
        return size
    if isinstance(node, list):
        return sum(_count(child) for child in node)
    return 0


@lru_cache(maxsize=65536)
def first_dtype(types_json: str | None) -> str | None:
    """The first non-empty dtype in an ``Input type`` JSON text."""
    if not types_json:
        return None
    try:
        types = json.loads(types_json)
    except json.JSONDecodeError:
        return None
    return next((t for t in types if isinstance(t, str) and t and t not in ("Scalar", "TensorList")), None)
