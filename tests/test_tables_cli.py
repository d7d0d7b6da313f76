"""`vtrain tables` fits the terminal: at 80 columns no line is wider, every operator name is printed whole (never
elided), and the numbers of every row are there; wider terminals get the kernel names too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO

RECORDED = REPO / "traces" / "t2p2d2"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tables") / "profile"
    result = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", RECORDED, "-o", out],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    return out


def _tables(profile: Path, columns: int, top: int = 8) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    result = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "tables", profile, "--top", str(top)],
                            capture_output=True, text=True, cwd=REPO, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("columns", [80, 100])
def test_narrow_terminal_keeps_every_operator_name_whole(profile: Path, columns: int) -> None:
    out = _tables(profile, columns)
    assert max(len(line) for line in out.splitlines()) <= columns
    assert "…" not in out
    ops = pl.read_parquet(profile / "op_latency.parquet").sort(
        pl.col("median_us") * pl.col("count"), descending=True).head(8)
    for row in ops.iter_rows(named=True):
        # a long name may wrap at its spaces onto the row's next line, after the row's numbers: its words stay
        assert re.search(".*?".join(map(re.escape, row["op"].split())), out, re.DOTALL), row["op"]
        assert f"{row['median_us']:.1f}" in out and f"{row['p90_us']:.1f}" in out


def test_wide_terminal_adds_kernel_names(profile: Path) -> None:
    narrow, wide = _tables(profile, 80), _tables(profile, 200)
    assert "kernels" in wide and "kernels" not in narrow
    assert "algbw GB/s" in wide and "busbw GB/s" in narrow


def test_a_markdown_cell_stays_on_its_row() -> None:
    """A name from a user's file (a job, an operator) may hold a line break or a pipe: the row must not split."""
    from vtrain.report.document import markdown_table

    table = markdown_table((["job", "n"], [["gpt\nsmall", "1"], ["a|b\r\nc", "2"]]))
    assert table.splitlines()[2:] == ["| gpt small | 1 |", "| a\\|b  c | 2 |"]


def test_large_jobs_fit_80_columns_without_eliding_a_name_or_a_number() -> None:
    """A 1024-GPU reduce-scatter of 3 GiB over CollNet taking 1.2 s, called 123,456 times, and a flash-attention
    backward over four bf16 tensors: at 80 columns the names wrap (never "…") and every number is whole."""
    import io

    from rich.console import Console

    from vtrain.cli.tables import nccl_table, op_table
    from vtrain.tables.store import conform

    nccl = conform(pl.DataFrame([
        {"collective": "reduce_scatter", "group_size": 1024, "bytes": 3 << 30, "count": 123456,
         "median_us": 1234567.8, "algbw_gbps": 2.6, "busbw_gbps": 2.61, "algorithm": "COLLNET_DIRECT"},
        {"collective": "all_reduce", "group_size": 8, "bytes": 1 << 20, "count": 2, "median_us": 44.7,
         "algbw_gbps": 23.4, "busbw_gbps": 40.95, "algorithm": "NVLS_TREE"}]), "nccl_latency")
    dims = "[[8, 16, 2048, 128], [8, 16, 2048, 128], [8, 16, 2048, 128], [8, 16, 2048, 128]]"
    ops = conform(pl.DataFrame([{
        "op": "aten::_scaled_dot_product_flash_attention_backward", "input_dims": dims,
        "input_types": '["c10::BFloat16"]', "device_type": "cuda", "kernels": "k", "n_kernels": 1,
        "count": 1234567, "median_us": 123456.7, "p10_us": 99999.9, "p90_us": 1234567.8, "mean_us": 1.0}]),
        "op_latency")
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(op_table(ops, 5, wide=False))
    console.print(nccl_table(nccl, 5, wide=False))
    out = console.export_text()
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    cells = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]
    first, last = "".join(c[0] for c in cells), "".join(c[-1] for c in cells)  # a wrapped cell, put back together
    for name in ("aten::_scaled_dot_product_flash_attention_backward", "reduce_scatter", "all_reduce"):
        assert name in first, name
    for name in ("COLLNET_DIRECT", "NVLS_TREE"):
        assert name in last, name
    for number in ("1,234,567", "123456.7", "99999.9", "1234567.8", "123,456", "3.0 GiB", "2.61", "40.95"):
        assert number in out, number


def test_the_warnings_of_an_ingest_are_said_again_by_tables(tmp_path: Path) -> None:
    """`vtrain ingest` warns once; a user reading the tables later (or someone else's profile) saw nothing. The
    profile keeps its ingest's warnings (traces/hta-v100-2rank: 2,020 collectives without a size, a rank missing,
    no input shapes) and `vtrain tables` says them again, marked as the ingest's."""
    from tests.conftest import vtrain_in_process

    ingested = vtrain_in_process("ingest", REPO / "traces" / "hta-v100-2rank", "-o", tmp_path / "profile")
    assert ingested.returncode == 0, ingested.stderr
    said = [line for line in ingested.stderr.splitlines() if line.startswith("warning: ")]
    assert len(said) == 3 and any("2020 of 2020 collectives" in line for line in said)
    shown = vtrain_in_process("tables", tmp_path / "profile", "--top", "1")
    assert shown.returncode == 0, shown.stderr
    again = [line for line in shown.stderr.splitlines() if line.startswith("warning: ")]
    assert again == [line.replace("warning: ", "warning: (when the traces were ingested) ", 1) for line in said]


def test_the_warnings_a_profile_keeps_are_printed_as_text_lines(tmp_path: Path) -> None:
    """What `vtrain tables` says again comes from a file: terminal escapes are shown as codes, not run; entries that
    are not text are refused; more than it prints are counted."""
    import json
    import shutil

    from tests.conftest import vtrain_in_process

    profile = tmp_path / "profile"
    shutil.copytree(REPO / "profiles" / "a100", profile)
    metadata = json.loads((profile / "metadata.json").read_text())
    (profile / "metadata.json").write_text(json.dumps({**metadata, "warnings": ["\x1b[2Jcleared\x07"] * 300}))
    shown = vtrain_in_process("tables", profile, "--top", "1")
    lines = [line for line in shown.stderr.splitlines() if line.startswith("warning: ")]
    assert shown.returncode == 0 and "\x1b" not in shown.stderr and len(lines) == 202
    assert lines[0].endswith("\\x1b[2Jcleared\\x07") and "99 more warning(s)" in lines[-1]
    (profile / "metadata.json").write_text(json.dumps({**metadata, "warnings": [1, None]}))
    refused = vtrain_in_process("tables", profile)
    assert refused.returncode == 2 and "warnings must be a list of text" in refused.stderr


def test_an_operator_without_percentiles_prints_a_dash(profile: Path, tmp_path: Path) -> None:
    """An operator latency may lack p10 and p90 (only the median and count are required): `tables` printed a traceback
    for the first such row (found by mutating profiles); it prints "-", as for a collective without a bandwidth."""
    import shutil

    copy = tmp_path / "profile"
    shutil.copytree(profile, copy)
    file = copy / "op_latency.parquet"
    ops = pl.read_parquet(file)
    top = ops.sort(pl.col("median_us") * pl.col("count"), descending=True)["op"][0]
    ops.with_columns(p10_us=pl.when(pl.col("op") == top).then(None).otherwise(pl.col("p10_us"))).write_parquet(file)
    printed = _tables(copy, 100, top=1)
    assert re.search(r"\s-\s+[\d,.]+\s*$", printed.split("op_latency")[1].split("nccl_latency")[0], re.M), printed


def test_a_fitted_profile_says_what_it_was_fitted_to_and_a_closed_pipe_stops_quietly() -> None:
    """`vtrain tables profiles/h200`: a profile fitted by `vtrain fit` has no ranks or iterations of its own (its
    header read "ranks None of ?, iterations None"); and `vtrain tables ... | head` exited 1 (rich's answer to a
    broken pipe), which reads as a failure: it exits as `simulate ... | head` does, 141 and nothing on stderr."""
    shown = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "tables", REPO / "profiles" / "h200"],
                           capture_output=True, text=True, cwd=REPO, timeout=300, env={**os.environ, "COLUMNS": "200"})
    header = shown.stdout.splitlines()[0]
    assert shown.returncode == 0 and "None" not in header, header
    assert re.search(r"fitted to \d+ measurement file\(s\) and the traces of 1 profile\(s\) \(1 rank file\(s\)\)",
                     header), header
    process = subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", "tables", REPO / "profiles" / "h200"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    assert process.wait(timeout=300) == 141 and process.stderr.read().decode() == ""


def test_an_ingested_profile_names_its_ranks_and_iterations_as_spans(profile: Path) -> None:
    header = _tables(profile, 200).splitlines()[0]
    assert header.endswith(": cpu, ranks 0-7 of 8, iterations 1-10"), header
