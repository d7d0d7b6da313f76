"""Speed and memory of the replay and of `vtrain validate`.

Run with `make bench`: the replay of the real 2-rank-of-V100 trace in process, and the whole `vtrain validate`
process (without HTA, whose own parsing is benchmarked against ingest) on the generated 127 MB trace, with its
peak RSS in extra_info.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import ProcessCost, run_measured
from tests.conftest import TRACES
from vtrain.replay.run import replay
from vtrain.replay.trace import read_trace_set

V100 = TRACES / "hta-v100-2rank"


def test_replay_v100_trace(benchmark) -> None:
    benchmark.group = "replay"
    traces = read_trace_set(V100)
    result = benchmark.pedantic(replay, args=(traces,), rounds=3 if benchmark.enabled else 1, iterations=1)
    benchmark.extra_info["events"] = result.events.height
    benchmark.extra_info["edges"] = sum(result.edge_counts.values())


def test_validate_100mb_whole_process(benchmark, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if not benchmark.enabled:
        pytest.skip("a whole-process measurement: runs with `make bench` only")
    trace_100mb: Path = request.getfixturevalue("trace_100mb")
    benchmark.group = "validate a 127 MB trace (whole process, no HTA)"
    costs: list[ProcessCost] = []
    command = [sys.executable, "-m", "vtrain.cli.main", "validate", str(trace_100mb), "-o", str(tmp_path / "report"),
               "--no-hta"]

    def once() -> None:
        costs.append(run_measured(command))

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info["max_rss_mb"] = round(max(c.max_rss_mb for c in costs), 1)
    benchmark.extra_info["input_mb"] = round(sum(f.stat().st_size for f in trace_100mb.iterdir()) / 1e6, 1)
