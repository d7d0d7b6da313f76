"""The replay on every real trace set shipped in traces/ (HTA's A100/V100 traces and the recorded CPU runs):
the replayed iteration time is within 2 % of the measured one, and the replayed trace loads in HTA."""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Callable
from functools import cache
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import TRACES
from vtrain.replay.chrome import write_replayed_traces
from vtrain.replay.replayer import Replay, replay
from vtrain.replay.trace import RankTrace
from vtrain.runconfig import load_run_config
from vtrain.validate.timeline import MEASURED, REPLAYED, annotate, iterations

TRACE_SETS = sorted(p for p in TRACES.iterdir() if p.is_dir() and any(p.glob("rank-*.json*")))


@pytest.fixture(scope="module")
def replayed_set(shipped_traces: Callable[[Path], list[RankTrace]]) -> Callable[[Path], Replay]:
    """Each set replayed once for the module, from its traces read once per test run (tests/conftest.py)."""
    @cache
    def replayed(trace_dir: Path) -> Replay:
        config = load_run_config(trace_dir) if (trace_dir / "run.yaml").exists() else None
        return replay(shipped_traces(trace_dir), config)

    return replayed


def job_iteration_ms(frame: pl.DataFrame, side) -> float:
    table = iterations(frame, side)
    steady = sorted(table["iteration"].unique().to_list())[1:]
    per_iteration = (table.filter(pl.col("iteration").is_in(steady)).group_by("iteration")
                     .agg(pl.col("time_us").mean())["time_us"].to_list())
    return statistics.median(per_iteration) / 1e3


@pytest.mark.parametrize("trace_dir", TRACE_SETS, ids=lambda p: p.name)
def test_replay_is_within_two_percent(trace_dir: Path, replayed_set: Callable[[Path], Replay]) -> None:
    replayed = replayed_set(trace_dir)
    frame = annotate(replayed.events)
    measured, predicted = job_iteration_ms(frame, MEASURED), job_iteration_ms(frame, REPLAYED)
    assert abs(predicted - measured) / measured <= 0.02, (measured, predicted)
    assert not replayed.notes


def test_recorded_runs_match_every_collective_across_ranks(replayed_set: Callable[[Path], Replay]) -> None:
    recorded = [p for p in TRACE_SETS if (p / "run.yaml").exists()]
    assert recorded, "no recorded trace set in traces/"
    for trace_dir in recorded:
        replayed = replayed_set(trace_dir)
        assert replayed.stats.collectives_matched > 0, trace_dir.name
        assert not replayed.stats.collective_calls_unmatched, (trace_dir.name, replayed.stats)


def test_replayed_traces_are_kineto_traces_at_the_replayed_times(tmp_path: Path,
                                                                 replayed_set: Callable[[Path], Replay]) -> None:
    trace_dir = next(p for p in TRACE_SETS if p.name == "hta-v100-1rank")
    replayed = replayed_set(trace_dir)
    [written] = write_replayed_traces(replayed, tmp_path)
    with gzip.open(written, "rt") as handle:
        document = json.load(handle)
    steps = sorted((e for e in document["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])
    expected = replayed.events.filter(pl.col("name").cat.starts_with("ProfilerStep#")).sort("ts")
    assert [round(e["dur"], 2) for e in steps] == [round(d, 2) for d in expected["sim_dur"].to_list()]
    assert document["distributedInfo"]["rank"] == 0
    assert not any(e.get("ph") in ("s", "f") for e in document["traceEvents"])
