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
    """The CPU operators that do the work, for ranks without device activity.

    On a CPU run an operator's latency is its own CPU duration. The operator that does the work is the outermost
    op whose self time (duration minus the ops nested in it) is at least half its duration, so ``aten::addmm``
    counts rather than its caller ``aten::linear`` or its helpers (``aten::expand``, ``aten::resolve_conj``).
    Communication ops (``c10d::*``, ``record_param_comms``) and everything inside them are left out.
    """
    ops = cpu_ops.filter(pl.col("cat") == "cpu_op").sort("rank", "tid", "ts", pl.col("dur"), descending=[
        False, False, False, True])
    work = work_op_mask(ops["rank"].to_list(), ops["tid"].to_list(), ops["ts"].to_list(), ops["dur"].to_list(),
                        ops["name"].to_list())
    return ops.filter(pl.Series(work, dtype=pl.Boolean)).select(
        op="name", input_dims="input_dims", input_types="input_types", dur="dur",
        kernels="name", n_kernels=pl.lit(1, dtype=pl.Int32), device_type=pl.lit("cpu"))


_COMMUNICATION_OP = ("c10d::", "record_param_comms", "gloo:", "nccl:")


def work_op_mask(ranks: list[int], tids: list[int], starts: list[float], durations: list[float],
                 names: list[str]) -> list[bool]:
    """For CPU ops sorted by (rank, thread, start, longest first): True for the ops doing the work.

    The outermost op whose self time is at least half its duration, except that an op holding a collective
    (``c10d::*``, ``gloo:*``, ...) is never one: its self time is mostly the wait for that collective (e.g. a
    tensor-parallel ``autograd.Function``), so the search goes on inside it. Collectives and what they hold are
    never work ops.
    """
    n = len(starts)
    parent = [-1] * n
    child_time = [0.0] * n
    stack: list[int] = []
    for i in range(n):
        if i and (ranks[i] != ranks[i - 1] or tids[i] != tids[i - 1]):
            stack = []
        while stack and starts[stack[-1]] + durations[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            child_time[stack[-1]] += durations[i]
        stack.append(i)
    holds_comm = [name.startswith(_COMMUNICATION_OP) for name in names]
    for i in range(n - 1, -1, -1):
        if holds_comm[i] and parent[i] >= 0:
            holds_comm[parent[i]] = True
    work = [False] * n
    covered = [False] * n  # a work op or a collective is at or above this op
    for i in range(n):
        above = parent[i] >= 0 and covered[parent[i]]
        if names[i].startswith(_COMMUNICATION_OP):
            covered[i] = True
        elif (not above and not holds_comm[i] and durations[i] > 0
              and durations[i] - child_time[i] >= 0.5 * durations[i]):
            work[i] = covered[i] = True
        else:
            covered[i] = above
    return work


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
        .with_columns(algbw_gbps=pl.col("bytes") / pl.col("median_us") / 1e3, source=pl.lit("trace"))
    )
    factors = [None if g is None else bus_bandwidth_factor(c, g)
               for c, g in zip(table["collective"], table["group_size"])]
    table = table.with_columns(busbw_gbps=pl.col("algbw_gbps") * pl.Series(factors, dtype=pl.Float64))
    return conform(table.sort(keys, nulls_last=True), "nccl_latency")
