"""The GPU path end to end without a GPU: `vtrain simulate` writes a predicted GPU timeline (kernels, launches,
NCCL kernels, pipeline transfers between two stage ranks) with its run.yaml; validating that folder must give
back the simulator's own iteration time (model) and the timeline itself (replay), and HTA must analyse the
measured, replayed and model traces alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

CONFIG = """\
model: {layers: 4, hidden: 1024, heads: 16, seq: 1024, vocab: 32000}
parallelism: {tp: 2, pp: 2, dp: 1, micro_batch: 2, global_batch: 8}
precision: bf16
hardware: {device: A100, device_count: 4, gpus_per_node: 4}
"""


def vtrain(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, timeout=600)


def test_validating_the_simulators_own_gpu_timeline_gives_it_back(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG)
    traces = tmp_path / "predicted-as-measured"
    simulated = vtrain("simulate", config, "-o", traces, "--json")
    assert simulated.returncode == 0, simulated.stderr
    iteration_ms = json.loads(simulated.stdout)["iteration_time_ms"]

    out = tmp_path / "report"
    result = vtrain("validate", traces, "-o", out, "--json", "--max-error", "2")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["replay"]["error_pct"] == pytest.approx(0.0, abs=0.1)
    assert summary["model"]["predicted_ms"] == pytest.approx(iteration_ms, rel=1e-3)  # traces round to 1 µs
    assert summary["model"]["error_pct"] == pytest.approx(0.0, abs=1.0)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["replay"]["dependencies"]["collectives_matched"] > 0
    hta = metrics["hta"]
    assert set(hta) == {"measured", "replay", "model"}
    for side in ("replay", "model"):
        for rank, numbers in hta["measured"].items():
            assert hta[side][rank]["compute_pct"] == pytest.approx(numbers["compute_pct"], abs=1.0), (side, rank)
