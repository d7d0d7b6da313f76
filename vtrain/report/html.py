"""``report.html``: one self-contained page (plotly.js inlined) with the timelines of the same iteration, measured
and predicted, one above the other, the error per operator class, the per-operator error histogram and the
report's tables."""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from vtrain.report import tables
from vtrain.report.tables import Table
from vtrain.validate.compare import Comparison
from vtrain.validate.run import Validation

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
h1 { font-size: 1.5em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; }
.note { color: #555; }
"""
_PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
            "#bab0ac"]


def html_table(table: Table) -> str:
    header, rows = table
    if not rows:
        return "<p class='note'>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(v: Validation) -> str:
    """The whole page."""
    figures = [timeline_figure(v), class_error_figure(v), histogram_figure(v)]
    plots = []
    for k, figure in enumerate(f for f in figures if f is not None):
        plots.append(figure.to_html(full_html=False, include_plotlyjs="inline" if k == 0 else False))
    parts = [f"<h1>Validation report: {html.escape(str(v.trace_dir))}</h1>",
             f"<p>ranks {v.ranks} of world size {v.world_size or '?'}, {v.device} traces; profiled iterations "
             f"{v.iterations}, steady {v.steady}; run described by {html.escape(v.config_source or 'nothing')}</p>",
             f"<p class='note'>Iteration time: {html.escape(v.measured['definition'])}.</p>",
             "<h2>Iteration time</h2>", html_table(tables.headline(v.replay, v.model)),
             html_table(tables.spread(v.measured)), *plots]
    parts += _prediction("Replay (dependency model)", v.replay)
    parts += ["<h3>Dependency model</h3>", html_table(tables.dependencies(v.replay))]
    if v.model is not None:
        parts += _prediction("Model (vtrain simulate)", v.model)
        parts += ["<h3>Where the error comes from</h3><ul>"
                  + "".join(f"<li>{html.escape(line)}</li>" for line in tables.where_the_error_comes_from(v.model))
                  + "</ul>", "<h3>Operators found on one side only</h3>", html_table(tables.one_side(v.model))]
    else:
        parts.append(f"<h2>Model</h2><p>No model-driven prediction: {html.escape(v.model_reason or '')}</p>")
    parts.append("<h2>HTA on the measured and the predicted traces</h2>")
    hta = tables.hta(v.hta)
    parts.append(html_table(hta) if hta else f"<p>{html.escape(v.hta.get('reason') or 'no result')}</p>")
    if v.warnings:
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in v.warnings) + "</ul>")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>vtrain validate: "
            f"{html.escape(v.trace_dir.name)}</title><style>{_STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def _prediction(title: str, c: Comparison) -> list[str]:
    parts = [f"<h2>{html.escape(title)}</h2>",
             f"<p>Iteration time: measured {tables.ms(c.measured_ms)} ms, predicted {tables.ms(c.predicted_ms)} ms, "
             f"error {tables.pct(c.error_pct)}.</p>"]
    if c.details.get("profile"):
        parts.append(f"<p class='note'>Latency tables: {html.escape(c.details['profile'])}.</p>")
    if c.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in c.notes) + "</ul>")
    parts += ["<h3>Per iteration</h3>", html_table(tables.iterations(c))]
    if c.phases:
        parts += ["<h3>Per phase</h3>", html_table(tables.grouped(c.phases, "phase"))]
    if c.stages:
        parts += ["<h3>Per pipeline stage</h3>", html_table(tables.grouped(c.stages, "stage"))]
    if c.micro_batches:
        parts += ["<h3>Per micro-batch</h3>", html_table(tables.grouped(c.micro_batches, "micro_batch"))]
    parts += ["<h3>Per operator class</h3>", html_table(tables.classes(c)), "<h3>Breakdown</h3>",
              html_table(tables.breakdown(c)), "<h3>Ten worst-predicted operators</h3>", html_table(tables.worst(c))]
    return parts


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
    figure = go.Figure()
    for comparison in (v.replay, v.model):
        if comparison is None or not comparison.classes:
            continue
        figure.add_trace(go.Bar(x=[r["op_class"] for r in comparison.classes],
                                y=[r["error_pct"] for r in comparison.classes], name=comparison.name))
    if not figure.data:
        return None
    figure.update_layout(title="Error per operator class (total time, %)", yaxis_title="error %", barmode="group")
    return figure


def histogram_figure(v: Validation) -> go.Figure | None:
    """Distribution of per-operator errors."""
    figure = go.Figure()
    for comparison in (v.replay, v.model):
        if comparison is None or not comparison.op_errors_pct:
            continue
        clipped = [max(-200.0, min(200.0, x)) for x in comparison.op_errors_pct]
        figure.add_trace(go.Histogram(x=clipped, name=comparison.name, opacity=0.6, nbinsx=80))
    if not figure.data:
        return None
    figure.update_layout(title="Per-operator error (%, clipped to ±200)", barmode="overlay",
                         xaxis_title="error %", yaxis_title="operators")
    return figure
