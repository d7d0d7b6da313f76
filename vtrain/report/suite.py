"""The summary of a validation suite: one row per trace set, with its bounds and whether it passed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from vtrain.report.console import stdout_console
from vtrain.report.document import markdown_table
from vtrain.report.tables import Table, ms, pct
from vtrain.validate.suite import Suite, SuiteEntry, check


@dataclass
class SetResult:
    """One trace set's outcome."""

    entry: SuiteEntry
    summary: dict[str, Any]  # Validation.summary()

    def error(self, prediction: str) -> float | None:
        part = self.summary.get(prediction)
        return None if part is None else part["error_pct"]

    @property
    def passed(self) -> bool:
        return (check(self.error("replay"), self.entry.max_replay_error_pct)
                and check(self.error("model"), self.entry.max_model_error_pct))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.entry.name, "traces": str(self.entry.traces), **self.summary,
                "max_replay_error_pct": self.entry.max_replay_error_pct,
                "max_model_error_pct": self.entry.max_model_error_pct, "passed": self.passed}


def summary_table(results: list[SetResult]) -> Table:
    header = ["set", "measured ms", "replay", "bound", "model ms", "model", "bound", "ok"]
    rows = []
    for r in results:
        replay, model = r.summary["replay"], r.summary.get("model")
        rows.append([r.entry.name, ms(replay["measured_ms"]), pct(replay["error_pct"]),
                     _bound(r.entry.max_replay_error_pct), ms(model["predicted_ms"]) if model else "–",
                     pct(model["error_pct"]) if model else "no run",
                     _bound(r.entry.max_model_error_pct), "yes" if r.passed else "NO"])
    return header, rows


def _bound(value: float | None) -> str:
    return "–" if value is None else f"±{value:g} %"


def render_suite_markdown(suite: Suite, results: list[SetResult]) -> str:
    passed = sum(r.passed for r in results)
    lines = [f"# Validation suite `{suite.name}`\n", suite.description + "\n" if suite.description else "",
             f"{passed} of {len(results)} trace sets within their bounds. Each set's full report is in its "
             f"folder (`<set>/report.md`, `report.html`, `metrics.json`).\n",
             markdown_table(summary_table(results))]
    return "\n".join(lines)


def print_suite(suite: Suite, results: list[SetResult], target: str, console: Console | None = None) -> None:
    console = console or stdout_console()
    header, rows = summary_table(results)
    table = RichTable(title=f"suite {suite.name}: {sum(r.passed for r in results)} of {len(results)} within bounds")
    for k, column in enumerate(header):  # a set's name folds onto a second line, never cut (h200-val-... x6)
        table.add_column(column, justify="left" if k == 0 else "right", overflow="fold" if k == 0 else "ellipsis")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"report: {target}/suite.md, metrics.json and one folder per set")
