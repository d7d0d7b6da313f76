"""Real GPU traces of "one rank of many" whose collectives run on the host: data parallelism over gloo, every rank
on one H100 (``validators/gpu/gloo_ranks.py``; ``traces/gpu/README.md``). ``h100-gloo-world2`` holds both ranks of
a world of two, ``h100-gloo-one-of-four`` only rank 2 of four (the others trained unprofiled).

gloo's collectives launch no kernel: they are ``gloo:*`` annotations on gloo's worker threads (and copies through
host memory). Read as NCCL's would be, through kernels only, a GPU rank had no collective at all.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.pipeline import ingest_traces
from vtrain.tables.latency import MATCHED_DURATION, RAW_DURATION
from vtrain.whatif.changes import parse_scale
from vtrain.whatif.retime import what_if

GPU = REPO / "traces" / "gpu"
WORLD2, ONE_OF_FOUR = GPU / "h100-gloo-world2", GPU / "h100-gloo-one-of-four"


def _gloo_calls(trace: Path) -> Counter[str]:
    """The raw trace's gloo collectives (the host annotations gloo writes), by name."""
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"))


@pytest.mark.parametrize("folder", [WORLD2, ONE_OF_FOUR], ids=lambda path: path.name)
def test_every_gloo_collective_of_a_gpu_rank_is_a_collective(folder: Path) -> None:
    """One row per gloo call of the raw trace, on the host, in the rank's one process group (its
    distributedInfo.pg_config), with its size from the call's input."""
    tables = ingest_traces(folder)
    collectives = tables["collectives"]
    for trace in sorted(folder.glob("rank-*.json.gz")):
        rank = int(trace.name.split("-")[1].split(".")[0])
        raw = _gloo_calls(trace)
        mine = collectives.filter(pl.col("rank") == rank)
        assert Counter("gloo:" + name for name in mine["collective"]) == raw and sum(raw.values()) == 8
        assert set(mine["device_type"]) == {"cpu"} and mine["bytes"].null_count() == 0
    world = 2 if folder == WORLD2 else 4
    assert set(collectives["group_ranks"]) == {json.dumps(list(range(world)), separators=(",", ":"))}
    assert set(collectives["group_size"]) == {world}
    latency = tables["nccl_latency"]
    assert set(latency["collective"]) == {"all_reduce", "broadcast"} and set(latency["group_size"]) == {world}
    # both ranks of the world of two are matched, so the transfer is timed; one rank of four keeps its raw waits
    assert set(latency["duration_source"]) == {MATCHED_DURATION if folder == WORLD2 else RAW_DURATION}


def test_tables_mark_raw_durations_of_one_rank_of_four(tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    ingested = vtrain_in_process("ingest", ONE_OF_FOUR, "-o", profile)
    assert ingested.returncode == 0, ingested.stderr
    assert "3 of 4 ranks have no trace file (missing: 0, 1, 3)" in ingested.stderr
    shown = vtrain_in_process("tables", profile)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("*") >= 4 and "raw durations of one rank" in shown.stdout


def test_whatif_scales_gloo_collectives_of_gpu_ranks() -> None:
    """The scaled calls are found (before: "no event holds time of this kind"), and halving them shortens the
    iteration: the rank's thread that waited for the last all-reduce resumes after it. (Before, a device-wide
    synchronisation was tied to every stream's last activity by that activity's own gap, 55 ms for gloo's copy
    stream, which pinned the iteration whatever the all-reduces took.)"""
    notes: list[str] = []
    result = what_if(ONE_OF_FOUR, [parse_scale("all_reduce=0.5")], warn=notes.append)
    assert result.scale_hits == {"all_reduce": 6}
    steady = result.steady
    assert all(result.predicted_us[i] < 0.99 * result.replayed_us[i] for i in steady), (result.predicted_us, notes)
    assert not any("no iteration moved" in note for note in notes)


def test_whatif_says_when_the_scaled_events_move_no_iteration() -> None:
    """A launch-bound run (the GPU idles while the host launches): doubling its GEMMs leaves every iteration as it
    was, and the what-if says why rather than a bare +0.00 %."""
    notes: list[str] = []
    result = what_if(GPU / "h100-user-ckpt-accum", [parse_scale("gemm=2")], warn=notes.append)
    assert result.scale_hits["gemm"] > 0
    assert any("no iteration moved: none of these events is on a critical path" in note for note in notes), notes


def test_gloo_collectives_of_a_rank_in_two_groups_of_the_same_members(tmp_path: Path) -> None:
    """A job that makes a gloo group of every rank beside its default NCCL group (for CPU-side collectives) has two
    groups of the same members in ``pg_config``: its annotations are still among those ranks, and the two ranks'
    calls are matched into collectives. Before, no group: the calls kept no ranks and raw durations."""
    for trace in sorted(WORLD2.glob("rank-*.json.gz")):
        with gzip.open(trace, "rt") as handle:
            data = json.load(handle)
        groups = data["distributedInfo"]["pg_config"]
        assert len(groups) == 1 and groups[0]["ranks"] == [0, 1]
        groups.append({**groups[0], "pg_name": "gloo-of-all", "backend_config": "cpu:gloo"})
        with gzip.open(tmp_path / trace.name, "wt") as handle:
            json.dump(data, handle)
    tables = ingest_traces(tmp_path)
    collectives = tables["collectives"]
    assert collectives.height == 16 and set(collectives["group_ranks"]) == {"[0,1]"}
    assert collectives["process_group"].null_count() == 16  # two names for those ranks: neither is said
    assert set(tables["nccl_latency"]["duration_source"]) == {MATCHED_DURATION}


def test_a_damaged_process_group_list_is_said_and_the_groups_in_it_still_read(tmp_path: Path) -> None:
    """``distributedInfo.pg_config`` with entries that are no process group (a number, ranks as a text or holding
    an object, a size as a word) beside the real one: ingest said an AttributeError traceback; now one warning line
    per file, and the real group still gives the calls their ranks and size."""
    folder = tmp_path / "traces"
    folder.mkdir()
    for trace in sorted(WORLD2.glob("rank-*.json.gz")):
        with gzip.open(trace, "rt") as handle:
            data = json.load(handle)
        data["distributedInfo"]["pg_config"] = [5, {"ranks": "abc"}, {"ranks": [0, {"x": 1}], "pg_size": "two"},
                                                *data["distributedInfo"]["pg_config"]]
        with gzip.open(folder / trace.name, "wt") as handle:
            json.dump(data, handle)
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "pg_config" in line]
    assert len(said) == 2 and all("3 entries of distributedInfo.pg_config are no process group" in s for s in said)
    collectives = pl.read_parquet(tmp_path / "profile" / "collectives.parquet")
    assert set(collectives["group_ranks"]) == {"[0,1]"} and set(collectives["group_size"]) == {2}
    validated = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")
    assert validated.returncode == 0, validated.stderr
    from vtrain.ingest.assemble import pg_config_problem

    assert pg_config_problem({"pg_config": {"0": [0, 1]}}) == ("distributedInfo.pg_config is no list of process "
                                                              "groups: left out")
    assert pg_config_problem({"pg_config": [{"ranks": [0, 1], "pg_size": -3}]}) is None
    assert pg_config_problem({}) is None and pg_config_problem(None) is None


@pytest.mark.parametrize(("folder", "bound_pct"), [(WORLD2, 25.0), (ONE_OF_FOUR, 15.0)], ids=lambda each: getattr(
    each, "name", str(each)))
def test_a_gpu_jobs_gloo_collectives_are_priced_as_measured(folder: Path, bound_pct: float, tmp_path: Path) -> None:
    """The model side of validate on the gloo ranks: their measured collectives (gloo's, on the host) price the
    gradient all-reduce of the run read off the traces. They were left aside as another device's (a GPU run looked
    for the device's rows only) and NCCL's datasheet priced it: -58.8 % (world of two) and -63.9 % (one rank of four);
    now -17.2 and +7.8 %."""
    ran = vtrain_in_process("validate", folder, "--no-hta", "--json", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert abs(json.loads(ran.stdout)["model"]["error_pct"]) < bound_pct


def test_a_cpu_recordings_collectives_do_not_price_a_gpu_run(tmp_path: Path) -> None:
    """Only a GPU recording whose collectives all ran on the host lends them to a GPU run: a CPU recording's gloo
    all-reduces are not what an H100 job's NCCL would take (the datasheet's links price it)."""
    from vtrain.devices import device_model
    from vtrain.simulate.collective_latency import CollectiveResolver
    from vtrain.tables.store import load_profile

    done = vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", tmp_path / "cpu")
    assert done.returncode == 0, done.stderr
    profile = load_profile(tmp_path / "cpu")
    assert profile["nccl_latency"].filter(pl.col("collective") == "all_reduce").height  # gloo's, measured
    resolver = CollectiveResolver(profile, device_model("H100"), "cuda", 8)
    assert resolver.resolve("all_reduce", 2, 2**24, 1, 2).source == "modelled"
    on_cpus = CollectiveResolver(profile, device_model("H100"), "cpu", 8)  # a CPU run takes them
    assert on_cpus.resolve("all_reduce", 2, 2**24, 1, 2).source != "modelled"
