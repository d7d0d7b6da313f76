"""The drift report of `vtrain calibrate`: ``report.md``, a self-contained ``report.html`` (plotly.js inlined),
``drift.json`` and every compared row as Parquet under ``tables/``; and the short table printed on the terminal."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl
from rich.console import Console
from rich.table import Table as RichTable

from vtrain.calibrate.drift import (
    COLLECTIVE,
    EFFECT,
    GONE,
    KERNEL,
    MIN_CHANGE,
    MOVED,
    NEW,
    OP,
    RUN_SPREADS,
    SPREAD_ROWS,
    STATUSES,
    Z,
)
from vtrain.calibrate.drift.samples import ranks_text
from vtrain.calibrate.result import Calibration
from vtrain.outputs import write_json, write_text
from vtrain.report import document as doc
from vtrain.report.console import stdout_console
from vtrain.report.tables import LISTED, Table, ms, pct

#: rows in the terminal's table of what moved
PRINTED = 20
#: characters of a row's label printed there
LABEL = 48

_TITLES = {COLLECTIVE: "Collectives (collective x group size x bytes)", KERNEL: "Kernels (by name)",
           OP: "Operator signatures (op + input dims + dtypes)"}
_COLOURS = {"slower": "#e45756", "faster": "#54a24b", "unchanged": "#bab0ac"}


def rule_lines(run_spread: float) -> list[str]:
    """The drift rule, as the report states it, with this comparison's run-to-run spread."""
    return [
        "A row's samples are its steps, on the ranks both profiles hold (the calls of one step share its "
        "conditions): its value in a step is the median of its calls there (a collective's: its fastest call), its "
        "median the median over steps. ratio = new median / old median.",
        f"A row drifted (slower/faster) when |ln ratio| is beyond each of: {Z:g} x max(e_old, e_new), the noise "
        f"band; {EFFECT:g} x max(c_old, c_new), the effect size: more than what the row's calls vary by; "
        f"{RUN_SPREADS:g} x the run-to-run spread; and ln(1 + {MIN_CHANGE:g}), at least {100 * MIN_CHANGE:g} %. "
        "'drift beyond' is that threshold.",
        "A spread is (median - p10) / median / 1.2816 (the fast half: slow outliers barely move a median but "
        "stretch p90): c that of one call site over the steps (the k-th call of the row in a step of a rank; the "
        "median over its sites), e = 1.2533 x the steps' spread / sqrt(steps). Rows without a spread of their own "
        "borrow the median of their table (marked *).",
        f"Run-to-run spread = 1.4826 x the median absolute deviation of ln ratio over the rows in both profiles "
        f"(at least {SPREAD_ROWS}): how far apart two recordings of the job lie where nothing changed. Here "
        f"{_spread(run_spread)}.",
        "noise band = exp(Z x max(e_old, e_new)): a ratio within [1/band, band] is noise.",
    ]


def _spread(run_spread: float) -> str:
    """This comparison's run-to-run spread and the change it asks of a row, in words."""
    if run_spread == 0:
        return "0: the rows in both profiles are alike (or too few to tell)"
    needed = 100 * math.expm1(RUN_SPREADS * run_spread)
    return f"±{100 * math.expm1(run_spread):.1f} %, so a row needs ±{needed:.1f} %"


def scope(calibration: Calibration) -> list[doc.Block]:
    """The ranks compared, those only one profile holds and the collectives left out for waiting on them."""
    c, drift = calibration, calibration.drift
    compared = drift.scope.compared
    ranks = "all (a profile holds no calls)" if compared is None else ranks_text(compared) or "none"
    blocks: list[doc.Block] = [doc.Bullets([f"ranks compared: {ranks}", *drift.said(c.base_path)])]
    if drift.left_out.height:
        blocks.append(doc.TableBlock((["collective not compared", "old calls", "new calls", "waits for ranks"],
                                      [[r["label"], _count(r["old_calls"]), _count(r["new_calls"]), r["waits_for"]]
                                       for r in drift.left_out.iter_rows(named=True)])))
    return blocks


def counts(calibration: Calibration) -> Table:
    """Rows per kind and status."""
    found = calibration.drift.counts()
    return (["kind", *STATUSES], [[kind, *(str(found[kind][s]) for s in STATUSES)] for kind in found])


def software(calibration: Calibration) -> Table:
    """Software versions and device that changed, old -> new (a version a profile does not record, as a fitted
    profile's, is said so: it is not known to have changed)."""
    return (["", "old", "new"], [[key, version(change["old"]), version(change["new"])]
                                 for key, change in calibration.drift.software.items()])


def version(value: object) -> str:
    """A software version as the drift report shows it: ``not recorded`` where the profile has none."""
    return "not recorded" if value is None else str(value)


def reference(predicted: dict[str, Any]) -> Table:
    """The reference run's predicted iteration time with either profile (``Calibration.reference``)."""
    return (["reference run", "old profile ms", "new profile ms", "change"],
            [[predicted["config"], ms(predicted["old_ms"]), ms(predicted["new_ms"]), pct(predicted["change_pct"])]])


def rows(frame: pl.DataFrame, statuses: tuple[str, ...], limit: int = LISTED) -> Table:
    """The rows of ``frame`` with one of ``statuses``, at most ``limit`` of them."""
    header = ["", "status", "old n", "new n", "old median µs", "new median µs", "ratio", "noise band",
              "drift beyond"]
    shown = frame.filter(pl.col("status").is_in(statuses)).head(limit)
    return header, [[r["label"], r["status"], _count(r["old_count"]), _count(r["new_count"]), _us(r["old_median_us"]),
                     _us(r["new_median_us"]), _ratio(r["ratio"]), _band(r["band"], r["pooled_spread"]),
                     _band(r["threshold"], None)] for r in shown.iter_rows(named=True)]


def collective_types(calibration: Calibration) -> Table:
    """Per collective type: rows per status, the median ratio and the time-weighted ratio."""
    header = ["collective", "rows", *STATUSES, "median ratio", "time-weighted ratio"]
    return header, [[r["collective"], str(r["rows"]), *(str(r[s]) for s in STATUSES), _ratio(r["median_ratio"]),
                     _ratio(r["time_ratio"])] for r in calibration.drift.collective_types.iter_rows(named=True)]


def suite(calibration: Calibration) -> Table:
    """Each suite set's measured time and the model's error with the old and the new profile."""
    header = ["set", "measured ms", "replay error", "model ms (old)", "error (old)", "model ms (new)", "error (new)",
              "note"]
    found = []
    for s in calibration.suite or []:
        found.append([s.name, ms(s.replay["measured_ms"]), pct(s.replay["error_pct"]), *_model(s.old),
                      *_model(s.new), s.reason or ""])
    return header, found


def _model(model: dict[str, Any] | None) -> list[str]:
    return ["–", "–"] if model is None else [ms(model["predicted_ms"]), pct(model["error_pct"])]


def _count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def _us(value: float | None) -> str:
    return "–" if value is None else f"{value:,.3f}"


def _ratio(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _band(value: float | None, pooled: bool | None) -> str:
    if value is None:
        return "–"
    return f"±{100 * (value - 1):.1f} %" + (" *" if pooled else "")


def document(calibration: Calibration, *, with_figures: bool = False) -> doc.Document:
    """The report's sections, in order; with ``with_figures`` the plot of every ratio with its noise band."""
    c, drift = calibration, calibration.drift
    heading: list[doc.Block] = [doc.Bullets(_heading(c)), doc.Text("Rule:"), doc.Bullets(rule_lines(drift.run_spread))]
    if with_figures:
        figure = ratio_figure(c)
        heading.append(doc.Figure(figure) if figure is not None
                       else doc.Text("no row is in both profiles: nothing to plot", note=True))
    sections = [
        doc.Section("What moved", [doc.TableBlock(counts(c))]),
        doc.Section("What was compared", scope(c)),
        doc.Section("Software and device", [doc.TableBlock(software(c)) if drift.software
                                            else doc.Text("no software version or device changed")]),
        doc.Section("Reference run", [doc.TableBlock(reference(c.reference)) if c.reference
                                      else doc.Text(f"not predicted: {c.reference_reason}")]),
        doc.Section("Collective types", [doc.TableBlock(collective_types(c))]),
    ]
    for kind in (COLLECTIVE, KERNEL, OP):
        frame = drift.tables()[kind]
        unchanged = frame.filter(pl.col("status") == "unchanged").height
        listed = f"; at most {LISTED} rows are listed per table, all are in drift.json" if frame.height > LISTED else ""
        sections += [doc.Section(_TITLES[kind]),
                     doc.Section("Moved", [doc.TableBlock(rows(frame, MOVED))], level=3),
                     doc.Section("Only in one profile", [doc.TableBlock(rows(frame, (NEW, GONE))),
                                                         doc.Text(f"{unchanged:,} of {frame.height:,} rows "
                                                                  f"unchanged{listed}")], level=3)]
    if c.suite is not None:
        sections.append(doc.Section(f"Validation suite `{c.suite_name}` with the old and the new profile",
                                    [doc.TableBlock(suite(c))]))
    if c.warnings:
        sections.append(doc.Section("Warnings", [doc.Bullets(list(c.warnings))]))
    return doc.Document(f"Calibration drift: `{c.output}` against `{c.base_path}`", heading, sections)


def _heading(calibration: Calibration) -> list[str]:
    c, meta = calibration, calibration.profile.metadata
    return [f"new traces: {c.trace_dir}",
            f"new profile: {c.output} (version {meta['version']}, created {meta['created_at']})",
            f"parent: {c.base_path} (version {meta['parent']['version']}, metadata.json sha256 "
            f"{meta['parent']['sha256']})"]


def render_markdown(calibration: Calibration) -> str:
    """``report.md``."""
    return doc.render_markdown(document(calibration))


def render_html(calibration: Calibration) -> str:
    """``report.html``: the same sections and a plot of every ratio with its noise band."""
    return doc.render_html(document(calibration, with_figures=True),
                           page_title=f"vtrain calibrate: {calibration.output.name}")


def ratio_figure(calibration: Calibration) -> go.Figure | None:
    """Every row in both profiles: ratio new/old against the old median, with its noise band, coloured by status."""
    figure = go.Figure()
    symbols = {COLLECTIVE: "diamond", KERNEL: "circle", OP: "square"}
    for kind, frame in calibration.drift.tables().items():
        both = frame.filter(pl.col("ratio").is_not_null() & (pl.col("ratio") > 0))
        if both.is_empty():
            continue
        ratio, band = both["ratio"], both["band"]
        figure.add_trace(go.Scatter(
            x=both["old_median_us"].to_list(), y=ratio.to_list(), mode="markers", name=kind,
            marker={"symbol": symbols[kind], "color": [_COLOURS.get(s, "#4c78a8") for s in both["status"]]},
            error_y={"type": "data", "symmetric": False, "array": (ratio * band - ratio).to_list(),
                     "arrayminus": (ratio - ratio / band).to_list(), "thickness": 1, "width": 0},
            hovertext=[f"{label} ({status})" for label, status in zip(both["label"], both["status"])],
            hovertemplate="%{hovertext}<br>old median %{x:.3f} µs, ratio %{y:.3f}<extra></extra>"))
    if not figure.data:
        return None
    figure.update_layout(title="Ratio new/old median per row, with its noise band (red slower, green faster)",
                         xaxis={"type": "log", "title": "old median µs"},
                         yaxis={"type": "log", "title": "new / old"}, height=560)
    return figure


def write_drift_report(calibration: Calibration, folder: Path) -> None:
    """``report.md``, ``report.html``, ``drift.json`` and ``tables/{op,collective,kernel}.parquet``."""
    write_text(folder / "report.md", render_markdown(calibration))
    write_text(folder / "report.html", render_html(calibration))
    write_json(folder / "drift.json", calibration.to_dict())
    tables = folder / "tables"
    tables.mkdir()
    for kind, frame in calibration.drift.tables().items():
        frame.write_parquet(tables / f"{kind}.parquet")


def print_drift(calibration: Calibration, console: Console | None = None) -> None:
    """The rows that moved (largest change first), the software that changed, the reference run, the paths."""
    console = console or stdout_console()
    c = calibration
    moved = c.drift.drifted()
    table = RichTable(title=f"{c.output} against {c.base_path}: {len(moved)} row(s) moved")
    for column in ("kind", "status", "ratio", "beyond", "old µs", "new µs", ""):
        table.add_column(column, justify="left" if column in ("kind", "status", "") else "right")
    for row in moved[:PRINTED]:
        label = row["label"] if len(row["label"]) <= LABEL else row["label"][:LABEL - 1] + "…"
        table.add_row(row["kind"], row["status"], _ratio(row["ratio"]), _band(row["threshold"], None),
                      _us(row["old_median_us"]), _us(row["new_median_us"]), label)
    console.print(table)
    if len(moved) > PRINTED:
        console.print(f"  … and {len(moved) - PRINTED} more (report.md, drift.json)")
    found = c.drift.counts()
    console.print("  " + "; ".join(f"{kind}: " + ", ".join(f"{n} {s}" for s, n in found[kind].items() if n)
                                   for kind in found if any(found[kind].values())))
    for key, change in c.drift.software.items():
        console.print(f"  {key}: {version(change['old'])} -> {version(change['new'])}")
    if c.reference is not None:
        r = c.reference
        console.print(f"  reference {r['config']}: {ms(r['old_ms'])} ms -> {ms(r['new_ms'])} ms "
                      f"({pct(r['change_pct'])})")
    else:
        console.print(f"  reference run not predicted: {c.reference_reason}")
    console.print(f"profile: {c.output} (parent {c.base_path})")
    console.print(f"report: {c.report_dir}/report.md, report.html, drift.json")
