"""Fitting an α-β model (:class:`~vtrain.collective_cost.AlphaBeta`) per collective, group size and node count to
measured collective times.

    time = alpha_us + bytes · busbw_factor(collective, n) / bus_bandwidth

as nccl-tests defines bus bandwidth (:mod:`vtrain.collective_cost`), so ``bus_gbps`` is directly comparable with
nccl-tests' busbw column. The two parameters are a linear least-squares fit of relative errors (each row divided
by its measured time), so small and large messages weigh alike.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from vtrain.accuracy import mape_pct
from vtrain.collective_cost import AlphaBeta, bus_bandwidth_factor
from vtrain.tables.schema import TRACE_SOURCE


def fit_collectives(table: pl.DataFrame) -> list[AlphaBeta]:
    """One :class:`AlphaBeta` per (collective, group size, nodes) of an ``nccl_latency`` table with at least two
    message sizes. Rows without a group size are skipped; rows without a node count are taken as one node.

    Where a benchmark (nccl-tests, vidur, ...) measured the same collective, group size and node count as a
    trace, the trace's rows are left out: a traced collective's duration includes waiting for late peers
    (always so when only some ranks were traced), a benchmark's does not."""
    rows = table.filter(pl.col("group_size").is_not_null() & pl.col("median_us").is_not_null()
                        & (pl.col("median_us") > 0) & (pl.col("bytes") > 0))
    rows = _benchmarks_over_traces(rows.with_columns(pl.col("nodes").fill_null(1), pl.col("source").fill_null("")))
    fits: list[AlphaBeta] = []
    for (collective, group_size, nodes), group in rows.group_by(["collective", "group_size", "nodes"],
                                                                 maintain_order=True):
        if group["bytes"].n_unique() < 2:
            continue
        fit = _fit_one(collective, int(group_size), int(nodes), group)
        if fit is not None:
            fits.append(fit)
    return sorted(fits, key=lambda f: (f.collective, f.nodes, f.group_size))


def _fit_one(collective: str, group_size: int, nodes: int, group: pl.DataFrame) -> AlphaBeta | None:
    nbytes = group["bytes"].to_numpy().astype(float)
    measured = group["median_us"].to_numpy()
    factor = bus_bandwidth_factor(collective, group_size)
    design = np.vstack([np.ones_like(nbytes), nbytes * factor]).T / measured[:, None]
    (alpha, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(measured), rcond=None)
    if per_byte <= 0:  # latency-bound over the whole range: no bandwidth to speak of
        return None
    alpha = max(float(alpha), 0.0)
    predicted = alpha + nbytes * factor * per_byte
    sources = tuple(sorted(set(group["source"].drop_nulls().to_list())))
    return AlphaBeta(collective=collective, group_size=group_size, nodes=nodes, alpha_us=alpha,
                     bus_gbps=1.0 / per_byte / 1e3, samples=group.height,
                     mape_pct=mape_pct(predicted, measured), sources=sources)


def _benchmarks_over_traces(rows: pl.DataFrame) -> pl.DataFrame:
    keys = ["collective", "group_size", "nodes"]
    benchmarked = rows.filter(pl.col("source") != TRACE_SOURCE).select(keys).unique()
    traced_only = rows.filter(pl.col("source") == TRACE_SOURCE).join(benchmarked, on=keys, how="anti")
    return pl.concat([rows.filter(pl.col("source") != TRACE_SOURCE), traced_only])
