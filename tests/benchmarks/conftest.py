"""Benchmark helpers: generated large traces and whole-process measurement."""

from __future__ import annotations

import json
import subprocess
import sys
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


#: runs a command and prints its wall time and peak RSS. A process spawned by pytest starts with pytest's own
#: peak RSS (Linux carries the parent's high-water mark over the exec), hundreds of MB once a large trace was
#: generated, so each tool is spawned by this small launcher instead.
_LAUNCHER = """
import json, os, subprocess, sys, time
started = time.perf_counter()
process = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
_, status, usage = os.wait4(process.pid, 0)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "max_rss_mb": usage.ru_maxrss / 1024,
                  "code": os.waitstatus_to_exitcode(status), "stderr": process.stderr.read().decode()[-2000:]}))
"""


def run_measured(command: list[str]) -> ProcessCost:
    """Run a whole process from :data:`_LAUNCHER`; its wall time and its own peak resident set size."""
    launched = subprocess.run([sys.executable, "-c", _LAUNCHER, *command], capture_output=True, text=True,
                              check=True)
    result = json.loads(launched.stdout)
    if result["code"] != 0:
        raise AssertionError(f"{command} failed ({result['code']}): {result['stderr']}")
    return ProcessCost(seconds=result["seconds"], max_rss_mb=result["max_rss_mb"])


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
