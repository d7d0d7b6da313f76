"""Collective metadata that ingest misread, found by an audit of real and rewritten traces; each input is made in
tmp_path from a trace shipped in the repo.

- A message size whose byte count overflows 64 bits (``In msg nelems`` 2^62 of floats) made ingest fail with a
  polars traceback; a negative size or group size was written into a profile that `vtrain tables` then refused.
  Both are now read as absent, with one warning line per file.
- ProcessGroupNCCL's profiling titles (``nccl:_all_gather_base``, ``nccl:_reduce_oop`` ...) were no collective
  name: an all-gather of a 128-rank job, run as SendRecv kernels, was reported as a send_recv of 2 ranks.
- Collectives without a size left ``nccl_latency`` empty without a word, and a size of 0 elements was read as no
  size.
- One rank of a job whose trace lists no process group (PyTorch before 2.1 wrote none; a pruned file): its
  collectives' latencies had no group size and no prediction used them, without a word. A job of two ranks has one
  group of more than one rank: its size is 2; beyond that the group is unknown, and a prediction from the profile
  says that its measured collectives are not used.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import TRACES, vtrain_in_process
from tests.rawcount import load_trace
from vtrain.ingest.collectives import canonical_collective
from vtrain.ingest.pipeline import ingest_traces
from vtrain.tables.store import load_profile

#: a real A100 rank with its collective metadata on NCCL kernels and record_param_comms (21 collectives)
A100 = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"

Trace = dict[str, Any]


@pytest.fixture(scope="module")
def a100() -> Trace:
    return load_trace(A100)


def _with_args(trace: Trace, **values: int) -> Trace:
    """A copy of ``trace`` whose events carrying ``In msg nelems`` have these args (keys with spaces as ``_``)."""
    changed = copy.deepcopy(trace)
    for event in changed["traceEvents"]:
        args = event.get("args") or {}
        if "In msg nelems" in args:
            args.update({key.replace("_", " "): value for key, value in values.items()})
    return changed


def _write(trace: Trace, folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "rank-0.json").write_text(json.dumps(trace))
    return folder


def _ingest(folder: Path) -> tuple[Any, list[str]]:
    warnings: list[str] = []
    return ingest_traces(folder, warn=warnings.append), warnings


def test_a_size_beyond_64_bits_is_left_out_with_a_warning(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with ``In msg nelems``/``Out msg nelems`` 2^62 (floats: 2^64 bytes) made a polars
    ComputeError traceback, exit 1. Now the sizes are read as absent (the kernels and their time stay): one line."""
    folder = _write(_with_args(a100, In_msg_nelems=2**62, Out_msg_nelems=2**62), tmp_path / "huge")
    out = tmp_path / "profile"
    ran = vtrain_in_process("ingest", folder, "-o", out)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if "rank-0.json" in line]
    assert len(lines) == 1 and "21 collectives carry a size no collective can have" in lines[0], lines
    profile = load_profile(out)
    assert profile["collectives"].height == 21 and profile["collectives"]["bytes"].null_count() == 21
    assert profile["kernels"].height == 3774


@pytest.mark.parametrize("key", ["In msg nelems", "Group size"])
def test_negative_metadata_never_makes_a_profile_tables_refuses(key: str, a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with ``In msg nelems`` -5 (or ``Group size`` -3) on every collective: ingest
    wrote it, and `vtrain tables` refused its own profile ("row(s) with a bytes that is negative")."""
    values = {"In msg nelems": -5, "Out msg nelems": -5} if key == "In msg nelems" else {"Group size": -3}
    changed = copy.deepcopy(a100)
    for event in changed["traceEvents"]:
        args = event.get("args") or {}
        if key in args:
            args.update(values)
    folder = _write(changed, tmp_path / "negative")
    out = tmp_path / "profile"
    ran = vtrain_in_process("ingest", folder, "-o", out)
    assert ran.returncode == 0, ran.stderr
    assert sum("carry a size no collective can have" in line for line in ran.stderr.splitlines()) == 1
    shown = vtrain_in_process("tables", out)
    assert shown.returncode == 0, shown.stderr
    collectives = load_profile(out)["collectives"]
    assert ((collectives["bytes"] < 0) | (collectives["group_size"] < 1)).fill_null(False).sum() == 0


def test_zero_elements_is_a_size_not_a_missing_one(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with ``In msg nelems`` 0: an ``or`` chain read 0 as missing, so every call left
    nccl_latency in silence. A zero-element collective is a real (barrier-like) call of 0 bytes."""
    profile, warnings = _ingest(_write(_with_args(a100, In_msg_nelems=0, Out_msg_nelems=0), tmp_path / "zero"))
    assert (profile["collectives"]["bytes"] == 0).all()
    assert profile["nccl_latency"].height > 0 and (profile["nccl_latency"]["bytes"] == 0).all()
    assert not [w for w in warnings if "collectives" in w], warnings


def test_collectives_without_a_size_are_said() -> None:
    """traces/hta-v100-2rank (2,020 all-reduces, 357 ms of NCCL time, no shapes recorded): nccl_latency had 0 rows
    and nothing said why."""
    profile, warnings = _ingest(TRACES / "hta-v100-2rank")
    assert profile["nccl_latency"].is_empty()
    said = [w for w in warnings if "collectives have no name or no message size" in w]
    assert said == [f"{TRACES / 'hta-v100-2rank' / 'rank-1.json.gz'}: 2020 of 2020 collectives have no name or no "
                    f"message size in the trace (no element count or dtype in their args, op or annotation): left "
                    f"out of nccl_latency; their time still counts as communication"]


def test_a_sized_trace_has_no_size_warning(a100: Trace, tmp_path: Path) -> None:
    """The shipped A100 trace, unchanged: every collective is sized, nothing is said about them."""
    _, warnings = _ingest(_write(a100, tmp_path / "plain"))
    assert not [w for w in warnings if "collectives" in w], warnings


def test_an_all_gather_run_as_send_recv_kernels_is_an_all_gather() -> None:
    """traces/hta-sm80-128rank-sampled: ncclKernel_SendRecv kernels launched inside c10d::_allgather_base_ ->
    nccl:_all_gather_base were a ``send_recv`` of group size 2 (16 MiB) in a 128-rank job."""
    profile, _ = _ingest(TRACES / "hta-sm80-128rank-sampled")
    collectives = profile["collectives"]
    assert collectives.filter(pl.col("collective") == "send_recv").is_empty()
    gathers = collectives.filter(pl.col("collective") == "all_gather")
    # c10d::_allgather_base_'s Input Dims: a 1 GiB output of a 16 MiB input, a group of 64
    assert gathers.height == 4 and gathers["group_size"].to_list() == [64] * 4


@pytest.mark.parametrize(("name", "collective"), [
    ("nccl:_all_gather_base", "all_gather"), ("nccl:all_gather_into_tensor_coalesced", "all_gather"),
    ("c10d::allgather_into_tensor_coalesced_", "all_gather"),
    ("_c10d_functional::all_gather_into_tensor", "all_gather"),
    ("nccl:all_reduce_coalesced", "all_reduce"), ("c10d::allreduce_coalesced_", "all_reduce"),
    ("nccl:_broadcast_oop", "broadcast"), ("nccl:_reduce_oop", "reduce"),
    ("nccl:_reduce_scatter_base", "reduce_scatter"), ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("c10d::_reduce_scatter_base_", "reduce_scatter"), ("_c10d_functional::all_to_all_single", "all_to_all"),
    ("c10d::alltoall_base_", "all_to_all"), ("c10d::recv_any_source_", "recv"), ("recvAnySource", "recv"),
    ("nccl:all_reduce_barrier", "barrier"), ("SendRecv", "send_recv"), ("nccl:coalesced", None), ("Generic", None),
])
def test_pytorch_collective_names(name: str, collective: str | None) -> None:
    """ProcessGroupNCCL's titles and c10d ops of PyTorch 1.13-2.5 (traces/hta-sm80-128rank-sampled writes
    ``nccl:_all_gather_base``); ``nccl:coalesced`` and NCCL >= 2.19's ``ncclDevKernel_Generic`` name none."""
    assert canonical_collective(name) == collective


def _one_rank_without_groups(trace: Trace, world_size: int) -> Trace:
    """``trace`` as one rank of a job of ``world_size`` ranks whose trace lists no process group, neither in
    ``distributedInfo`` nor on its collectives."""
    changed = copy.deepcopy(trace)
    info = changed["distributedInfo"]
    changed["distributedInfo"] = {"backend": info["backend"], "rank": 0, "world_size": world_size}
    for event in changed["traceEvents"]:
        for key in ("Process Group Name", "Process Group Description", "Process Group Ranks", "Group size"):
            (event.get("args") or {}).pop(key, None)
    return changed


def test_one_rank_of_two_without_groups_measures_collectives_of_two(a100: Trace, tmp_path: Path) -> None:
    profile, _ = _ingest(_write(_one_rank_without_groups(a100, 2), tmp_path / "traces"))
    latency = profile.tables["nccl_latency"]
    assert latency.height == 7 and latency["group_size"].to_list() == [2] * 7


def test_collectives_of_an_unknown_group_are_said_where_a_prediction_leaves_them_out(a100: Trace,
                                                                                     tmp_path: Path) -> None:
    traces = _write(_one_rank_without_groups(a100, 4), tmp_path / "traces")
    assert vtrain_in_process("ingest", traces, "-o", tmp_path / "profile").returncode == 0
    assert load_profile(tmp_path / "profile").tables["nccl_latency"]["group_size"].null_count() == 7
    config = tmp_path / "run.yaml"
    config.write_text("model: {layers: 2, hidden: 1024, heads: 16, seq: 512}\n"
                      "parallelism: {dp: 4, micro_batch: 1, global_batch: 4}\n"
                      "precision: fp16\nhardware: {device: A100, device_count: 4}\n")
    ran = vtrain_in_process("simulate", config, "--profile", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert (f"warning: {tmp_path / 'profile'}: 7 measured collective latency row(s) (nccl_latency) have no group "
            f"size: no prediction can use them") in ran.stderr
    shipped = vtrain_in_process("simulate", config, "--profile", TRACES.parent / "profiles" / "a100")
    assert "have no group size" not in shipped.stderr
    (traces / "run.yaml").write_text(config.read_text())  # validate's own profile of the traces says it too, and where
    ran = vtrain_in_process("validate", traces, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: {traces}: 7 measured collective latency row(s) (nccl_latency) have no group size" in ran.stderr


def test_a_held_out_profile_sizes_the_collectives_an_iteration_boundary_splits() -> None:
    """validate's profile of every other iteration matches a collective's members among all iterations: in vtrain's
    own t2p2d2 recording a gradient all-reduce's members fall on both sides of one rank's iteration boundary, and the
    odd iterations' profile kept it unmatched and unsized (the demo warned that no prediction could use it)."""
    from vtrain.ingest.pipeline import ingest_traces
    from vtrain.validate.model import held_out_profile

    profile = ingest_traces(TRACES / "t2p2d2")
    steady = sorted(profile["collectives"]["iteration"].drop_nulls().unique().to_list())
    for iterations in (steady[0::2], steady[1::2]):
        table = held_out_profile(profile, iterations).nccl_latency
        assert table.filter(pl.col("group_size").is_null()).is_empty(), table
        assert set(table["collective"]) == {"all_reduce", "send", "recv"}
