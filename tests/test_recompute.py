"""Activation recomputation in the simulated iteration: none, selective (the attention core of each layer re-run
before its backward, Korthikanti et al.) and full (each layer's forward re-run)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"


@pytest.mark.parametrize("framework", ["reference", "megatron"])
def test_selective_recomputation_reruns_each_layers_attention_core(framework: str) -> None:
    from dataclasses import replace

    config = replace(load_run_config(MTNLG), framework=framework)
    profile = load_profile(REPO / "profiles" / "a100")
    sims = {mode: simulate(config.with_overrides(recompute=mode), profile) for mode in ("none", "selective", "full")}
    core = [step.signature for step in gpt.attention_core(GptShape.from_config(config))]
    backward = next(t.work for t in sims["selective"].graph.tasks if t.kind == "backward" and t.stage == 1)
    recomputed = [block for block in backward.blocks if block.phase == "recompute"]
    assert len(recomputed) == 3 and all(block.kind == "attention" for block in recomputed)  # 3 layers a stage
    assert all([r.step.signature for r in block.steps] == core for block in recomputed)
    layer = next(block for block in backward.blocks if block.kind == "layer")
    assert layer.phase == "backward"
    assert sims["none"].iteration_us < sims["selective"].iteration_us < sims["full"].iteration_us
    assert sims["full"].largest_stage_bytes < sims["selective"].largest_stage_bytes < sims["none"].largest_stage_bytes


def test_the_recorder_refuses_selective_recomputation(tmp_path) -> None:
    """vtrain record checkpoints whole layers; a selective run recorded as none would be mislabelled."""
    from typer.testing import CliRunner

    from vtrain.cli.app import app

    result = CliRunner().invoke(app, ["record", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16",
                                      "--vocab", "64", "--micro-batch", "1", "--global-batch", "1", "--recompute",
                                      "selective", "--device", "cpu", "-o", str(tmp_path / "never")])
    assert result.exit_code == 2 and "selective recomputation is simulated, not recorded" in result.output
    assert not (tmp_path / "never").exists()
