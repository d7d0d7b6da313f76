"""Drift between two profiles: every operator signature, collective and kernel name compared, old against new.

Each compared row gets the ratio ``r = new median / old median`` and a status:

``new`` / ``gone``   the row exists only in the new / only in the old profile;
``slower`` / ``faster``   the ratio is outside the noise band *and* beyond the minimum change:
                     ``|ln r| > max(Z * max(e_old, e_new), ln(1 + MIN_CHANGE))``;
``unchanged``        otherwise.

``e`` is the relative standard error of one side's median. The median of ``n`` samples from a distribution of
width ``sigma`` has the standard error ``1.2533 * sigma / sqrt(n)``, and ``sigma`` is estimated from the fast half
of the samples, ``sigma = (median - p10) / 1.2816`` (exact for a normal distribution). The fast half is used because
timing noise is one-sided: slow outliers (a kernel delayed by another process, an iteration waiting on a
straggler) move p90 far out but barely move the median. A ratio counts as drift only when each median lies more
than ``Z`` standard errors outside the other one.

``n`` is the row's count for operator signatures and collectives. For a kernel name, whose calls mix many shapes,
the spread is the typical spread of one call site (the k-th launch of the name in each iteration of a rank, over
the iterations) and ``n`` the typical number of iterations a call site was seen in: iteration-wide effects move
every call of an iteration together, so the independent repeats are the iterations.

A row seen once (or a kernel name whose call sites were each seen once) has no spread of its own: it borrows the
median spread of the rows of its table on the same side that have one, with ``n = 1``. When no row of the table
has a spread, the band is zero and only the minimum change applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from vtrain.devices.catalog import canonical_device_name
from vtrain.tables.latency import SIGNATURE
from vtrain.tables.schema import TRACE_SOURCE
from vtrain.tables.store import Profile

#: a ratio is drift only beyond this relative change (5 %)
MIN_CHANGE = 0.05
#: and only when each median is more than this many standard errors from the other
Z = 2.0
#: standard error of a median per unit of (median - p10) / sqrt(n): 1.2533 / 1.2816 (normal distribution)
SE_PER_LOWER_SPREAD = 1.2533 / 1.2816

OP, COLLECTIVE, KERNEL = "op", "collective", "kernel"
FASTER, SLOWER, UNCHANGED, NEW, GONE = "faster", "slower", "unchanged", "new", "gone"
STATUSES = (SLOWER, FASTER, NEW, GONE, UNCHANGED)
MOVED = (SLOWER, FASTER)

COLLECTIVE_KEYS = ["collective", "group_size", "bytes", "device_type"]
KERNEL_KEYS = ["name"]
KEYS = {OP: SIGNATURE, COLLECTIVE: COLLECTIVE_KEYS, KERNEL: KERNEL_KEYS}
_OP_LABEL = pl.format("{} {} {} ({})", "op", pl.col("input_dims").fill_null("-"),
                      pl.col("input_types").fill_null("-"), pl.col("device_type").fill_null("-"))
_COLLECTIVE_LABEL = pl.format("{} group={} bytes={} ({})", "collective",
                              pl.col("group_size").cast(pl.String).fill_null("?"), pl.col("bytes"),
                              pl.col("device_type").fill_null("-"))
_STATS = ["count", "median_us", "p10_us", "p90_us", "jitter", "repeats", "pooled"]


@dataclass
class Drift:
    """The comparison tables of two profiles and the software that changed between them."""

    ops: pl.DataFrame
    collectives: pl.DataFrame
    kernels: pl.DataFrame
    collective_types: pl.DataFrame
    software: dict[str, dict[str, Any]]

    def tables(self) -> dict[str, pl.DataFrame]:
        """The per-row comparison of each kind."""
        return {OP: self.ops, COLLECTIVE: self.collectives, KERNEL: self.kernels}

    def rows(self, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
        """Rows of every kind with one of ``statuses``, largest change first: kind, key, ratio, band, status."""
        found = []
        for kind, frame in self.tables().items():
            for row in frame.filter(pl.col("status").is_in(statuses)).iter_rows(named=True):
                found.append({"kind": kind, "key": {k: row[k] for k in KEYS[kind]}, "label": row["label"],
                              "ratio": row["ratio"], "band": row["band"], "status": row["status"],
                              "old_median_us": row["old_median_us"], "new_median_us": row["new_median_us"],
                              "old_count": row["old_count"], "new_count": row["new_count"]})
        return sorted(found, key=lambda r: -_change(r["ratio"]))

    def drifted(self) -> list[dict[str, Any]]:
        """The rows that moved (``slower`` or ``faster``)."""
        return self.rows(MOVED)

    def counts(self) -> dict[str, dict[str, int]]:
        """Rows per kind and status."""
        return {kind: {s: frame.filter(pl.col("status") == s).height for s in STATUSES}
                for kind, frame in self.tables().items()}


def _change(ratio: float | None) -> float:
    """``|ln ratio|``: how far a ratio is from 1 either way (a time that fell to 0 counts as the largest)."""
    if ratio is None:
        return 0.0
    return abs(math.log(ratio)) if ratio > 0 else math.inf


def compare_profiles(old: Profile, new: Profile, *, min_change: float = MIN_CHANGE, z: float = Z) -> Drift:
    """Compare two profiles row by row; see the module docstring for the rule."""
    collectives = compare(_trace_rows(old["nccl_latency"]), _trace_rows(new["nccl_latency"]), COLLECTIVE_KEYS,
                          _COLLECTIVE_LABEL, min_change=min_change, z=z)
    return Drift(
        ops=compare(old["op_latency"], new["op_latency"], SIGNATURE, _OP_LABEL, min_change=min_change, z=z),
        collectives=collectives,
        kernels=compare(kernel_stats(old["kernels"]), kernel_stats(new["kernels"]), KERNEL_KEYS,
                        pl.col("name"), min_change=min_change, z=z),
        collective_types=collective_types(collectives),
        software=software_changes(old.metadata, new.metadata))


def _trace_rows(nccl: pl.DataFrame) -> pl.DataFrame:
    """Collective rows measured in traces (imported nccl-tests or similar rows are not drift of the traces)."""
    return nccl.filter(pl.col("source").is_null() | (pl.col("source") == TRACE_SOURCE))


def kernel_stats(kernels: pl.DataFrame) -> pl.DataFrame:
    """Per kernel name: count, median, p10, p90 of its durations, with the spread of one call site.

    A call site is the k-th launch of the name in one iteration of one rank; ``jitter`` is the median over the
    name's call sites of ``(median - p10) / median`` across the iterations, ``repeats`` the median number of
    iterations a call site was seen in.
    """
    if kernels.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "count": pl.Int64, "median_us": pl.Float64,
                                    "p10_us": pl.Float64, "p90_us": pl.Float64, "jitter": pl.Float64,
                                    "repeats": pl.Float64})
    calls = kernels.sort("ts").with_columns(site=pl.int_range(pl.len()).over("rank", "name", "iteration"))
    sites = (calls.group_by("rank", "name", "site")
             .agg(n=pl.len(), median=pl.col("dur").median(), p10=_p10("dur"))
             .filter((pl.col("n") >= 2) & (pl.col("median") > 0))
             .group_by("name")
             .agg(jitter=((pl.col("median") - pl.col("p10")) / pl.col("median")).median(),
                  repeats=pl.col("n").median().cast(pl.Float64)))
    names = calls.group_by("name").agg(
        count=pl.len().cast(pl.Int64), median_us=pl.col("dur").median(), p10_us=_p10("dur"),
        p90_us=pl.col("dur").quantile(0.9, interpolation="linear"))
    return names.join(sites, on="name", how="left")


def _p10(column: str) -> pl.Expr:
    return pl.col(column).quantile(0.1, interpolation="linear")


def _with_spread(table: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``keys`` and the statistics of one side; rows without a spread of their own borrow the table's median."""
    if "jitter" not in table.columns:  # a latency table: the row's own samples
        own = pl.when((pl.col("count") >= 2) & (pl.col("median_us") > 0)).then(
            (pl.col("median_us") - pl.col("p10_us")) / pl.col("median_us"))
        table = table.with_columns(jitter=own, repeats=pl.col("count").cast(pl.Float64))
    pooled = table["jitter"].drop_nulls().median() if table.height else None
    return table.select(
        *keys, "count", "median_us", "p10_us", "p90_us",
        pooled=pl.col("jitter").is_null(),
        jitter=pl.col("jitter").fill_null(pooled if pooled is not None else 0.0),
        repeats=pl.when(pl.col("jitter").is_null()).then(1.0).otherwise(pl.col("repeats")))


def compare(old: pl.DataFrame, new: pl.DataFrame, keys: list[str], label: pl.Expr, *,
            min_change: float = MIN_CHANGE, z: float = Z) -> pl.DataFrame:
    """One row per key of either side: both sides' statistics, the ratio of medians, the noise band and the status.

    ``old`` and ``new`` have ``keys`` plus ``count``, ``median_us``, ``p10_us``, ``p90_us`` (and, for kernel names,
    ``jitter`` and ``repeats``); ``label`` is an expression naming a row.
    ``band`` is the half-width of the noise band as a factor: a ratio inside ``[1/band, band]`` is noise.
    """
    sides = [_with_spread(frame, keys).rename({c: f"{prefix}_{c}" for c in _STATS})
             for prefix, frame in (("old", old), ("new", new))]
    joined = sides[0].join(sides[1], on=keys, how="full", coalesce=True, nulls_equal=True)
    se = [SE_PER_LOWER_SPREAD * pl.col(f"{p}_jitter") / pl.col(f"{p}_repeats").sqrt() for p in ("old", "new")]
    log_band = z * pl.max_horizontal(*se)
    threshold = pl.max_horizontal(log_band, pl.lit(math.log1p(min_change)))
    ratio = pl.when(pl.col("old_median_us") > 0).then(pl.col("new_median_us") / pl.col("old_median_us"))
    status = (pl.when(pl.col("old_count").is_null()).then(pl.lit(NEW))
              .when(pl.col("new_count").is_null()).then(pl.lit(GONE))
              .when(pl.col("ratio").is_null())  # old median 0: any time now is slower
              .then(pl.when(pl.col("new_median_us") > 0).then(pl.lit(SLOWER)).otherwise(pl.lit(UNCHANGED)))
              .when(pl.col("ratio").log().abs() > threshold)
              .then(pl.when(pl.col("ratio") > 1).then(pl.lit(SLOWER)).otherwise(pl.lit(FASTER)))
              .otherwise(pl.lit(UNCHANGED)))
    table = (joined
             .with_columns(label=label, ratio=ratio,
                           band=log_band.exp(), pooled_spread=pl.col("old_pooled") | pl.col("new_pooled"))
             .with_columns(status=status)
             .with_columns(order=pl.col("status").replace_strict({s: k for k, s in enumerate(STATUSES)},
                                                                 return_dtype=pl.Int32),
                           change=pl.col("ratio").log().abs().fill_null(0.0)))
    columns = [*keys, "label", "status", "ratio", "band", "pooled_spread", "old_count", "new_count",
               "old_median_us", "new_median_us", "old_p10_us", "new_p10_us", "old_p90_us", "new_p90_us"]
    return table.sort(["order", "change"], descending=[False, True]).select(columns)


def collective_types(collectives: pl.DataFrame) -> pl.DataFrame:
    """Per collective type: rows per status, the median ratio and the time-weighted ratio of the rows in both
    profiles (``sum(new median x old count) / sum(old median x old count)``)."""
    both = pl.col("ratio").is_not_null()
    return (collectives.group_by("collective")
            .agg(rows=pl.len(), **{s: (pl.col("status") == s).sum() for s in STATUSES},
                 median_ratio=pl.col("ratio").filter(both).median(),
                 new_time=(pl.col("new_median_us") * pl.col("old_count")).filter(both).sum(),
                 old_time=(pl.col("old_median_us") * pl.col("old_count")).filter(both).sum())
            .with_columns(time_ratio=pl.when(pl.col("old_time") > 0).then(pl.col("new_time") / pl.col("old_time")))
            .drop("new_time", "old_time")
            .sort("collective"))


def software_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Software versions (``metadata["software"]``) and the device name that differ, ``{key: {old, new}}``. Two
    names of one GPU (a fitted profile's catalog name ``H100``, a trace's ``NVIDIA H100 80GB HBM3``) are no
    change."""
    def versions(meta: dict[str, Any]) -> dict[str, Any]:
        return {**(meta.get("software") or {}), "device": (meta.get("device") or {}).get("name")}

    def same(key: str, a: Any, b: Any) -> bool:
        if key == "device" and a and b:
            return (canonical_device_name(str(a)) or a) == (canonical_device_name(str(b)) or b)
        return a == b

    before, after = versions(old), versions(new)
    keys = list(dict.fromkeys([*before, *after]))
    return {k: {"old": before.get(k), "new": after.get(k)} for k in keys if not same(k, before.get(k), after.get(k))}
