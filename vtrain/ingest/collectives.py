"""Naming collectives, reading NCCL kernel names, and sizing messages."""

from __future__ import annotations

import json
import re
from functools import lru_cache

#: canonical collective names, keyed by a spelling in lower case without underscores (:func:`_alias_key`): the
#: ``Collective name`` of Kineto args and ``record_param_comms``, NCCL kernel names (``AllReduce``, ``SendRecv``),
#: ProcessGroupNCCL's profiling titles (``nccl:_all_gather_base``, ``nccl:all_reduce_coalesced``,
#: ``nccl:_broadcast_oop``, ``nccl:_reduce_oop``, ``nccl:all_reduce_barrier`` ...), c10d ops
#: (``c10d::_allgather_base_``, ``c10d::reduce_scatter_tensor_coalesced_``, ``c10d::recv_any_source_`` ...), functional
#: collectives (``_c10d_functional::all_gather_into_tensor``, ``all_to_all_single``) and gloo/MPI/UCC titles, as
#: PyTorch 1.13 to 2.5 write them. ``nccl:coalesced`` (a batch of any collectives) names none.
_ALIASES = {
    **dict.fromkeys(["allreduce", "allreducecoalesced"], "all_reduce"),
    **dict.fromkeys(["allgather", "allgatherbase", "allgathercoalesced", "allgatherintotensor",
                     "allgatherintotensorcoalesced", "allgatherintotensorout"], "all_gather"),
    **dict.fromkeys(["reducescatter", "reducescatterbase", "reducescattertensor", "reducescattertensorcoalesced"],
                    "reduce_scatter"),
    **dict.fromkeys(["broadcast", "broadcastoop"], "broadcast"),
    **dict.fromkeys(["reduce", "reduceoop"], "reduce"),
    "gather": "gather", "scatter": "scatter",
    **dict.fromkeys(["alltoall", "alltoallv", "alltoallbase", "alltoallsingle"], "all_to_all"),
    "send": "send", **dict.fromkeys(["recv", "recvanysource"], "recv"), "sendrecv": "send_recv",
    # ProcessGroupNCCL's barrier is a one-element all-reduce: the op is the barrier
    **dict.fromkeys(["barrier", "monitoredbarrier", "allreducebarrier"], "barrier"),
}

_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_ALGORITHMS = ("COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS_TREE", "NVLSTREE", "NVLS", "COLLNET", "RING", "TREE", "PAT")
_PROTOCOLS = ("LL128", "LL", "SIMPLE")


def canonical_collective(name: str | None) -> str | None:
    """``all_reduce`` for ``allreduce``, ``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::allreduce_`` ..."""
    if not name:
        return None
    return _ALIASES.get(_alias_key(name))


def _alias_key(name: str) -> str:
    """The key of a name in :data:`_ALIASES`: after the last ``:``, lower case, without underscores (PyTorch spells
    one collective ``_allgather_base`` in c10d and ``_all_gather_base`` in ProcessGroupNCCL)."""
    return name.rsplit(":", 1)[-1].strip().lower().replace("_", "")


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


