"""The report's tables as plain rows of text, shared by the Markdown, HTML and terminal writers."""

from __future__ import annotations

from typing import Any

from vtrain.errors import number_ranges
from vtrain.report.document import Table  # header, rows
from vtrain.validate.diff import Comparison


#: rows a report lists in one table (all of them are in its JSON)
LISTED = 100


def per_iteration(count: float) -> str:
    """A count per rank and iteration: whole where it is (``1,219``), else to a tenth (``7.5``)."""
    return f"{count:,.0f}" if count == round(count) else f"{count:,.1f}"


def ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.3f}"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.2f} %"


def share(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} %"


def peak_memory(rows: list[dict[str, Any]]) -> Table:
    """Each traced rank's measured peak memory against the memory model's peak of its stage
    (:func:`vtrain.validate.peak_memory.peak_memory_rows`)."""
    header = ["rank", "stage", "measured GiB (max_memory_allocated)", "memory model GiB", "error"]
    return header, [[str(r["rank"]), str(r["stage"]), f"{r['measured_gib']:,.3f}", f"{r['model_gib']:,.3f}",
                     pct(r["error_pct"])] for r in rows]


def headline(replay: Comparison, model: Comparison | None) -> Table:
    """Iteration time: measured, predicted and error for each prediction."""
    header = ["prediction", "measured ms", "median of iterations", "predicted ms", "error"]
    shown = [("replay (dependency model)", replay), ("model (vtrain simulate)", model)]
    return header, [[label, ms(one.measured_ms), number_ranges(one.measured_iterations), ms(one.predicted_ms),
                     pct(one.error_pct)] for label, one in shown if one is not None]


def spread(measured: dict[str, Any]) -> Table:
    header = ["", "iterations", "median ms", "min ms", "max ms", "p10 ms", "p90 ms", "stdev ms"]

    def row(label: str, s: dict[str, Any]) -> list[str]:
        return [label, str(s["count"]), ms(s["median"]), ms(s["min"]), ms(s["max"]), ms(s["p10"]), ms(s["p90"]),
                ms(s["stdev"])]

    rows = [row("job", measured["iteration_ms"])]
    rows += [row(f"rank {rank}", s) for rank, s in measured["per_rank"].items()]
    return header, rows


def iterations(comparison: Comparison) -> Table:
    return (["iteration", "measured ms", "predicted ms", "error"],
            [[str(r["iteration"]), ms(r["measured_ms"]), ms(r["predicted_ms"]), pct(r["error_pct"])]
             for r in comparison.iterations])


def grouped(rows: list[dict[str, Any]], key: str) -> Table:
    label = key.replace("_", "-")
    return ([label, "measured ms", "predicted ms", "error", "unmatched spans"],
            [[str(r[key]), ms(r["measured_ms"]), ms(r["predicted_ms"]), pct(r["error_pct"]),
              str(r["unmatched_spans"])] for r in rows])


def classes(comparison: Comparison) -> Table:
    return (["operator class", "ops", "measured ms", "predicted ms", "error of total", "MAPE"],
            [[r["op_class"], per_iteration(r["ops"]), ms(r["measured_ms"]), ms(r["predicted_ms"]), pct(r["error_pct"]),
              share(r["mape_pct"])] for r in comparison.classes])


def breakdown(comparison: Comparison) -> Table:
    return (["", "measured ms", "predicted ms", "error"],
            [[r["category"], ms(r["measured_ms"]), ms(r["predicted_ms"]), pct(r["error_pct"])]
             for r in comparison.breakdown])


def worst(comparison: Comparison) -> Table:
    return (["operator", "class", "calls", "measured ms", "predicted ms", "error"],
            [[_short(r["op"]), r["op_class"], per_iteration(r["calls"]), ms(r["measured_ms"]), ms(r["predicted_ms"]),
              pct(r["error_pct"])] for r in comparison.worst_ops])


def one_side(comparison: Comparison) -> Table:
    return (["found", "operator", "class", "calls", "ms"],
            [[r["side"], _short(r["op"]), r["op_class"], per_iteration(r["calls"]), ms(r["ms"])]
             for r in comparison.one_side_only])


def dependencies(comparison: Comparison) -> Table:
    deps = comparison.details.get("dependencies", {})
    started = deps.get("device_activities_started_by", {})
    rows = []
    if started:
        total = sum(started.values())
        for reason in ("launch", "stream", "event", "inferred", "root", "none"):
            if started.get(reason):
                rows.append([f"device activities started by {_REASONS[reason]}", f"{started[reason]:,}",
                             f"{100 * started[reason] / total:.1f} %"])
        rows.append(["device time not explained by any dependency", ms(deps.get("device_unexplained_ms")) + " ms",
                     ""])
    blocked = deps.get("blocked_runtime_calls", {})
    for reason, label in (("explicit", "from cuda_sync records"), ("inferred", "inferred from timing")):
        if blocked.get(reason):
            rows.append([f"blocking runtime calls tied to the device activity they waited for ({label})",
                         f"{blocked[reason]:,}", ""])
    if deps.get("thread_waits"):
        rows.append(["idle CPU stretches ended by another thread or a collective", f"{deps['thread_waits']:,}", ""])
    rows.append(["collectives matched across ranks", f"{deps.get('collectives_matched', 0):,}", ""])
    for reason, n in deps.get("collective_calls_unmatched", {}).items():
        rows.append([f"collective calls with measured duration: {reason}", f"{n:,}", ""])
    for kind, n in deps.get("collective_ends", {}).items():
        rows.append([f"collective ends: {_ENDS.get(kind, kind)}", f"{n:,}", ""])
    if deps.get("graph_launches"):
        rows.append(["graph launches releasing several activities", f"{deps['graph_launches']:,}", ""])
    for cause, kept in deps.get("kept_waits", {}).items():
        rows.append([f"waits kept as measured: {cause} ({ms(kept['ms'])} ms)", f"{kept['count']:,}", ""])
    return ["", "count", "share"], rows


_REASONS = {"launch": "their launch", "stream": "the previous activity on their stream",
            "event": "a recorded CUDA event wait", "inferred": "another stream (inferred from timing)",
            "root": "nothing (first on their stream, no launch)", "none": "nothing known (started later than "
                                                                           "any dependency explains)"}
_ENDS = {"peers": "last arrival + transfer time", "waited": "when the thread waited for it",
         "measured": "measured duration"}


def hta(hta_result: dict[str, Any]) -> Table | None:
    """Per rank and side: HTA's idle / compute / non-compute shares and comm-comp overlap."""
    sides = [side for side in ("measured", "replay", "model") if isinstance(hta_result.get(side), dict)
             and "reason" not in hta_result[side]]
    if not sides:
        return None
    header = ["rank", "metric"] + sides
    rows = []
    ranks = sorted({rank for side in sides for rank in hta_result[side]}, key=int)
    for rank in ranks:
        for metric, label in (("idle_pct", "idle %"), ("compute_pct", "compute %"),
                              ("non_compute_pct", "non-compute %"), ("overlap_pct", "comm/comp overlap %")):
            values = [hta_result[side].get(rank, {}).get(metric) for side in sides]
            rows.append([rank, label] + [share(v) for v in values])
    return header, rows


def _short(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def where_the_error_comes_from(comparison: Comparison) -> list[str]:
    """The biggest gaps between predicted and measured time, by breakdown category and by operator class."""
    lines = []
    gaps = [(r["predicted_ms"] - r["measured_ms"], r["category"], r)
            for r in comparison.breakdown if r["category"] != "time"
            and r["measured_ms"] is not None and r["predicted_ms"] is not None]
    for gap, category, r in sorted(gaps, key=lambda g: -abs(g[0]))[:3]:
        if abs(gap) >= 0.001:
            lines.append(f"{category}: measured {ms(r['measured_ms'])} ms, predicted {ms(r['predicted_ms'])} ms "
                         f"({gap:+,.3f} ms per rank and iteration)")
    class_gaps = [(r["predicted_ms"] - r["measured_ms"], r) for r in comparison.classes]
    for gap, r in sorted(class_gaps, key=lambda g: -abs(g[0]))[:3]:
        if abs(gap) >= 0.001:
            lines.append(f"operator class {r['op_class']}: measured {ms(r['measured_ms'])} ms, predicted "
                         f"{ms(r['predicted_ms'])} ms ({gap:+,.3f} ms; MAPE {share(r['mape_pct'])})")
    missing = [r for r in comparison.one_side_only if r["side"] == "measured only"]
    if missing:
        total = sum(r["ms"] for r in missing)
        lines.append(f"operators measured but not predicted: {total:,.3f} ms per rank and iteration "
                     f"(largest: {_short(missing[0]['op'], 60)})")
    return lines
