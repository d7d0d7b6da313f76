"""The diff between a measured and a predicted timeline, once their iterations, spans and operators are aligned.

Every number is a mean per rank and iteration over the iterations under test, in milliseconds; errors are
``(predicted - measured) / measured`` in percent (negative: the prediction is too fast). Per operator class the
report gives both the error of the class's total time and the MAPE over its operators
(``mean(|predicted - measured| / measured)``): the first says how far the class's share of the iteration is
off, the second how well single operators are predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from vtrain.accuracy import error_pct

BREAKDOWN = ("compute_us", "bubble_us", "exposed_comm_us", "idle_us")
PHASES = ("forward", "backward", "recompute", "optimizer")
_HISTOGRAM_SAMPLE = 20000
_WORST = 10


def _total(column: str) -> pl.Expr:
    """A group's sum taken over its values in sorted order: the same number however the rows came in (a float
    sum depends on its order, and joins and parallel grouping do not keep one), so that two validations of one
    trace folder write the same report."""
    return pl.col(column).sort().sum()


def _average(column: str | pl.Expr) -> pl.Expr:
    """A group's mean over its values in sorted order (see :func:`_total`)."""
    return (pl.col(column) if isinstance(column, str) else column).sort().mean()


@dataclass
class Comparison:
    """One prediction (replay or model) against the measurement."""

    name: str
    measured_ms: float
    predicted_ms: float
    iterations: list[dict[str, Any]]
    phases: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    micro_batches: list[dict[str, Any]] = field(default_factory=list)
    classes: list[dict[str, Any]] = field(default_factory=list)
    worst_ops: list[dict[str, Any]] = field(default_factory=list)
    one_side_only: list[dict[str, Any]] = field(default_factory=list)
    breakdown: list[dict[str, Any]] = field(default_factory=list)
    op_errors_pct: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    #: every aligned operator and span (measured_us / predicted_us), written as Parquet beside the report
    ops_table: pl.DataFrame | None = None
    spans_table: pl.DataFrame | None = None

    @property
    def error_pct(self) -> float:
        return error_pct(self.predicted_ms, self.measured_ms) or 0.0

    @property
    def measured_iterations(self) -> list[int]:
        """The iterations whose job time's median is ``measured_ms`` (the replay's: every steady one; the model's:
        those it was not profiled on)."""
        return [row["iteration"] for row in self.iterations]

    def summary(self) -> dict[str, Any]:
        """What ``--json`` prints: the three numbers and the iterations measured."""
        return {"measured_ms": round(self.measured_ms, 4), "predicted_ms": round(self.predicted_ms, 4),
                "error_pct": round(self.error_pct, 3), "measured_iterations": self.measured_iterations}

    def to_dict(self) -> dict[str, Any]:
        return {**self.summary(), "iterations": self.iterations, "phases": self.phases, "stages": self.stages,
                "micro_batches": self.micro_batches,
                "classes": self.classes, "worst_ops": self.worst_ops, "one_side_only": self.one_side_only,
                "breakdown": self.breakdown, "notes": self.notes, **self.details}


def iteration_rows(measured: pl.DataFrame, predicted: pl.DataFrame) -> list[dict[str, Any]]:
    """Per iteration under test: the job's iteration time (mean over ranks) on both sides."""
    joined = (
        measured.group_by("iteration").agg(measured_ms=pl.col("time_us").mean() / 1e3)
        .join(predicted.group_by("iteration").agg(predicted_ms=pl.col("time_us").mean() / 1e3), on="iteration",
              how="left")
        .sort("iteration")
    )
    return [{"iteration": it, "measured_ms": m, "predicted_ms": p, "error_pct": error_pct(p, m)}
            for it, m, p in joined.iter_rows()]


def phase_rows(spans: pl.DataFrame) -> list[dict[str, Any]]:
    """Per phase: the time in its spans per rank and iteration (``spans`` has measured_us / predicted_us)."""
    return _grouped(spans.filter(pl.col("span_kind").is_in(PHASES)), ["phase"])


def stage_rows(spans: pl.DataFrame) -> list[dict[str, Any]]:
    """Per pipeline stage: the time in its phase spans per rank and iteration."""
    phased = spans.filter(pl.col("span_kind").is_in(PHASES) & pl.col("stage").is_not_null())
    return _grouped(phased.with_columns(pl.col("stage").cast(pl.Int64, strict=False)), ["stage"])


def micro_batch_rows(spans: pl.DataFrame) -> list[dict[str, Any]]:
    """Per phase and micro-batch: the time in its passes (``vtrain/forward|backward|recompute ... mb=M``)."""
    passes = spans.filter(pl.col("span_kind").is_in(PHASES[:3]) & pl.col("mb").is_not_null())
    rows = _grouped(passes.with_columns(pl.col("mb").cast(pl.Int64, strict=False)), ["phase", "mb"])
    return [{"micro_batch": f"{row.pop('phase')} mb={row.pop('mb')}", **row} for row in rows]


def _grouped(spans: pl.DataFrame, keys: list[str]) -> list[dict[str, Any]]:
    if spans.is_empty():
        return []
    table = (
        spans.group_by(*keys, "rank", "iteration")
        .agg(measured=_total("measured_us"), predicted=_total("predicted_us"),
             missing=pl.col("predicted_us").is_null().sum())
        .group_by(keys).agg(measured_ms=_average("measured") / 1e3, predicted_ms=_average("predicted") / 1e3,
                            unmatched_spans=pl.col("missing").sum())
        .sort(keys)
    )
    return [{**row, "error_pct": error_pct(row["predicted_ms"], row["measured_ms"])}
            for row in table.iter_rows(named=True)]


def class_rows(aligned: pl.DataFrame, rank_iterations: int) -> list[dict[str, Any]]:
    """Per operator class over matched operators: operators and time per rank and iteration on both sides, the
    error of the total and the MAPE; ``aligned`` has op_class, measured_us, predicted_us (null on one side only)."""
    matched = aligned.filter(pl.col("measured_us").is_not_null() & pl.col("predicted_us").is_not_null())
    if matched.is_empty():
        return []
    table = (
        matched.group_by("op_class")
        .agg(ops=pl.len(), measured=_total("measured_us"), predicted=_total("predicted_us"),
             mape=_average(pl.when(pl.col("measured_us") > 0)
                           .then((pl.col("predicted_us") - pl.col("measured_us")).abs() / pl.col("measured_us"))))
        .sort("measured", "op_class", descending=[True, False])
    )
    n = max(rank_iterations, 1)
    return [{"op_class": c, "ops": ops / n, "measured_ms": m / n / 1e3, "predicted_ms": p / n / 1e3,
             "error_pct": error_pct(p, m), "mape_pct": None if mape is None else 100.0 * mape}
            for c, ops, m, p, mape in table.iter_rows()]


def worst_op_rows(aligned: pl.DataFrame, rank_iterations: int) -> list[dict[str, Any]]:
    """The operators (by signature and class) whose predicted time is furthest from the measured one (those
    predicted within 0.01 % are left out): calls and time per rank and iteration."""
    matched = aligned.filter(pl.col("measured_us").is_not_null() & pl.col("predicted_us").is_not_null())
    if matched.is_empty():
        return []
    n = max(rank_iterations, 1)
    table = (
        matched.group_by("op_class", "name")
        .agg(calls=pl.len(), measured=_total("measured_us"), predicted=_total("predicted_us"))
        .with_columns(gap=(pl.col("predicted") - pl.col("measured")).abs())
        .filter(pl.col("gap") > 1e-4 * pl.col("measured").abs())
        .sort("gap", "op_class", "name", descending=[True, False, False]).head(_WORST)
    )
    return [{"op": name, "op_class": c, "calls": calls / n, "measured_ms": m / n / 1e3, "predicted_ms": p / n / 1e3,
             "error_pct": error_pct(p, m)}
            for c, name, calls, m, p, _ in table.iter_rows()]


def one_side_rows(aligned: pl.DataFrame, rank_iterations: int) -> list[dict[str, Any]]:
    """Operators found on one side only, by side and name: calls and time per rank and iteration."""
    n = max(rank_iterations, 1)
    rows = []
    for side, column in (("measured only", "measured_us"), ("predicted only", "predicted_us")):
        other = "predicted_us" if column == "measured_us" else "measured_us"
        table = (
            aligned.filter(pl.col(other).is_null() & pl.col(column).is_not_null())
            .group_by("op_class", "name").agg(calls=pl.len(), time=_total(column))
            .sort("time", "op_class", "name", descending=[True, False, False]).head(_WORST)
        )
        rows += [{"side": side, "op": name, "op_class": c, "calls": calls / n, "ms": t / n / 1e3}
                 for c, name, calls, t in table.iter_rows()]
    return rows


def op_error_sample(aligned: pl.DataFrame) -> list[float]:
    """Per-operator errors in percent (operators of at least 1 µs), at most 20 000 of them, for the histogram."""
    matched = aligned.filter(pl.col("measured_us") >= 1.0).filter(pl.col("predicted_us").is_not_null())
    if matched.height > _HISTOGRAM_SAMPLE:
        matched = matched.sample(_HISTOGRAM_SAMPLE, seed=0)
    errors = ((matched["predicted_us"] - matched["measured_us"]) / matched["measured_us"] * 100.0)
    return [round(x, 3) for x in errors.to_list()]


def breakdown_rows(measured: pl.DataFrame, predicted: pl.DataFrame) -> list[dict[str, Any]]:
    """Mean per rank and iteration of each breakdown category on both sides."""
    rows = []
    for column in ("time_us", *BREAKDOWN):
        m = measured[column].mean() if measured.height else None
        p = predicted[column].mean() if predicted.height else None
        rows.append({"category": column.removesuffix("_us"), "measured_ms": None if m is None else m / 1e3,
                     "predicted_ms": None if p is None else p / 1e3, "error_pct": error_pct(p, m)})
    return rows
