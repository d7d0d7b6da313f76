"""Hostile trace folders found by an audit of the trace-side commands, each made in tmp_path from a small real
trace shipped in the repo (traces/wild/mi250-rocm: an MI250 ROCm trace, 2 ProfilerSteps, 14 kernels).

- Files of two jobs (their ``distributedInfo.world_size`` disagree) are one error line in `vtrain validate` and
  `vtrain whatif` as in `vtrain ingest` (validate and whatif took the first file's world size and said nothing).
- An output folder inside the trace folder is refused (it was written there: the input folder changed).
- Kernel launches whose device activities are not in the file (not recorded, pruned, or in a category vtrain does
  not read) are a warning line in ingest, validate and whatif (the kernels were left out in silence: a GPU trace
  read as one without device work).
- `vtrain whatif` says what it did not read or left out of the traces, as validate does (it said nothing).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TRACES, vtrain_in_process

SOURCE = TRACES / "wild" / "mi250-rocm" / "rank-0.json.gz"
COMMANDS = {
    "ingest": lambda traces, out: ["ingest", traces, "-o", out],
    "validate": lambda traces, out: ["validate", traces, "--no-hta", "-o", out],
    "whatif": lambda traces, out: ["whatif", traces, "--scale", "gemm=0.5", "-o", out],
}


def write_trace(folder: Path, name: str, change: Callable[[dict], None]) -> None:
    """The shipped MI250 trace, edited by ``change`` (the whole document), written to ``folder/name``."""
    document = json.loads(gzip.decompress(SOURCE.read_bytes()))
    change(document)
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(gzip.compress(json.dumps(document).encode()))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder`` with its bytes (empty for what is not a plain file)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def rank_of(rank: int, world_size: int) -> Callable[[dict], None]:
    """A change giving the trace ``distributedInfo`` with this rank and world size."""
    return lambda document: document.update(distributedInfo={"rank": rank, "world_size": world_size})


@pytest.mark.parametrize("command", ["validate", "whatif"])
def test_files_of_two_jobs_are_one_error_line(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_trace(traces, "rank-0.json.gz", rank_of(0, 2))
    write_trace(traces, "rank-1.json.gz", rank_of(1, 4))
    out = tmp_path / "out"
    ran = vtrain_in_process(*COMMANDS[command](traces, out))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip() == (f"error: {traces / 'rank-1.json.gz'}: world size 4 here but 2 in rank-0.json.gz: "
                                  f"the files come from different jobs")
    assert not out.exists()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_output_inside_the_trace_folder_is_refused(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_trace(traces, "rank-0.json.gz", lambda _: None)
    before = snapshot(traces)
    ran = vtrain_in_process(*COMMANDS[command](traces, traces / "out"))
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert [line for line in ran.stderr.splitlines() if line.startswith("error:")] == [
        f"error: {traces / 'out'}: the {'profile' if command == 'ingest' else 'report'} folder would lie inside the "
        f"input folder {traces} (nothing is ever written into an input); give another -o"]
    assert snapshot(traces) == before


def kernels_in_an_unknown_category(document: dict) -> None:
    """Every kernel of the trace written with a category vtrain does not read (as a future PyTorch might)."""
    for event in document["traceEvents"]:
        if event.get("cat") == "kernel":
            event["cat"] = "gpu_kernel"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_launches_without_their_kernels_are_said(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_trace(traces, "rank-0.json.gz", kernels_in_an_unknown_category)
    ran = vtrain_in_process(*COMMANDS[command](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert (f"warning: {traces / 'rank-0.json.gz'}: 14 of 14 kernel launches have no device activity in the file "
            f"(device events not recorded or pruned, or written with a category vtrain does not read): their "
            f"device time is not counted") in ran.stderr.splitlines()


def test_a_whole_trace_has_no_such_warning(tmp_path: Path) -> None:
    """The warning above is not said of the trace it was made from: every launch there has its kernel."""
    ran = vtrain_in_process(*COMMANDS["ingest"](SOURCE.parent, tmp_path / "out"))
    assert ran.returncode == 0 and "kernel launches" not in ran.stderr, ran.stderr


def one_kernel_without_a_duration(document: dict) -> None:
    """The first kernel's duration made negative: the event is left out."""
    next(e for e in document["traceEvents"] if e.get("cat") == "kernel")["dur"] = -1.0


def test_whatif_says_what_it_did_not_read_or_left_out(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    write_trace(traces, "rank-0.json.gz", lambda document: (rank_of(0, 2)(document),
                                                            one_kernel_without_a_duration(document)))
    os.mkfifo(traces / "rank-1.json")  # named like a trace, never read (it would block)
    ran = vtrain_in_process(*COMMANDS["whatif"](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.splitlines()
    for said in (f"{traces / 'rank-1.json'}: not read: named like a trace but not a file",
                 f"{traces}: 1 of 2 ranks have no trace file (missing: 1)",
                 f"{traces / 'rank-0.json.gz'}: 1 event(s) without a usable time, duration or lane were left out"):
        assert f"warning: {said}" in lines
