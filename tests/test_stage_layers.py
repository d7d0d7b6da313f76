"""Runs whose layers do not divide evenly over their pipeline stages (BLOOM: 70 layers on 12 stages, split by
DeepSpeed's PipelineModule) say how they split them in ``parallelism.stage_layers`` (or a table's ``stage layers``
column); without it such a config is refused, the message giving DeepSpeed's split to paste."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.partition import partition
from vtrain.runconfig import (
    HardwareConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    balanced_stage_layers,
    load_run_config,
    save_run_config,
)

BLOOM_SPLIT = (5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5)  # type:transformer|embedding: an embedding weighs a layer


def _config(layers: int = 70, pp: int = 12, stage_layers: tuple[int, ...] | None = BLOOM_SPLIT,
            **parallel: object) -> RunConfig:
    return RunConfig(model=ModelConfig(layers=layers, hidden=1024, heads=16, seq=512, vocab=50304),
                     parallelism=ParallelConfig(tp=1, pp=pp, dp=1, micro_batch=1, global_batch=4 * pp,
                                                stage_layers=stage_layers, **parallel),
                     precision="bf16", framework="megatron",
                     hardware=HardwareConfig(device="A100-80GB", device_count=pp))


def test_each_stage_holds_the_layers_it_is_given_in_order() -> None:
    chunks = [stage[0] for stage in partition(_config())]
    assert [c.layers for c in chunks] == list(BLOOM_SPLIT)
    assert [c.first_layer for c in chunks] == [sum(BLOOM_SPLIT[:k]) for k in range(12)]
    assert chunks[-1].layer_ids[-1] == 69
    assert [c.has_embedding for c in chunks] == [True] + [False] * 11
    assert [c.has_head for c in chunks] == [False] * 11 + [True]


def test_deepspeeds_balanced_split_fills_the_first_stages() -> None:
    assert balanced_stage_layers(70, 12) == (6,) * 11 + (4,)
    assert balanced_stage_layers(10, 4) == (3, 3, 3, 1)
    assert balanced_stage_layers(96, 8) == (12,) * 8


def test_uneven_layers_without_a_split_are_refused_with_deepspeeds_split_to_paste() -> None:
    errors = _config(stage_layers=None).constraint_errors()
    assert len(errors) == 1 and "layers (70) is not divisible by pp*virtual_stages (12*1)" in errors[0]
    assert "[6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4] is DeepSpeed's PipelineModule split" in errors[0]
    no_layers_left = _config(layers=9, pp=4, stage_layers=None).constraint_errors()  # DeepSpeed: 3, 3, 3, 0
    assert no_layers_left == ["layers (9) is not divisible by pp*virtual_stages (4*1)"]


@pytest.mark.parametrize(("stage_layers", "message"), [
    ((5, 6, 6), "stage_layers has 3 entries for 12 pipeline stages (pp)"),
    ((6,) * 12, "stage_layers sums to 72 layers, the model has 70"),
    ((0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0), "stage_layers must hold whole numbers of layers from 1 to 1024"),
    ([5.5] * 12, "stage_layers must hold whole numbers of layers"),
    ([True] * 12, "stage_layers must hold whole numbers of layers"),
    ("5 6 6", "stage_layers must be a list of layer counts, one a pipeline stage"),
    ([], "stage_layers must be a list of layer counts"),
])
def test_a_split_that_is_not_the_runs_is_refused(stage_layers: object, message: str) -> None:
    errors = _config(stage_layers=stage_layers).constraint_errors()  # type: ignore[arg-type]
    assert errors and message in errors[0], errors


def test_an_uneven_split_is_not_interleaved() -> None:
    config = _config(layers=24, pp=2, stage_layers=(11, 13), schedule="interleaved", virtual_stages=2)
    assert any("stage_layers with virtual_stages > 1" in e for e in config.constraint_errors())


def test_run_yaml_keeps_the_split(tmp_path: Path) -> None:
    save_run_config(_config(), tmp_path / "run.yaml")
    assert "stage_layers:\n  - 5\n  - 6" in (tmp_path / "run.yaml").read_text()
    loaded = load_run_config(tmp_path / "run.yaml")
    assert loaded == _config() and loaded.parallelism.stage_layers == BLOOM_SPLIT


def test_simulate_says_the_split(tmp_path: Path) -> None:
    save_run_config(_config(), tmp_path / "run.yaml")
    ran = vtrain_in_process("simulate", tmp_path / "run.yaml", "--profile", REPO / "profiles" / "a100")
    assert ran.returncode == 0, ran.stderr
    assert "layers per stage 5 6 6 6 6 6 6 6 6 6 6 5" in ran.stdout


def _simulate(config: RunConfig, folder: Path, name: str) -> dict:
    path = folder / f"{name}.yaml"
    save_run_config(config, path)
    ran = vtrain_in_process("simulate", path, "--profile", REPO / "profiles" / "a100", "--json")
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_each_stage_runs_its_own_layers(tmp_path: Path) -> None:
    """70 layers as 5 + 10 x 6 + 5 take longer than the even split of 60 (5 a stage) and less than that of 72 (6 a
    stage); the ten stages of 6 compute alike, the first (5 layers and the embedding) less than they do."""
    uneven, fives, sixes = (_simulate(config, tmp_path, name)["iteration_time_ms"] for name, config in (
        ("uneven", _config()), ("fives", _config(layers=60, stage_layers=None)),
        ("sixes", _config(layers=72, stage_layers=None))))
    assert fives < uneven < sixes
    again = _simulate(_config(), tmp_path, "again")
    assert again["parallelism"]["stage_layers"] == list(BLOOM_SPLIT)
    compute = [s["breakdown_ms"]["compute"] for s in again["stages"]]
    assert compute[1:11] == pytest.approx([compute[1]] * 10)  # the ten stages of 6 layers alike
    assert compute[0] < compute[1]  # 5 layers and the embedding against 6 layers


def test_a_tables_stage_layers_column(tmp_path: Path) -> None:
    header = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
              "tensor parallelism,pipeline parallelism,data parallelism,stage layers,iteration time (ms)")
    rows = ['12,48,1,1024,16,70,512,1,12,1,"5 6 6 6 6 6 6 6 6 6 6 5",900',
            '12,48,1,1024,16,70,512,1,12,1,"[5, 6, 6]",900',
            "12,48,1,1024,16,70,512,1,12,1,,900"]
    table = tmp_path / "runs.csv"
    table.write_text("\n".join([header, *rows]) + "\n")
    ran = vtrain_in_process("validate", "--measurements", table, "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert ("2 row(s) not simulated and not scored (row 2: stage_layers has 3 entries for 12 pipeline stages"
            in ran.stderr)
    assert "MAPE" in ran.stdout and "over 1 rows" in ran.stdout
    table.write_text("\n".join([header, '12,48,1,1024,16,70,512,1,12,1,"5 six",900']) + "\n")
    ran = vtrain_in_process("validate", "--measurements", table, "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "report2")
    assert ran.returncode == 2 and "line 2: 'stage layers' is not whole numbers of layers, one a stage" in ran.stderr
    assert not (tmp_path / "report2").exists()


def test_a_table_row_and_a_run_config_predict_the_same(tmp_path: Path) -> None:
    """One predictor: the row above through validate --measurements and its run config through simulate."""
    from vtrain.importers.measurements import measurement_config, read_measurements

    header = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
              "tensor parallelism,pipeline parallelism,data parallelism,stage layers,iteration time (ms)")
    table = tmp_path / "runs.csv"
    table.write_text(header + ',device\n12,48,1,1024,16,70,512,1,12,1,"5 6 6 6 6 6 6 6 6 6 6 5",900,A100-80GB\n')
    row = read_measurements(table).row(0, named=True)
    config = measurement_config(row)
    assert config.parallelism.stage_layers == BLOOM_SPLIT
    ran = vtrain_in_process("validate", "--measurements", table, "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    simulated = _simulate(config, tmp_path, "row")["iteration_time_ms"]
    assert pl.read_parquet(tmp_path / "report" / "rows.parquet")["predicted_ms"][0] == pytest.approx(simulated,
                                                                                                    rel=1e-9)


def test_plan_keeps_the_runs_split_for_its_own_depth(tmp_path: Path) -> None:
    """The run's own plan (its pipeline depth, one chunk a stage) is simulated with its split, as simulate does;
    other depths split evenly, where they can."""
    path = tmp_path / "run.yaml"
    save_run_config(_config(), path)
    ran = vtrain_in_process("plan", path, "--gpus", "12", "--profile", REPO / "profiles" / "a100", "--json",
                            "-o", tmp_path / "plan")
    assert ran.returncode == 0, ran.stderr
    reference = json.loads(ran.stdout)["reference"]
    assert (reference["pp"], reference["fits"]) == (12, True)
    assert reference["iteration_ms"] == pytest.approx(_simulate(_config(), tmp_path, "own")["iteration_time_ms"],
                                                      rel=1e-9)
    plans = pl.read_parquet(tmp_path / "plan" / "plans.parquet")
    twelve = plans.filter((pl.col("pp") == 12) & (pl.col("virtual_stages") == 1))
    assert twelve.filter(pl.col("status") == "simulated").height
    assert twelve["stage_layers"].unique().to_list() == ["5 6 6 6 6 6 6 6 6 6 6 5"]
    assert reference["stage_layers"] == "5 6 6 6 6 6 6 6 6 6 6 5"
    assert not twelve["reason"].drop_nulls().str.contains("layers").any()
    four = plans.filter(pl.col("pp") == 4)  # 70 layers on 4 stages: no split given
    assert four.height and four["reason"].str.contains("layers \\(70\\) is not divisible").all()
    assert four["stage_layers"].null_count() == four.height
