"""Shared fixtures: paths of the shipped trace sets, and their traces and profiles read once per test run."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from vtrain.replay.trace import RankTrace
    from vtrain.tables.store import Profile

REPO = Path(__file__).resolve().parents[1]

#: what vtrain derives from profiles (:mod:`vtrain.cache`) is kept in a folder of this test run, shared by its
#: workers and the commands they start (they inherit the environment), never in the user's cache
if "VTRAIN_TEST_CACHE" not in os.environ:
    os.environ["VTRAIN_TEST_CACHE"] = os.environ["VTRAIN_CACHE_DIR"] = tempfile.mkdtemp(prefix="vtrain-cache-")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the test run's cache folder (once, by the process that made it: not by an xdist worker)."""
    if not hasattr(session.config, "workerinput"):
        shutil.rmtree(os.environ["VTRAIN_TEST_CACHE"], ignore_errors=True)
TRACES = REPO / "traces"
HTA_TRACE_SETS = sorted(p for p in TRACES.glob("hta-*") if p.is_dir())


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shipped_traces() -> Callable[[Path], list[RankTrace]]:
    """``read_trace_set`` of a trace folder in traces/, read once per test run: the replay and the model's
    accuracy tests read the same real traces (the replay and the timeline leave what they are given unchanged).
    Only for folders no test writes to."""
    from vtrain.replay.trace import read_trace_set

    read = functools.cache(read_trace_set)
    return lambda folder: list(read(Path(folder)))


@pytest.fixture(scope="session")
def shipped_profile() -> Callable[[Path], Profile]:
    """``ingest_traces`` of a trace folder in traces/ (default options), ingested once per test run: several test
    files check the tables of the same real traces. Only for folders no test writes to. Each call gives its own
    copy of the profile's table dict, metadata and path (``write_profile`` sets the path); the tables themselves
    are shared (polars frames are not changed in place)."""
    from vtrain.ingest.pipeline import ingest_traces

    ingest = functools.cache(ingest_traces)

    def profile(folder: Path) -> Profile:
        ingested = ingest(Path(folder))
        return dataclasses.replace(ingested, tables=dict(ingested.tables),
                                   metadata=copy.deepcopy(ingested.metadata))

    return profile


def vtrain_in_process(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``vtrain ARGS`` through the console script's entry point in this process, as a finished process: exit code,
    stdout and stderr as a process gives them (an uncaught exception's traceback written to stderr as the
    interpreter would; see :func:`tests.test_hostile_inputs.run_cli`). It spares a second of start-up a call;
    each command keeps tests that run it as a real process."""
    from tests.test_hostile_inputs import run_cli

    ran = run_cli([str(arg) for arg in args], cwd)
    return subprocess.CompletedProcess(["vtrain", *map(str, args)], ran.code, ran.out, ran.err)


def one_trace_folders(factory: pytest.TempPathFactory, files: dict[str, tuple[str, bytes]]) -> dict[str, Path]:
    """A folder per name, holding the one trace file ``files[name]`` gives (its file name and bytes): traces made
    from a shipped one by a test, never committed."""
    made = {}
    for name, (file, data) in files.items():
        folder = factory.mktemp(name)
        (folder / file).write_bytes(data)
        made[name] = folder
    return made


def changed_trace(source: Path, change: Callable[[list[dict]], None]) -> bytes:
    """A shipped gzip trace as JSON text after ``change`` edited its events in place."""
    import gzip
    import json

    trace = json.loads(gzip.decompress(source.read_bytes()))
    change(trace["traceEvents"])
    return json.dumps(trace).encode()
