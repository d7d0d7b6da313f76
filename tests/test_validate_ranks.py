"""`vtrain validate` reads a folder's ranks in parallel (``--workers``, ``--ray``): each rank file becomes its part of
the replay graph, its kept columns and its tables in a process of its own (:mod:`vtrain.validate.ranks`), and the
validation is that of reading them one at a time."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.benchmarks.trace_folder import V100_RANK, make_trace_folder
from tests.conftest import REPO, TRACES, vtrain_in_process
from vtrain.errors import InputError
from vtrain.validate.ranks import read_for_validation
from vtrain.validate.traces import prepare_validation

FOLDER = TRACES / "t1p1d2"  # two CPU ranks of a recorded data-parallel run, with its run.yaml: both predictions


def _validated(tmp_path: Path, name: str, *args: str) -> tuple[dict, dict[str, dict]]:
    """The --json summary (its report path left out) and the replayed traces (gzip's header holds a time)."""
    out = tmp_path / name
    ran = vtrain_in_process("validate", FOLDER, "-o", out, "--no-hta", "--json", *args)
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    summary.pop("report")
    replayed = {path.name: json.loads(gzip.decompress(path.read_bytes()))
                for path in sorted((out / "predicted" / "replay").iterdir())}
    return summary, replayed


def test_workers_give_the_validation_of_one_process(tmp_path: Path) -> None:
    one = _validated(tmp_path, "one", "--workers", "1")
    two = _validated(tmp_path, "two", "--workers", "2")
    assert one == two
    assert len(one[1]) == 2


def _same_reading(one: tuple, other: tuple) -> None:
    """Two readings of a folder (:func:`read_for_validation`) keep the same of every rank."""
    one_builder, one_kept, _ = one
    other_builder, other_kept, _ = other
    assert [k.rank for k in one_kept] == [k.rank for k in other_kept] == [0, 1]
    for a, b in zip(one_kept, other_kept):
        assert a.columns.equals(b.columns) and a.index == b.index and a.source.fields == b.source.fields
        assert [bytes(raw) for batch in a.source.events() for raw in batch] == [
            bytes(raw) for batch in b.source.events() for raw in batch]
        left, right = one_builder.parts[a.rank], other_builder.parts[b.rank]
        assert np.array_equal(left.ts, right.ts) and np.array_equal(left.launch, right.launch)
        assert all(getattr(left.edges, name) == getattr(right.edges, name) for name in ("src", "dst", "delay", "kind"))
        assert len(left.edges.src) > 0 and left.calls == right.calls
    assert one_builder.stats == other_builder.stats


def test_ranks_read_as_ray_tasks_keep_what_one_process_keeps() -> None:
    ray = pytest.importorskip("ray")
    one = read_for_validation(FOLDER, None, None, workers=1)
    try:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception when its node does not start
        pytest.skip(f"a local Ray instance did not start on this machine: {exc}")
    try:
        _same_reading(one, read_for_validation(FOLDER, None, None, ray_address="local"))
    finally:
        ray.shutdown()


def test_a_ray_cluster_that_cannot_be_reached_is_one_error_line(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    ran = vtrain_in_process("validate", FOLDER, "-o", tmp_path / "out", "--no-hta", "--ray-address", "ray://nowhere:1")
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1, ran.stderr
    assert "could not start or reach Ray at 'ray://nowhere:1'" in ran.stderr
    assert not (tmp_path / "out").exists()


def test_ranks_read_apart_keep_what_one_process_keeps() -> None:
    _same_reading(read_for_validation(FOLDER, None, None, workers=1), read_for_validation(FOLDER, None, None, workers=2))


def test_two_files_of_one_rank_is_the_same_error_with_workers(tmp_path: Path) -> None:
    folder = tmp_path / "twice"
    shutil.copytree(FOLDER, folder)
    shutil.copy(folder / "rank-1.json.gz", folder / "rank-1-again.json.gz")
    errors = []
    for workers in (1, 2):
        with pytest.raises(InputError) as caught:
            prepare_validation(folder, workers=workers)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "rank 1 is claimed by both" in errors[0]


def test_ctrl_c_stops_the_workers_and_leaves_nothing(tmp_path: Path) -> None:
    """Ctrl-C while worker processes read the ranks: one line, exit 130, no worker left, nothing written (as for
    `vtrain ingest --workers`, tests/test_ingest_ranks.py, which caught workers that polars let stop on Ctrl-C)."""
    folder = tmp_path / "many"
    make_trace_folder(V100_RANK, folder, total_bytes=4 * 60_000_000, ranks=4)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", "validate", str(folder), "-o", str(out),
                                "--no-hta", "--workers", "2"], cwd=REPO, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(psutil.Process(process.pid).children()) < 2:  # the pool's workers are up (and reading)
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(3)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches every process of the terminal's group
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.splitlines() == ["interrupted"], err
    assert not out.exists()
