"""A profiler step that holds nothing is no iteration, in `ingest`, `validate` and `whatif` alike (an audit, on real
traces of a 2-rank gloo DDP job profiled with ``schedule(wait=1, warmup=1, active=2, repeat=2)``: one file per
rank and cycle, tests/data/profiler-cycles/README.md).

- The second cycle of a loop that ended as it began holds one 31-38 µs ``ProfilerStep#6`` per rank, with nothing in
  it: `validate` measured it (0.0344 ms, exit 0, "steady"), `whatif` re-timed it (0.034 -> 0.034 ms), and all three
  commands said the ranks' clocks disagree, from the 5 ms between the two empty steps.
- The second cycle of a loop that ended one step later holds a whole ``ProfilerStep#6`` and a 37 µs stub #7: the
  run read off the traces' shapes was looked for in the stub (the middle of the steps 6-7), so `validate` said
  there is "no word embedding ... or recorded without record_shapes"; `ingest` counted iterations 6-7, silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.inferred_run import INFERRED

CYCLES = REPO / "tests" / "data" / "profiler-cycles"
EMPTY = CYCLES / "empty-second-cycle"
TRUNCATED = CYCLES / "truncated-second-cycle"
CLOCKS = "clocks disagree"


def _lines(stderr: str, *words: str) -> list[str]:
    """The lines of ``stderr`` holding every one of ``words``."""
    return [line for line in stderr.splitlines() if all(word in line for word in words)]


@pytest.mark.parametrize("command", [["validate", "--no-hta"], ["whatif", "--scale", "gemm=0.5"]])
def test_a_cycle_of_empty_steps_is_one_line_and_exit_2(command: list[str], tmp_path: Path) -> None:
    """Nothing to measure: the one line of a folder whose steps hold none of its events, naming the folder; no
    report, and no clock verdict before it."""
    ran = vtrain_in_process(command[0], EMPTY, *command[1:], "-o", tmp_path / "out")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip().splitlines() == [
        f"error: {EMPTY}: its 2 ProfilerStep#N spans hold none of its events (the longest lasts 37.638 us): no "
        "iteration to measure"]
    assert not (tmp_path / "out").exists()


def test_ingest_counts_no_iteration_of_empty_steps_and_no_clock_of_theirs(tmp_path: Path) -> None:
    ran = vtrain_in_process("ingest", EMPTY, "-o", tmp_path / "profile", "--json")
    assert ran.returncode == 0, ran.stderr
    assert len(_lines(ran.stderr, "ProfilerStep#N spans hold none of its events", "no iteration of it")) == 2
    assert not _lines(ran.stderr, CLOCKS)
    assert {rank: row["iterations"] for rank, row in json.loads(ran.stdout)["ranks"].items()} == {"0": 0, "1": 0}
    assert json.loads((tmp_path / "profile" / "metadata.json").read_text())["iterations"] == []


def test_ingest_leaves_out_the_stub_step_says_it_once_and_reads_the_run_off_the_real_one(tmp_path: Path) -> None:
    ran = vtrain_in_process("ingest", TRUNCATED, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert _lines(ran.stderr, "ProfilerStep#7") == [
        f"warning: {TRUNCATED / 'rank0.1795972053373772538.pt.trace.json.gz'}: ProfilerStep#7 holds nothing but its "
        "own span (the longest lasts 42.912 us; and on 1 other rank file(s)): no operator, no device activity (the "
        "profiler stopped as it began); not counted as an iteration"]
    metadata = json.loads((tmp_path / "profile" / "metadata.json").read_text())
    assert metadata["iterations"] == [6]
    assert metadata["run_source"] == INFERRED
    model = metadata["run"]["model"]
    assert (model["layers"], model["hidden"], model["heads"], model["seq"], model["vocab"]) == (2, 128, 4, 64, 512)
    tables = vtrain_in_process("tables", tmp_path / "profile", "--top", "1")
    shown = " ".join(tables.stdout.split())  # the title wraps where the temporary folder's path is long
    assert tables.returncode == 0 and ": cpu, ranks 0-1 of 2, iterations 6 " in shown  # it said 6-7


def test_validate_reads_the_run_off_the_real_step(tmp_path: Path) -> None:
    ran = vtrain_in_process("validate", TRUNCATED, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert metrics["config"] == INFERRED and metrics["model"] is not None, metrics["model_reason"]
    assert (metrics["iterations"], metrics["steady_iterations"]) == ([6], [6])
    assert len(_lines(ran.stderr, "ProfilerStep#7", "not counted as an iteration")) == 1


def test_whatif_measures_the_real_step_alone(tmp_path: Path) -> None:
    ran = vtrain_in_process("whatif", TRUNCATED, "--scale", "gemm=0.5", "-o", tmp_path / "whatif")
    assert ran.returncode == 0, ran.stderr
    said = json.loads((tmp_path / "whatif" / "whatif.json").read_text())
    assert [row["iteration"] for row in said["iterations"]] == [6] and said["steady_iterations"] == [6]
    assert len(_lines(ran.stderr, "ProfilerStep#7", "not counted as an iteration")) == 1
