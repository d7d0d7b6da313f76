"""Speed and memory of `vtrain ingest` against HTA's TraceAnalysis on the same generated traces, whole process.

Run with `make bench`; the results table groups both tools. extra_info holds each tool's peak RSS, and HTA's row
also the median time and peak RSS of both side by side (HTA runs after vtrain).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import ProcessCost, run_measured

HTA_PARSE = ("from hta.trace_analysis import TraceAnalysis; import sys; "
             "TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)")


#: each tool's runs on the 127 MB trace, to put them side by side
_RUNS: dict[str, list[ProcessCost]] = {}

def _command(tool: str, trace_dir: Path, out: Path) -> list[str]:
    if tool == "vtrain":
        return [sys.executable, "-m", "vtrain.cli.main", "ingest", str(trace_dir), "-o", str(out), "--force"]
    return [sys.executable, "-c", HTA_PARSE, str(trace_dir)]


@pytest.mark.parametrize("tool", ["vtrain", "hta"])
def test_ingest_100mb_vs_hta(benchmark, tool: str, trace_100mb: Path, tmp_path: Path) -> None:
    benchmark.group = "ingest a 127 MB trace (whole process)"
    costs: list[ProcessCost] = []

    def once() -> None:
        costs.append(run_measured(_command(tool, trace_100mb, tmp_path / "profile")))

    benchmark.pedantic(once, rounds=3 if benchmark.enabled else 1, iterations=1)
    benchmark.extra_info["max_rss_mb"] = round(max(c.max_rss_mb for c in costs), 1)
    benchmark.extra_info["input_mb"] = round(sum(f.stat().st_size for f in trace_100mb.iterdir()) / 1e6, 1)
    _RUNS[tool] = costs
    if tool == "hta" and "vtrain" in _RUNS:
        ours, theirs = _RUNS["vtrain"], _RUNS["hta"]
        vtrain_s = statistics.median(c.seconds for c in ours)
        hta_s = statistics.median(c.seconds for c in theirs)
        benchmark.extra_info.update(
            vtrain_median_s=round(vtrain_s, 3), hta_median_s=round(hta_s, 3), speedup=round(hta_s / vtrain_s, 2),
            vtrain_max_rss_mb=round(max(c.max_rss_mb for c in ours), 1),
            hta_max_rss_mb=round(max(c.max_rss_mb for c in theirs), 1))


def test_ingest_1gb_stays_under_4gb_rss(benchmark, trace_1gb: Path, tmp_path: Path) -> None:
    benchmark.group = "ingest a 1 GB trace (whole process)"
    costs: list[ProcessCost] = []

    def once() -> None:
        costs.append(run_measured(_command("vtrain", trace_1gb, tmp_path / "profile")))

    benchmark.pedantic(once, rounds=1, iterations=1)
    peak = max(c.max_rss_mb for c in costs)
    benchmark.extra_info["max_rss_mb"] = round(peak, 1)
    benchmark.extra_info["input_mb"] = round(sum(f.stat().st_size for f in trace_1gb.iterdir()) / 1e6, 1)
    assert peak < 4096, f"peak RSS {peak:.0f} MB for a 1 GB trace"
