"""Host events (CPU ops, runtime calls, ProfilerStep annotations) with a time no profile can have are left out and
said, by `vtrain ingest` and `vtrain validate` alike (:func:`vtrain.kineto.absurd_host_events`). Before, a
ProfilerStep lasting 10^18 µs (a corrupt duration) became a 5·10^14 ms measured iteration in validate's report, and
an op starting at 10^300 µs went unmentioned in both."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import TRACES, changed_trace, one_trace_folders, vtrain_in_process
from vtrain.ingest.pipeline import ingest_traces
from vtrain.kineto import absurd_host_events
from vtrain.limits import MAX_TRACE_US
from vtrain.replay.trace import read_rank_trace

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"
WARNING = "left out 1 CPU ops or runtime calls with an absurd time"


def _step(events: list[dict[str, Any]]) -> dict[str, Any]:
    return [event for event in events if str(event.get("name", "")).startswith("ProfilerStep")][1]


def _op(events: list[dict[str, Any]]) -> dict[str, Any]:
    return [event for event in events if event.get("cat") == "cpu_op"][3]


CASES = {"step-lasting-1e18-us": (_step, "dur", 1e18), "op-starting-at-1e300-us": (_op, "ts", 1e300)}


def _setting(pick: Callable[[list[dict[str, Any]]], dict[str, Any]], key: str, value: float) -> Callable:
    return lambda events: pick(events).__setitem__(key, value)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return one_trace_folders(tmp_path_factory, {
        name: ("rank-0.json", changed_trace(SOURCE, _setting(*case))) for name, case in CASES.items()})


@pytest.mark.parametrize("name", CASES)
def test_ingest_leaves_it_out_and_says_so(name: str, folders: dict[str, Path], shipped_profile: Any) -> None:
    warnings: list[str] = []
    profile = ingest_traces(folders[name], warn=warnings.append)
    assert profile["cpu_ops"].height == shipped_profile(SOURCE.parent)["cpu_ops"].height - 1
    assert profile["cpu_ops"]["ts"].max() < 1e300 and (profile["cpu_ops"]["dur"] < MAX_TRACE_US).all()
    assert sum(WARNING in line for line in warnings) == 1


@pytest.mark.parametrize("name", CASES)
def test_validate_leaves_it_out_and_says_so(name: str, folders: dict[str, Path], tmp_path: Path) -> None:
    assert read_rank_trace(folders[name] / "rank-0.json").absurd_host == 1
    ran = vtrain_in_process("validate", folders[name], "-o", tmp_path / "report", "--no-hta", "--json")
    assert ran.returncode == 0, ran.stderr
    assert WARNING in ran.stderr and WARNING in (tmp_path / "report" / "report.md").read_text()
    measured = json.loads(ran.stdout)["replay"]["measured_ms"]
    assert 100 < measured < 1000  # the trace's iterations take about 220 ms


def test_the_rule_is_relative_to_the_trace_not_to_the_epoch() -> None:
    epoch = 1.7e15  # µs since 1970: a trace written with wall-clock times
    ts = np.array([epoch, epoch + 10, epoch + 1e6, np.inf, epoch + 2 * MAX_TRACE_US, epoch - 2 * MAX_TRACE_US])
    dur = np.array([5.0, MAX_TRACE_US * 2, 1.0, 1.0, 1.0, 1.0])
    assert absurd_host_events(ts, dur).tolist() == [False, True, False, True, True, True]
