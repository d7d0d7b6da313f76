"""An all-gather's message size is its output buffer (nccl-tests'), in ``collectives`` and ``nccl_latency``, whatever
part of the trace says it: the call's own metadata, its group size, the output tensor of the issuing
``c10d::_allgather_base_`` op, or the members found by matching the call across ranks; where none does, one warning
and no size (an audit found them sized by their input: 64x too low on the shipped 128-rank trace, 2x on HSDP).

The traces are real: the shipped ``traces/hta-sm80-128rank-sampled`` (PyTorch 2.0, NCCL, no ``pg_config``) and
``tests/data/hsdp4-gloo`` (FSDP2 on a 2x2 mesh over gloo: groups of 4, 2 and 2), some with parts of their
header or ops removed as older PyTorch versions wrote them. The expected sizes are counted from the raw events.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from vtrain.errors import InputWarning
from vtrain.ingest.pipeline import ingest_traces

ROOT = Path(__file__).resolve().parents[1]
SM80 = ROOT / "traces" / "hta-sm80-128rank-sampled"
HSDP = ROOT / "tests" / "data" / "hsdp4-gloo"
GATHER_OP = "c10d::_allgather_base_"
ITEM_BYTES = {"float": 4, "signed char": 1}


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as file:
        return json.load(file)


def _traces(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json.gz"))


def _raw_gathers(folder: Path) -> set[tuple[int, int]]:
    """(output bytes, group size) of every ``c10d::_allgather_base_`` call of the folder's traces, counted from the
    raw events: its ``Input Dims`` are [output, input, ...] (the audit's ``count_ag.py``)."""
    found = set()
    for path in _traces(folder):
        for event in _load(path)["traceEvents"]:
            if event.get("name") == GATHER_OP:
                (output, *_), (given, *_) = event["args"]["Input Dims"][:2]
                found.add((output * ITEM_BYTES[event["args"]["Input type"][0]], output // given))
    return found


def _rewritten(folder: Path, out: Path, *, header: bool = True, op_dims: bool = True, ranks: int | None = None) -> Path:
    """The folder's traces written to ``out``: ``header=False`` keeps of ``distributedInfo`` only backend, rank and
    world size (as PyTorch <= 2.1 wrote it), ``op_dims=False`` drops the c10d all-gather ops' ``Input Dims`` (no
    output tensor anywhere), ``ranks`` keeps that many rank files."""
    out.mkdir()
    for path in _traces(folder)[:ranks]:
        trace = _load(path)
        if not header:
            trace["distributedInfo"] = {k: trace["distributedInfo"][k] for k in ("backend", "rank", "world_size")}
        if not op_dims:
            for event in trace["traceEvents"]:
                if event.get("name") == GATHER_OP:
                    event["args"].pop("Input Dims")
        (out / path.name.removesuffix(".gz")).write_text(json.dumps(trace))
    return out


def _sizes(tables: dict[str, pl.DataFrame], table: str) -> set[tuple[int | None, int | None]]:
    rows = tables[table].filter(pl.col("collective") == "all_gather")
    return set(rows.select("bytes", "group_size").iter_rows())


def test_the_rule():
    from vtrain.tables.latency import all_gather_output

    assert all_gather_output(16, 1024, None) == (1024, 64)  # the output given: the group is output / input
    assert all_gather_output(16, None, 4) == (64, 4)  # the group given: the output is input x group
    assert all_gather_output(16, None, None) == (None, None)  # neither: unknown, not the input
    assert all_gather_output(0, None, None) == (0, None)  # gathering nothing gives nothing


def test_shipped_trace_without_pg_config_takes_the_output_of_the_c10d_op():
    """PyTorch 2.0's ``nccl:_all_gather_base`` annotation launching the kernel holds only the input (16 MiB);
    the enclosing ``c10d::_allgather_base_`` holds the 1 GiB output of a 64-rank group."""
    raw = _raw_gathers(SM80)
    assert raw == {(1073741824, 64)}
    tables = ingest_traces(SM80).tables
    assert _sizes(tables, "collectives") == raw
    assert _sizes(tables, "nccl_latency") == raw
    assert tables["nccl_latency"].filter(pl.col("collective") == "all_gather")["busbw_gbps"].is_not_null().all()


@pytest.mark.parametrize("header", [True, False], ids=["groups-of-two-sizes", "no-pg-config"])
def test_hsdp_all_gathers_are_sized_by_their_output(tmp_path, header):
    """Ranks in groups of sizes 4 and 2 have no one default group size, and a header without ``pg_config`` none
    at all: the all-gathers' outputs come from their c10d ops."""
    raw = _raw_gathers(HSDP)
    assert raw == {(526336, 2), (525312, 2)}
    tables = ingest_traces(_rewritten(HSDP, tmp_path / "t", header=header)).tables
    assert _sizes(tables, "collectives") == raw
    assert _sizes(tables, "nccl_latency") == raw


def test_input_alone_is_sized_by_the_members_matched_across_ranks(tmp_path):
    """Neither a group nor an output in the trace: ``collectives`` gives no bytes (never the input's as the size),
    and ``nccl_latency`` sizes each call by its input times the members found by matching it across ranks."""
    raw = _raw_gathers(HSDP)
    tables = ingest_traces(_rewritten(HSDP, tmp_path / "t", header=False, op_dims=False)).tables
    gathers = tables["collectives"].filter(pl.col("collective") == "all_gather")
    assert gathers["bytes"].is_null().all() and gathers["group_size"].is_null().all()
    assert set(gathers["elements"] * 4) == {output // group for output, group in raw}  # the inputs
    latency = tables["nccl_latency"].filter(pl.col("collective") == "all_gather")
    assert set(latency.select("bytes", "group_size").iter_rows()) == raw
    assert set(latency["group_size_source"]) == {"matched across ranks"}


def test_a_size_that_cannot_be_known_is_said_and_left_out(tmp_path):
    """Two of 128 GPU ranks, no group size, no output tensor: nothing can size the all-gathers. One warning line;
    none of them in ``nccl_latency`` (they were there at their input's size, 64x too small)."""
    folder = _rewritten(SM80, tmp_path / "t", header=False, op_dims=False)
    with pytest.warns(InputWarning, match="all-gather") as said:
        tables = ingest_traces(folder).tables
    assert len([w for w in said if "all-gather" in str(w.message)]) == 1
    assert _sizes(tables, "nccl_latency") == set()
    assert _sizes(tables, "collectives") == {(None, None)}
