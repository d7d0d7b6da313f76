"""Drift between two profiles: every operator signature, collective and kernel name compared, old against new, on
the ranks both hold, with its steps as samples (:mod:`vtrain.calibrate.drift.samples`).

Each compared row gets the ratio ``r = new median / old median`` of its medians over steps and a status:

``new`` / ``gone``   the row exists only in the new / only in the old profile;
``slower`` / ``faster``   ``|ln r|`` is beyond each of
                     ``Z * max(e_old, e_new)``         the noise band: each median more than ``Z`` standard errors
                                                       outside the other;
                     ``EFFECT * max(c_old, c_new)``    the effect size: the change is larger than what the row's
                                                       calls vary by, ``EFFECT`` times over;
                     ``RUN_SPREADS * run_spread``      the run-to-run spread: larger than how far apart the rows of
                                                       the two profiles lie where nothing changed;
                     ``ln(1 + MIN_CHANGE)``            the smallest change that counts (5 %);
``unchanged``        otherwise.

A spread is sigma of a normal distribution estimated from the fast half of the samples, ``(median - p10) / median
/ 1.2816``: timing noise is one-sided, slow outliers stretch p90 but barely move a median. ``e = 1.2533 * s /
sqrt(n)`` is the relative standard error of a side's median, ``s`` the spread of its ``n`` steps; ``c`` is what
one of its calls varies by, the spread of one call site (the k-th call of the row in a step of a rank) over the
steps, the median over its sites. A row without a spread of its own (seen in one step) borrows the median spread
of its table on that side; if no row has one, that term is zero.

The run-to-run spread is ``1.4826 * MAD(ln r)`` over the rows of every kind in both profiles, their median
absolute deviation around their median: most rows did not change, so their ratios show how far two recordings of
the job lie apart, and the rows that did change barely move it. A comparison of fewer than :data:`SPREAD_ROWS`
such rows has none, and identical traces, or traces that differ in a few rows, have a spread of zero. Two
back-to-back recordings on one machine differ by more than either's steps and calls do (another placement of the
processes, another load on the machine), and by more in some rows than in others (a busy machine stalls an
operator for a whole run): hence :data:`RUN_SPREADS` of them. Until 2026-11-29 each call was a sample, so a 3 %
jitter over thousands of calls was drift, and two recordings of one job moved a third of their operators.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from vtrain.calibrate.drift.samples import (
    COLLECTIVE_KEYS,
    KERNEL_KEYS,
    Scope,
    collective_rows,
    kernel_rows,
    operator_rows,
)
from vtrain.devices.catalog import canonical_device_name
from vtrain.tables.latency import SIGNATURE
from vtrain.tables.store import Profile

#: a ratio is drift only beyond this relative change (5 %)
MIN_CHANGE = 0.05
#: and only when each median is more than this many standard errors from the other
Z = 2.0
#: and only when the change is this many times what the row's calls vary by
EFFECT = 1.5
#: and only when the change is this many times the run-to-run spread of the rows
RUN_SPREADS = 5.0
#: the run-to-run spread is estimated from at least this many rows in both profiles
SPREAD_ROWS = 10
#: sigma of a normal distribution per unit of (median - p10)
SIGMA_PER_LOWER_SPREAD = 1 / 1.2816
#: standard error of a median per unit of (median - p10) / sqrt(n): 1.2533 / 1.2816 (normal distribution)
SE_PER_LOWER_SPREAD = 1.2533 * SIGMA_PER_LOWER_SPREAD
#: sigma of a normal distribution per unit of median absolute deviation
SIGMA_PER_MAD = 1.4826

OP, COLLECTIVE, KERNEL = "op", "collective", "kernel"
FASTER, SLOWER, UNCHANGED, NEW, GONE = "faster", "slower", "unchanged", "new", "gone"
STATUSES = (SLOWER, FASTER, NEW, GONE, UNCHANGED)
MOVED = (SLOWER, FASTER)

KEYS = {OP: SIGNATURE, COLLECTIVE: COLLECTIVE_KEYS, KERNEL: KERNEL_KEYS}
_OP_LABEL = pl.format("{} {} {} ({})", "op", pl.col("input_dims").fill_null("-"),
                      pl.col("input_types").fill_null("-"), pl.col("device_type").fill_null("-"))
COLLECTIVE_LABEL = pl.format("{} group={} bytes={} ({})", "collective",
                             pl.col("group_size").cast(pl.String).fill_null("?"), pl.col("bytes"),
                             pl.col("device_type").fill_null("-"))
LABELS = {OP: _OP_LABEL, COLLECTIVE: COLLECTIVE_LABEL, KERNEL: pl.col("name")}
_STATS = ["count", "median_us", "p10_us", "p90_us", "jitter", "repeats", "spread", "pooled"]


@dataclass
class Drift:
    """The comparison tables of two profiles, what they compare and the software that changed between them."""

    ops: pl.DataFrame
    collectives: pl.DataFrame
    kernels: pl.DataFrame
    collective_types: pl.DataFrame
    software: dict[str, dict[str, Any]]
    scope: Scope
    #: collective keys not compared: they wait for ranks only one profile holds
    left_out: pl.DataFrame
    #: how far apart the rows of the two profiles lie (``1.4826 * MAD(ln ratio)``)
    run_spread: float

    def tables(self) -> dict[str, pl.DataFrame]:
        """The per-row comparison of each kind."""
        return {OP: self.ops, COLLECTIVE: self.collectives, KERNEL: self.kernels}

    def rows(self, statuses: tuple[str, ...]) -> list[dict[str, Any]]:
        """Rows of every kind with one of ``statuses``, largest change first: kind, key, ratio, band, threshold,
        status."""
        found = []
        for kind, frame in self.tables().items():
            for row in frame.filter(pl.col("status").is_in(statuses)).iter_rows(named=True):
                found.append({"kind": kind, "key": {k: row[k] for k in KEYS[kind]}, "label": row["label"],
                              "ratio": row["ratio"], "band": row["band"], "threshold": row["threshold"],
                              "status": row["status"], "old_median_us": row["old_median_us"],
                              "new_median_us": row["new_median_us"], "old_count": row["old_count"],
                              "new_count": row["new_count"]})
        return sorted(found, key=lambda r: -_change(r["ratio"]))

    def drifted(self) -> list[dict[str, Any]]:
        """The rows that moved (``slower`` or ``faster``)."""
        return self.rows(MOVED)

    def counts(self) -> dict[str, dict[str, int]]:
        """Rows per kind and status."""
        return {kind: {s: frame.filter(pl.col("status") == s).height for s in STATUSES}
                for kind, frame in self.tables().items()}

    def said(self, base: object) -> list[str]:
        """What was not compared, in words: the ranks one profile lacks, the collectives waiting on them."""
        lines = self.scope.lines(base)
        if self.left_out.height:
            calls = int(self.left_out["old_calls"].sum() + self.left_out["new_calls"].sum())
            lines.append(f"{self.left_out.height} collective row(s) ({calls:,} calls) are not compared: their calls "
                         "wait for ranks one profile holds and the other does not, so on one side their time includes "
                         "waiting for a peer that is not there")
        return lines


def _change(ratio: float | None) -> float:
    """``|ln ratio|``: how far a ratio is from 1 either way (a time that fell to 0 counts as the largest)."""
    if ratio is None:
        return 0.0
    return abs(math.log(ratio)) if ratio > 0 else math.inf


def compare_profiles(old: Profile, new: Profile, *, min_change: float = MIN_CHANGE, z: float = Z) -> Drift:
    """Compare two profiles row by row on the ranks both hold; see the module docstring for the rule."""
    scope = Scope.of(old, new)
    collectives = collective_rows(old, new, scope)
    sides = {OP: operator_rows(old, new, scope), COLLECTIVE: (collectives.old, collectives.new),
             KERNEL: kernel_rows(old, new, scope)}
    paired = {kind: pair(*sides[kind], KEYS[kind], LABELS[kind], z=z) for kind in sides}
    spread = run_to_run_spread(paired.values())
    tables = {kind: with_status(frame, KEYS[kind], min_change=min_change, run_spread=spread)
              for kind, frame in paired.items()}
    return Drift(ops=tables[OP], collectives=tables[COLLECTIVE], kernels=tables[KERNEL],
                 collective_types=collective_types(tables[COLLECTIVE]),
                 software=software_changes(old.metadata, new.metadata), scope=scope,
                 left_out=collectives.left_out.with_columns(label=COLLECTIVE_LABEL), run_spread=spread)


def _with_spread(table: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``keys`` and the statistics of one side; rows without a spread of their own borrow the table's median."""
    if "jitter" not in table.columns:  # a latency table: the row's own samples
        own = pl.when((pl.col("count") >= 2) & (pl.col("median_us") > 0)).then(
            (pl.col("median_us") - pl.col("p10_us")) / pl.col("median_us"))
        table = table.with_columns(jitter=own, spread=own, repeats=pl.col("count").cast(pl.Float64))
    pooled = {c: table[c].drop_nulls().median() if table.height else None for c in ("jitter", "spread")}
    return table.select(
        *keys, "count", "median_us", "p10_us", "p90_us",
        pooled=pl.col("jitter").is_null(),
        jitter=pl.col("jitter").fill_null(pooled["jitter"] if pooled["jitter"] is not None else 0.0),
        spread=pl.col("spread").fill_null(pooled["spread"] if pooled["spread"] is not None else 0.0),
        repeats=pl.when(pl.col("jitter").is_null()).then(1.0).otherwise(pl.col("repeats")))


def pair(old: pl.DataFrame, new: pl.DataFrame, keys: list[str], label: pl.Expr, *, z: float = Z) -> pl.DataFrame:
    """One row per key of either side: both sides' statistics, the ratio of medians, the noise band and the
    larger spread of the calls (``spread``, sigma relative to the median).

    ``old`` and ``new`` have ``keys`` plus ``count``, ``median_us``, ``p10_us``, ``p90_us`` and either
    ``jitter``, ``repeats`` and ``spread`` (:func:`vtrain.calibrate.drift.samples.step_stats`) or none of them (a
    latency table: its ``count`` calls are the samples); ``label`` is an expression naming a row. ``band`` is the
    half-width of the noise band as a factor: a ratio inside ``[1/band, band]`` is noise.
    """
    sides = [_with_spread(frame, keys).rename({c: f"{prefix}_{c}" for c in _STATS})
             for prefix, frame in (("old", old), ("new", new))]
    joined = sides[0].join(sides[1], on=keys, how="full", coalesce=True, nulls_equal=True)
    se = [SE_PER_LOWER_SPREAD * pl.col(f"{p}_jitter") / pl.col(f"{p}_repeats").sqrt() for p in ("old", "new")]
    return joined.with_columns(
        label=label, ratio=pl.when(pl.col("old_median_us") > 0).then(pl.col("new_median_us") / pl.col("old_median_us")),
        band=(z * pl.max_horizontal(*se)).exp(),
        spread=SIGMA_PER_LOWER_SPREAD * pl.max_horizontal("old_spread", "new_spread"),
        pooled_spread=pl.col("old_pooled") | pl.col("new_pooled"))


def run_to_run_spread(tables: Iterable[pl.DataFrame]) -> float:
    """``1.4826 * MAD(ln ratio)`` over the rows of ``tables`` (from :func:`pair`) in both profiles, 0 with fewer
    than :data:`SPREAD_ROWS` of them."""
    ratios = pl.concat([t.select("ratio") for t in tables]).filter(pl.col("ratio") > 0)["ratio"].log()
    if ratios.len() < SPREAD_ROWS:
        return 0.0
    return SIGMA_PER_MAD * float((ratios - ratios.median()).abs().median())


def with_status(paired: pl.DataFrame, keys: list[str], *, min_change: float = MIN_CHANGE, effect: float = EFFECT,
                run_spread: float = 0.0, run_spreads: float = RUN_SPREADS) -> pl.DataFrame:
    """Rows of :func:`pair` with their ``threshold`` (the ratio beyond which a row drifted, as a factor) and
    ``status``, ordered by status and largest change first."""
    log_threshold = pl.max_horizontal(pl.col("band").log(), effect * pl.col("spread"),
                                      pl.lit(run_spreads * run_spread), pl.lit(math.log1p(min_change)))
    status = (pl.when(pl.col("old_count").is_null()).then(pl.lit(NEW))
              .when(pl.col("new_count").is_null()).then(pl.lit(GONE))
              .when(pl.col("ratio").is_null())  # old median 0: any time now is slower
              .then(pl.when(pl.col("new_median_us") > 0).then(pl.lit(SLOWER)).otherwise(pl.lit(UNCHANGED)))
              .when(pl.col("ratio").log().abs() > pl.col("threshold").log())
              .then(pl.when(pl.col("ratio") > 1).then(pl.lit(SLOWER)).otherwise(pl.lit(FASTER)))
              .otherwise(pl.lit(UNCHANGED)))
    table = (paired.with_columns(threshold=log_threshold.exp())
             .with_columns(status=status)
             .with_columns(order=pl.col("status").replace_strict({s: k for k, s in enumerate(STATUSES)},
                                                                 return_dtype=pl.Int32),
                           change=pl.col("ratio").log().abs().fill_null(0.0)))
    columns = [*keys, "label", "status", "ratio", "band", "threshold", "pooled_spread", "old_count", "new_count",
               "old_median_us", "new_median_us", "old_p10_us", "new_p10_us", "old_p90_us", "new_p90_us"]
    return table.sort(["order", "change"], descending=[False, True]).select(columns)


def compare(old: pl.DataFrame, new: pl.DataFrame, keys: list[str], label: pl.Expr, *,
            min_change: float = MIN_CHANGE, z: float = Z, run_spread: float = 0.0) -> pl.DataFrame:
    """:func:`pair` and :func:`with_status` in one: one row per key of either side, its statistics, ratio, noise
    band, threshold and status."""
    return with_status(pair(old, new, keys, label, z=z), keys, min_change=min_change, run_spread=run_spread)


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
