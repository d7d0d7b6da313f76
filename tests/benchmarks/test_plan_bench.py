"""Speed of `vtrain plan`: the full MT-NLG 530B design space (105 layers, hidden 20480, 128 heads, seq 2048,
global batch 1920) on every GPU count up to 3,360 with ``profiles/a100`` and 80 GiB per GPU, over 2 worker
processes (goal: <= 60 s on 2 cores), and one plan's timing at p = 35 and p = 105 on 3,360 GPUs.

vTrain's own predictor is not available here; its paper reports about 9 s per configuration.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import REPO
from vtrain.devices import device_for_config
from vtrain.plan import sweep
from vtrain.plan.evaluate import _LAST_WORK, time_plan
from vtrain.plan.space import parse_gpus
from vtrain.runconfig import RunConfig, load_run_config
from vtrain.simulate.run import SharedResolvers
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"
SWEEP_TARGET_S = 60.0


@pytest.fixture(scope="module")
def a100():
    return load_profile(REPO / "profiles" / "a100")


def test_plan_mtnlg_530b_up_to_3360_gpus(benchmark, a100) -> None:
    base = load_run_config(MTNLG)
    counts = parse_gpus("..3360", base)
    benchmark.group = "plan MT-NLG 530B, every GPU count up to 3,360"
    table = benchmark.pedantic(lambda: sweep(base, counts, a100, divisible=True, device_memory_gib=80, workers=2),
                               rounds=1, iterations=1)
    benchmark.extra_info.update(table.counts)
    assert table.counts["simulated"] > 100 and table.frontier().height >= 1
    if benchmark.stats is not None:
        assert benchmark.stats.stats.min <= SWEEP_TARGET_S


def _mtnlg(pp: int, dp: int) -> RunConfig:
    config = load_run_config(MTNLG).with_overrides(pp=pp, dp=dp, global_batch=1920)
    return replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size))


@pytest.mark.parametrize("pp,dp", [(35, 12), (105, 4)])
def test_time_one_mtnlg_plan(benchmark, a100, pp: int, dp: int) -> None:
    """One plan's timing in a sweep (resolvers shared and warm, the plan's own work not resolved yet: the last
    plan's is forgotten before each round), at 3,360 GPUs. The pipeline shape's pass table is kept, as in a sweep,
    where the plans of one (schedule, p, micro-batches, chunks) follow one another (recomputation, overlap, sequence
    parallelism: 6 to 12 of them)."""
    config = _mtnlg(pp, dp)
    shared = SharedResolvers(a100, device_for_config(config))
    time_plan(config, shared)
    benchmark.group = "time one MT-NLG plan (p = 35 vs p = 105)"
    def forget_the_last_plan() -> tuple[tuple[RunConfig, SharedResolvers], dict[str, object]]:
        shared.work.pop(_LAST_WORK, None)
        return (config, shared), {}

    timing = benchmark.pedantic(time_plan, setup=forget_the_last_plan, rounds=40, iterations=1)
    benchmark.extra_info["iteration_ms"] = round(timing.iteration_us / 1e3, 1)
