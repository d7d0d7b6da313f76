"""`vtrain validate` from the command line: the report, --json, --max-error, suites, HTA side by side, and bad
input (one line, exit 2, nothing written)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, TRACES, vtrain_in_process

PIPELINE = TRACES / "t1p2d1"
A100 = TRACES / "hta-a100-2rank-nccl"
V100_1RANK = TRACES / "hta-v100-1rank"


def vtrain(*args: object, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_report_json_and_max_error(tmp_path: Path) -> None:
    """A recorded pipeline run: both predictions, every report file, and exit 1 above --max-error."""
    out = tmp_path / "report"
    result = vtrain("validate", PIPELINE, "-o", out, "--json", "--no-hta", "--max-error", "5")
    summary = json.loads(result.stdout)
    shown = {"measured_ms", "predicted_ms", "error_pct", "measured_iterations"}
    assert set(summary["replay"]) == shown
    assert abs(summary["replay"]["error_pct"]) <= 2.0
    model = summary["model"]
    assert model is not None and set(model) == shown
    # the two measured times are medians over different iterations: the model's leaves out those it was profiled on
    metrics = json.loads((out / "metrics.json").read_text())
    assert summary["replay"]["measured_iterations"] == metrics["steady_iterations"]
    assert model["measured_iterations"] == metrics["model"]["test_iterations"]
    assert set(model["measured_iterations"]) < set(summary["replay"]["measured_iterations"])
    expected = 0 if abs(model["error_pct"]) <= 5 else 1
    assert result.returncode == expected, result.stderr
    assert summary["passed"] is (expected == 0)
    assert "does it describe these traces?" not in result.stderr  # its own run.yaml: 99.8 % of the time measured
    report = (out / "report.md").read_text()
    for section in ("## Iteration time", "### Per phase", "### Per pipeline stage", "### Per operator class",
                    "### Breakdown", "### Ten worst-predicted operators", "### Where the error comes from",
                    "### Operators found on one side only", "### Dependency model"):
        assert section in report, section
    page = (out / "report.html").read_text()
    assert "<script" in page and "Timeline of one iteration" in page and "Error per operator class" in page
    assert "<script src=" not in page and len(page) > 1_000_000  # self-contained: plotly.js inlined
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"]["test_iterations"] and metrics["model"]["profile"]
    assert metrics["replay"]["dependencies"]["collectives_matched"] > 0
    assert sorted(p.name for p in (out / "predicted" / "replay").iterdir()) == ["rank-0.json.gz", "rank-1.json.gz"]
    assert any((out / "predicted" / "model").glob("rank-*.json.gz"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left
    # a second validation of the same folder writes the same numbers, to the last digit (float sums are taken in
    # one order, whatever order joins and parallel grouping leave the rows in)
    again = tmp_path / "again"
    assert vtrain("validate", PIPELINE, "-o", again, "--json", "--no-hta", "--max-error", "5").stdout == result.stdout.replace(
        str(out), str(again))
    assert (again / "metrics.json").read_text() == (out / "metrics.json").read_text().replace(str(out), str(again))
    for trace in (out / "predicted").rglob("*.json.gz"):
        twin = again / trace.relative_to(out)
        assert gzip.decompress(twin.read_bytes()) == gzip.decompress(trace.read_bytes()), trace


def test_hta_side_by_side_on_gpu_traces(tmp_path: Path) -> None:
    out = tmp_path / "a100"
    result = vtrain("validate", A100, "-o", out, "--max-error", "2")
    assert result.returncode == 0, result.stderr
    assert "no run described" in result.stderr  # the missing model is said, never silent
    hta = json.loads((out / "metrics.json").read_text())["hta"]
    measured, replayed = hta["measured"]["0"], hta["replay"]["0"]
    assert measured["idle_pct"] == pytest.approx(replayed["idle_pct"], abs=0.5)
    assert measured["overlap_pct"] == pytest.approx(replayed["overlap_pct"], abs=0.5)
    assert "## HTA on the measured and the predicted traces" in (out / "report.md").read_text()


def test_suite_runs_every_set_and_checks_its_bounds(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: small\nsets:\n  - traces: {V100_1RANK}\n    max_replay_error_pct: 2\n"
                     f"  - traces: {PIPELINE}\n    name: pipeline\n    max_replay_error_pct: 2\n"
                     f"    max_model_error_pct: 0.001\n")
    out = tmp_path / "suite-report"
    result = vtrain("validate", "--suite", suite, "-o", out, "--json", "--no-hta")
    assert result.returncode == 1, result.stderr  # the model is not within 0.001 %
    summary = json.loads(result.stdout)
    passed = {s["name"]: s["passed"] for s in summary["sets"]}
    assert passed == {"hta-v100-1rank": True, "pipeline": False}
    assert (out / "suite.md").exists() and (out / "pipeline" / "report.md").exists()
    assert (out / "hta-v100-1rank" / "report.html").exists()


def test_shipped_suite_lists_every_trace_set() -> None:
    from vtrain.validate.suite import load_suite

    suite = load_suite(REPO / "validators" / "traces.yaml")
    listed = {entry.traces.resolve() for entry in suite.entries}
    folders = [*TRACES.iterdir(), *(TRACES / "wild").iterdir(), *(TRACES / "gpu").iterdir()]
    shipped = {p.resolve() for p in folders if p.is_dir() and any(p.glob("rank-*.json*"))}
    assert listed == shipped
    assert all(entry.max_replay_error_pct == 2 for entry in suite.entries)


def _truncated(tmp_path: Path) -> Path:
    folder = tmp_path / "broken"
    folder.mkdir()
    data = (V100_1RANK / "rank-0.json.gz").read_bytes()
    (folder / "rank-0.json.gz").write_bytes(data[: len(data) // 2])
    return folder


def _not_kineto(tmp_path: Path) -> Path:
    folder = tmp_path / "notkineto"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps({"events": []}))
    return folder


def _other_world(tmp_path: Path) -> Path:
    config = tmp_path / "run.yaml"
    config.write_text((PIPELINE / "run.yaml").read_text().replace("pp: 2", "pp: 4").replace(
        "device_count: 2", "device_count: 4"))
    return config


def _empty_folder(tmp_path: Path) -> Path:
    """An empty folder beside the report's (a report is never written inside an input folder)."""
    path = tmp_path / "empty"
    path.mkdir()
    return path


def _bad_suite(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text("sets: [unclosed\n")
    return path


@pytest.mark.parametrize(("make_args", "message"), [
    (lambda tmp: ["validate", tmp / "missing"], "no such trace folder"),
    (lambda tmp: ["validate", _truncated(tmp)], "truncated gzip"),
    (lambda tmp: ["validate", _not_kineto(tmp)], "no traceEvents"),
    (lambda tmp: ["validate", PIPELINE, "--config", _other_world(tmp)], "the traces come from a job of 2"),
    (lambda tmp: ["validate", V100_1RANK, "--config", tmp / "nope.yaml"], "no such run config"),
    (lambda tmp: ["validate", PIPELINE, "--profile", _empty_folder(tmp)], "not a profile folder"),
    (lambda tmp: ["validate"], "give a TRACE_DIR"),
    (lambda tmp: ["validate", "--suite", _bad_suite(tmp)], "not valid YAML"),
    (lambda tmp: ["validate", V100_1RANK, "--suite", _bad_suite(tmp)], "not both"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, make_args, message: str) -> None:
    """The first case as a real process; the others through the console script's entry point in this process
    (exit code, stdout and stderr as a process gives them, a traceback written as the interpreter would: see
    tests/test_hostile_inputs.py), which spares a second of start-up each."""
    out = tmp_path / "out"
    run = vtrain if message == "no such trace folder" else vtrain_in_process
    result = run(*make_args(tmp_path), "-o", out)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_traces_without_profiler_steps_are_one_iteration(tmp_path: Path) -> None:
    folder = tmp_path / "nosteps"
    folder.mkdir()
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
              {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]
    (folder / "rank-0.json").write_text(json.dumps({"traceEvents": events}))
    result = vtrain("validate", folder, "-o", tmp_path / "out", "--json", "--no-hta")
    assert result.returncode == 0, result.stderr
    assert "whole trace is taken as one iteration" in result.stderr
    assert json.loads(result.stdout)["replay"]["measured_ms"] == pytest.approx(0.015)


def test_default_report_folder_is_reports_slash_trace_dir_name(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(V100_1RANK, work / "v100")
    result = vtrain("validate", work / "v100", "--no-hta", cwd=work)
    assert result.returncode == 0, result.stderr
    assert (work / "reports" / "v100" / "report.md").exists()
    with gzip.open(work / "reports" / "v100" / "predicted" / "replay" / "rank-0.json.gz", "rt") as handle:
        assert json.load(handle)["traceEvents"]


def _rank_one_changed(folder: Path, change: Callable[[list[dict], list[float]], list[dict]]) -> None:
    """``folder``'s rank 1 with its events replaced by ``change(events, sorted step starts)``."""
    path = folder / "rank-1.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    steps = sorted(e["ts"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    trace["traceEvents"] = change(trace["traceEvents"], steps)
    path.write_bytes(gzip.compress(json.dumps(trace).encode(), 1))


def _shifted(events: list[dict], seconds: float) -> list[dict]:
    return [{**e, "ts": e["ts"] + seconds * 1e6} if isinstance(e.get("ts"), (int, float)) else e for e in events]


@pytest.mark.parametrize(("change", "said"), [
    (lambda events, steps: [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")],
     "rank 1 is in none of the 10 profiled iterations of the other ranks"),  # its step spans pruned
    (lambda events, steps: [e for e in events if e.get("ph") != "X" or e["ts"] >= steps[4]],
     "rank 1 is in 6 of the 10 profiled iterations (not in 1, 2, 3, 4)"),  # profiling began four steps late
    (lambda events, steps: _shifted(events, 3600.0),  # another host's clock, an hour ahead
     "the ranks' clocks disagree: rank 1 +3,600.0"),
])
def test_a_rank_outside_the_profiled_iterations_or_off_the_clock_is_said(change, said: str, tmp_path: Path) -> None:
    """A rank in none or only some of the iterations the other ranks profiled (the measured times are then the
    other ranks' alone), or on a clock of its own: a warning line and a line in the report; the replay is the
    same."""
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "t1p1d2", folder)
    _rank_one_changed(folder, change)
    ran = vtrain_in_process("validate", folder, "-o", tmp_path / "report", "--no-hta", "--json")
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if line.startswith("warning: ") and said in line]
    assert said in (tmp_path / "report" / "report.md").read_text()
    assert "rank 0 is in" not in ran.stderr and "rank 0 +" not in ran.stderr  # the rank that is fine is not said


def test_a_run_yaml_that_does_not_load_leaves_the_traces_replayed(tmp_path: Path) -> None:
    """A run.yaml of another vtrain version (a field this one does not know) beside the traces: validate and whatif
    replay the traces, one warning line naming the file says the run is not simulated (both stopped at exit 2, as
    ingest never did); an explicit --config that does not load stays an error."""
    traces = tmp_path / "traces"
    shutil.copytree(PIPELINE, traces)
    described = (traces / "run.yaml").read_text()
    (traces / "run.yaml").write_text(described.replace("  layers: 4\n", "  layers: 4\n  rotary_base: 10000\n"))
    validated = vtrain_in_process("validate", traces, "--no-hta", "-o", tmp_path / "report")
    assert validated.returncode == 0, validated.stderr
    warned = [line for line in validated.stderr.splitlines() if "run.yaml" in line]
    assert len(warned) == 1 and "unknown field(s) in model: rotary_base" in warned[0], validated.stderr
    assert "the run is not simulated, the traces are replayed" in warned[0]
    assert (tmp_path / "report" / "report.md").is_file()
    retimed = vtrain_in_process("whatif", traces, "--scale", "gemm=0.5", "-o", tmp_path / "whatif")
    assert retimed.returncode == 0 and "rotary_base: the traces are re-timed without the run" in retimed.stderr
    explicit = vtrain_in_process("validate", PIPELINE, "--config", traces / "run.yaml", "--no-hta",
                                 "-o", tmp_path / "report2")
    assert explicit.returncode == 2 and "rotary_base" in explicit.stderr


def test_a_run_yaml_that_describes_another_run_is_flagged(tmp_path: Path) -> None:
    """A run.yaml whose model is not the traced one (its hidden size edited): the model side is simulated from the
    traces' own operators, of which it finds almost none (5 % of its time measured, against 99.8 % for the true
    run.yaml), and says so, where it printed +482 % with no word of why."""
    traces = tmp_path / "traces"
    shutil.copytree(PIPELINE, traces)
    (traces / "run.yaml").write_text((traces / "run.yaml").read_text().replace("  hidden: 512\n", "  hidden: 256\n"))
    edited = vtrain_in_process("validate", traces, "--no-hta", "-o", tmp_path / "edited")
    assert edited.returncode == 0, edited.stderr
    assert "does it describe these traces?" in edited.stderr  # the true run.yaml: test_report_json_and_max_error


def test_a_run_config_unlike_the_traces_operators_is_said(tmp_path: Path) -> None:
    """A run config of 8 layers and micro-batch 1 given for traces of 4 layers and micro-batch 2 (`--config`): its
    run is simulated, and the error is the config's; a 1.3B run validated with 12 layers for 24 was -46 %, without a
    word (an audit). The run read off the traces' operators says what differs."""
    config = tmp_path / "run.yaml"
    config.write_text((PIPELINE / "run.yaml").read_text().replace("  layers: 4\n", "  layers: 8\n")
                      .replace("  micro_batch: 2\n", "  micro_batch: 1\n"))
    ran = vtrain_in_process("validate", PIPELINE, "--config", config, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert (f"warning: {config} says layers 8 (the traces: 4), micro-batch 1 (the traces: 2), read off {PIPELINE}'s "
            "operators' shapes: does it describe these traces?") in ran.stderr, ran.stderr


@pytest.mark.parametrize(("set_name", "words"), [(".vtrain-output", "is taken by the suite's own report"),
                                                 ("suite.md", "is taken by the suite's own report"),
                                                 ("metrics.json", "is taken by the suite's own report")])
def test_a_set_named_like_the_suites_own_files_is_refused(set_name: str, words: str, tmp_path: Path) -> None:
    """A set named `.vtrain-output` was a FileExistsError traceback, one named `suite.md` or `metrics.json` an
    IsADirectoryError (an audit): its report folder would be the suite's own marker or file."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"sets:\n  - traces: {V100_1RANK}\n    name: {set_name}\n")
    result = vtrain("validate", "--suite", suite, "-o", tmp_path / "out", "--no-hta")
    assert result.returncode == 2 and words in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_set_named_by_its_traces_folder_says_so(tmp_path: Path) -> None:
    """`traces: ..` gave "name '..' must not be a path" for a set that gave no name."""
    suite = tmp_path / "sets" / "suite.yaml"
    suite.parent.mkdir()
    suite.write_text("sets:\n  - traces: ..\n")
    result = vtrain("validate", "--suite", suite, "-o", tmp_path / "out", "--no-hta")
    assert result.returncode == 2 and "its traces folder's" in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["ingest"], ["whatif", "--scale", "gemm=0.5"]])
def test_ranks_on_clocks_seconds_apart_are_said_by_ingest_and_whatif_too(command: list[str], tmp_path: Path) -> None:
    """Rank 1's clock 3 s ahead: ingest read send/recv at 3,075 µs where they took 284, whatif's GEMMs-halved
    prediction moved from -43 % to -28 %, both silently (validate alone said it)."""
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "t1p2d1", folder)
    _rank_one_changed(folder, lambda events, steps: _shifted(events, 3.0))
    ran = vtrain_in_process(command[0], folder, *command[1:], "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "the ranks' clocks disagree: rank 1 +3.000 s" in line
            or "the ranks' clocks disagree: rank 1 +2.9" in line], ran.stderr


def test_whatif_says_the_collectives_it_cannot_match_to_their_peers(tmp_path: Path) -> None:
    """Without distributedInfo (its process groups) whatif kept every collective's measured duration, its wait for
    the peer included, silently: halving the GEMMs read -28 % instead of -43 %."""
    folder = tmp_path / "run"
    shutil.copytree(TRACES / "t1p2d1", folder)
    (folder / "run.yaml").unlink()  # recorded elsewhere: no run config to give the groups either
    for path in folder.glob("rank-*.json.gz"):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        del trace["distributedInfo"]
        path.write_bytes(gzip.compress(json.dumps(trace).encode(), 1))
    ran = vtrain_in_process("whatif", folder, "--scale", "gemm=0.5", "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "collective call(s) not matched to their peers' keep their "
            "measured duration" in line and "process group unknown" in line], ran.stderr
    shipped = vtrain_in_process("whatif", TRACES / "t1p2d1", "--scale", "gemm=0.5", "-o", tmp_path / "shipped")
    assert "not matched" not in shipped.stderr, shipped.stderr
