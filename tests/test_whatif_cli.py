"""`vtrain whatif` through the command line: the report folder, the JSON, the predicted traces, and bad input
(one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.test_replay_graph import cpu, write_trace
from tests.test_whatif_graph import one_thread_iterations
from vtrain.cli.main import app
from vtrain.replay.trace import read_trace_set

runner = CliRunner()


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A one-thread job and a second recording of it whose GEMMs take twice as long, without its first add, and
    whose softmax calls an operator of its own (its time is the softmax's)."""
    write_trace(tmp_path / "a", 0, one_thread_iterations())
    write_trace(tmp_path / "b", 0, one_thread_iterations(mm=2.0, drop_first_add=True, split_softmax=True))
    return tmp_path / "a", tmp_path / "b"


def test_json_report_and_predicted_traces(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = pair
    out = tmp_path / "out"
    done = runner.invoke(app, ["whatif", str(a), "--scale", "gemm=2", "-o", str(out), "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["measured_ms"] == pytest.approx(0.4)
    assert result["predicted_ms"] == pytest.approx(0.4 + 0.29)  # + the GEMM time on the path
    assert result["change_pct"] == pytest.approx(100 * 0.29 / 0.4)
    assert sorted(p.name for p in out.iterdir()) == [".vtrain-output", "predicted", "report.html", "report.md",
                                                     "whatif.json"]
    report = (out / "report.md").read_text()
    assert "Operators that moved the critical path" in report and "| aten::mm | gemm |" in report
    predicted = read_trace_set(out / "predicted")[0]
    steps = {n: d for n, d in zip(predicted.name, predicted.dur) if n.startswith("ProfilerStep#")}
    assert steps["ProfilerStep#2"] == pytest.approx(690.0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging folder left behind"


def test_durations_from_names_what_it_could_not_match(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = pair
    done = runner.invoke(app, ["whatif", str(a), "--durations-from", str(b), "-o", str(tmp_path / "o"), "--json"])
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert result["other_measured_ms"] == pytest.approx(0.4 + 0.27)  # iteration 2 of b: the mm take 270 more
    assert result["predicted_ms"] == pytest.approx(0.67) and abs(result["error_pct"]) < 1e-6
    details = json.loads((tmp_path / "o" / "whatif.json").read_text())
    assert details["unmatched"]["base"] == 1 and details["unmatched"]["other"] == 2
    assert {r["name"] for r in details["unmatched"]["other_names"]} == {"aten::narrow"}
    assert details["unmatched"]["base_names"][0]["name"] == "aten::add"
    assert "1 event(s) with own time" in done.stderr
    predicted = read_trace_set(tmp_path / "o" / "predicted")[0]
    softmax = [d for n, d in zip(predicted.name, predicted.dur) if n == "aten::softmax"]
    assert softmax == pytest.approx([40.0, 40.0])  # 30 of its own + its child's 10 in the other recording
    assert "aten::add" in (tmp_path / "o" / "report.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--scale", "gemmm=2"], "unknown class 'gemmm'"),
    (["--scale", "gemm"], "expected NAME=FACTOR"),
    (["--scale", "gemm=-1"], "the factor must be a number from 0 to 1e+06"),
    (["--scale", "gemm=1e308"], "the factor must be a number from 0 to 1e+06"),  # overflowed the times to inf
    (["--scale", "gemm=fast"], "is not a number"),
    (["--scale-kernel", "(mm=2"], "not a regular expression"),
    ([], "nothing to change"),
    (["--ops-only", "--scale", "gemm=2"], "--ops-only needs --durations-from"),
    (["--durations-from", "/no/such/folder"], "/no/such/folder: not a folder"),
])
def test_bad_flags_exit_2_with_one_line(pair: tuple[Path, Path], tmp_path: Path, flags: list[str],
                                        message: str) -> None:
    a, _ = pair
    out = tmp_path / "out"
    done = runner.invoke(app, ["whatif", str(a), *flags, "-o", str(out)])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1
    assert message in done.stderr
    assert not out.exists()


def test_another_job_is_refused(pair: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = pair
    other = tmp_path / "two-ranks"
    for rank in (0, 1):
        write_trace(other, rank, [cpu("ProfilerStep#1", 0, 100, cat="user_annotation"), cpu("aten::mm", 1, 50)],
                    world=2)
    done = runner.invoke(app, ["whatif", str(a), "--durations-from", str(other), "-o", str(tmp_path / "o")])
    assert done.exit_code == 2 and "not the same job" in done.stderr
    assert not (tmp_path / "o").exists()


def test_output_that_is_an_input_or_not_written_by_vtrain_is_refused(pair: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    a, b = pair
    for target in (a, b, tmp_path):
        done = runner.invoke(app, ["whatif", str(a), "--durations-from", str(b), "-o", str(target)])
        said = [line for line in done.stderr.splitlines() if "one steady iteration" not in line]  # the pair's 2 steps
        assert done.exit_code == 2 and len(said) == 1, done.output
        assert sorted(p.name for p in a.iterdir()) == ["rank-0.json"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    done = runner.invoke(app, ["whatif", str(a), "--scale", "gemm=2", "-o", str(mine)])
    assert done.exit_code == 2 and (mine / "notes.txt").read_text() == "keep me"


def test_a_folder_without_iterations_is_one_iteration(tmp_path: Path) -> None:
    """As validate: the whole trace is the iteration, and a warning says so (it was refused)."""
    write_trace(tmp_path / "flat", 0, [cpu("aten::mm", 0, 50), cpu("aten::add", 60, 10)])
    done = runner.invoke(app, ["whatif", str(tmp_path / "flat"), "--scale", "gemm=2", "-o", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    assert "no ProfilerStep#N spans; the whole trace is taken as one iteration" in done.stderr
    assert (tmp_path / "o").is_dir()
    shutil.rmtree(tmp_path / "flat")


@pytest.mark.parametrize("events", [[], [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]],
                         ids=["no-events", "metadata-only"])
def test_a_trace_with_nothing_to_replay_is_refused_as_validate_refuses_it(events: list[dict], pair: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    """It was a traceback after the report had been written; as the traces or as --durations-from."""
    write_trace(tmp_path / "empty", 0, events)
    a, _ = pair
    for args in ([str(tmp_path / "empty"), "--scale", "gemm=2"], [str(a), "--durations-from", str(tmp_path / "empty")]):
        done = runner.invoke(app, ["whatif", *args, "-o", str(tmp_path / "o")])
        said = [line for line in done.stderr.splitlines() if "one steady iteration" not in line]  # the pair's 2 steps
        assert done.exit_code == 2 and len(said) == 1, done.output
        assert "nothing to replay: no CPU operator, runtime call or device activity with a time" in done.stderr
        assert not (tmp_path / "o").exists()


def test_predicted_traces_load_in_hta(pair: tuple[Path, Path], tmp_path: Path) -> None:
    from vtrain.validate.hta import hta_analysis

    a, _ = pair
    out = tmp_path / "out"
    assert runner.invoke(app, ["whatif", str(a), "--scale", "gemm=2", "-o", str(out)]).exit_code == 0
    trace = hta_analysis(out / "predicted").t
    symbols = trace.symbol_table.get_sym_table()
    frame = trace.get_trace(0)
    durations = dict(zip(frame["name"].map(symbols.__getitem__), frame["dur"]))  # HTA keeps the first iteration
    assert durations["ProfilerStep#1"] == 690 and durations["aten::softmax"] == 40


def test_a_factor_of_one_says_it_changes_nothing_not_that_its_events_wait(pair: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    """`--scale gemm=1` warned that no GEMM is on a critical path, of a job whose GEMMs are its critical path
    (`gemm=2` moves it 72 %): an audit."""
    a, _ = pair
    done = runner.invoke(app, ["whatif", str(a), "--scale", "gemm=1", "-o", str(tmp_path / "out"), "--json"])
    assert done.exit_code == 0, done.output
    said = [line for line in done.stderr.splitlines() if "one steady iteration" not in line]  # the pair's 2 steps
    assert said == ["warning: gemm: a factor of 1 changes nothing"], done.stderr
    assert json.loads(done.stdout)["change_pct"] == 0


def test_a_critical_path_holds_no_more_than_its_iteration(tmp_path: Path) -> None:
    """`whatif traces/hta-sm80-128rank-sampled --scale comm=2`: the predicted critical path summed to 897.7 ms for a
    643 ms iteration (an audit), the whole of a send/recv wait begun in the iteration before counted in this one.
    An edge that crosses the iteration's start counts its part after it."""
    from tests.conftest import TRACES, vtrain_in_process

    ran = vtrain_in_process("whatif", TRACES / "hta-sm80-128rank-sampled", "--scale", "comm=2", "-o", tmp_path / "w")
    assert ran.returncode == 0, ran.stderr
    result = json.loads((tmp_path / "w" / "whatif.json").read_text())
    paths = result["critical_path"]
    # the longest rank's path, against the mean of the ranks' iterations (626.5 and 659.5 ms predicted)
    assert sum(paths["predicted_ms"].values()) <= 1.05 * result["predicted_ms"], paths["predicted_ms"]
    assert sum(paths["baseline_ms"].values()) <= 1.05 * result["measured_ms"], paths["baseline_ms"]
