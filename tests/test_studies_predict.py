"""The studies' speeds are `vtrain plan`'s: the adapter's best plan is the best of the same part of the sweep."""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import REPO
from vtrain.plan.sweep import sweep
from vtrain.runconfig import ModelConfig
from vtrain.studies.predict import Cluster, PlanThroughput
from vtrain.studies.throughput import Workload
from vtrain.tables.store import load_profile


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_best_plan_matches_the_sweep(gpus: int) -> None:
    profile = load_profile(REPO / "profiles" / "a100")
    throughput = PlanThroughput(profile, Cluster(device_memory_gib=6.0), max_micro_batch=2)
    workload = Workload(ModelConfig(layers=4, hidden=1024, heads=16, seq=512, vocab=51200), global_batch=16)
    prediction = throughput(workload, gpus)
    table = sweep(throughput.base_config(workload, gpus), [gpus], profile, device_memory_gib=6.0,
                  max_micro_batch=2).simulated()
    same_part = table.filter((pl.col("schedule") == "1f1b") & (pl.col("dp_overlap") == (pl.col("dp") > 1))
                             & ~pl.col("sequence_parallel") & (pl.col("recompute") != "selective"))
    best = same_part.sort("tokens_per_s", descending=True).row(0, named=True)
    assert prediction.tokens_per_s == pytest.approx(best["tokens_per_s"], rel=1e-9)
    assert (prediction.plan["tp"], prediction.plan["dp"], prediction.plan["pp"]) == (best["tp"], best["dp"],
                                                                                    best["pp"])
    assert prediction.plan["mfu"] == pytest.approx(best["mfu"], rel=1e-9)
    assert throughput(workload, gpus) is prediction and throughput.sweeps == 1  # asked once


def test_no_plan_fits() -> None:
    throughput = PlanThroughput(None, Cluster(device_memory_gib=1.0))
    big = Workload(ModelConfig(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200), global_batch=8)
    assert throughput(big, 8) is None


def test_the_studies_run_megatrons_kernels_and_memory() -> None:
    """The studies' jobs are Megatron's by default (the runs profiles/a100 was fitted to, the paper's setting): its
    20 bytes of model state per fp16 parameter (its step's copies included), not the reference model's 10 (no fp32
    master weights), decide which plans fit."""
    from vtrain.errors import InputError
    from vtrain.model.memory import peak_stage_memory

    workload = Workload(ModelConfig(layers=4, hidden=1024, heads=16, seq=512, vocab=51200), global_batch=16)
    megatron = PlanThroughput(None, Cluster()).base_config(workload, 1)
    reference = PlanThroughput(None, Cluster(framework="reference")).base_config(workload, 1)
    assert (megatron.framework, reference.framework) == ("megatron", "reference")
    states = [peak_stage_memory(config) for config in (megatron, reference)]
    per_parameter = [(m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes + m.step_bytes) / m.parameter_bytes * 2
                     for m in states]
    assert per_parameter == [20, 10]
    with pytest.raises(InputError, match="--framework must be one of"):
        Cluster(framework="deepspeed")


def test_the_studies_jobs_run_the_attention_asked_for() -> None:
    """`vtrain size` and `vtrain cluster --attention flash`: the jobs' plans hold no attention scores, and at a long
    sequence train faster than with them."""
    profile = load_profile(REPO / "profiles" / "a100")
    workload = Workload(ModelConfig(layers=4, hidden=1024, heads=16, seq=4096, vocab=51200), global_batch=16)
    speeds = {}
    for attention in ("eager", "flash"):
        throughput = PlanThroughput(profile, Cluster(device_memory_gib=40.0, attention=attention), max_micro_batch=2)
        assert throughput.base_config(workload, 8).attention == attention
        speeds[attention] = throughput(workload, 8).tokens_per_s
    assert speeds["flash"] > speeds["eager"]
