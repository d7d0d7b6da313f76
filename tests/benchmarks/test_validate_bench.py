"""Speed and memory of the replay and of `vtrain validate`.

Run with `make bench`: the replay of the real 2-rank-of-V100 trace in process, the whole `vtrain validate`
process (without HTA, whose own parsing is benchmarked against ingest) on the generated 127 MB trace, with its
peak RSS in extra_info, and validate against its peer, HTA's parse of the same folder (`TraceAnalysis`), in the
same run: each tool's time and peak RSS side by side in HTA's row; and `vtrain validate --no-hta` on generated
multi-rank folders of 1 GB (and the sizes in ``VTRAIN_BENCH_GB``, as for ingest), whole process, with its peak RSS
per trace byte (issue 17).
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

import pytest

from tests.benchmarks.conftest import ProcessCost, run_measured
from tests.benchmarks.test_ingest_bench import HTA_PARSE
from tests.benchmarks.test_ingest_folder_bench import BIG_GB
from tests.benchmarks.trace_folder import V100_RANK, make_trace_folder
from tests.benchmarks.tree_rss import TreeCost, measured_from_a_fresh_process
from tests.conftest import TRACES
from vtrain.replay.replayer import replay
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


#: each tool's runs on the generated trace, to put them side by side
_PEER_RUNS: dict[str, list[ProcessCost]] = {}


@pytest.mark.parametrize("tool", ["validate", "hta"])
def test_validate_vs_hta_parse(benchmark, tool: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`vtrain validate --no-hta` (read once, replay, compare, write the replayed trace and the report) against
    HTA's parse alone of the same 127 MB folder, whole processes; the peak RSS per trace byte is the figure of
    issue 17 (HTA's users report about 4.75 bytes per trace byte)."""
    if not benchmark.enabled:
        pytest.skip("a whole-process measurement: runs with `make bench` only")
    trace_100mb: Path = request.getfixturevalue("trace_100mb")
    benchmark.group = "validate vs HTA's parse, 127 MB trace (whole process)"
    command = ([sys.executable, "-m", "vtrain.cli.main", "validate", str(trace_100mb), "-o",
                str(tmp_path / "report"), "--no-hta"] if tool == "validate"
               else [sys.executable, "-c", HTA_PARSE, str(trace_100mb)])
    costs: list[ProcessCost] = []
    benchmark.pedantic(lambda: costs.append(run_measured(command)), rounds=1, iterations=1)
    input_mb = sum(f.stat().st_size for f in trace_100mb.iterdir()) / 1e6
    peak = max(c.max_rss_mb for c in costs)
    benchmark.extra_info.update(max_rss_mb=round(peak, 1), input_mb=round(input_mb, 1),
                                rss_per_trace_byte=round(peak / input_mb, 2))
    _PEER_RUNS[tool] = costs
    if tool == "hta" and "validate" in _PEER_RUNS:
        ours, theirs = _PEER_RUNS["validate"], _PEER_RUNS["hta"]
        benchmark.extra_info.update(
            validate_s=round(statistics.median(c.seconds for c in ours), 2),
            hta_parse_s=round(statistics.median(c.seconds for c in theirs), 2),
            validate_max_rss_mb=round(max(c.max_rss_mb for c in ours), 1),
            hta_parse_max_rss_mb=round(max(c.max_rss_mb for c in theirs), 1))


@pytest.mark.parametrize("gb", [1.0, *BIG_GB])
def test_validate_folder_memory(benchmark, gb: float, tmp_path_factory: pytest.TempPathFactory) -> None:
    """`vtrain validate --no-hta` on a generated folder of 127 MB ranks (the V100 rank repeated, as the ranks of
    one job): wall time, peak RSS of the whole process tree, and peak RSS per trace byte. The folder and the
    report are removed afterwards (a folder may be 10 GB)."""
    if not benchmark.enabled:
        pytest.skip("a whole-process measurement: runs with `make bench` only")
    folder = tmp_path_factory.mktemp(f"validate{gb:g}gb")
    report = folder.parent / f"report{gb:g}gb"
    costs: list[TreeCost] = []
    try:
        make_trace_folder(V100_RANK, folder, total_bytes=int(gb * 1e9), ranks=max(1, round(gb * 1e9 / 127e6)))
        input_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
        command = [sys.executable, "-m", "vtrain.cli.main", "validate", str(folder), "-o", str(report), "--no-hta"]

        def once() -> None:
            cost = measured_from_a_fresh_process(command)
            assert cost.code == 0, cost.stderr
            costs.append(cost)

        benchmark.group = f"validate a {gb:g} GB folder (whole process, no HTA)"
        benchmark.pedantic(once, rounds=1, iterations=1)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(report, ignore_errors=True)
    cost = costs[-1]
    benchmark.extra_info.update(input_mb=round(input_mb, 1), seconds=round(cost.seconds, 2),
                                tree_max_rss_mb=round(cost.tree_max_rss_mb, 1),
                                rss_per_trace_byte=round(cost.tree_max_rss_mb / input_mb, 2))
