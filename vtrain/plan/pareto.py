"""The time-versus-cost Pareto frontier: the plans no other plan beats on both training time and cost."""

from __future__ import annotations

import polars as pl


def pareto_frontier(plans: pl.DataFrame, time: str = "days", cost: str = "usd") -> pl.DataFrame:
    """The rows of ``plans`` on the frontier of (``time``, ``cost``), fastest first: a row is kept when every
    faster row costs more. Rows with a null time or cost are left out; of rows tied on both, the first is kept."""
    ranked = plans.filter(pl.col(time).is_not_null() & pl.col(cost).is_not_null()).sort([time, cost],
                                                                                        maintain_order=True)
    keep, cheapest = [], float("inf")
    for index, value in enumerate(ranked[cost].to_list()):
        if value < cheapest:
            keep.append(index)
            cheapest = value
    return ranked[keep]
