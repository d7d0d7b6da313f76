"""Benchmark helpers: generated large traces and whole-process measurement."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.benchmarks.synth import repeat_trace
from tests.conftest import TRACES

SOURCE_TRACE = TRACES / "hta-v100-2rank" / "rank-1.json.gz"


@dataclass
class ProcessCost:
    seconds: float
    max_rss_mb: float


def run_measured(command: list[str]) -> ProcessCost:
    """Run a whole process; its wall time and its own peak resident set size (from wait4)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode() if process.stderr else ""
    if process.returncode != 0:
        raise AssertionError(f"{command} failed ({process.returncode}): {stderr[-2000:]}")
    return ProcessCost(seconds=seconds, max_rss_mb=usage.ru_maxrss / 1024)


def _generated(tmp_path_factory: pytest.TempPathFactory, name: str, min_bytes: int) -> Path:
    folder = tmp_path_factory.mktemp(name)
    repeat_trace(SOURCE_TRACE, folder / "rank-1.json", min_bytes)
    return folder


@pytest.fixture(scope="session")
def trace_100mb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A >= 100 MB single-rank trace: the real V100 trace repeated."""
    return _generated(tmp_path_factory, "trace100mb", 100_000_000)


@pytest.fixture(scope="session")
def trace_1gb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A >= 1 GB single-rank trace: the real V100 trace repeated (made here, never committed)."""
    return _generated(tmp_path_factory, "trace1gb", 1_000_000_000)
