"""HolisticTraceAnalysis on a folder of traces: temporal breakdown and communication/computation overlap per
rank, the same calls on the measured traces and on each predicted one."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any


def hta_summary(trace_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``({rank: {idle_us, compute_us, non_compute_us, kernel_us, idle_pct, compute_pct, non_compute_pct,
    overlap_pct}}, None)``, or ``(None, reason)`` when HTA cannot analyse the folder (e.g. no device kernels
    in CPU-only traces). HTA's own output is swallowed."""
    logging.getLogger("hta").setLevel(logging.ERROR)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            analysis = hta_analysis(trace_dir)
            breakdown = analysis.get_temporal_breakdown(visualize=False)
            overlap = analysis.get_comm_comp_overlap(visualize=False)
    except Exception as exc:  # HTA raises many types (IndexError, KeyError, ValueError) on traces it cannot use
        return None, f"HTA could not analyse {trace_dir.name}: {type(exc).__name__}: {exc}"
    overlaps = {int(row["rank"]): float(row["comp_comm_overlap_pctg"]) for row in overlap.to_dict("records")}
    per_rank: dict[str, Any] = {}
    for row in breakdown.to_dict("records"):
        rank = int(row["rank"])
        per_rank[str(rank)] = {
            "idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]), "kernel_us": float(row["kernel_time(us)"]),
            "idle_pct": float(row["idle_time_pctg"]), "compute_pct": float(row["compute_time_pctg"]),
            "non_compute_pct": float(row["non_compute_time_pctg"]), "overlap_pct": overlaps.get(rank),
        }
    return per_rank, None


def hta_analysis(trace_dir: Path, include_last_profiler_step: bool = False) -> Any:
    """HTA's ``TraceAnalysis`` of a folder, its ranks parsed in this process. HTA's own constructor parses them in a
    pool of *forked* processes; forking a process that runs polars' (or Ray's) threads can copy a held lock into the
    child, which then waits forever (seen as a hung test run). ``Trace.load_traces`` can parse without forking."""
    from hta.common.trace import Trace
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis.__new__(TraceAnalysis)
    analysis.t = Trace(None, str(trace_dir))
    analysis.t.load_traces(include_last_profiler_step, use_multiprocessing=False)
    return analysis
