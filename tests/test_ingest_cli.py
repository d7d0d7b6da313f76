"""`vtrain ingest` / `vtrain tables` from the command line: good input, schema variants and bad input."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import HTA_TRACE_SETS, REPO, vtrain_in_process
from vtrain.ingest.pipeline import ingest_traces, rank_summary

A100 = next(p for p in HTA_TRACE_SETS if "a100" in p.name)


def vtrain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def _load(path: Path) -> dict:
    with gzip.open(path, "rt") if path.suffix == ".gz" else path.open() as handle:
        return json.load(handle)


def test_ingest_writes_tables_and_json_summary(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    result = vtrain("ingest", A100, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    rank0 = summary["ranks"]["0"]
    assert set(rank0) >= {"kernels", "computation_us", "communication_us", "memory_us", "iterations"}
    assert rank0["iterations"] == 3 and rank0["communication_us"] > 0
    assert "1 of 2 ranks have no trace file" in result.stderr
    for table in ("kernels", "cpu_ops", "collectives", "op_latency", "nccl_latency"):
        assert pl.read_parquet(out / f"{table}.parquet").height > 0, table
    assert json.loads((out / "metadata.json").read_text())["world_size"] == 2
    shown = vtrain("tables", out, "--top", "3")
    assert shown.returncode == 0 and "op_latency" in shown.stdout and "nccl_latency" in shown.stdout


def test_a_cpu_run_is_summed_up_by_its_operators_not_as_zero_device_time(tmp_path: Path) -> None:
    """A CPU run's ranks read "0 device activities, compute 0.0 ms, comm 0.0 ms, memory 0.0 ms", as if nothing ran;
    they are summed up by their CPU operators."""
    result = vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", tmp_path / "profile")
    assert result.returncode == 0, result.stderr
    cpu_ops = pl.read_parquet(tmp_path / "profile" / "cpu_ops.parquet").filter(pl.col("rank") == 0).height
    assert f"rank 0: {cpu_ops:,} CPU operators, no device activities, 10 iterations" in result.stdout
    assert "compute 0.0 ms" not in result.stdout


def test_schema_variants_give_the_same_tables(tmp_path: Path) -> None:
    """Newer spellings (async_cpu_to_gpu flows, ncclDevKernel names) and no deviceProperties/distributedInfo
    (rank from the file name) change nothing in the per-class kernel time."""
    trace = _load(next(A100.glob("*.json.gz")))
    for event in trace["traceEvents"]:
        if event.get("cat") == "ac2g":
            event["cat"] = event["name"] = "async_cpu_to_gpu"
        if event.get("name", "").startswith("ncclKernel_AllReduce_RING_LL_Sum_float"):
            event["name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
            for key in ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype"):
                event["args"].pop(key, None)
    del trace["deviceProperties"], trace["distributedInfo"]
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "trace_rank_0.pt.trace.json").write_text(json.dumps(trace))
    original = rank_summary(ingest_traces(A100))["0"]
    changed = ingest_traces(variant)
    assert rank_summary(changed)["0"] == original
    all_reduce = changed["collectives"].filter(pl.col("collective") == "all_reduce")
    assert all_reduce.height > 0 and set(all_reduce["algorithm"]) == {"RING"} and set(all_reduce["protocol"]) == {"LL"}


def test_dropped_events_are_counted_in_one_warning(tmp_path: Path) -> None:
    trace = _load(next(A100.glob("*.json.gz")))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["dur"] = -5
    del kernels[1]["dur"]
    folder = tmp_path / "bad-durations"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    result = vtrain("ingest", folder, "-o", tmp_path / "p", "--json")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "missing or negative" in line]
    assert warnings == [f"warning: {folder / 'rank-0.json'}: dropped 2 events with a missing or negative duration"]
    assert json.loads(result.stdout)["ranks"]["0"]["kernels"] == rank_summary(ingest_traces(A100))["0"]["kernels"] - 2


def _write(folder: Path, name: str, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def _bad_inputs(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = (next(A100.glob("*.json.gz"))).read_bytes()
    text = gzip.decompress(good)
    cases: dict[str, tuple[Path, str]] = {}
    _write(tmp / "truncated-json", "rank-0.json", text[: len(text) // 2])
    cases["truncated json"] = (tmp / "truncated-json", "truncated JSON")
    _write(tmp / "truncated-gzip", "rank-0.json.gz", good[: len(good) // 2])
    cases["truncated gzip"] = (tmp / "truncated-gzip", "truncated gzip")
    _write(tmp / "not-gzip", "rank-0.json.gz", text)
    cases["not gzip"] = (tmp / "not-gzip", "not a gzip file")
    _write(tmp / "empty", "rank-0.json", b"")
    cases["empty file"] = (tmp / "empty", "file is empty")
    _write(tmp / "not-trace", "rank-0.json", b'{"hello": [1, 2, 3]}')
    cases["json that is not a trace"] = (tmp / "not-trace", "not a Kineto trace")
    _write(tmp / "array", "rank-0.json", b"[1, 2, 3]")
    cases["json array"] = (tmp / "array", "not a Kineto trace")
    (tmp / "no-traces").mkdir(parents=True)
    (tmp / "no-traces" / "notes.txt").write_text("nothing here")
    cases["folder with no traces"] = (tmp / "no-traces", "no trace files")
    cases["missing folder"] = (tmp / "does-not-exist", "no such trace folder")
    _write(tmp / "same-rank", "a.json.gz", good)
    _write(tmp / "same-rank", "b.json.gz", good)
    cases["two files, same rank"] = (tmp / "same-rank", "rank 0 is claimed by both a.json.gz and b.json.gz")
    other = json.loads(text)
    other["distributedInfo"]["rank"] = 1
    other["distributedInfo"]["world_size"] = 4
    _write(tmp / "two-jobs", "rank-0.json.gz", good)
    _write(tmp / "two-jobs", "rank-1.json", json.dumps(other).encode())
    cases["two jobs"] = (tmp / "two-jobs", "world size 4 here but 2 in rank-0.json.gz")
    anonymous = json.loads(text)
    del anonymous["distributedInfo"]
    _write(tmp / "no-rank", "host_1.trace.json", json.dumps(anonymous).encode())
    _write(tmp / "no-rank", "host_2.trace.json", json.dumps(anonymous).encode())  # one file alone is rank 0
    cases["no rank anywhere"] = (tmp / "no-rank", "cannot tell the rank")
    return cases


def test_bad_input_gives_one_line_exit_2_and_no_profile(tmp_path: Path) -> None:
    """The missing folder as a real process; the others through the console script's entry point in this
    process (exit code, stdout and stderr as a process gives them, a traceback written as the interpreter would:
    see tests/test_hostile_inputs.py), which spares a second of start-up each."""
    for label, (folder, message) in _bad_inputs(tmp_path / "in").items():
        out = tmp_path / "out" / label.replace(" ", "-")
        run = vtrain if label == "missing folder" else vtrain_in_process
        result = run("ingest", folder, "-o", out)
        assert result.returncode == 2, (label, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (label, result.stderr)
        assert message in lines[0], (label, lines[0])
        assert "Traceback" not in result.stderr
        assert not out.exists(), label
        assert not list((tmp_path / "out").glob(".*")) if (tmp_path / "out").exists() else True


def test_existing_profile_is_kept_without_force(tmp_path: Path) -> None:
    out = tmp_path / "p"
    assert vtrain("ingest", A100, "-o", out).returncode == 0
    stamp = (out / "metadata.json").read_text()
    again = vtrain("ingest", A100, "-o", out)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert (out / "metadata.json").read_text() == stamp
    assert vtrain("ingest", A100, "-o", out, "--force").returncode == 0


_LOADED = """
import runpy, sys
sys.argv = ["vtrain", *sys.argv[1:]]
try:
    runpy.run_module("vtrain.cli.main", run_name="__main__")
except SystemExit as exit:
    print(exit.code, sorted({m.split(".")[0] for m in sys.modules} & {"typer", "pydantic", "rich"}))
"""


def test_ingest_runs_without_typer_pydantic_or_rich(tmp_path: Path) -> None:
    """They cost an ingest a tenth of a second of start-up; its help and usage errors come from argparse."""
    ran = subprocess.run([sys.executable, "-c", _LOADED, "ingest", A100, "-o", tmp_path / "p"],
                         capture_output=True, text=True, cwd=REPO)
    assert ran.stdout.splitlines()[-1] == "0 []", ran.stderr
    assert "usage: vtrain ingest" in vtrain("ingest", "--help").stdout
    wrong = vtrain("ingest", A100)
    assert wrong.returncode == 2 and "-o/--output" in wrong.stderr
    # the console script goes through typer, which hands ingest its arguments
    forwarded = subprocess.run([sys.executable, "-c", "from vtrain.cli.main import app; app()", "ingest", A100,
                                "-o", tmp_path / "q", "--json"], capture_output=True, text=True, cwd=REPO)
    assert forwarded.returncode == 0 and json.loads(forwarded.stdout)["world_size"] == 2, forwarded.stderr


def test_tables_on_a_folder_that_is_not_a_profile(tmp_path: Path) -> None:
    result = vtrain("tables", tmp_path)
    assert result.returncode == 2 and "not a profile folder" in result.stderr


@pytest.fixture(scope="module")
def gloo_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank gloo job on CPU, profiled with torch.profiler."""
    folder = tmp_path_factory.mktemp("gloo")
    script = REPO / "tests" / "data" / "gloo_job.py"
    ran = subprocess.run([sys.executable, str(script), str(folder)], timeout=300, capture_output=True, text=True)
    assert ran.returncode == 0, f"the gloo job failed (exit {ran.returncode}):\n{ran.stderr[-4000:]}"
    return folder


def test_cpu_only_traces_give_cpu_latency_tables(gloo_traces: Path) -> None:
    profile = ingest_traces(gloo_traces)
    assert profile["kernels"].is_empty()
    assert profile.metadata["device"]["type"] == "cpu" and profile.metadata["ranks"] == [0, 1]
    ops = profile.op_latency
    assert set(ops["device_type"]) == {"cpu"}
    assert {"aten::addmm", "aten::gelu", "aten::gelu_backward", "aten::mm"} <= set(ops["op"])
    addmm = ops.filter(pl.col("op") == "aten::addmm").row(0, named=True)
    assert addmm["input_dims"] == "[[64], [128, 64], [64, 64], [], []]"
    nccl = profile.nccl_latency
    assert set(nccl["collective"]) >= {"all_reduce", "all_gather"}
    assert nccl.filter(pl.col("collective") == "all_reduce")["bytes"].to_list() == [4000]
    assert nccl.filter(pl.col("collective") == "all_gather")["bytes"].to_list() == [8000]
    assert (nccl["group_size"] == 2).all()


def test_a_warning_about_a_file_whose_name_holds_a_line_break_is_one_line(tmp_path: Path) -> None:
    """Warnings name files as errors do, on one line (``\\n`` shown escaped): a line break in a file name made a
    warning two lines."""
    folder = tmp_path / "traces"
    folder.mkdir()
    os.mkfifo(folder / "rank-1\nx.json")  # named like a trace, not a file: a warning names it
    shutil.copy(REPO / "traces" / "hta-a100-2rank-nccl" / "rank-0.json.gz", folder / "rank-0.json.gz")
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: {folder}/rank-1\\nx.json: not read: named like a trace but not a file\n" in ran.stderr


def test_a_run_yaml_that_does_not_load_is_one_warning_and_the_profile_is_written(tmp_path: Path) -> None:
    """The traced run's config is for the simulator (what it models in the timeline); a broken one does not stop
    the ingest: one warning line naming the file, and a profile without ``run``."""
    traces = tmp_path / "traces"
    shutil.copytree(REPO / "traces" / "t2p1d1", traces)
    (traces / "run.yaml").write_text("model: {layers: -3}\n")
    out = tmp_path / "profile"
    result = vtrain("ingest", traces, "-o", out)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "run.yaml" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "without the traced run's config" in warned[0]
    assert json.loads((out / "metadata.json").read_text())["run"] is None


def test_a_run_yaml_of_another_job_is_one_warning_and_not_kept(tmp_path: Path) -> None:
    """A run.yaml of 4 ranks (tp 2) beside the traces of a 2-rank job was stored in the profile without a word, where
    validate refuses the same folder (an audit): one warning line, and the profile is written without it."""
    traces = tmp_path / "traces"
    shutil.copytree(REPO / "traces" / "t2p1d1", traces)
    run = (traces / "run.yaml").read_text()
    (traces / "run.yaml").write_text(run.replace("dp: 1", "dp: 2").replace("device_count: 2", "device_count: 4"))
    out = tmp_path / "profile"
    result = vtrain("ingest", traces, "-o", out)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "run.yaml" in line]
    assert len(warned) == 1 and "tp*pp*dp = 4 ranks but the traces come from a job of 2" in warned[0], warned
    assert json.loads((out / "metadata.json").read_text())["run"] is None


def test_a_profile_whose_run_does_not_load_is_refused_in_one_line(tmp_path: Path) -> None:
    """A profile's ``run`` (the traced run's config) edited into something that is not a run config: `simulate`
    with that profile says so in one line naming metadata.json, exit 2."""
    out = tmp_path / "profile"
    assert vtrain("ingest", REPO / "traces" / "t2p1d1", "-o", out).returncode == 0
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["run"]["parallelism"]["tp"] == 2
    metadata["run"]["parallelism"]["tp"] = 0
    (out / "metadata.json").write_text(json.dumps(metadata))
    result = vtrain("simulate", REPO / "traces" / "t2p1d1" / "run.yaml", "--profile", out)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "metadata.json" in result.stderr and "Traceback" not in result.stderr


def test_a_profile_whose_run_is_another_runs_is_one_warning(tmp_path: Path) -> None:
    """The traces of one run with the run.yaml of another beside them (another width: 28 of its 136 operator
    signatures are in the timeline): the profile is usable, but its host time is measured between the wrong
    operators; `simulate` says so in one warning line and predicts all the same."""
    traces = tmp_path / "traces"
    shutil.copytree(REPO / "traces" / "t2p1d1", traces)
    described = (traces / "run.yaml").read_text()
    (traces / "run.yaml").write_text(described.replace("hidden: ", "hidden: 1", 1))
    out = tmp_path / "profile"
    assert vtrain("ingest", traces, "-o", out).returncode == 0
    result = vtrain("simulate", REPO / "traces" / "t2p1d1" / "run.yaml", "--profile", out, "--json")
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "places only 28 of its 136" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "metadata.json" in warned[0]
    assert json.loads(result.stdout)["iteration_time_ms"] > 0


def test_operators_without_input_shapes_are_said_once_per_folder(tmp_path: Path) -> None:
    """torch's profiler records no input shapes unless ``record_shapes=True`` (its default is off; HTA's A100 and
    V100 traces have none): every shape of an operator then shares one latency, which a prediction cannot look up
    by shape. One warning line for the folder (ingest said nothing); a recording with shapes gives none."""
    shapeless = tmp_path / "no-shapes"
    shapeless.mkdir()
    for trace in sorted((REPO / "traces" / "t1p1d2").glob("rank-*.json.gz")):
        data = json.loads(gzip.decompress(trace.read_bytes()))
        for event in data["traceEvents"]:
            for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
                (event.get("args") or {}).pop(key, None)
        (shapeless / trace.name).write_bytes(gzip.compress(json.dumps(data).encode()))
    said = [line for line in vtrain_in_process("ingest", shapeless, "-o", tmp_path / "p1").stderr.splitlines()
            if "record_shapes=True" in line]
    assert said == [f"warning: {shapeless}: none of its rank files record the operators' input shapes (profiled "
                    f"without record_shapes=True): each operator's latency is one median over all its shapes, which a "
                    f"prediction cannot look up by shape"]
    with_shapes = vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", tmp_path / "p2")
    assert with_shapes.returncode == 0 and "record_shapes" not in with_shapes.stderr


def test_the_same_traces_write_the_same_tables(tmp_path: Path) -> None:
    """Ingesting one folder twice writes the same bytes in every table: the profile's cache key is of its files'
    contents, so a table whose rows came out in another order (operators of the same median time, in the order
    polars' threads finished: it happened two runs in three on `traces/t2p2d2`) made the same profile a new one."""
    for name in ("first", "second", "third"):
        done = vtrain_in_process("ingest", REPO / "traces" / "t2p2d2", "-o", tmp_path / name)
        assert done.returncode == 0, done.stderr
    for table in sorted(path.name for path in (tmp_path / "first").glob("*.parquet")):
        for name in ("second", "third"):
            assert (tmp_path / name / table).read_bytes() == (tmp_path / "first" / table).read_bytes(), table


def test_trace_files_without_a_single_event_are_one_error_not_an_empty_profile(tmp_path: Path) -> None:
    """`"traceEvents": []` in every file: ingest wrote a profile of 0 rows with two warnings, exit 0 (an audit);
    one file of metadata only was already an error. One empty rank among others is still a warning."""
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "rank-0.json").write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1},
                                                    "traceEvents": []}))
    ran = vtrain_in_process("ingest", empty, "-o", tmp_path / "profile")
    assert ran.returncode == 2 and ran.stderr == (f"error: {empty}: no event in any of its 1 trace file(s) "
                                                  "(traceEvents empty): a profile of them would hold nothing\n")
    assert not (tmp_path / "profile").exists()


def test_one_rank_traced_without_distributed_info_says_the_ranks_its_collectives_name(tmp_path: Path) -> None:
    """Rank 0 of HTA's 2-rank NCCL trace without its distributedInfo: its all-reduces name ranks 0 and 1, yet the
    job was read as one of an unknown size, no rank said missing (an audit: one rank of 64). The collectives'
    groups give a lower bound, said; with distributedInfo the usual missing-ranks line stands alone."""
    source = REPO / "traces" / "hta-a100-2rank-nccl" / "rank-0.json.gz"
    trace = json.loads(gzip.decompress(source.read_bytes()))
    trace.pop("distributedInfo")
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert (f"warning: {folder}: no trace says the job's world size, and its collectives' groups name ranks up to "
            "1: at least 2 ranks, 1 of them with no trace file here") in ran.stderr, ran.stderr
    whole = tmp_path / "whole"
    whole.mkdir()
    shutil.copy(source, whole)
    ran = vtrain_in_process("ingest", whole, "-o", tmp_path / "profile2")
    assert ran.returncode == 0 and "no trace says the job's world size" not in ran.stderr, ran.stderr
    assert "1 of 2 ranks have no trace file" in ran.stderr
