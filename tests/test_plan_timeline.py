"""The sweep's graph-free pipeline timeline gives `simulate()`'s iteration time, through resolvers shared between
runs, for every schedule, with and without overlap and recomputation, on modelled and on recorded latencies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.conftest import REPO
from vtrain.devices import device_for_config
from vtrain.fit.device import device_for_run
from vtrain.plan.evaluate import time_plan
from vtrain.runconfig import RunConfig, load_run_config, run_config_from_dict
from vtrain.simulate import simulate
from vtrain.simulate.run import SharedResolvers
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"

CASES = [
    {},
    {"dp_overlap": False},
    {"recompute": "none"},
    {"schedule": "gpipe"},
    {"pp": 5, "dp": 4, "global_batch": 40, "micro_batch": 2},
    {"pp": 5, "dp": 4, "global_batch": 40, "schedule": "interleaved", "virtual_stages": 7},
    {"pp": 3, "dp": 2, "global_batch": 12, "schedule": "interleaved", "virtual_stages": 5},
    {"pp": 7, "dp": 2, "global_batch": 2},  # one micro-batch: its only backward is split for the buckets
    {"pp": 1, "dp": 2, "global_batch": 8, "tp": 8},
    {"pp": 7, "dp": 1, "global_batch": 14, "dp_overlap": False},
]


def _mtnlg(**parallelism: object) -> RunConfig:
    config = load_run_config(MTNLG).with_overrides(**parallelism)
    return replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size))


def test_timeline_equals_simulate_on_the_a100_profile() -> None:
    profile = load_profile(REPO / "profiles" / "a100")
    shared = SharedResolvers(profile, device_for_run(_mtnlg(), profile))
    for case in CASES:  # one set of resolvers for every case, as in a sweep
        config = _mtnlg(**case)
        timing = time_plan(config, shared)
        sim = simulate(config, profile)
        assert timing.iteration_us == pytest.approx(sim.iteration_us, rel=1e-12), case
        assert timing.coverage == pytest.approx(sim.coverage_share, abs=1e-9), case


@pytest.mark.parametrize("trace_set", ["t1p2d1", "t1p2d1-interleaved", "t1p1d2-overlap"])
def test_timeline_equals_simulate_on_a_recorded_cpu_profile(trace_set: str, shipped_profile) -> None:
    """A profile with a timeline: host gaps and interference factors are calibrated on the placed operators it
    holds, so runs of other shapes must not share its calibration wrongly."""
    profile = shipped_profile(REPO / "traces" / trace_set)  # `ingest_traces`, once per test run (tests/conftest.py)
    recorded = load_run_config(REPO / "traces" / trace_set / "run.yaml")
    shared = SharedResolvers(profile, device_for_run(recorded, profile))
    variants = [recorded, recorded.with_overrides(micro_batch=1, global_batch=8),
                recorded.with_overrides(recompute="full"), recorded.with_overrides(dp_overlap=True)]
    for config in variants:
        config.validate()
        assert time_plan(config, shared).iteration_us == pytest.approx(simulate(config, profile).iteration_us,
                                                                       rel=1e-12)


def test_a_deadlocking_order_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain.parallel import pass_at, passes_per_stage
    from vtrain.plan import timeline

    config = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 64},
                                   "parallelism": {"pp": 2, "global_batch": 2}, "hardware": {"device_count": 2}})
    from vtrain.simulate.run import resolve_work

    _, inputs, _, _ = resolve_work(config, None, device_for_config(config))
    backwards_first = replace(config.parallelism, schedule="1f1b")

    def reversed_order(schedule: int, p: int, m: int, stage: int, v: int, k: int) -> tuple[int, int, int]:
        return pass_at(schedule, p, m, stage, v, passes_per_stage(schedule, m, v) - 1 - k)

    # the walk as plain Python (its compiled form cannot be given another order), each stage's order reversed
    monkeypatch.setattr(timeline, "_pass_at", reversed_order)
    monkeypatch.setattr(timeline, "_walk", timeline._walk.py_func)
    with pytest.raises(ValueError, match="deadlock"):
        timeline.iteration_timeline(backwards_first, inputs)
