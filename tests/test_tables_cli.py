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
