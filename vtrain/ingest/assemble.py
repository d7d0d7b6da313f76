"""Assembling one rank's frames into the ``kernels``, ``cpu_ops`` and ``collectives`` tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from vtrain.ingest.classify import COMMUNICATION
from vtrain.ingest.collectives import (
    canonical_collective,
    dtype_bytes,
    elements_from_dims,
    first_dtype,
    parse_nccl_kernel,
)
from vtrain.ingest.enclosing import enclosing_op_ids
from vtrain.ingest.extract import RankEvents
from vtrain.naming import ITERATION_PREFIX
from vtrain.tables.store import conform


@dataclass
class RankTables:
    """The event tables of one rank."""

    rank: int
    kernels: pl.DataFrame
    cpu_ops: pl.DataFrame
    collectives: pl.DataFrame
    iterations: list[int]
    dropped: int


def iteration_spans(cpu: pl.DataFrame) -> pl.DataFrame:
    """``ProfilerStep#N`` spans as (step_ts, step_end, iteration), sorted by start."""
    return (
        cpu.filter(pl.col("name").str.starts_with(ITERATION_PREFIX))
        .with_columns(iteration=pl.col("name").str.strip_prefix(ITERATION_PREFIX).cast(pl.Int64, strict=False))
        .filter(pl.col("iteration").is_not_null())
        .select(step_ts=pl.col("ts"), step_end=pl.col("ts") + pl.col("dur"), iteration="iteration")
        .sort("step_ts")
    )


def assign_iteration(frame: pl.DataFrame, steps: pl.DataFrame, ts_column: str = "ts") -> pl.DataFrame:
    """Add ``iteration``: the ProfilerStep whose span holds ``ts_column`` (null outside every step).

    The step is the last one starting at or before the time (a binary search in the sorted step starts, so the
    frame keeps its order without being sorted).
    """
    if steps.is_empty():
        return frame.with_columns(iteration=pl.lit(None, dtype=pl.Int64))
    latest = steps["step_ts"].search_sorted(frame[ts_column], side="right").cast(pl.Int64) - 1
    started = latest >= 0
    step = latest.clip(lower_bound=0)
    inside = started & (frame[ts_column] < steps["step_end"].gather(step))
    return frame.with_columns(iteration=pl.when(inside).then(steps["iteration"].gather(step)))


def assemble_rank(rank: int, events: RankEvents, dist_info: dict[str, Any] | None) -> RankTables:
    """Build the kernels, cpu_ops and collectives tables of one rank."""
    steps = iteration_spans(events.cpu)
    cpu = assign_iteration(events.cpu, steps)
    kernels = _kernels(events, cpu, steps)
    collectives = _collectives(rank, kernels, cpu, dist_info)
    return RankTables(
        rank=rank,
        kernels=conform(kernels.with_columns(rank=pl.lit(rank)), "kernels"),
        cpu_ops=conform(cpu.with_columns(rank=pl.lit(rank)), "cpu_ops"),
        collectives=collectives,
        iterations=steps["iteration"].to_list(),
        dropped=events.dropped,
    )


def _kernels(events: RankEvents, cpu: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Device activities with their launching CPU op and the iteration of their launch.

    The launching op is the CPU op whose External id the kernel carries. Some traces give kernels their
    correlation id instead; there the launching op is the innermost CPU op on the launching thread that
    encloses the runtime call (``external_id`` is then that op's id).
    """
    launching_ops = (
        cpu.filter(pl.col("external_id").is_not_null())
        .unique("external_id", keep="first")
        .select("external_id", cpu_op="name", input_dims="input_dims", input_types="input_types",
                op_collective="arg_collective", op_in_nelems="arg_in_nelems", op_out_nelems="arg_out_nelems",
                op_group_size="arg_group_size", op_dtype="arg_dtype", op_pg_name="arg_pg_name",
                op_pg_ranks="arg_pg_ranks")
    )
    launches = (
        events.runtime.filter(pl.col("correlation").is_not_null())
        .unique("correlation", keep="first")
        .select("correlation", launch_tid="tid", launch_ts="ts", launch_external_id="external_id")
    )
    device = events.device.join(launches, on="correlation", how="left")
    known = pl.col("external_id").is_in(launching_ops["external_id"].implode())
    unresolved = device.filter(~known & pl.col("launch_ts").is_not_null())
    if not unresolved.is_empty():
        enclosing = enclosing_op_ids(cpu,
                                     unresolved.select("correlation", tid="launch_tid", ts="launch_ts"))
        device = (
            device.join(enclosing, on="correlation", how="left")
            .with_columns(external_id=pl.when(known)
                          .then(pl.col("external_id")).otherwise(pl.coalesce("enclosing_id", "external_id")))
            .drop("enclosing_id")
        )
    device = (
        device.join(launching_ops, on="external_id", how="left")
        .with_columns(launch_ts=pl.coalesce("launch_ts", "ts"))
    )
    return assign_iteration(device, steps, ts_column="launch_ts")


def _collectives(rank: int, kernels: pl.DataFrame, cpu: pl.DataFrame,
                 dist_info: dict[str, Any] | None) -> pl.DataFrame:
    """One row per collective: NCCL kernels on GPU ranks, ``gloo:*``/``nccl:*`` annotations on CPU-only ranks."""
    rows: list[dict[str, Any]] = []
    default_group = _default_group_size(rank, dist_info)
    comm = kernels.filter(pl.col("kernel_class") == COMMUNICATION)
    for row in comm.iter_rows(named=True):
        kernel_collective, algorithm, protocol = parse_nccl_kernel(row["name"])
        # the op-level name wins: NCCL runs all_to_all, send and recv as SendRecv kernels
        collective = (canonical_collective(row["arg_collective"]) or canonical_collective(row["op_collective"])
                      or canonical_collective(row["cpu_op"]) or kernel_collective)
        dtype = row["arg_dtype"] or row["op_dtype"] or first_dtype(row["input_types"])
        in_n = row["arg_in_nelems"] or row["op_in_nelems"] or elements_from_dims(row["input_dims"])
        out_n = row["arg_out_nelems"] or row["op_out_nelems"]
        source = ("kernel_args" if row["arg_in_nelems"] else "record_param_comms" if row["op_in_nelems"]
                  else "annotation" if in_n else None)
        rows.append(_collective_row(
            rank, collective, row["arg_pg_name"] or row["op_pg_name"], row["arg_pg_ranks"] or row["op_pg_ranks"],
            row["arg_group_size"] or row["op_group_size"] or default_group, dtype, in_n, out_n,
            algorithm, protocol, "cuda", row["stream"], row["ts"], row["dur"], source, row["iteration"]))
    if kernels.is_empty():
        annotations = cpu.filter(pl.col("cat") == "user_annotation"
                                 ).filter(pl.col("name").str.contains(r"^(gloo|nccl|mpi|ucc):"))
        for row in annotations.iter_rows(named=True):
            collective = canonical_collective(row["name"])
            in_n = row["arg_in_nelems"] or elements_from_dims(row["input_dims"])
            rows.append(_collective_row(
                rank, collective, row["arg_pg_name"], row["arg_pg_ranks"],
                row["arg_group_size"] or default_group, row["arg_dtype"] or first_dtype(row["input_types"]),
                in_n, row["arg_out_nelems"], None, None, "cpu", None, row["ts"], row["dur"],
                "annotation" if in_n else None, row["iteration"]))
    return conform(pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame(), "collectives")


def _collective_row(rank: int, collective: str | None, pg_name: str | None, pg_ranks: str | None,
                    group_size: int | None, dtype: str | None, in_n: int | None, out_n: int | None,
                    algorithm: str | None, protocol: str | None, device_type: str, stream: int | None,
                    ts: float, dur: float, source: str | None, iteration: int | None) -> dict[str, Any]:
    if collective in ("send", "recv", "send_recv"):
        group_size = 2
    elements = max(n for n in (in_n, out_n) if n) if (in_n or out_n) else None
    if collective == "all_gather" and in_n and not out_n and group_size:
        elements = in_n * group_size  # nccl-tests sizes all-gather by its output buffer
    size = dtype_bytes(dtype)
    return {
        "rank": rank, "collective": collective, "process_group": pg_name, "group_ranks": pg_ranks,
        "group_size": group_size, "dtype": dtype, "elements": elements,
        "bytes": elements * size if elements and size else None, "algorithm": algorithm, "protocol": protocol,
        "device_type": device_type, "stream": stream, "ts": ts, "dur": dur, "metadata_source": source,
        "iteration": iteration,
    }


def _default_group_size(rank: int, dist_info: dict[str, Any] | None) -> int | None:
    """The group size when every process group of size > 1 holding this rank has the same size."""
    if not dist_info:
        return None
    sizes = {int(pg.get("pg_size", len(pg.get("ranks", []))))
             for pg in dist_info.get("pg_config") or [] if rank in (pg.get("ranks") or [])}
    sizes.discard(1)
    return sizes.pop() if len(sizes) == 1 else None
