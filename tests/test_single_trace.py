"""A single-process job's trace as torch.profiler's tensorboard_trace_handler names it
(``<host>_<pid>.<timestamp>.pt.trace.json``, no ``distributedInfo``): the only trace of its folder is rank 0, with a
warning, for ingest and validate alike."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

SOURCE = REPO / "traces" / "hta-v100-1rank" / "rank-0.json.gz"


def _anonymous(folder: Path, name: str) -> Path:
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    trace.pop("distributedInfo", None)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(trace))
    return folder


def _vtrain(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=600)


def test_the_only_trace_of_a_folder_is_rank_0_with_a_warning(tmp_path: Path) -> None:
    folder = _anonymous(tmp_path / "job", "gpu-node-3_41234.1700000000123.pt.trace.json")
    result = _vtrain("ingest", folder, "-o", tmp_path / "profile", "--json")
    assert result.returncode == 0, result.stderr
    assert list(json.loads(result.stdout)["ranks"]) == ["0"]
    assert "taken as rank 0" in result.stderr
    report = _vtrain("validate", folder, "--no-hta", "-o", tmp_path / "report", "--json")
    assert report.returncode == 0, report.stderr
    assert abs(json.loads(report.stdout)["replay"]["error_pct"]) <= 2
    assert "taken as rank 0" in report.stderr  # validate says it too (it did not: an audit)


def test_two_anonymous_traces_are_still_refused(tmp_path: Path) -> None:
    folder = _anonymous(tmp_path / "job", "host_1.1.pt.trace.json")
    _anonymous(folder, "host_2.1.pt.trace.json")
    result = _vtrain("ingest", folder, "-o", tmp_path / "profile")
    assert result.returncode == 2 and "cannot tell the rank" in result.stderr
