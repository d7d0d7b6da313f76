"""Kernel classification, exactly as HolisticTraceAnalysis does it (``hta.utils.utils.get_kernel_type``).

The regular expressions are HTA's own (MIT licence); they are repeated here because importing HTA costs half a
second, and a test checks that both agree on every kernel of the shipped traces.
"""

from __future__ import annotations

import re
from functools import lru_cache

from vtrain.tables.schema import COMMUNICATION, COMPUTATION, MEMORY, OTHER

_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


@lru_cache(maxsize=None)
def kernel_class(name: str) -> str:
    """The ``kernel_class`` of a device activity's name: ``communication``, ``memory``, ``computation`` or
    ``other`` (:data:`vtrain.tables.schema.KERNEL_CLASSES`)."""
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER
