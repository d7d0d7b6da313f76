"""A ``distributedInfo.pg_config`` process group holding ranks the job cannot have (an audit: rank 0 of a 2-rank
job listing ranks [0, 1, 2, 3], or a million ranks) is left out of the collectives' groups, said on one warning
line naming the rank file: ingest describes the collectives as if it were not listed (before, ``nccl_latency``
lost its ``send`` row and timed ``recv`` with its waits, and a million listed ranks took 87 s to ingest)."""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from polars.testing import assert_frame_equal

from vtrain.ingest.assemble import pg_config_problem
from vtrain.ingest.pipeline import ingest_traces
from vtrain.limits import FITTED_COUNTS

TRACES = Path(__file__).resolve().parent.parent / "traces" / "t1p2d1"
LEFT_OUT = "left out of the collectives' groups"


@pytest.fixture(scope="module")
def unmodified() -> Any:
    """The shipped 2-rank trace set's profile (no warning)."""
    warnings: list[str] = []
    profile = ingest_traces(TRACES, warn=warnings.append)
    assert warnings == []
    return profile


def _with_rank0_groups(folder: Path, groups: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    """A copy of the shipped trace set in ``folder`` whose rank 0 lists ``groups(its pg_config)``."""
    shutil.copytree(TRACES, folder)
    rank0 = folder / "rank-0.json.gz"
    trace = json.loads(gzip.decompress(rank0.read_bytes()))
    info = trace["distributedInfo"]
    info["pg_config"] = groups(info["pg_config"])
    rank0.write_bytes(gzip.compress(json.dumps(trace).encode(), 1))
    return folder


def _ingested(folder: Path) -> tuple[Any, list[str]]:
    warnings: list[str] = []
    return ingest_traces(folder, warn=warnings.append), warnings


def test_groups_of_four_in_a_world_of_two_are_left_out(tmp_path: Path, unmodified: Any) -> None:
    folder = _with_rank0_groups(tmp_path / "pg-4-in-world-2",
                                lambda config: [dict(pg, pg_size=4, ranks=[0, 1, 2, 3]) for pg in config])
    profile, warnings = _ingested(folder)
    assert_frame_equal(profile.tables["nccl_latency"], unmodified.tables["nccl_latency"])
    assert sorted(profile.tables["nccl_latency"]["collective"]) == ["recv", "send"]
    assert warnings == [f"{folder / 'rank-0.json.gz'}: 3 process groups hold ranks the job cannot have in "
                        f"distributedInfo.pg_config (pg '0': 4 ranks in a world of 2; pg '1': 4 ranks in a world "
                        f"of 2; pg '2': 4 ranks in a world of 2): {LEFT_OUT}"]


def test_a_million_listed_ranks_are_left_out_unread(tmp_path: Path, unmodified: Any) -> None:
    million = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo", "pg_size": 10**6,
                "ranks": list(range(10**6))}]
    folder = _with_rank0_groups(tmp_path / "pg-million-ranks", lambda _: million)
    profile, warnings = _ingested(folder)
    assert_frame_equal(profile.tables["nccl_latency"], unmodified.tables["nccl_latency"])
    assert warnings == [f"{folder / 'rank-0.json.gz'}: 1 process group holds ranks the job cannot have in "
                        f"distributedInfo.pg_config (pg '0': 1,000,000 ranks in a world of 2): {LEFT_OUT}"]


def test_a_rank_outside_the_world_is_said() -> None:
    info = {"world_size": 2, "pg_config": [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": "1", "ranks": [0, 5]}]}
    assert pg_config_problem(info) == ("1 process group holds ranks the job cannot have in distributedInfo.pg_config "
                                       f"(pg '1': rank 5 in a world of 2): {LEFT_OUT}")


def test_without_a_world_size_the_largest_job_bounds_the_groups() -> None:
    most = FITTED_COUNTS["group_size"][1]
    info = {"pg_config": [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": "big", "ranks": [0] * (most + 1)},
                          {"pg_name": "far", "ranks": [0, most]}]}
    assert pg_config_problem(info) == (
        "2 process groups hold ranks the job cannot have in distributedInfo.pg_config (pg 'big': "
        f"{most + 1:,} ranks beyond the {most:,} of any job; pg 'far': rank {most:,} beyond the {most:,} of any "
        f"job): {LEFT_OUT}")
    assert pg_config_problem({"pg_config": [{"pg_name": "0", "ranks": [0, most - 1]}]}) is None


def test_unread_entries_and_groups_beyond_the_job_are_said_on_one_line() -> None:
    info = {"world_size": "2", "pg_config": [3, {"pg_name": "0", "ranks": [0, 1, 2]}]}
    assert pg_config_problem(info) == (
        "1 entries of distributedInfo.pg_config are no process group (an object with a list of integer ranks); "
        "1 process group holds ranks the job cannot have in distributedInfo.pg_config (pg '0': 3 ranks in a world "
        f"of 2): {LEFT_OUT}")
