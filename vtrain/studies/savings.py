"""Cost-optimal parallelisation: what the plans `vtrain plan` found save over the plan a run actually used.

``python -m vtrain.cli.savings PLAN_DIR [PLAN_DIR ...]`` (:func:`savings_table`) reads each plan folder (``summary.json``: the
reference plan, i.e. the run config's own parallelism; ``plans.parquet``: every plan) and prints, per folder, a
Markdown table of the original plan against the best plan on the same GPUs, the cheapest plan no slower than the
original, and the cheapest and the fastest plans overall, with the time and money each saves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError


@dataclass(frozen=True)
class Choice:
    """One plan picked from a sweep, and why."""

    why: str
    row: dict[str, Any]


def choices(folder: Path) -> tuple[dict[str, Any], list[Choice]]:
    """The original (reference) plan of a plan folder and the plans compared with it."""
    summary_file, plans_file = folder / "summary.json", folder / "plans.parquet"
    if not summary_file.is_file() or not plans_file.is_file():
        raise InputError("not a plan folder (no summary.json and plans.parquet): run `vtrain plan` first", folder)
    reference = json.loads(summary_file.read_text()).get("reference")
    if not reference or reference.get("days") is None:
        raise InputError("the plan folder has no timed reference plan: give `vtrain plan` a run config "
                         "with the original parallelism", folder)
    timed = pl.read_parquet(plans_file).filter(pl.col("status") == "simulated")
    picks = [
        ("best plan on the same GPUs", timed.filter(pl.col("gpus") == reference["gpus"]).sort(["usd", "days"])),
        ("cheapest plan no slower than the original",
         timed.filter(pl.col("days") <= reference["days"]).sort(["usd", "days"])),
        ("cheapest plan", timed.sort(["usd", "days"])),
        ("fastest plan", timed.sort(["days", "usd"])),
    ]
    return reference, [Choice(why, frame.row(0, named=True)) for why, frame in picks if frame.height]


def savings_table(folder: Path) -> str:
    """The Markdown comparison of one plan folder."""
    from vtrain.plan.report import label

    reference, picked = choices(folder)
    lines = ["| plan | GPUs | s/iteration | MFU | days | USD | time saved | money saved |",
             "|---|---|---|---|---|---|---|---|",
             _line("original: " + label(reference), reference, reference)]
    lines += [_line(f"{choice.why}: {label(choice.row)}", choice.row, reference) for choice in picked]
    return "\n".join(lines) + "\n"


def _line(name: str, row: dict[str, Any], reference: dict[str, Any]) -> str:
    time_saved = 1 - row["days"] / reference["days"]
    money_saved = 1 - row["usd"] / reference["usd"]
    return (f"| {name} | {row['gpus']:,} | {row['iteration_ms'] / 1e3:.2f} | {row['mfu']:.1%} | {row['days']:.1f} "
            f"| {row['usd']:,.0f} | {time_saved:+.1%} | {money_saved:+.1%} |")
