"""The host CPU as a device: its GEMM rate and memory bandwidth measured once per process with torch."""

from __future__ import annotations

import functools
import time

from vtrain.collective_cost import Link
from vtrain.devices.model import DeviceModel

_GEMM_SIZE = 512
_COPY_BYTES = 64 * 2**20


def _best_seconds(work, repeats: int) -> float:
    work()  # warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


@functools.lru_cache(maxsize=1)
def measured_cpu() -> DeviceModel:
    """Measure this machine's fp32 GEMM FLOP/s and copy bandwidth (about 0.2 s, once per process)."""
    import torch  # only CPU runs need it: keep `vtrain simulate` of GPU runs free of the import

    n = _GEMM_SIZE
    a, b = torch.randn(n, n), torch.randn(n, n)
    gemm_flops = 2.0 * n**3 / _best_seconds(lambda: torch.mm(a, b), repeats=5)
    src = torch.empty(_COPY_BYTES // 4)
    dst = torch.empty_like(src)
    bandwidth = 2.0 * _COPY_BYTES / _best_seconds(lambda: dst.copy_(src), repeats=5)
    provenance = {"peak_flops": "measured", "memory_bandwidth": "measured", "launch_overhead_us": "assumed",
                  "gemm_efficiency": "assumed", "memory_efficiency": "assumed", "intra_node.alpha_us": "assumed",
                  "intra_node.bandwidth_gbps": "measured", "inter_node.alpha_us": "assumed",
                  "inter_node.bandwidth_gbps": "assumed"}
    return DeviceModel(
        name=f"cpu ({torch.get_num_threads()} threads)",
        peak_flops={"float": gemm_flops},  # measured fp32; other dtypes use it too (see peak_for)
        memory_bandwidth=bandwidth, launch_overhead_us=5.0, gemm_efficiency=1.0, memory_efficiency=1.0,
        intra_node=Link(alpha_us=30.0, bandwidth_gbps=bandwidth / 2 / 1e9),  # gloo through shared memory
        inter_node=Link(alpha_us=50.0, bandwidth_gbps=1.25),  # 10 Gbit/s Ethernet
        provenance=provenance,
    )
