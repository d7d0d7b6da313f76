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
    same_part = table.filter((pl.col("schedule") == "1f1b") & (pl.col("dp_overlap") == (pl.col("dp") > 1)))
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
