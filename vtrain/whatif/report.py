"""The what-if report: ``report.md``, a self-contained ``report.html``, ``whatif.json`` and the predicted Chrome
traces (``predicted/rank-N.json.gz``: Perfetto opens them, HTA loads them like the measured ones)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from vtrain.accuracy import error_pct
from vtrain.outputs import write_json, write_text
from vtrain.replay.chrome import write_replayed_traces
from vtrain.report import document as doc
from vtrain.report.tables import Table, ms, pct, share
from vtrain.whatif.critical import mean_by
from vtrain.whatif.retime import WhatIf, to_ms

_TOP_OPS = 15


def write_whatif_report(w: WhatIf, folder: Path) -> None:
    """Everything into ``folder`` (a staging folder)."""
    predicted = folder / "predicted"
    predicted.mkdir()
    write_replayed_traces(w.replay, predicted)
    write_json(folder / "whatif.json", w.to_dict())
    write_text(folder / "report.md", render_markdown(w))
    write_text(folder / "report.html", render_html(w))


def headline(w: WhatIf) -> Table:
    """Median iteration time over the steady iterations."""
    s = w.summary()
    rows = [["measured (this trace set)", ms(s["measured_ms"]), ""],
            ["replay (unchanged durations)", ms(s["replay_ms"]), pct(error_pct(s["replay_ms"], s["measured_ms"]))],
            ["predicted", ms(s["predicted_ms"]), pct(s["change_pct"])]]
    if "other_measured_ms" in s:
        rows.append(["measured (--durations-from)", ms(s["other_measured_ms"]),
                     pct(error_pct(s["other_measured_ms"], s["measured_ms"]))])
        rows.append(["prediction error against it", "", pct(s["error_pct"])])
    return ["", "median iteration ms", "vs measured"], rows


def per_iteration(w: WhatIf) -> Table:
    other = w.other_measured_us is not None
    header = ["iteration", "measured ms", "predicted ms", "change"] + (["other measured ms", "error"] if other else [])
    rows = []
    for i in w.iterations:
        measured, predicted = to_ms(w.measured_us.get(i)), to_ms(w.predicted_us.get(i))
        row = [f"{i}{'' if i in w.steady else ' (not steady)'}", ms(measured), ms(predicted),
               pct(error_pct(predicted, measured))]
        if other:
            reference = to_ms(w.other_measured_us.get(i))
            row += [ms(reference), pct(error_pct(predicted, reference))]
        rows.append(row)
    return header, rows


def critical_classes(w: WhatIf) -> Table:
    """Mean time per steady iteration on the critical path, per class: before and after the change."""
    before, after = mean_by(w.baseline_paths, "by_class"), mean_by(w.predicted_paths, "by_class")
    total_before, total_after = sum(before.values()) or 1.0, sum(after.values()) or 1.0
    keys = sorted(set(before) | set(after), key=lambda k: -max(before.get(k, 0.0), after.get(k, 0.0)))
    return (["class", "replay ms", "share", "predicted ms", "share", "moved ms"],
            [[k, ms(before.get(k, 0.0) / 1e3), share(100 * before.get(k, 0.0) / total_before),
              ms(after.get(k, 0.0) / 1e3), share(100 * after.get(k, 0.0) / total_after),
              _signed_ms((after.get(k, 0.0) - before.get(k, 0.0)) / 1e3)] for k in keys])


def moved_ops(w: WhatIf) -> Table:
    """The operators whose time on the critical path changed most (mean per steady iteration)."""
    before, after = mean_by(w.baseline_paths, "by_op"), mean_by(w.predicted_paths, "by_op")
    keys = sorted(set(before) | set(after), key=lambda k: -abs(after.get(k, 0.0) - before.get(k, 0.0)))
    rows = [[name, cls, ms(before.get((cls, name), 0.0) / 1e3), ms(after.get((cls, name), 0.0) / 1e3),
             _signed_ms((after.get((cls, name), 0.0) - before.get((cls, name), 0.0)) / 1e3)]
            for cls, name in keys[:_TOP_OPS] if after.get((cls, name), 0.0) != before.get((cls, name), 0.0)]
    return ["operator", "class", "on path before ms", "on path after ms", "moved ms"], rows


def unmatched(w: WhatIf) -> list[tuple[str, Table]]:
    if w.matching is None:
        return []
    out = []
    for title, frame in ((f"in {w.trace_dir} only (kept their own duration)", w.matching.unmatched_base),
                         (f"in {w.other_dir} only (their time counts for the matched operator around them)",
                          w.matching.unmatched_other)):
        out.append((title, (["name", "kind", "events", "own time ms"],
                            [[r["name"], r["kind"], str(r["events"]), ms(r["own_ms"])]
                             for r in frame.head(20).iter_rows(named=True)])))
    return out


def document(w: WhatIf, *, with_figures: bool = False) -> doc.Document:
    """The report's sections, in order; with ``with_figures`` the critical path per class, before and after."""
    sections = [
        doc.Section("Iteration time", [doc.TableBlock(headline(w)), doc.TableBlock(per_iteration(w)),
                                       *([doc.Figure(_figure(w))] if with_figures else [])]),
        doc.Section("Critical path per class (mean per steady iteration)",
                    [doc.Text(_path_note(), note=True), doc.TableBlock(critical_classes(w))]),
        doc.Section("Operators that moved the critical path", [doc.TableBlock(moved_ops(w))]),
        *(doc.Section(f"Unmatched events {title}", [doc.TableBlock(table)]) for title, table in unmatched(w)),
    ]
    if w.notes:
        sections.append(doc.Section("Notes", [doc.Bullets(list(w.notes))]))
    return doc.Document(f"What-if: {w.trace_dir}", [doc.Text(_description(w))], sections)


def render_markdown(w: WhatIf) -> str:
    """The whole report as Markdown."""
    return doc.render_markdown(document(w))


def render_html(w: WhatIf) -> str:
    """The whole report as one self-contained page."""
    return doc.render_html(document(w, with_figures=True), page_title="vtrain whatif")


def _figure(w: WhatIf) -> go.Figure:
    before, after = mean_by(w.baseline_paths, "by_class"), mean_by(w.predicted_paths, "by_class")
    keys = sorted(set(before) | set(after), key=lambda k: -before.get(k, 0.0))
    figure = go.Figure([go.Bar(name="replay", x=keys, y=[before.get(k, 0.0) / 1e3 for k in keys]),
                        go.Bar(name="predicted", x=keys, y=[after.get(k, 0.0) / 1e3 for k in keys])])
    figure.update_layout(barmode="group", title="Critical path per class (ms per steady iteration)", height=420)
    return figure


def _description(w: WhatIf) -> str:
    changes = []
    if w.other_dir is not None:
        what = ("every operator's, kernel's and collective transfer's own time" if w.ops_only else
                "every operator's, kernel's and collective transfer's own time and every host stretch (a thread's "
                "time between operators)")
        changes.append(f"{what} from {w.other_dir} (matched per rank, iteration and occurrence; waits recomputed)")
    changes += [f"{c} ({w.scale_hits.get(c.rsplit('=', 1)[0], 0)} events)" for c in w.changes]
    return (f"Changes: {'; '.join(changes) or 'none'}. Predicted by re-evaluating the replay graph of the trace set "
            f"(thread order, launches, streams, syncs, collectives matched across ranks) with the changed "
            f"durations: modelled from measured dependencies. Steady iterations: {w.steady}; iteration time is "
            f"the mean over ranks of ProfilerStep#N start to its end (or its last device activity's).")


def _path_note() -> str:
    return ("From the iteration's last point on any rank back to its first start, following the dependency that "
            "set each point's time. Classes in parentheses are time that belongs to no operator.")


def _signed_ms(value: float) -> str:
    return f"{value:+,.3f}"
