"""One predictor: `vtrain simulate`, `vtrain validate --measurements` and the Python API predict the same run
identically from the same fitted profile, on one node and across nodes (where the run's network rate replaces
the profile's measured multi-node curves)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO
from vtrain.cli.main import app
from vtrain.runconfig import load_run_config
from vtrain.simulate.run import simulate
from vtrain.tables.store import load_profile

DATA = REPO / "tests" / "data" / "a100"
HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
          "data parallelism,pipeline parallelism,iteration time (ms)")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fitted A100 profile (kernels from LLMCompass and one vidur model, collectives from nccl-tests and
    vidur's two-node runs), no host terms."""
    out = tmp_path_factory.mktemp("fit") / "a100"
    result = CliRunner().invoke(app, [
        "fit", "-o", str(out), "--nccl-tests", str(DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"),
        "--llmcompass", str(DATA / "llmcompass-a100"), "--vidur-compute", str(DATA / "vidur-a100" / "compute" /
                                                                              "phi-2-mlp.csv"),
        "--vidur-network", str(DATA / "vidur-a100" / "network" / "all_reduce.csv"), "--json"])
    assert result.exit_code == 0, result.output
    return out


def _run(tmp_path: Path, gpus: int, tp: int, dp: int, pp: int, inter: float | None) -> Path:
    config = {"model": {"layers": 8, "hidden": 2048, "heads": 16, "seq": 2048, "vocab": 50257},
              "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 2, "global_batch": 16 * dp,
                              "schedule": "1f1b", "recompute": "full", "dp_overlap": False},
              "precision": "fp16", "framework": "megatron",
              "hardware": {"device": "A100-40GB", "device_count": gpus, "gpus_per_node": 8,
                           "inter_node_gbps": inter}}
    path = tmp_path / f"run-{gpus}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("gpus", "tp", "dp", "pp", "inter"), [(8, 2, 2, 2, None), (32, 4, 4, 2, 800.0)])
def test_same_run_same_prediction_through_every_command(profile: Path, tmp_path: Path, gpus: int, tp: int,
                                                        dp: int, pp: int, inter: float | None) -> None:
    runner = CliRunner()
    run = _run(tmp_path, gpus, tp, dp, pp, inter)
    simulated = runner.invoke(app, ["simulate", str(run), "--profile", str(profile), "--json"])
    assert simulated.exit_code == 0, simulated.output
    cli_ms = json.loads(simulated.stdout)["iteration_time_ms"]

    csv = tmp_path / "one.csv"
    extra = ",inter-node gbps" if inter else ""
    row = f"{gpus},{16 * dp},2,2048,16,8,2048,{tp},{dp},{pp},1000" + (f",{inter:g}" if inter else "")
    csv.write_text(f"{HEADER}{extra}\n{row}\n")
    report = tmp_path / "report"
    validated = runner.invoke(app, ["validate", "--measurements", str(csv), "--profile", str(profile), "-o",
                                    str(report), "--json"])
    assert validated.exit_code == 0, validated.output
    metrics = json.loads((report / "metrics.json").read_text())
    measurements_ms = metrics["worst"][0]["predicted_ms"]

    api_ms = simulate(load_run_config(run), load_profile(profile)).iteration_us / 1e3
    assert cli_ms == pytest.approx(api_ms, rel=1e-9)
    assert measurements_ms == pytest.approx(api_ms, rel=1e-9)


def test_prediction_uses_the_fitted_device_and_says_so(profile: Path, tmp_path: Path) -> None:
    sim = simulate(load_run_config(_run(tmp_path, 8, 2, 2, 2, None)), load_profile(profile))
    assert "gemm" in sim.device.provenance and sim.device.provenance["gemm"].startswith("fitted")
    ops = [r for r in _resolutions(sim) if "fitted kernel model" in r]
    assert ops and all(("interpolated" in r) or ("extrapolated" in r) for r in ops)


def test_run_network_rate_replaces_measured_multi_node_curves(profile: Path, tmp_path: Path) -> None:
    slow = simulate(load_run_config(_run(tmp_path, 32, 4, 4, 2, 100.0)), load_profile(profile))
    fast = simulate(load_run_config(_run(tmp_path, 32, 4, 4, 2, 3200.0)), load_profile(profile))
    assert slow.breakdown_us["dp"] > fast.breakdown_us["dp"]


def _resolutions(sim) -> list[str]:
    """The details of every op resolution in the simulation's blocks."""
    details = []
    for task in sim.graph.tasks:
        blocks = getattr(task.work, "blocks", None) or (task.work,)
        for block in blocks:
            details += [step.resolution.detail for step in getattr(block, "steps", ())]
    return details
