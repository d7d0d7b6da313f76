"""`vtrain validate` leaves out a device activity whose time no measurement can have, as `vtrain ingest` does (one
rule, `vtrain.kineto.absurd_activities`), and says so on a warning line and in the report: a real A100 trace with
one kernel's start moved 10^12 us (11 days) later, or its duration set to 1e300 us. Kernels written twice are kept
and said, as ingest says them."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TRACES

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"


def _validate(folder: Path, out: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    ran = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "validate", str(folder), "-o", str(out),
                          "--no-hta", "--json"], capture_output=True, text=True, cwd=REPO, check=False)
    return ran, json.loads(ran.stdout) if ran.returncode == 0 else {}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[float, str]:
    """The unmodified trace's measured iteration time, and what validate said on it."""
    tmp = tmp_path_factory.mktemp("plain")
    ran, result = _validate(SOURCE.parent, tmp / "out")
    assert ran.returncode == 0, ran.stderr
    return result["replay"]["measured_ms"], ran.stderr


@pytest.mark.parametrize("change", ["start 11 days later", "duration 1e300"])
def test_an_absurd_kernel_is_left_out_with_a_warning(change: str, plain: tuple[float, str], tmp_path: Path) -> None:
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    victim = max(kernels, key=lambda e: e["dur"])  # the longest: leaving it out changes the busy time, not the span
    if change == "duration 1e300":
        victim["dur"] = 1e300
    else:
        victim["ts"] += 1e12
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    ran, result = _validate(folder, tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    line = "left out 1 device activities with an absurd time"
    assert line in ran.stderr and "Traceback" not in ran.stderr
    assert line in (tmp_path / "out" / "report.md").read_text()
    # the iteration is the trace's, not 11 days or 1e297 ms long
    assert result["replay"]["measured_ms"] == pytest.approx(plain[0], rel=0.05)


def test_kernels_written_twice_are_said(tmp_path: Path) -> None:
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    trace["traceEvents"] += [dict(kernels[0]) for _ in range(3)]
    folder = tmp_path / "trace"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    ran, _ = _validate(folder, tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "3 device activities repeat another exactly" in ran.stderr
    assert "repeat another" in (tmp_path / "out" / "report.md").read_text()


def test_the_real_trace_has_no_such_warning(plain: tuple[float, str]) -> None:
    assert "absurd time" not in plain[1] and "repeat another" not in plain[1]
