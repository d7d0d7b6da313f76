"""The validation report of `vtrain validate`: one list of sections (:func:`document`), rendered to ``report.md``
and to a self-contained ``report.html`` whose top shows the timelines of the same iteration, measured and
predicted, one above the other, the error per operator class and the per-operator error histogram."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vtrain.outputs import write_json, write_text
from vtrain.report import document as doc
from vtrain.report import tables
from vtrain.validate.diff import Comparison
from vtrain.validate.traces import Validation

_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac"]


def render_markdown(v: Validation) -> str:
    """``report.md``."""
    return doc.render_markdown(document(v))


def render_html(v: Validation) -> str:
    """``report.html``: the same sections and the figures."""
    return doc.render_html(document(v, with_figures=True), page_title=f"vtrain validate: {v.trace_dir.name}")


def document(v: Validation, *, with_figures: bool = False) -> doc.Document:
    """The report's sections, in order."""
    figures = [timeline_figure(v), class_error_figure(v), histogram_figure(v)] if with_figures else []
    heading: list[doc.Block] = [
        doc.Bullets([f"ranks {v.ranks} of world size {v.world_size or '?'}, {v.device} traces",
                     f"profiled iterations {v.iterations}; steady iterations {v.steady} ({v.steady_basis})",
                     f"run described by: {v.config_source or 'nothing (replay only)'}",
                     f"iteration time: {v.measured['definition']}"])]
    sections = [doc.Section("Iteration time", [
        doc.TableBlock(tables.headline(v.replay, v.model)),
        doc.TableBlock(tables.spread(v.measured), caption="Measured spread over the steady iterations:"),
        *(doc.Figure(f) for f in figures if f is not None)])]
    sections += _prediction("Replay: the traces' own dependency graph, re-simulated with measured durations",
                            v.replay)
    sections.append(doc.Section("Dependency model", [doc.TableBlock(tables.dependencies(v.replay))], level=3))
    if v.model is not None:
        sections += _prediction("Model: `vtrain simulate` of the described run", v.model)
        sections += [doc.Section("Where the error comes from",
                                 [doc.Bullets(tables.where_the_error_comes_from(v.model))], level=3),
                     doc.Section("Operators found on one side only (per rank and iteration)",
                                 [doc.TableBlock(tables.one_side(v.model))], level=3)]
    else:
        sections.append(doc.Section("Model", [doc.Text(f"No model-driven prediction: {v.model_reason}")]))
    if v.memory:
        sections.append(doc.Section("Peak memory", [doc.TableBlock(tables.peak_memory(v.memory))]))
    sections.append(doc.Section("HTA on the measured and the predicted traces", _hta_blocks(v)))
    if v.warnings:
        sections.append(doc.Section("Warnings", [doc.Bullets(list(v.warnings))]))
    return doc.Document(f"Validation report: {v.trace_dir}", heading, sections)


def _prediction(title: str, c: Comparison) -> list[doc.Section]:
    blocks: list[doc.Block] = [doc.Text(f"Iteration time: measured {tables.ms(c.measured_ms)} ms, predicted "
                                        f"{tables.ms(c.predicted_ms)} ms, error {tables.pct(c.error_pct)}.")]
    if c.details.get("profile"):
        blocks.append(doc.Text(f"Latency tables: {c.details['profile']}.", note=True))
    if c.notes:
        blocks.append(doc.Bullets(list(c.notes)))
    sections = [doc.Section(title, blocks),
                doc.Section("Per iteration", [doc.TableBlock(tables.iterations(c))], level=3)]
    for rows, key, title_of in ((c.phases, "phase", "Per phase (time in phase spans per rank and iteration)"),
                                (c.stages, "stage", "Per pipeline stage (time in phase spans per rank and iteration)"),
                                (c.micro_batches, "micro_batch",
                                 "Per micro-batch (time in its passes per rank and iteration)")):
        if rows:
            sections.append(doc.Section(title_of, [doc.TableBlock(tables.grouped(rows, key))], level=3))
    sections += [
        doc.Section("Per operator class (per rank and iteration)", [doc.TableBlock(tables.classes(c))], level=3),
        doc.Section("Breakdown (per rank and iteration)", [doc.TableBlock(tables.breakdown(c))], level=3),
        doc.Section("Ten worst-predicted operators (per rank and iteration)", [doc.TableBlock(tables.worst(c))],
                    level=3)]
    return sections


def _hta_blocks(v: Validation) -> list[doc.Block]:
    hta = tables.hta(v.hta)
    if hta is None:
        return [doc.Text(v.hta.get("reason") or "HTA gave no result.")]
    notes = [f"{side}: {v.hta[side]['reason']}" for side in ("measured", "replay", "model")
             if isinstance(v.hta.get(side), dict) and "reason" in v.hta[side]]
    return [doc.TableBlock(hta, caption="Temporal breakdown and communication/computation overlap (HTA, whole "
                                        "trace):"), *([doc.Bullets(notes)] if notes else [])]


def timeline_figure(v: Validation) -> go.Figure | None:
    """The same iteration of the lowest rank, measured and predicted, one above the other, one row per class."""
    sides = [(name, rows) for name, rows in v.timelines.items() if rows]
    if not sides:
        return None
    classes = sorted({row["op_class"] for _, rows in sides for row in rows})
    colour = {c: _PALETTE[k % len(_PALETTE)] for k, c in enumerate(classes)}
    figure = make_subplots(rows=len(sides), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                           subplot_titles=[f"{name} (rank {rows[0]['rank']})" for name, rows in sides])
    for row_number, (_, rows) in enumerate(sides, start=1):
        for op_class in classes:
            mine = [r for r in rows if r["op_class"] == op_class]
            if not mine:
                continue
            figure.add_trace(go.Bar(
                x=[r["dur_ms"] for r in mine], base=[r["start_ms"] for r in mine], y=[op_class] * len(mine),
                orientation="h", marker_color=colour[op_class], name=op_class, legendgroup=op_class,
                showlegend=row_number == 1, hovertext=[r["name"] for r in mine],
                hovertemplate="%{hovertext}<br>start %{base:.3f} ms, %{x:.3f} ms<extra></extra>"), row=row_number, col=1)
    figure.update_layout(title="Timeline of one iteration: measured and predicted", barmode="overlay",
                         height=260 * len(sides) + 120, xaxis_title="ms from the iteration's start")
    figure.update_xaxes(title_text="ms from the iteration's start", row=len(sides), col=1)
    return figure


def class_error_figure(v: Validation) -> go.Figure | None:
    """Error of each operator class's total time, per prediction."""
    return _per_prediction(
        v, lambda c: c.classes,
        lambda c: go.Bar(x=[r["op_class"] for r in c.classes], y=[r["error_pct"] for r in c.classes], name=c.name),
        title="Error per operator class (total time, %)", yaxis_title="error %", barmode="group")


def histogram_figure(v: Validation) -> go.Figure | None:
    """Distribution of per-operator errors."""
    return _per_prediction(
        v, lambda c: c.op_errors_pct,
        lambda c: go.Histogram(x=[max(-200.0, min(200.0, x)) for x in c.op_errors_pct], name=c.name, opacity=0.6,
                               nbinsx=80),
        title="Per-operator error (%, clipped to ±200)", barmode="overlay", xaxis_title="error %",
        yaxis_title="operators")


def _per_prediction(v: Validation, has_data: Callable[[Comparison], Any],
                    trace: Callable[[Comparison], Any], **layout: Any) -> go.Figure | None:
    """One trace per prediction (replay, model) that ``has_data``; None when neither has."""
    figure = go.Figure()
    for comparison in (v.replay, v.model):
        if comparison is not None and has_data(comparison):
            figure.add_trace(trace(comparison))
    if not figure.data:
        return None
    figure.update_layout(**layout)
    return figure


def write_report_files(v: Validation, folder: Path) -> None:
    """``report.md``, ``report.html``, ``metrics.json`` and, under ``tables/``, every aligned operator and span
    and every iteration as Parquet."""
    write_text(folder / "report.md", render_markdown(v))
    write_text(folder / "report.html", render_html(v))
    write_json(folder / "metrics.json", v.to_dict())
    tables = folder / "tables"
    tables.mkdir(exist_ok=True)
    if v.iteration_table is not None:
        v.iteration_table.write_parquet(tables / "iterations.parquet")
    for comparison in (v.replay, v.model):
        if comparison is None:
            continue
        for kind, frame in (("ops", comparison.ops_table), ("spans", comparison.spans_table)):
            if frame is not None:
                frame.write_parquet(tables / f"{comparison.name}_{kind}.parquet")
