"""Time and peak memory of `vtrain ingest` on large multi-rank folders, against HTA's TraceAnalysis parse of the
same folder in the same run (the peer it replaces), whole process with all its workers.

The folders are generated from real shipped traces (:mod:`tests.benchmarks.trace_folder`, never committed): the
V100 rank repeated to 64 MB or 127 MB per rank, and the sm80 rank of a 128-rank job copied to 128 and 1,000 ranks.
Memory is the peak of the summed resident sets of the process and its workers (:mod:`tests.benchmarks.tree_rss`);
both tools read ranks in parallel (vtrain with ``--workers``, by default one per core; HTA with a process pool of
the same size). The 1,000-rank folder is ingested by vtrain alone (see :func:`folder_1000_ranks`). The 4 GB and
10 GB folders are made only when ``VTRAIN_BENCH_GB`` names them (``4,10``): they need that much free disk and
minutes per run. Run with `make bench`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.benchmarks.trace_folder import SM80_RANK, V100_RANK, make_trace_folder
from tests.benchmarks.tree_rss import TreeCost, measured_from_a_fresh_process
from vtrain.ingest.pipeline import default_workers

#: HTA's parse of a folder, checked to have read every rank (HTA finds a file's rank by a regular expression and
#: takes files it finds none in as rank 0, one overwriting the other)
HTA_PARSE = ("from hta.trace_analysis import TraceAnalysis; import os, sys; "
             "parsed = TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True); "
             "files = [f for f in os.listdir(sys.argv[1]) if '.json' in f]; "
             "assert len(parsed.t.traces) == len(files), (len(parsed.t.traces), len(files))")
#: folder sizes (GB) measured for vtrain alone, besides 1 GB, when asked for in VTRAIN_BENCH_GB
BIG_GB = [float(gb) for gb in os.environ.get("VTRAIN_BENCH_GB", "").split(",") if gb.strip()]
#: peak memory allowed for the ingesting process and for each worker, whatever the folder's size (a worker holds
#: one 127 MB rank at a time: about 430 MB measured)
MAX_RSS_MB_PER_PROCESS = 512

_RUNS: dict[tuple[str, str], TreeCost] = {}


def _command(tool: str, trace_dir: Path, out: Path) -> list[str]:
    if tool == "vtrain":
        return [sys.executable, "-m", "vtrain.cli.main", "ingest", str(trace_dir), "-o", str(out), "--force"]
    return [sys.executable, "-c", HTA_PARSE, str(trace_dir)]


def _measure(benchmark, tool: str, folder: Path, out: Path, group: str) -> TreeCost:
    costs: list[TreeCost] = []

    def once() -> None:
        cost = measured_from_a_fresh_process(_command(tool, folder, out))
        assert cost.code == 0, cost.stderr
        costs.append(cost)

    benchmark.group = group
    benchmark.pedantic(once, rounds=1, iterations=1)
    cost = costs[-1]
    input_mb = sum(f.stat().st_size for f in folder.iterdir()) / 1e6
    benchmark.extra_info.update(input_mb=round(input_mb, 1), files=len(list(folder.iterdir())),
                                seconds=round(cost.seconds, 2), tree_max_rss_mb=round(cost.tree_max_rss_mb, 1),
                                largest_process_max_rss_mb=round(cost.max_rss_mb, 1))
    _RUNS[(group, tool)] = cost
    other = _RUNS.get((group, "vtrain"))
    if tool == "hta" and other:
        benchmark.extra_info.update(vtrain_s=round(other.seconds, 2), hta_s=round(cost.seconds, 2),
                                    speedup=round(cost.seconds / other.seconds, 2),
                                    vtrain_tree_max_rss_mb=round(other.tree_max_rss_mb, 1),
                                    hta_tree_max_rss_mb=round(cost.tree_max_rss_mb, 1))
    return cost


@pytest.fixture(scope="module")
def folder_256mb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 ranks of 64 MB: the real V100 rank repeated, as rank 0-3 of one job."""
    folder = tmp_path_factory.mktemp("folder256mb")
    make_trace_folder(V100_RANK, folder, total_bytes=256_000_000, ranks=4)
    return folder


def _small_ranks(tmp_path_factory: pytest.TempPathFactory, ranks: int) -> Path:
    folder = tmp_path_factory.mktemp(f"ranks{ranks}")
    make_trace_folder(SM80_RANK, folder, total_bytes=1, ranks=ranks, compress=True)
    return folder


@pytest.fixture(scope="module")
def folder_128_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sm80 job's 128 ranks: gzip files of 120 kB (1.7 MB of JSON each), the real rank 0 as each rank."""
    return _small_ranks(tmp_path_factory, 128)


@pytest.fixture(scope="module")
def folder_1000_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,000 such ranks (1.7 GB of JSON): for vtrain alone, HTA would hold about 15 GB (9x the JSON, measured on
    the 127 MB trace) on this shared 24 GB machine."""
    return _small_ranks(tmp_path_factory, 1000)


@pytest.mark.parametrize("tool", ["vtrain", "hta"])
def test_ingest_4_ranks_vs_hta(benchmark, tool: str, folder_256mb: Path, tmp_path: Path) -> None:
    _measure(benchmark, tool, folder_256mb, tmp_path / "profile", "ingest 4 ranks x 64 MB (whole process tree)")


@pytest.mark.parametrize("tool", ["vtrain", "hta"])
def test_ingest_128_ranks_vs_hta(benchmark, tool: str, folder_128_ranks: Path, tmp_path: Path) -> None:
    _measure(benchmark, tool, folder_128_ranks, tmp_path / "profile", "ingest 128 small ranks (whole process tree)")


def test_ingest_1000_ranks(benchmark, folder_1000_ranks: Path, tmp_path: Path) -> None:
    cost = _measure(benchmark, "vtrain", folder_1000_ranks, tmp_path / "profile",
                    "ingest 1,000 small ranks (whole process tree)")
    workers = default_workers(sorted(folder_1000_ranks.iterdir()))
    assert cost.tree_max_rss_mb < MAX_RSS_MB_PER_PROCESS * (1 + workers), f"{cost.tree_max_rss_mb:.0f} MB"


@pytest.mark.parametrize("gb", [1.0, *BIG_GB])
def test_ingest_folder_memory_is_bounded(benchmark, gb: float, tmp_path_factory: pytest.TempPathFactory) -> None:
    """vtrain alone on 1 GB (and VTRAIN_BENCH_GB) folders of 127 MB ranks: peak memory stays bounded by a rank
    at a time per process, whatever the folder's size. The folder is removed afterwards (it may be 10 GB)."""
    folder = tmp_path_factory.mktemp(f"folder{gb:g}gb")
    try:
        make_trace_folder(V100_RANK, folder, total_bytes=int(gb * 1e9), ranks=max(1, round(gb * 1e9 / 127e6)))
        workers = default_workers(sorted(folder.iterdir()))
        cost = _measure(benchmark, "vtrain", folder, folder.parent / f"profile{gb:g}gb",
                        f"ingest a {gb:g} GB folder (whole process tree)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.parent / f"profile{gb:g}gb", ignore_errors=True)
    benchmark.extra_info["workers"] = workers
    limit = MAX_RSS_MB_PER_PROCESS * (1 + workers)
    assert cost.tree_max_rss_mb < limit, f"{cost.tree_max_rss_mb:.0f} MB for {gb:g} GB with {workers} workers"
