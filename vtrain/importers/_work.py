"""The work columns of ``op_benchmarks`` rows shared by the importers."""

from __future__ import annotations

import polars as pl

#: bytes of one fp16 element (every imported benchmark ran in fp16)
HALF = 2
#: PyTorch's name for fp16 in traces, the ``dtype`` of imported fp16 benchmarks
HALF_DTYPE = "c10::Half"


def gemm_work(element_bytes: int = HALF) -> list[pl.Expr]:
    """``flops`` (2 x batch x m x k x n) and ``bytes`` (both operands and the output, batch x (mk + kn + mn)
    elements) of GEMM rows with ``batch`` (null = 1), ``m``, ``k`` and ``n`` columns."""
    batch = pl.col("batch").fill_null(1).cast(pl.Float64)
    m, k, n = (pl.col(name).cast(pl.Float64) for name in ("m", "k", "n"))
    return [(2 * batch * m * k * n).alias("flops"), (element_bytes * batch * (m * k + k * n + m * n)).alias("bytes")]
