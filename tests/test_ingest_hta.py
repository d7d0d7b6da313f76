"""Agreement with HolisticTraceAnalysis on the real A100/V100 traces shipped in traces/hta-*."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hta.utils.utils import get_kernel_type

from tests.conftest import HTA_TRACE_SETS
from vtrain.ingest.classify import kernel_class
from vtrain.ingest.pipeline import rank_summary
from vtrain.validate.hta import hta_analysis

HTA_CLASS = {"COMPUTATION": "computation_us", "COMMUNICATION": "communication_us", "MEMORY": "memory_us"}


def _hta_per_rank(trace_dir: Path) -> dict[int, dict[str, tuple[float, int]]]:
    """HTA's kernel time and count per class, each rank parsed in this process: HTA's own constructor forks a pool,
    and a fork of a test worker that runs polars' or Ray's threads can hang forever (a CI run did, in this test)."""
    analysis = hta_analysis(trace_dir, include_last_profiler_step=True)
    symbols = analysis.t.symbol_table.get_sym_table()
    result: dict[int, dict[str, tuple[float, int]]] = {}
    for rank, frame in analysis.t.traces.items():
        device = frame[frame["stream"].ne(-1)]
        kinds = device["name"].map(lambda i: get_kernel_type(symbols[i]))
        result[rank] = {
            key: (float(device.loc[kinds == hta_kind, "dur"].sum()), int((kinds == hta_kind).sum()))
            for hta_kind, key in HTA_CLASS.items()
        }
    return result


@pytest.mark.parametrize("trace_dir", HTA_TRACE_SETS, ids=lambda p: p.name)
def test_kernel_time_per_class_matches_hta(trace_dir: Path, shipped_profile) -> None:
    profile = shipped_profile(trace_dir)  # `ingest_traces`, once per test run (tests/conftest.py)
    ours = rank_summary(profile)
    theirs = _hta_per_rank(trace_dir)
    assert sorted(int(r) for r in ours) == sorted(theirs)
    kernels = profile["kernels"]
    fractional = bool((kernels["ts"] != kernels["ts"].floor()).any())
    for rank, classes in theirs.items():
        for key, (hta_us, count) in classes.items():
            # HTA rounds sub-microsecond traces to whole microseconds (start up, end down): up to 2 us a kernel
            assert abs(ours[str(rank)][key] - hta_us) <= 2 * count + 1e-6, (rank, key)
            mine = kernels.filter((pl.col("rank") == rank) & (pl.col("kernel_class") == key.removesuffix("_us")))
            if fractional:  # HTA's own rounding applied to our rows gives HTA's number exactly
                rounded = ((mine["ts"] + mine["dur"]).floor() - mine["ts"].ceil()).sum()
                assert rounded == pytest.approx(hta_us, abs=1e-6), (rank, key)
            else:
                assert ours[str(rank)][key] == pytest.approx(hta_us, abs=1e-6), (rank, key)
        assert ours[str(rank)]["kernels"] == sum(count for _, count in classes.values()) + kernels.filter(
            (pl.col("rank") == rank) & (pl.col("kernel_class") == "other")).height


def test_classification_is_htas_on_every_kernel_name(shipped_profile) -> None:
    names: set[str] = set()
    for trace_dir in HTA_TRACE_SETS:
        names |= set(shipped_profile(trace_dir)["kernels"]["name"].unique().to_list())
    assert len(names) > 100
    for name in names:
        assert kernel_class(name) == get_kernel_type(name).lower(), name


def test_collective_metadata_is_read_from_every_schema(shipped_profile) -> None:
    a100 = shipped_profile(next(p for p in HTA_TRACE_SETS if "a100" in p.name))
    kernel_args = a100["collectives"].filter(pl.col("metadata_source") == "kernel_args")
    assert kernel_args.height == a100["collectives"].height > 0
    assert set(kernel_args["collective"]) <= {"all_reduce", "broadcast"}
    assert (kernel_args["group_size"] == 2).all()
    # bytes = elements x 4 for float all-reduces
    row = kernel_args.filter(pl.col("collective") == "all_reduce").row(0, named=True)
    assert row["bytes"] == row["elements"] * 4 and row["algorithm"] == "RING" and row["protocol"] == "LL"

    sm80 = shipped_profile(next(p for p in HTA_TRACE_SETS if "sm80" in p.name))
    # NCCL runs all_to_all as SendRecv kernels: the op-level name wins, sizes come from the op's Input Dims
    assert {"all_to_all", "all_reduce"} <= set(sm80["collectives"]["collective"])
    assert sm80["collectives"].filter(pl.col("collective") == "all_to_all")["bytes"].drop_nulls().len() > 0


def test_op_latency_has_signatures_and_kernel_sequences(shipped_profile) -> None:
    profile = shipped_profile(next(p for p in HTA_TRACE_SETS if "v100-1rank" in p.name))
    ops = profile.op_latency
    assert ops.height > 10
    assert (ops["count"] >= 1).all() and (ops["p10_us"] <= ops["median_us"]).all()
    assert (ops["median_us"] <= ops["p90_us"]).all()
    conv = ops.filter(pl.col("op") == "aten::convolution_backward")
    assert conv.height >= 1 and (conv["n_kernels"] >= 1).all()
    # every op_latency call is made of kernels of the kernels table
    kernels = set(profile["kernels"]["name"])
    for sequence in ops["kernels"]:
        assert set(sequence.split(" ; ")) <= kernels


def test_metadata_records_devices_versions_ranks_and_sources(shipped_profile) -> None:
    profile = shipped_profile(next(p for p in HTA_TRACE_SETS if "a100" in p.name))
    meta = profile.metadata
    assert meta["device"]["name"] == "NVIDIA A100-PG509-200"
    assert meta["device"]["compute_capability"] == "8.0"
    assert meta["software"]["nccl"] == "2.17.1"
    assert meta["world_size"] == 2 and meta["ranks"] == [0] and meta["ranks_missing"] == [1]
    assert len(meta["iterations"]) == 3
    assert len(meta["sources"][0]["sha256"]) == 64
