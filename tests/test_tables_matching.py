"""Collective calls matched across ranks: transfer (end - last arrival) and wait, groups from metadata, from
co-completion and from point-to-point pairing; nccl_latency built from the transfers; the recorded 8-rank run's
groups are exactly its tensor-, data- and pipeline-parallel groups."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import TRACES
from vtrain.replay.collective_matching import Layout
from vtrain.runconfig import load_run_config
from vtrain.tables.latency import MATCHED_DURATION, RAW_DURATION, nccl_latency
from vtrain.tables.matching import MATCHED, METADATA, POINT_TO_POINT, match_calls
from vtrain.tables.store import conform


def calls(rows: list[tuple], **common: object) -> pl.DataFrame:
    """Collectives rows from (rank, collective, ts, dur, iteration) tuples."""
    frame = pl.DataFrame([{"rank": r, "collective": c, "ts": ts, "dur": dur, "iteration": it, "bytes": 1024,
                           "device_type": "cpu", **common} for r, c, ts, dur, it in rows])
    return conform(frame, "collectives")


def test_metadata_group_gives_transfer_from_the_last_arrival_and_each_members_wait() -> None:
    table = calls([(0, "all_reduce", 100.0, 50.0, 1), (1, "all_reduce", 130.0, 21.0, 1)],
                  group_ranks="[0, 1]", group_size=2)
    matched = match_calls(table).sort("rank")
    assert matched["transfer_us"].to_list() == [20.0, 21.0]
    assert matched["wait_us"].to_list() == [30.0, 0.0]
    assert matched["members"].to_list() == [2, 2]
    assert matched["group_size_source"].to_list() == [METADATA, METADATA]
    assert matched["match_id"].n_unique() == 1


def test_a_call_queued_behind_the_previous_one_waits_only_from_when_it_was_ready() -> None:
    """Rank 0 issues two buckets at once (the second queues behind the first); rank 1 issues each 30 us later.
    The second call's wait on rank 0 starts when its first call ended, not when it was issued."""
    table = calls([(0, "all_reduce", 100.0, 50.0, 1), (0, "all_reduce", 101.0, 99.0, 1),
                   (1, "all_reduce", 130.0, 20.0, 1), (1, "all_reduce", 160.0, 40.0, 1)],
                  group_ranks="[0, 1]", group_size=2)
    matched = match_calls(table).sort("rank", "ts")
    assert matched["wait_us"].to_list() == [30.0, 10.0, 0.0, 0.0]
    assert matched["transfer_us"].to_list() == [20.0, 40.0, 20.0, 40.0]


def test_gloo_groups_are_inferred_from_calls_that_end_together() -> None:
    """Ranks 0+1 and 2+3 all-reduce the same size at nearly the same times; within a pair the calls end
    together, across pairs they only overlap now and then."""
    rows = []
    for k in range(6):
        base = 1000.0 * k
        rows += [(0, "all_reduce", base, 300.0, 1), (1, "all_reduce", base + 100.0, 201.0, 1),
                 (2, "all_reduce", base + 150.0 + 40 * k, 500.0, 1), (3, "all_reduce", base + 600.0 + 40 * k, 52.0, 1)]
    matched = match_calls(calls(rows))
    assert matched["group_size_source"].to_list() == [MATCHED] * len(rows)
    groups = matched.group_by("match_id").agg(pl.col("rank").sort()).get_column("rank").to_list()
    assert sorted(map(tuple, groups)) == [(0, 1)] * 6 + [(2, 3)] * 6
    first = matched.filter((pl.col("rank") == 0) & (pl.col("ts") == 0.0))
    assert first["transfer_us"].item() == pytest.approx(200.0) and first["wait_us"].item() == pytest.approx(100.0)


def test_two_pairs_ending_close_together_are_told_apart_by_the_nearest_end() -> None:
    """Pairs 0+2 and 1+3 reduce at the same moment; all four calls end within a quarter of their duration of each
    other (a loaded machine), but each pair's members end within 100 us and the pairs 1-3 ms apart."""
    rows = []
    for k in range(5):
        base, shift = 100_000.0 * k, (1000.0, -2000.0, 3000.0, -1500.0, 2500.0)[k]
        rows += [(0, "all_reduce", base, 20_000.0, 1), (2, "all_reduce", base + 500.0, 19_550.0, 1),
                 (1, "all_reduce", base + 200.0, 19_800.0 + shift, 1),
                 (3, "all_reduce", base + 900.0, 19_140.0 + shift, 1)]
    matched = match_calls(calls(rows))
    groups = matched.group_by("match_id").agg(pl.col("rank").sort()).get_column("rank").to_list()
    assert sorted(map(tuple, groups)) == [(0, 2)] * 5 + [(1, 3)] * 5


def test_four_members_ending_alike_stay_one_group() -> None:
    rows = [(rank, "all_reduce", 100_000.0 * k + 100.0 * rank, 20_000.0 - 100.0 * rank + ((rank * 37 + k * 11) % 7) * 20.0, 1)
            for k in range(5) for rank in range(4)]
    groups = match_calls(calls(rows)).group_by("match_id").agg(pl.col("rank").sort()).get_column("rank").to_list()
    assert sorted(map(tuple, groups)) == [(0, 1, 2, 3)] * 5


def test_calls_that_never_overlap_are_not_one_collective() -> None:
    matched = match_calls(calls([(0, "all_reduce", 0.0, 10.0, 1), (1, "all_reduce", 50.0, 10.0, 1)]))
    assert matched["transfer_us"].null_count() == 2 and matched["group_size_source"].null_count() == 2


def test_point_to_point_transfer_ends_with_the_receive() -> None:
    """A gloo isend span lasts until the sender waits for it; the transfer is over when the receiver has it."""
    rows = [(0, "send", 0.0, 5000.0, 1), (1, "recv", 100.0, 300.0, 1),  # receiver waited 0 us for a posted send
            (0, "send", 1000.0, 4000.0, 1), (1, "recv", 900.0, 400.0, 1)]  # receiver posted first and waited
    matched = match_calls(calls(rows, group_size=2)).sort("ts")
    assert matched["group_size_source"].to_list() == [POINT_TO_POINT] * 4
    by_ts = dict(zip(matched["ts"].to_list(), matched["transfer_us"].to_list()))
    assert by_ts[0.0] == by_ts[100.0] == pytest.approx(300.0)
    assert by_ts[900.0] == by_ts[1000.0] == pytest.approx(300.0)


def test_nccl_latency_holds_transfers_and_keeps_raw_waits_only_where_nothing_matched() -> None:
    table = calls([(0, "all_reduce", 100.0, 50.0, 1), (1, "all_reduce", 130.0, 21.0, 1),
                   (0, "all_reduce", 500.0, 80.0, 2)], group_ranks="[0, 1]", group_size=2)
    table = table.with_columns(bytes=pl.when(pl.col("ts") == 500.0).then(4096).otherwise(pl.col("bytes")))
    rows = {row["bytes"]: row for row in nccl_latency(table).iter_rows(named=True)}
    assert rows[1024]["median_us"] == pytest.approx(20.5) and rows[1024]["wait_us"] == pytest.approx(15.0)
    assert rows[1024]["duration_source"] == MATCHED_DURATION and rows[1024]["group_size"] == 2
    assert rows[4096]["median_us"] == 80.0 and rows[4096]["duration_source"] == RAW_DURATION


@pytest.fixture(scope="module")
def t2p2d2(shipped_profile) -> tuple[pl.DataFrame, Layout]:
    profile = shipped_profile(TRACES / "t2p2d2")  # `ingest_traces`, once per test run (tests/conftest.py)
    return match_calls(profile["collectives"], profile["cpu_ops"]), Layout.of(
        load_run_config(TRACES / "t2p2d2" / "run.yaml"))


def test_recorded_gloo_run_groups_are_its_parallel_groups(t2p2d2: tuple[pl.DataFrame, Layout]) -> None:
    matched, layout = t2p2d2
    assert matched["match_id"].null_count() == 0, "every collective of the recorded run is matched"
    groups = matched.group_by("match_id").agg(pl.col("rank").sort(), pl.col("collective").first())
    tp = {tuple(layout.rank(p, d, t) for t in range(layout.tp)) for p in range(layout.pp) for d in range(layout.dp)}
    dp = {tuple(layout.rank(p, d, t) for d in range(layout.dp)) for p in range(layout.pp) for t in range(layout.tp)}
    pp = {tuple(layout.rank(p, d, t) for p in range(layout.pp)) for d in range(layout.dp) for t in range(layout.tp)}
    for _, ranks, collective in groups.iter_rows():
        assert tuple(ranks) in (pp if collective in ("send", "recv") else tp | dp), (ranks, collective)


def test_recorded_gloo_run_latency_table_has_group_sizes_and_no_waits(shipped_profile) -> None:
    profile = shipped_profile(TRACES / "t2p2d2")
    table = nccl_latency(profile["collectives"], profile["cpu_ops"])
    assert table["group_size"].to_list() == [2] * table.height  # the world group made them unknown before
    assert set(table["duration_source"]) == {MATCHED_DURATION}
    raw = profile["collectives"].group_by("collective", "bytes").agg(pl.col("dur").mean())
    joined = table.join(raw, on=["collective", "bytes"])
    assert (joined["mean_us"] < joined["dur"]).all()  # the collectives table keeps the raw durations


def test_one_reading_of_a_groups_ranks_for_ingest_replay_and_matching() -> None:
    """A process group's ranks are read one way wherever a trace gives them (pg_config, Process Group Ranks):
    whole numbers, also as texts or floats, sorted; a bool, an object, a negative or fractional number makes it no
    group. Before, ingest took only integers (a ["0", "1"] group was no group there) and the replay truncated 1.5 to
    1 and took True for 1."""
    from vtrain.kineto import group_ranks, only_group
    from vtrain.tables.matching import _metadata_group

    assert group_ranks([1, "0", 2.0]) == (0, 1, 2)
    assert [group_ranks(v) for v in ([0, True], [0, 1.5], [0, -1], [0, {}], "0,1", [])] == [None] * 6
    assert only_group(0, [{"pg_name": "0", "ranks": ["1", "0"]}]) == ("0", (0, 1))
    assert _metadata_group('["1", 0]', None) == ("ranks", (0, 1))


def test_one_rule_for_the_group_of_a_collective_that_names_none() -> None:
    """Ingest and replay take a collective that names no group to be among the one group of more than one rank
    that holds the rank (one function, ``kineto.only_group``): two groups with the same members are that group
    (named only when they share a name), two different groups leave it unknown, and a two-rank job that lists no
    group is ranks 0 and 1. Before, ingest had its own copy without the two-rank rule, and the replay keyed groups
    by name (two groups of one name were one)."""
    from vtrain.kineto import only_group

    nccl_and_gloo = [{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "1", "ranks": [3, 2, 1, 0]}]
    assert only_group(2, nccl_and_gloo) == (None, (0, 1, 2, 3))
    tp_and_dp = [{"pg_name": "tp", "ranks": [0, 1]}, {"pg_name": "dp", "ranks": [0, 2]}]
    assert only_group(0, tp_and_dp) is None and only_group(1, tp_and_dp) == ("tp", (0, 1))
    assert only_group(1, [], world_size=2) == (None, (0, 1)) and only_group(1, [], world_size=4) is None
    assert only_group(1, "not a list", world_size=2) == (None, (0, 1))
    same_name = [{"pg_name": "x", "ranks": [0, 1]}, {"pg_name": "x", "ranks": [0, 2]}]
    assert only_group(0, same_name) is None
