"""The report of ``vtrain validate --measurements``: ``report.md``, a self-contained ``report.html`` (predicted
against measured, error histogram, error by dimension) and ``metrics.json``; a short table on the terminal."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from vtrain.outputs import write_json, write_text
from vtrain.report import document as doc
from vtrain.report.tables import LISTED, Table
from vtrain.validate.measurements import MeasurementValidation


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} %"


def headline(v: MeasurementValidation) -> Table:
    d = v.to_dict()
    return (["MAPE", "rows scored", "rows fitted on (excluded)", "invalid rows", "median |error|", "max |error|"],
            [[_pct(d["mape_pct"]), str(d["rows"]), str(d["excluded"]), str(d["invalid"]),
              _pct(d["median_abs_error_pct"]), _pct(d["max_abs_error_pct"])]])


def worst_rows(v: MeasurementValidation) -> Table:
    """The worst-predicted rows, with the model each names where the table names its models."""
    worst = v.worst()
    named = "model" in worst.columns and worst["model"].is_not_null().any()
    header = ["row", *(["model"] if named else []), "GPUs", "t", "d", "p", "micro", "global", "hidden", "layers",
              "measured ms", "predicted ms", "error"]
    rows = [[str(r["row"]), *([r["model"] or ""] if named else []), str(r["gpus"]), str(r["tp"]), str(r["dp"]),
             str(r["pp"]), str(r["micro_batch"]), str(r["global_batch"]), str(r["hidden"]), str(r["layers"]),
             f"{r['iteration_ms']:.1f}", f"{r['predicted_ms']:.1f}", f"{r['error_pct']:+.1f} %"]
            for r in worst.iter_rows(named=True)]
    return header, rows


def refused_rows(v: MeasurementValidation) -> list[doc.Block]:
    """Every row not simulated, with why (up to :data:`LISTED`); nothing when every row was."""
    refused = v.table.filter(pl.col("invalid").is_not_null())
    if refused.is_empty():
        return []
    located = "file" in refused.columns and refused["file"].is_not_null().any()
    rows = [[str(r["row"]), *([f"{r['file']} line {r['line']}" if r.get("file") else ""] if located else []),
             r["invalid"]] for r in refused.head(LISTED).iter_rows(named=True)]
    more = refused.height - len(rows)
    return [doc.TableBlock((["row", *(["where"] if located else []), "why it was not simulated"], rows)),
            *([doc.Text(f"{more} more in metrics.json (invalid_rows).", note=True)] if more > 0 else [])]


def dimension_table(frame: pl.DataFrame, dim: str) -> Table:
    rows = [[str(r[dim]), str(r["rows"]), _pct(r["mape_pct"]), f"{r['mean_error_pct']:+.2f} %"]
            for r in frame.iter_rows(named=True)]
    return [dim, "rows", "MAPE", "mean signed error"], rows


def per_micro_batch_table(frame: pl.DataFrame, dim: str) -> Table:
    rows = [[str(r[dim]), str(r["layouts"]), f"{r['per_micro_batch_ratio']:.3f}", f"{r['fixed_ms_measured']:.1f}",
             f"{r['fixed_ms_predicted']:.1f}"] for r in frame.iter_rows(named=True)]
    return [dim, "layouts", "predicted / measured per micro-batch", "fixed ms measured", "fixed ms predicted"], rows


PER_MICRO_BATCH = ("Each layout measured at two or more numbers of micro-batches (rows that differ only in their "
                   "global batch): its measured and its predicted times fitted as a fixed part plus a part per "
                   "micro-batch, medians over the layouts. The part per micro-batch is the work every micro-batch "
                   "repeats (its passes, their communication, a pipeline's hand-offs); the fixed part, the "
                   "iteration's own (the optimizer step, the gradient all-reduce, filling and draining a pipeline).")


def per_layer_table(frame: pl.DataFrame, dim: str) -> Table:
    rows = [[str(r[dim]), str(r["families"]), f"{r['per_layer_ratio']:.3f}", f"{r['outside_ms_measured']:.1f}",
             f"{r['outside_ms_predicted']:.1f}"] for r in frame.iter_rows(named=True)]
    return ([dim, "families", "predicted / measured per layer", "outside the layers ms measured",
             "outside the layers ms predicted"], rows)


PER_LAYER = ("Layouts that differ only in their layers: the time per micro-batch fitted as a part outside the "
             "layers (embedding, head and loss: the last stage sets a pipeline's pace) plus a part per layer a "
             "stage holds, medians over the families.")


def document(v: MeasurementValidation, *, with_figures: bool = False) -> doc.Document:
    """The report's sections, in order; with ``with_figures`` predicted against measured and the error
    histogram."""
    heading: list[doc.Block] = [
        doc.Text(f"Profile `{v.profile}`; {v.hardware.gpus_per_node} GPUs per node; inter-node "
                 f"{v.hardware.inter_node_gbps or 'fitted'} Gbit/s; intra-node "
                 f"{v.hardware.intra_node_gbps or 'fitted'} GB/s. Measured: {v.measured_as}. Rows the profile was "
                 "fitted on are predicted but not scored (grey in the plot)."),
        doc.TableBlock(headline(v)), *(doc.Figure(f) for f in (_figures(v) if with_figures else []))]
    sections = [
        doc.Section("Where the device model's numbers come from",
                    [doc.Bullets([f"{key}: {value}" for key, value in sorted(v.device_provenance.items())])]),
        doc.Section("Ten worst-predicted rows", [doc.TableBlock(worst_rows(v))]),
        *([doc.Section("Rows not simulated", refused)] if (refused := refused_rows(v)) else []),
        doc.Section("Error by dimension", [doc.TableBlock(dimension_table(frame, dim))
                                           for dim, frame in v.by_dimension().items()]),
        doc.Section("Per micro-batch and per iteration", [
            doc.Text(PER_MICRO_BATCH),
            *(doc.TableBlock(per_micro_batch_table(v.per_micro_batch_by(dim), dim)) for dim in ("tp", "pp")),
            doc.Text(PER_LAYER),
            *(doc.TableBlock(per_layer_table(v.per_layer_by(dim), dim)) for dim in ("tp", "pp"))]),
    ]
    return doc.Document(f"Validation against measured iteration times: {v.measurements.name}", heading, sections)


def render_markdown(v: MeasurementValidation) -> str:
    """``report.md``."""
    return doc.render_markdown(document(v))


def render_html(v: MeasurementValidation) -> str:
    """``report.html``: the same sections and the plots, plotly.js inlined once."""
    return doc.render_html(document(v, with_figures=True), page_title="vtrain validate --measurements")


def _figures(v: MeasurementValidation) -> list[go.Figure]:
    scored = v.scored
    fitted = v.table.filter(pl.col("fitted") & pl.col("predicted_ms").is_not_null())
    scatter = go.Figure()
    for name, frame, color in (("scored", scored, "#4c78a8"), ("fitted on", fitted, "#bab0ac")):
        if frame.height:
            scatter.add_trace(go.Scatter(
                x=frame["iteration_ms"].to_list(), y=frame["predicted_ms"].to_list(), mode="markers", name=name,
                marker={"color": color, "size": 5},
                text=[f"row {r} t={t} d={d} p={p}" for r, t, d, p in
                      frame.select("row", "tp", "dp", "pp").iter_rows()]))
    limits = [float(v.table["iteration_ms"].min() or 1), float(v.table["iteration_ms"].max() or 1)]
    scatter.add_trace(go.Scatter(x=limits, y=limits, mode="lines", name="predicted = measured",
                                 line={"color": "#888", "dash": "dash"}))
    scatter.update_layout(title="Predicted against measured iteration time (ms)", xaxis_type="log",
                          yaxis_type="log", xaxis_title="measured ms", yaxis_title="predicted ms", height=520)
    histogram = go.Figure(go.Histogram(x=scored["error_pct"].to_list(), nbinsx=60, marker_color="#f58518"))
    histogram.update_layout(title="Error of the scored rows (%)", xaxis_title="error %", height=360)
    return [scatter, histogram]


def write_measurement_report(v: MeasurementValidation, folder: Path) -> None:
    """Write the three report files into ``folder`` (a staging folder: :func:`vtrain.outputs.staged`)."""
    write_text(folder / "report.md", render_markdown(v))
    write_text(folder / "report.html", render_html(v))
    write_json(folder / "metrics.json", v.to_dict())
    v.table.write_parquet(folder / "rows.parquet")


def terminal_lines(v: MeasurementValidation) -> list[str]:
    """The short summary printed after the report is written."""
    d = v.to_dict()
    lines = [f"MAPE {_pct(d['mape_pct'])} over {d['rows']} rows ({d['excluded']} fitted on, excluded; "
             f"{d['invalid']} invalid)"]
    for dim in ("tp", "dp", "pp"):
        frame = v.by_dimension()[dim]
        lines.append(f"  by {dim}: " + ", ".join(f"{r[dim]}: {r['mape_pct']:.1f} %"
                                                 for r in frame.iter_rows(named=True)))
    by_pp = v.per_micro_batch_by("pp")
    if not by_pp.is_empty():
        lines.append("  predicted / measured time per micro-batch, by pp: " + ", ".join(
            f"{r['pp']}: {r['per_micro_batch_ratio']:.3f}" for r in by_pp.iter_rows(named=True))
            + f" (median over {by_pp['layouts'].sum()} layouts)")
    return lines
