"""`vtrain validate --measurements` on a large table said nothing until it was done (a million rows ran for hours
in silence). ``predict_runs`` now reports its distinct runs as it simulates them, and the command shows that on
the bar `vtrain plan` uses, on stderr where it is a terminal: stdout (``--json`` above all) is unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
A100_PROFILE = REPO / "profiles" / "a100"
GROUND_TRUTH = REPO / "tests" / "data" / "a100" / "vtrain-a100" / "ground_truth_single.csv"


def _table(tmp_path: Path) -> Path:
    """Six rows, three distinct runs (the first three of the ground truth, one repeated) and a row that is no
    measurement (a negative time: never simulated)."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    negative = ",".join([*lines[1].split(",")[:-1], "-3"])
    table = tmp_path / "m.csv"
    table.write_text("\n".join([lines[0], lines[1], lines[2], lines[1], negative, lines[3], lines[2]]) + "\n")
    return table


def test_progress_counts_the_distinct_runs_up_to_their_number(tmp_path: Path) -> None:
    from vtrain.fit.device import device_from_profile
    from vtrain.importers.measurements import read_measurements
    from vtrain.simulate.measured_runs import Hardware, predict_runs
    from vtrain.tables.store import load_profile

    profile = load_profile(A100_PROFILE)
    device = device_from_profile(profile)
    measurements = read_measurements(_table(tmp_path))
    calls: list[tuple[int, int]] = []
    predicted = predict_runs(measurements, profile, device, Hardware(), progress=lambda *c: calls.append(c))
    assert calls == [(0, 3), (1, 3), (2, 3), (3, 3)]
    # the same predictions without a callback
    assert predicted.equals(predict_runs(measurements, profile, device, Hardware()))

    restricted: list[tuple[int, int]] = []
    predict_runs(measurements, profile, device, Hardware(), rows=[1, 3], progress=lambda *c: restricted.append(c))
    assert restricted == [(0, 1), (1, 1)]


@pytest.mark.parametrize("as_json", [True, False])
def test_the_command_feeds_the_bar_and_prints_nothing_more_on_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     as_json: bool) -> None:
    """The command's bar is the shared one (vtrain.cli.progress), fed up to the number of distinct runs; stdout
    is what it was without a bar, and a stderr that is no terminal gets no bar (not even a blank line)."""
    from vtrain.cli import progress
    from vtrain.cli.main import app

    def invoke(out: str) -> tuple[str, str]:
        flags = ["--json"] if as_json else []
        result = CliRunner().invoke(app, ["validate", "--measurements", str(table), "--profile", str(A100_PROFILE),
                                          "-o", str(tmp_path / out), *flags])
        assert result.exit_code == 0, result.output
        return result.stdout.replace(str(tmp_path / out), "REPORT"), result.stderr

    table = _table(tmp_path)
    plain_out, plain_err = invoke("plain")  # stderr is no terminal here: no bar
    assert not progress.shown()
    assert all(line.startswith("warning:") for line in plain_err.splitlines()), plain_err

    labels: list[str] = []
    calls: list[tuple[int, int]] = []

    @contextmanager
    def counting(label: str) -> Iterator[progress.Counted]:
        labels.append(label)
        yield lambda *c: calls.append(c)

    monkeypatch.setattr(progress, "counting", counting)
    shown_out, shown_err = invoke("shown")
    assert labels == ["predicting runs"] and calls[0] == (0, 3) and calls[-1] == (3, 3)
    assert shown_out == plain_out and shown_err == plain_err
    if as_json:
        assert isinstance(json.loads(shown_out), dict) and shown_out.count("\n") == 1


def test_a_terminal_gets_the_bar_on_stderr_not_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With stderr taken for a terminal the real bar runs (on stderr): the ``--json`` document on stdout is the
    same."""
    from vtrain.cli import progress
    from vtrain.cli.main import app

    table = _table(tmp_path)
    args = ["validate", "--measurements", str(table), "--profile", str(A100_PROFILE), "--json", "-o"]
    plain = CliRunner().invoke(app, [*args, str(tmp_path / "r")])
    monkeypatch.setattr(progress, "shown", lambda: True)
    shown = CliRunner().invoke(app, [*args, str(tmp_path / "r")])
    assert plain.exit_code == shown.exit_code == 0, shown.output
    assert shown.stdout == plain.stdout and json.loads(shown.stdout)["rows"] == 5
