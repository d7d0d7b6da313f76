"""A profile's tables hold values no prediction may use (an audit, each through `vtrain simulate`): a NaN
``wait_us`` made the iteration ``nan ms`` (and validate a traceback, plan an MFU of 12,195 %), medians of 1e300 µs
or 0 made predictions of 1e300 ms or of no compute, GEMMs of no FLOPs tripled a prediction, a signature that does
not parse was dropped from the exact lookups, a ``provenance`` that is a list was a traceback. Each is now one
line naming the table, exit 2."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.tables.store import Profile, write_profile

A100 = REPO / "profiles" / "a100"
CONFIG = REPO / "examples" / "gpt-1.3b-a100.yaml"


def _table(table: str, change: Callable[[pl.DataFrame], pl.DataFrame]) -> Callable[[Path], str]:
    def corrupt(profile: Path) -> str:
        file = profile / f"{table}.parquet"
        change(pl.read_parquet(file)).write_parquet(file)
        return f"{table}.parquet"
    return corrupt


def _provenance(value: object) -> Callable[[Path], str]:
    def corrupt(profile: Path) -> str:
        file = profile / "metadata.json"
        metadata = json.loads(file.read_text())
        metadata["fitted"]["provenance"] = value
        file.write_text(json.dumps(metadata))
        return "metadata.json"
    return corrupt


CASES = {
    "nan wait_us": (_table("nccl_latency", lambda d: d.with_columns(wait_us=pl.lit(float("nan")))), "wait_us"),
    "huge collective mean": (_table("nccl_latency", lambda d: d.with_columns(mean_us=pl.lit(1e300))), "a week"),
    "huge kernel median": (_table("op_benchmarks", lambda d: d.with_columns(median_us=pl.lit(1e300))), "a week"),
    "zero kernel median": (_table("op_benchmarks", lambda d: d.with_columns(median_us=pl.lit(0.0))), "of 0"),
    "gemm of no flops": (_table("op_benchmarks", lambda d: d.with_columns(flops=pl.lit(0.0))), "no FLOPs"),
    "unparsable signature": (_table("op_latency", lambda d: d.with_columns(input_dims=pl.lit("[[["))), "JSON list"),
    "provenance a list": (_provenance([1]), "provenance must be a mapping"),
    "provenance of lists": (_provenance({"gemm": [1, 2]}), "provenance must say where each parameter came from"),
    "operator of no name": (_table("op_latency", lambda d: d.with_columns(
        op=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("op")))), "1 row(s) without op"),
    "collective of no kind": (_table("nccl_latency", lambda d: d.with_columns(
        collective=pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("collective")))),
        "1 row(s) without collective"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_profile_with_values_no_prediction_may_use_is_one_line(case: str, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    shutil.copytree(A100, profile)
    corrupt, words = CASES[case]
    file = corrupt(profile)
    ran = vtrain_in_process("simulate", CONFIG, "--profile", profile)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and file in errors[0] and words in errors[0], ran.stderr
    assert "Traceback" not in ran.stderr


def test_metadata_is_read_as_strictly_as_a_run_config(tmp_path: Path) -> None:
    """``metadata.json`` with a key given twice was read silently (Python's json keeps the last), and one saved
    with a byte-order mark (a Windows editor) was refused with json's own advice; run configs refuse the first
    and read the second."""
    profile = tmp_path / "profile"
    shutil.copytree(A100, profile)
    file = profile / "metadata.json"
    text = file.read_text()
    file.write_text("\ufeff" + text)
    assert vtrain_in_process("simulate", CONFIG, "--profile", profile).returncode == 0
    file.write_text(text.replace("{", '{"kind": "profile", ', 1))
    ran = vtrain_in_process("simulate", CONFIG, "--profile", profile)
    assert ran.returncode == 2 and "key 'kind' given twice" in ran.stderr, ran.stderr


def test_a_profile_that_names_no_device_is_shown(tmp_path: Path) -> None:
    """``"device": null`` in metadata.json (allowed: a profile may not know its device) was a traceback in
    `vtrain tables`."""
    profile = tmp_path / "profile"
    shutil.copytree(A100, profile)
    file = profile / "metadata.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "device": None}))
    ran = vtrain_in_process("tables", profile)
    shown = "".join(ran.stdout.split())  # rich wraps a long path anywhere, a space or a line break included
    assert ran.returncode == 0 and f"{profile}:deviceunknown,fittedto" in shown, ran.stderr


def test_a_file_given_as_the_profile_says_so() -> None:
    """`simulate --profile examples/tiny-cpu.yaml` said "no such profile folder" of a file that exists."""
    ran = vtrain_in_process("simulate", CONFIG, "--profile", CONFIG)
    assert ran.returncode == 2 and "is a file, not a profile folder" in ran.stderr, ran.stderr


def test_a_trace_in_whole_microseconds_makes_a_profile_vtrain_reads(tmp_path: Path) -> None:
    """Kineto before PyTorch 1.9 wrote whole microseconds: a small collective's kernel lasts 0. Refusing medians
    of 0 in every latency table made `vtrain ingest` of such a trace write a profile that `vtrain tables` and
    `simulate` then refused; only imported kernel measurements must take time."""
    import gzip

    traces = tmp_path / "traces"
    traces.mkdir()
    for source in sorted((REPO / "traces" / "hta-a100-2rank-nccl").glob("rank-*.json.gz")):
        trace = json.loads(gzip.decompress(source.read_bytes()))
        for event in trace["traceEvents"]:
            if event.get("cat") == "kernel" and "nccl" in event.get("name", "").lower():
                event["dur"] = 0
        (traces / source.name).write_bytes(gzip.compress(json.dumps(trace).encode()))
    assert vtrain_in_process("ingest", traces, "-o", tmp_path / "profile").returncode == 0
    ran = vtrain_in_process("tables", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    from vtrain.cli.tables import nccl_table
    from vtrain.tables.store import load_profile

    nccl = load_profile(tmp_path / "profile").nccl_latency
    assert (nccl["median_us"] == 0).any() and nccl["algbw_gbps"].null_count()  # no rate of a call of 0 µs
    assert nccl_table(nccl, 10, True).row_count == nccl.height  # the wide table shows it as "-"


@pytest.mark.parametrize(("table", "column"), [("cpu_ops", "name"), ("collectives", "rank"), ("cpu_ops", "ts")])
def test_an_event_without_its_rank_name_or_time_is_one_line(table: str, column: str, tmp_path: Path,
                                                            shipped_profile: Callable[[Path], Profile]) -> None:
    """A traced profile's events are placed when it is simulated (its host's gaps): a row without the rank, name
    or time ingest writes for every row was a traceback there (found by mutating profiles)."""
    profile = write_profile(shipped_profile(REPO / "traces" / "t2p2d2"), tmp_path / "profile")
    file = profile / f"{table}.parquet"
    frame = pl.read_parquet(file)
    frame.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(None).otherwise(pl.col(column))
                       .alias(column)).write_parquet(file)
    ran = vtrain_in_process("simulate", REPO / "traces" / "t2p2d2" / "run.yaml", "--profile", profile)
    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {file}: 1 row(s) without {column} (ingest writes it for every row)"], ran.stderr


def test_a_collective_call_ingest_could_not_name_is_kept(tmp_path: Path,
                                                        shipped_profile: Callable[[Path], Profile]) -> None:
    """Ingest writes a collective call of no known kind (an NCCL kernel whose name, args and op do not say it) with
    no ``collective`` and leaves it out of nccl_latency: a profile holding one is read, not refused."""
    profile = write_profile(shipped_profile(REPO / "traces" / "t2p2d2"), tmp_path / "profile")
    file = profile / "collectives.parquet"
    frame = pl.read_parquet(file)
    frame.with_columns(collective=pl.when(pl.int_range(pl.len()) == 3).then(None).otherwise(pl.col("collective"))
                       ).write_parquet(file)
    for command in (("simulate", REPO / "traces" / "t2p2d2" / "run.yaml", "--profile", profile),
                    ("tables", profile, "--top", "3")):
        ran = vtrain_in_process(*command)
        assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
