"""Kernel classification, exactly as HolisticTraceAnalysis does it (``hta.utils.utils.get_kernel_type``).

The regular expressions are HTA's own (MIT licence); they are repeated here because importing HTA costs half a
second, and a test checks that both agree on every kernel of the shipped traces.
"""

from __future__ import annotations

import re
from functools import lru_cache

_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

COMPUTATION = "computation"
COMMUNICATION = "communication"
MEMORY = "memory"
OTHER = "other"


@lru_cache(maxsize=None)
def kernel_class(name: str) -> str:
    """``communication``, ``memory``, ``computation`` or ``other`` for a device activity's name."""
    if _COMM.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER
