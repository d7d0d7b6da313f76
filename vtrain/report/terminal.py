"""The short tables printed on the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from vtrain.report import tables
from vtrain.report.console import stdout_console
from vtrain.validate.traces import Validation


def print_summary(v: Validation, report_dir: str, console: Console | None = None) -> None:
    """Iteration time of both predictions, the largest per-class errors, and where the report is."""
    console = console or stdout_console()
    header, rows = tables.headline(v.replay, v.model)
    table = Table(title=f"{v.trace_dir}: iteration time")
    for k, column in enumerate(header):  # the prediction's name whole: the other columns wrap first
        table.add_column(column, justify="left" if k == 0 else "right", no_wrap=k == 0)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if v.model is None:
        console.print(f"model: {v.model_reason}")
    else:
        for line in tables.where_the_error_comes_from(v.model)[:4]:
            console.print(f"  model {line}")
    console.print(f"report: {report_dir}/report.md, report.html, metrics.json")
