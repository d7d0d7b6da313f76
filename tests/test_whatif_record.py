"""`vtrain record --threads N`: the intra-op thread count per rank is chosen by the user and written to run.yaml
(what makes two recordings of one job at two operator speeds, for `vtrain whatif --durations-from`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vtrain.runconfig import load_run_config

TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--vocab", "128",
        "--micro-batch", "2", "--global-batch", "4", "--steps", "1"]


def _record(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", "record", *TINY, *flags], capture_output=True,
                          text=True, timeout=300, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_threads_are_recorded_in_run_yaml(tmp_path: Path) -> None:
    done = _record("--threads", "2", "-o", str(tmp_path / "t2"))
    assert done.returncode == 0, done.stderr
    assert load_run_config(tmp_path / "t2" / "run.yaml").recording["threads"] == 2


def test_threads_below_one_exit_2_with_one_line(tmp_path: Path) -> None:
    done = _record("--threads", "0", "-o", str(tmp_path / "t0"))
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --threads must be >= 1 (got 0)"
    assert not (tmp_path / "t0").exists()
