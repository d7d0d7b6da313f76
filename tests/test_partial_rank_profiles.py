"""A profile of some ranks of a job: its collectives matched with no other rank's call are timed with their waits
for the members its traces do not hold ("raw: waits included"). A prediction read them as the collectives' times:
one rank of the 2x2x2 gloo job read its receives at 109 ms where they take 1.7, and `simulate` of the job from it
put the pipeline's transfers at 35 times the full profile's (an audit). They are not used, and that is said."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.tables.latency import RAW_DURATION

JOB = REPO / "traces" / "t1p2d1"
SAID = "are timed with their waits for a peer the traces do not hold"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("partial")
    one = root / "one-rank"
    one.mkdir()
    shutil.copy(JOB / "rank-1.json.gz", one)
    shutil.copy(JOB / "run.yaml", one)
    made = {}
    for name, folder in (("one", one), ("all", JOB)):
        ran = vtrain_in_process("ingest", folder, "-o", root / f"profile-{name}")
        assert ran.returncode == 0, ran.stderr
        made[name] = root / f"profile-{name}"
    return made


def test_collectives_timed_with_their_waits_are_not_a_predictions(profiles: dict[str, Path]) -> None:
    import polars as pl

    table = pl.read_parquet(profiles["one"] / "nccl_latency.parquet")
    assert (table["duration_source"] == RAW_DURATION).any()  # the receive, its wait for rank 0 included
    runs = {}
    for name, profile in profiles.items():
        ran = vtrain_in_process("simulate", JOB / "run.yaml", "--profile", profile, "--json")
        assert ran.returncode == 0, ran.stderr
        assert (SAID in ran.stderr) == (name == "one"), ran.stderr
        runs[name] = json.loads(ran.stdout)
    assert runs["one"]["breakdown_ms"]["pp"] < 2 * runs["all"]["breakdown_ms"]["pp"] + 1.0
    assert runs["one"]["coverage"]["measured"] < 1.0
