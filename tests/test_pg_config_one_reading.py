"""One reading of ``distributedInfo.pg_config`` for ingest and the replay (:func:`vtrain.kineto.process_groups`).

A process group beyond the job (a rank outside its world, or more ranks than it has) was left out by ingest only:
the replay (`vtrain validate`, `vtrain whatif`) found groups with it, silently. On the shipped 2-rank pipeline
trace set without its run.yaml, a ``[r, 9]`` group on each rank left each rank's one group unknown to the replay,
its 160 send/recv calls unmatched, and ``whatif --scale send/recv=5`` predicted another iteration than on the clean
copy. A group whose ``pg_size`` is not the number of ranks it lists was taken at its ``pg_size`` by ingest
(the 2-rank data-parallel set's all-reduces of group size 4), silently: the ranks listed are the group now, and a
warning line says so.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from vtrain.ingest.assemble import pg_config_problem
from vtrain.ingest.pipeline import ingest_traces
from vtrain.kineto import only_group, process_groups
from vtrain.replay.trace import rank_trace_of_events, trace_set_warnings
from vtrain.whatif.changes import parse_scale
from vtrain.whatif.retime import what_if

TRACES = Path(__file__).resolve().parent.parent / "traces"
BEYOND = {"pg_name": "99", "pg_desc": "undefined", "backend_config": "cpu:gloo", "pg_size": 2}
LEFT_OUT = "left out of the collectives' groups"


def _copy(shipped: str, folder: Path, groups: Callable[[int, list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    """A copy of a shipped trace set without its run.yaml (the replay finds groups in ``pg_config``), each rank
    listing ``groups(rank, its pg_config)``."""
    shutil.copytree(TRACES / shipped, folder, ignore=shutil.ignore_patterns("run.yaml"))
    for path in sorted(folder.glob("rank-*.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        info = trace["distributedInfo"]
        info["pg_config"] = groups(info["rank"], info["pg_config"])
        path.write_bytes(gzip.compress(json.dumps(trace).encode(), 1))
    return folder


def _with_rank_9(rank: int, config: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``config`` and a group of ``rank`` and rank 9, beyond a world of 2 or 8."""
    return [*config, dict(BEYOND, ranks=[rank, 9])]


def test_groups_beyond_the_job_are_no_groups_of_the_one_reading() -> None:
    config = [{"pg_name": "0", "ranks": [0, 1]}, {"pg_name": "99", "ranks": [0, 9]}]
    assert [pg["pg_name"] for pg, _ in process_groups(config, 2)] == ["0"]
    assert [pg["pg_name"] for pg, _ in process_groups(config, 16)] == ["0", "99"]
    assert only_group(0, config, 2) == ("0", (0, 1))  # was None: [0, 9] made the rank's group unknown


def test_the_replay_says_ingests_warning_once_for_the_trace_set(tmp_path: Path) -> None:
    config = [{"pg_name": "0", "pg_size": 8, "ranks": list(range(8))}]
    traces = [rank_trace_of_events(tmp_path / f"rank-{rank}.json", {"distributedInfo": {
        "rank": rank, "world_size": 8, "pg_config": _with_rank_9(rank, config)}}, []) for rank in range(8)]
    assert all([pg["pg_name"] for pg in trace.process_groups] == ["0"] for trace in traces)
    said = [line for line in trace_set_warnings(tmp_path, traces, 8) if "pg_config" in line]
    assert said == [f"{tmp_path / 'rank-0.json'} (and 7 other rank files): 1 process group holds ranks the job "
                    f"cannot have in distributedInfo.pg_config (pg '99': rank 9 in a world of 8): {LEFT_OUT}"]


def _whatif(folder: Path) -> tuple[float, list[str]]:
    """`vtrain whatif FOLDER --scale send/recv=5`: its predicted iteration (ms) and its warning lines."""
    warnings: list[str] = []
    predicted = what_if(folder, [parse_scale("send/recv=5")], warn=warnings.append)
    return predicted.summary()["predicted_ms"], warnings


def test_whatif_re_times_as_if_the_group_beyond_the_job_were_not_listed(tmp_path: Path) -> None:
    clean, _ = _whatif(_copy("t1p2d1", tmp_path / "clean", lambda _, config: config))
    folder = _copy("t1p2d1", tmp_path / "rank-9", _with_rank_9)
    predicted, warnings = _whatif(folder)
    assert predicted == pytest.approx(clean)  # was another: its send/recv calls unmatched, their waits kept
    assert [line for line in warnings if "pg_config" in line] == [
        f"{folder / 'rank-0.json.gz'} (and 1 other rank file): 1 process group holds ranks the job cannot have in "
        f"distributedInfo.pg_config (pg '99': rank 9 in a world of 2): {LEFT_OUT}"]


def test_a_pg_size_unlike_the_ranks_listed_is_said_and_the_ranks_taken(tmp_path: Path) -> None:
    info = {"world_size": 2, "pg_config": [{"pg_name": "0", "pg_size": 4, "ranks": [0, 1]}]}
    assert pg_config_problem(info) == ("1 process group says another pg_size than the ranks listed in "
                                       "distributedInfo.pg_config (pg '0': pg_size 4, 2 ranks listed): the ranks "
                                       "listed are the group")
    folder = _copy("t1p1d2", tmp_path / "pg-size-4", lambda _, config: [dict(pg, pg_size=4) for pg in config])
    warnings: list[str] = []
    profile = ingest_traces(folder, warn=warnings.append)
    collectives = profile.tables["collectives"]
    assert collectives.height and set(collectives["group_size"]) == {2}  # was 4: pg_size believed over the ranks
    assert sorted(line for line in warnings if "pg_config" in line) == [
        f"{folder / f'rank-{rank}.json.gz'}: 2 process groups say another pg_size than the ranks listed in "
        f"distributedInfo.pg_config (pg '0': pg_size 4, 2 ranks listed; pg '1': pg_size 4, 2 ranks listed): the "
        f"ranks listed are the group" for rank in (0, 1)]
