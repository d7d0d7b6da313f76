"""Tables of measurements that are suspicious or useless (an audit of `validate --measurements`): a table pasted
twice was scored twice in silence, a measured time of 1e-300 ms gave a MAPE of 3e304 %, a named pipe given as the
table was "no such file", and a table none of whose rows could be predicted ended with exit 0 and a null MAPE."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process

GROUND_TRUTH = REPO / "tests" / "data" / "a100" / "vtrain-a100" / "ground_truth_single.csv"
PROFILE = REPO / "profiles" / "a100"


def _table(folder: Path, lines: list[str]) -> Path:
    header, *rows = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    table = folder / "runs.csv"
    table.write_text("\n".join([header, *(rows[:3] if not lines else lines)]) + "\n")
    return table


def _rows(count: int) -> list[str]:
    return GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[1:count + 1]


def _measure(table: Path, tmp_path: Path) -> object:
    return vtrain_in_process("validate", "--measurements", table, "--profile", PROFILE, "-o", tmp_path / "report",
                             "--json")


def test_a_table_pasted_twice_is_warned_of(tmp_path: Path) -> None:
    ran = _measure(_table(tmp_path, _rows(3) * 2), tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "3 row(s) repeat an earlier row exactly" in ran.stderr and "rows 4, 5, 6" in ran.stderr, ran.stderr


@pytest.mark.parametrize(("measured", "said"), [("1e-300", "1e-300 ms is shorter than any iteration"),
                                                 ("1e300", "1e+300 ms is longer than any iteration")])
def test_an_iteration_outside_a_microsecond_to_a_day_is_no_measurement(tmp_path: Path, measured: str,
                                                                      said: str) -> None:
    """1e-300 ms gave a MAPE of 3e304 %; 1e300 ms (or a throughput of 1e-300) was scored at -100 % and pulled the
    MAPE towards 100 %."""
    first, *others = _rows(3)
    fields = first.split(",")
    ran = _measure(_table(tmp_path, [",".join([*fields[:-1], measured]), *others]), tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert '"invalid": 1' in ran.stdout and said in ran.stderr, ran.stderr


def test_a_table_of_which_no_row_can_be_predicted_is_an_error(tmp_path: Path) -> None:
    rows = [",".join([*row.split(",")[:-1], "OOM"]) for row in _rows(3)]
    ran = _measure(_table(tmp_path, rows), tmp_path)
    assert ran.returncode == 2 and "no row could be predicted (3 refused; first: row 1" in ran.stderr, ran.stderr
    assert not (tmp_path / "report").exists()


def test_a_named_pipe_is_no_table(tmp_path: Path) -> None:
    pipe = tmp_path / "runs.csv"
    os.mkfifo(pipe)
    ran = _measure(pipe, tmp_path)
    assert ran.returncode == 2 and "is not a regular file" in ran.stderr, ran.stderr


def test_repeated_runs_of_one_configuration_are_not_warned_of(tmp_path: Path) -> None:
    """A table of repeated runs (one configuration measured three times, as published tables and users' logs
    give) is no table pasted twice: the rows differ in their times."""
    first = _rows(1)[0]
    fields = first.split(",")
    repeats = [",".join([*fields[:-1], f"{float(fields[-1]) * factor:.6f}"]) for factor in (1.0, 1.01, 0.99)]
    ran = _measure(_table(tmp_path, repeats), tmp_path)
    assert ran.returncode == 0 and "repeat an earlier row" not in ran.stderr, ran.stderr


def test_the_breakdown_by_dimension_is_the_same_every_time() -> None:
    """The per-dimension means of 1,440 rows summed in the order polars' threads finished: one call in three gave
    other last digits (the same table, another report). Two hundred calls, one answer."""
    import numpy as np
    import polars as pl

    from vtrain.validate.measurements import DIMENSIONS, MeasurementValidation

    rng = np.random.default_rng(0)
    table = pl.DataFrame({dim: rng.integers(1, 5, 1440) for dim in DIMENSIONS}).with_columns(
        error_pct=pl.Series(rng.normal(size=1440) * 10), predicted_ms=pl.lit(1.0), fitted=pl.lit(False))
    validation = MeasurementValidation(Path("m.csv"), Path("p"), None, table, {})  # type: ignore[arg-type]
    answers = {tuple(tuple(frame.rows()) for frame in validation.by_dimension().values()) for _ in range(200)}
    assert len(answers) == 1


def test_what_rows_leave_unsaid_is_said_with_what_they_were_predicted_with(tmp_path: Path) -> None:
    """A table without a recomputation, precision, GPU, framework or attention column was predicted with full
    recomputation, fp16, the profile's GPU, Megatron's kernels and eager attention without a word (and without
    the overlap, distributed optimizer and sequence parallelism columns: with none of them, until session 37): a
    user's table of runs without recomputation read 32 % off. Each setting left to the command is now named with its value
    and the flag that sets it; a table that says them all gets no such line."""
    header, *rows = _rows_with_header(3)
    table = _table(tmp_path, rows)
    ran = _measure(table, tmp_path)
    line = next(line for line in ran.stderr.splitlines() if "rows that do not say it" in line)
    assert line == (f"warning: {table}: rows that do not say it are predicted with: recomputation full "
                    "(--recompute) for 3 of 3; precision fp16 for 3 of 3; GPU A100-40GB (--device) for 3 of 3; "
                    "framework megatron (--framework) for 3 of 3; attention eager (--attention) for 3 of 3; gradient "
                    "all-reduce overlap off for 3 of 3; distributed optimizer off for 3 of 3; sequence parallelism "
                    "off for 3 of 3")
    said = [f"{row},none,bf16,A100-80GB,megatron,eager,false,false,false" for row in rows]
    said[0] = said[0].replace(",none,", ",,")  # one empty cell
    ran = vtrain_in_process("validate", "--measurements", _written(tmp_path, header, said), "--profile", PROFILE,
                            "--recompute", "selective", "-o", tmp_path / "said", "--json")
    assert ran.returncode == 0, ran.stderr
    assert [line.split(": ", 2)[2] for line in ran.stderr.splitlines() if "do not say it" in line] == [
        "rows that do not say it are predicted with: recomputation selective (--recompute) for 1 of 3"]


def _rows_with_header(count: int) -> list[str]:
    return GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[:count + 1]


def _written(folder: Path, header: str, rows: list[str]) -> Path:
    table = folder / "said.csv"
    table.write_text("\n".join([f"{header},recompute,precision,device,framework,attention,dp overlap,"
                                f"distributed optimizer,sequence parallel", *rows]) + "\n")
    return table


def test_a_named_llama_in_a_table_runs_its_attention_as_simulate_runs_the_name(tmp_path: Path) -> None:
    """NeMo's published table names its models (LLAMA3_8B): its rows were predicted with eager attention, where
    `vtrain simulate llama-3-8b` uses FlashAttention, the family's own; a row off by 569 %."""
    from vtrain.importers import read_measurements

    table = tmp_path / "nemo.md"
    table.write_text("| Model | #-GPUs | GBS | MBS | Sequence Length | TP | PP | Tokens / sec / GPU |\n"
                     "|---|---|---|---|---|---|---|---|\n"
                     "| LLAMA3_8B | 8 | 128 | 1 | 8192 | 1 | 1 | 12000 |\n"
                     "| gpt-3-175b | 1024 | 1536 | 1 | 2048 | 8 | 16 | 140 |\n")
    assert read_measurements(table)["attention"].to_list() == ["flash", "eager"]


def test_a_row_of_a_folder_of_tables_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    """A folder of tables was read as one: a row's warning named the folder and the row's number among all of
    them, not the file it is in."""
    header, first, second, third = _rows_with_header(3)
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.csv").write_text("\n".join([header, first, second]) + "\n")
    (folder / "b.csv").write_text("\n".join([header, third, ",".join(third.split(",")[:-1] + ["OOM"])]) + "\n")
    ran = vtrain_in_process("validate", "--measurements", folder, "--profile", PROFILE, "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: {folder}: 1 row(s) not simulated and not scored (row 4, b.csv line 3: no measured time " \
           "('OOM'))" in ran.stderr.splitlines(), ran.stderr


def test_every_row_not_simulated_is_in_the_report_with_why(tmp_path: Path) -> None:
    """Nine rows refused for nine reasons: the warning gave the first, the report only their count; the other eight
    reasons were in metrics.json alone (an audit). The report lists each, by its file and line in a folder."""
    header, first, second, third = _rows_with_header(3)
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.csv").write_text("\n".join([header, first, ",".join(second.split(",")[:-1] + ["OOM"])]) + "\n")
    (folder / "b.csv").write_text("\n".join([header, ",".join(third.split(",")[:-1] + ["-5"])]) + "\n")
    ran = vtrain_in_process("validate", "--measurements", folder, "--profile", PROFILE, "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "2 row(s) not simulated and not scored (row 2, a.csv line 3: no measured time ('OOM'); each with why in " \
           "the report)" in ran.stderr, ran.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    listed = report.split("## Rows not simulated")[1].split("##")[0]
    assert "| 2 | a.csv line 3 | no measured time ('OOM') |" in listed
    assert "| 3 | b.csv line 2 |" in listed, listed
