"""The latency tables the simulator reads: ``op_latency`` (per operator signature) and ``nccl_latency``
(per collective x group size x message size)."""

from __future__ import annotations

import polars as pl

from vtrain.ingest.classify import COMMUNICATION
from vtrain.tables.schema import bus_bandwidth_factor
from vtrain.tables.store import conform

SIGNATURE = ["op", "input_dims", "input_types", "device_type"]
KERNEL_SEPARATOR = " ; "


def _duration_stats(column: str) -> list[pl.Expr]:
    return [
        pl.len().alias("count"),
        pl.col(column).median().alias("median_us"),
        pl.col(column).quantile(0.1, interpolation="linear").alias("p10_us"),
        pl.col(column).quantile(0.9, interpolation="linear").alias("p90_us"),
        pl.col(column).mean().alias("mean_us"),
    ]


def gpu_op_calls(kernels: pl.DataFrame) -> pl.DataFrame:
    """One row per operator call that launched device work: its signature, kernel sequence and total time.

    Communication kernels are left out (they belong to ``nccl_latency``), as are kernels whose launching CPU
    op is unknown.
    """
    return (
        kernels.filter(pl.col("cpu_op").is_not_null() & (pl.col("kernel_class") != COMMUNICATION))
        .sort("ts")
        .group_by("rank", "external_id", maintain_order=True)
        .agg(
            op=pl.col("cpu_op").first(), input_dims=pl.col("input_dims").first(),
            input_types=pl.col("input_types").first(),
            kernels=pl.col("name").str.join(KERNEL_SEPARATOR), n_kernels=pl.len().cast(pl.Int32),
            dur=pl.col("dur").sum(),
        )
        .with_columns(device_type=pl.lit("cuda"))
    )


def cpu_op_calls(cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """Leaf CPU operators (no CPU op nested inside them on their thread), for ranks without device activity.

    On a CPU run the leaf operators do the work, so their own duration is the operator's latency.
    Communication ops (``c10d::*``, ``record_param_comms``) are left out.
    """
    ops = cpu_ops.filter(pl.col("cat") == "cpu_op").sort("rank", "tid", "ts")
    next_ts = pl.col("ts").shift(-1).over("rank", "tid")
    return (
        ops.with_columns(is_leaf=next_ts.is_null() | (next_ts >= pl.col("ts") + pl.col("dur")))
        .filter(pl.col("is_leaf") & ~pl.col("name").str.contains(r"^(c10d::|record_param_comms)"))
        .select(op="name", input_dims="input_dims", input_types="input_types", dur="dur",
                kernels="name", n_kernels=pl.lit(1, dtype=pl.Int32), device_type=pl.lit("cpu"))
    )


def op_latency(calls: pl.DataFrame) -> pl.DataFrame:
    """Aggregate operator calls by signature; ``kernels`` is the most common kernel sequence of the signature."""
    if calls.is_empty():
        return conform(pl.DataFrame(), "op_latency")
    stats = calls.group_by(SIGNATURE).agg(*_duration_stats("dur"))
    sequence = (
        calls.group_by(*SIGNATURE, "kernels", "n_kernels").agg(pl.len().alias("seen"))
        .sort("seen", "kernels", descending=[True, False])
        .unique(SIGNATURE, keep="first")
        .drop("seen")
    )
    table = stats.join(sequence, on=SIGNATURE, how="left", nulls_equal=True)
    return conform(table.sort("median_us", descending=True), "op_latency")


def nccl_latency(collectives: pl.DataFrame) -> pl.DataFrame:
    """Median time and nccl-tests bandwidths per collective, group size and message size."""
    sized = collectives.filter(pl.col("bytes").is_not_null() & pl.col("collective").is_not_null())
    if sized.is_empty():
        return conform(pl.DataFrame(), "nccl_latency")
    keys = ["collective", "group_size", "bytes", "device_type"]
    table = (
        sized.group_by(keys)
        .agg(*_duration_stats("dur"), algorithm=pl.col("algorithm").drop_nulls().mode().first())
        .with_columns(algbw_gbps=pl.col("bytes") / pl.col("median_us") / 1e3)
    )
    factors = [None if g is None else bus_bandwidth_factor(c, g)
               for c, g in zip(table["collective"], table["group_size"])]
    table = table.with_columns(busbw_gbps=pl.col("algbw_gbps") * pl.Series(factors, dtype=pl.Float64))
    return conform(table.sort(keys, nulls_last=True), "nccl_latency")
