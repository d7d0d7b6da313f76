"""What a trace folder holds besides readable rank files is said by `vtrain ingest` and `vtrain validate` alike.

- An entry named like a trace that is no file (a named pipe, which would block a reader forever; a folder) is not
  read, with a warning line naming it.
- A rank of the job with no trace file is a warning line in both, and a line in validate's report (validate said
  nothing of it before: its report only listed the ranks it had).
- Several profiler cycles' files of each rank: the latest whole cycle is read, the rest said.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, TRACES, vtrain_in_process
from vtrain.tables.store import load_profile

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"  # rank 0 of a job of world size 2


@pytest.fixture(params=["named-pipe", "folder"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SOURCE, traces / "rank-0.json.gz")
    if request.param == "named-pipe":
        os.mkfifo(traces / "rank-1.json")
    else:
        (traces / "rank-1.json").mkdir()
    return traces


def test_ingest_says_what_it_did_not_read_and_the_missing_rank(folder: Path, tmp_path: Path) -> None:
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: {folder / 'rank-1.json'}: not read: named like a trace but not a file" in ran.stderr
    assert f"warning: {folder}: 1 of 2 ranks have no trace file (missing: 1)" in ran.stderr


def test_validate_says_them_and_reports_them(folder: Path, tmp_path: Path) -> None:
    ran = vtrain_in_process("validate", folder, "-o", tmp_path / "report", "--no-hta")
    assert ran.returncode == 0, ran.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    for line in (f"{folder / 'rank-1.json'}: not read: named like a trace but not a file",
                 f"{folder}: 1 of 2 ranks have no trace file (missing: 1)"):
        assert f"warning: {line}" in ran.stderr
        assert line in report


@pytest.mark.parametrize("command", ["ingest", "validate"])
def test_of_two_profiler_cycles_of_one_rank_the_latest_is_read(command: str, tmp_path: Path) -> None:
    """A real H100 run profiled with ``schedule(repeat=2)`` and ``tensorboard_trace_handler`` leaves a file per
    cycle for the same rank (traces/gpu/h100-user-amp-ddp; the default ``repeat=0`` leaves one a cycle for as long as
    the run lasts): the folder was refused ("rank 0 is claimed by both", exit 2). The latest cycle is read (its
    ProfilerStep #6, #7), and a warning line says which and what else is in the folder."""
    cycles = TRACES / "gpu" / "h100-user-amp-ddp"
    out = tmp_path / "out"
    ran = vtrain_in_process(command, cycles, "-o", out, *(["--no-hta"] if command == "validate" else []))
    assert ran.returncode == 0, ran.stderr
    assert (f"warning: {cycles}: 2 profiler cycles (tensorboard_trace_handler writes a file per rank and cycle): "
            f"cycle 2 is read, not the other cycles' 1 file;") in ran.stderr
    if command == "ingest":
        profile = load_profile(out)
        assert profile["cpu_ops"].filter(pl.col("name").str.starts_with("ProfilerStep#"))["name"].unique().sort() \
            .to_list() == ["ProfilerStep#6", "ProfilerStep#7"]


def test_a_cycle_cut_short_is_not_the_one_read(tmp_path: Path) -> None:
    """A run that ended as a cycle began leaves that cycle's files with one empty step (tests/data/profiler-cycles):
    read as the latest cycle, the folder would hold nothing to measure. The latest whole cycle is read and the one
    cut short is said."""
    whole = sorted((TRACES / "gpu" / "h100-user-amp-ddp").glob("*.pt.trace.json.gz"))[0]
    stub = next((REPO / "tests" / "data" / "profiler-cycles" / "empty-second-cycle").glob("rank0.*"))
    folder = tmp_path / "traces"
    folder.mkdir()
    shutil.copy(whole, folder / whole.name)
    shutil.copy(stub, folder / f"vm_484.{int(whole.name.split('.')[1]) + 10**9}.pt.trace.json.gz")
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "cycle 1 is read, not the other cycles' 1 file; cycle 2 after it was cut short" in ran.stderr
    steps = load_profile(tmp_path / "out")["cpu_ops"].filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert sorted(steps["name"].unique().to_list()) == ["ProfilerStep#2", "ProfilerStep#3"]


def test_a_first_cycle_swollen_by_warm_up_is_not_the_one_read(tmp_path: Path) -> None:
    """A first cycle much larger than the later ones (warm-up: autotuning, CUDA graph capture) is no reason to read
    it: the cut-short rule measured every cycle against the largest, so of three cycles the first, 4.5x the others,
    was read. Only the last is measured, against the one before it: the latest (ProfilerStep #6, #7) is read."""
    large = TRACES / "gpu" / "h100-user-ckpt-accum" / "rank-0.json.gz"  # 1.7 MB: a real trace, standing in for cycle 1
    later = sorted((TRACES / "gpu" / "h100-user-amp-ddp").glob("*.pt.trace.json.gz"))  # 0.39 MB each
    folder = tmp_path / "traces"
    folder.mkdir()
    first = int(later[0].name.split(".")[1]) - 10**9
    shutil.copy(large, folder / f"vm_484.{first}.pt.trace.json.gz")
    for path in later:
        shutil.copy(path, folder / path.name)
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "3 profiler cycles (tensorboard_trace_handler writes a file per rank and cycle): cycle 3 is read" \
        in ran.stderr
    steps = load_profile(tmp_path / "out")["cpu_ops"].filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert sorted(steps["name"].unique().to_list()) == ["ProfilerStep#6", "ProfilerStep#7"]


def test_a_trace_beside_its_gzipped_copy_is_read_once(tmp_path: Path) -> None:
    """A user gzipped a trace and kept the original: the same rank twice was an error ("rank 0 is claimed by both
    rank-0.json and rank-0.json.gz"); the plain copy is now left out with a warning. A plain file that differs from
    the gzipped one stays two claims of one rank."""
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SOURCE, traces / "rank-0.json.gz")
    data = gzip.decompress(SOURCE.read_bytes())
    (traces / "rank-0.json").write_bytes(data)
    for command in (["ingest", traces, "-o", tmp_path / "profile"], ["validate", traces, "--no-hta", "-o",
                                                                       tmp_path / "report"]):
        ran = vtrain_in_process(*command)
        assert ran.returncode == 0, ran.stderr
        assert f"{traces / 'rank-0.json'}: not read: the same trace as rank-0.json.gz" in ran.stderr
    (traces / "rank-0.json").write_bytes(data.replace(b'"traceEvents"', b'"traceEvents" ', 1))
    ran = vtrain_in_process("ingest", traces, "-o", tmp_path / "profile2")
    assert ran.returncode == 2 and "rank 0 is claimed by both rank-0.json and rank-0.json.gz" in ran.stderr


def test_a_folder_of_rank_folders_says_where_the_traces_are(tmp_path: Path) -> None:
    """Traces one folder down (a folder per rank): the one-line error says how many lie in the subfolders and where
    the first is, instead of only "no trace files"."""
    for rank in (0, 1):
        (tmp_path / "run" / f"rank{rank}").mkdir(parents=True)
        shutil.copy(SOURCE, tmp_path / "run" / f"rank{rank}" / f"rank-{rank}.json.gz")
    ran = vtrain_in_process("ingest", tmp_path / "run", "-o", tmp_path / "profile")
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1
    assert "2 in its subfolders (rank0/rank-0.json.gz ...)" in ran.stderr


def test_json_files_that_are_no_trace_are_left_out_with_a_warning(tmp_path: Path) -> None:
    """A training run's config.json and metrics.json beside its traces stopped every command ("not a Kineto trace:
    no traceEvents list"); small JSON files named like no trace and holding no traceEvents are now left out, each
    with a warning. A file named like a trace is still read as one (its error names it), and a folder of nothing
    but such files says so."""
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(SOURCE, traces / "rank-0.json.gz")
    (traces / "config.json").write_text('{"lr": 0.001, "epochs": 3}')
    (traces / "metrics.json").write_text("[1, 2, 3]")
    ran = vtrain_in_process("ingest", traces, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    for name in ("config.json", "metrics.json"):
        assert f"{traces / name}: not read: a JSON file but no Kineto trace (no traceEvents)" in ran.stderr
    (traces / "rank-1.json").write_text('{"lr": 0.001}')
    ran = vtrain_in_process("ingest", traces, "-o", tmp_path / "profile2")
    assert ran.returncode == 2 and "rank-1.json: not a Kineto trace: no traceEvents list" in ran.stderr
    only = tmp_path / "only"
    only.mkdir()
    (only / "config.json").write_text("{}")
    ran = vtrain_in_process("validate", only, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 2 and "its 1 JSON file(s) are no Kineto trace" in ran.stderr


def test_traces_compressed_otherwise_than_gzip_are_named(tmp_path: Path) -> None:
    """rank-0.json.xz (or .zst, .bz2): not read, and the error says what they are and what to do, instead of only
    "no trace files"."""
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank-0.json.xz").write_bytes(lzma.compress(gzip.decompress(SOURCE.read_bytes())))
    ran = vtrain_in_process("ingest", traces, "-o", tmp_path / "profile")
    assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1
    assert "1 compressed otherwise (rank-0.json.xz ...): gzip them" in ran.stderr


def test_a_trace_in_chromes_array_format_is_named(tmp_path: Path) -> None:
    """torch.autograd.profiler before PyTorch 1.8 wrote Chrome's JSON array format (a list of events, no
    traceEvents): the one-line error says so, where it said only "the top level is not a JSON object"."""
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "rank-0.json").write_text('[{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 5, "tid": 1, '
                                        '"pid": "CPU functions", "args": {}}]')
    for command in ("ingest", "validate"):
        ran = vtrain_in_process(command, traces, "-o", tmp_path / command)
        assert ran.returncode == 2 and len(ran.stderr.splitlines()) == 1, ran.stderr
        assert "the top level is a JSON array (Chrome's array format" in ran.stderr


@pytest.mark.parametrize("kind", ["folder", "pipe", "broken link"])
def test_a_run_yaml_that_is_not_a_file_is_said(tmp_path: Path, kind: str) -> None:
    """A ``run.yaml`` that is a folder, a pipe or a broken link was ignored in silence: the profile's run was null
    and its warnings empty, where a run.yaml that does not load is said (an audit). It is said, never opened (a
    pipe would block), and the traces are read all the same."""
    traces = tmp_path / "run"
    shutil.copytree(TRACES / "t1p1d2", traces)
    described = traces / "run.yaml"
    described.unlink()
    {"folder": described.mkdir, "pipe": lambda: os.mkfifo(described),
     "broken link": lambda: described.symlink_to(tmp_path / "gone.yaml")}[kind]()
    ran = vtrain_in_process("ingest", traces, "-o", tmp_path / "p")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: {described}: not a file (a folder, a pipe or a broken link), not read" in ran.stderr, ran.stderr
