"""The sweep's graph-free pipeline timeline gives `simulate()`'s iteration time, through resolvers shared between
runs, for every schedule, with and without overlap and recomputation, on modelled and on recorded latencies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import REPO
from vtrain.devices import device_for_config
from vtrain.fit.device import device_for_run
from vtrain.ingest.pipeline import ingest_traces
from vtrain.graph.work import CommWork, GraphInputs
from vtrain.plan.evaluate import _coverage, _uses, time_plan
from vtrain.plan.timeline import iteration_timeline
from vtrain.runconfig import RunConfig, load_run_config, run_config_from_dict
from vtrain.simulate import simulate
from vtrain.simulate.latency import SOURCES
from vtrain.simulate.run import SharedResolvers, resolve_work
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"

CASES = [
    {},
    {"dp_overlap": False},
    {"recompute": "none"},
    {"recompute": "selective"},
    {"pp": 5, "dp": 4, "global_batch": 40, "schedule": "interleaved", "virtual_stages": 7, "recompute": "selective"},
    {"schedule": "gpipe"},
    {"pp": 5, "dp": 4, "global_batch": 40, "micro_batch": 2},
    {"pp": 5, "dp": 4, "global_batch": 40, "schedule": "interleaved", "virtual_stages": 7},
    {"pp": 3, "dp": 2, "global_batch": 12, "schedule": "interleaved", "virtual_stages": 5},
    {"pp": 7, "dp": 2, "global_batch": 2},  # one micro-batch: its only backward is split for the buckets
    {"pp": 1, "dp": 2, "global_batch": 8, "tp": 8},
    {"pp": 7, "dp": 1, "global_batch": 14, "dp_overlap": False},
    {"cuda_graphs": True},  # each layer pass one launch: the fitted host time once per graph
    {"pp": 5, "dp": 4, "global_batch": 40, "recompute": "selective", "cuda_graphs": True},
    {"distributed_optimizer": True},  # buckets reduce-scattered, their parameters all-gathered after the step
    {"fused_kernels": False, "recompute": "selective"},  # Megatron's layers without its fused kernels
    {"fused_kernels": False, "distributed_optimizer": True},
    {"distributed_optimizer": True, "dp_overlap": False},
    {"pp": 5, "dp": 4, "global_batch": 40, "schedule": "interleaved", "virtual_stages": 7,
     "distributed_optimizer": True},
]


def _mtnlg(cuda_graphs: bool = False, fused_kernels: bool = True, **parallelism: object) -> RunConfig:
    config = load_run_config(MTNLG).with_overrides(**parallelism)
    return replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size),
                   cuda_graphs=cuda_graphs, fused_kernels=fused_kernels)


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
                recorded.with_overrides(recompute="full"), recorded.with_overrides(recompute="selective"),
                recorded.with_overrides(dp_overlap=True)]
    for config in variants:
        config.validate()
        assert time_plan(config, shared).iteration_us == pytest.approx(simulate(config, profile).iteration_us,
                                                                       rel=1e-12)


def test_a_deadlocking_order_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain.parallel import pass_table
    from vtrain.plan import timeline

    config = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 64},
                                   "parallelism": {"pp": 2, "global_batch": 2}, "hardware": {"device_count": 2}})

    _, inputs, _, _ = resolve_work(config, None, device_for_config(config))
    backwards_first = replace(config.parallelism, schedule="1f1b")

    def reversed_orders(schedule: int, p: int, m: int, v: int) -> tuple[np.ndarray, ...]:
        return tuple(np.ascontiguousarray(column[:, ::-1]) for column in pass_table(schedule, p, m, v))

    monkeypatch.setattr(timeline, "pass_table", reversed_orders)  # each stage's order reversed
    with pytest.raises(ValueError, match="deadlock"):
        timeline.iteration_timeline(backwards_first, inputs)


def _per_step_coverage(config: RunConfig, inputs: GraphInputs) -> dict[str, float]:
    """The coverage as a loop over every step of every use adds it up (what :func:`_coverage` must equal)."""
    totals = dict.fromkeys(SOURCES, 0.0)
    for work, count in _uses(config, inputs):
        steps = [work] if isinstance(work, CommWork) else [step for block in work.blocks for step in block.steps]
        for step in steps:
            totals[step.resolution.source] += step.resolution.latency_us * count
    total = sum(totals.values())
    return {key: value / total for key, value in totals.items()}


def _durations(inputs: GraphInputs) -> list[object]:
    return [[work.duration_us for work in inputs.forward.values()],
            [work.duration_us for work in inputs.backward.values()],
            [[block.duration_us for block in work.blocks] for work in inputs.backward.values()],
            [work.duration_us for work in inputs.optimizer.values()],
            [[(bucket.after_block, bucket.comm.latency_us) for bucket in buckets]
             for buckets in inputs.dp_buckets.values()]]


@pytest.mark.parametrize("trace_set", ["t1p2d1", "t1p2d1-interleaved"])
def test_work_by_chunk_shape_is_the_same_work(trace_set: str) -> None:
    """A plan's work resolved once per chunk shape has every pass's, block's and bucket's time of the work
    resolved per chunk, bitwise, and its coverage is the per-step sum, bitwise: on a recorded profile whose gaps
    are per stage (its own layout) and on other layouts, with mixed measured and interpolated latencies."""
    profile = ingest_traces(REPO / "traces" / trace_set)
    recorded = load_run_config(REPO / "traces" / trace_set / "run.yaml")
    shared = SharedResolvers(profile, device_for_run(recorded, profile))
    variants = [recorded, recorded.with_overrides(recompute="full"),
                recorded.with_overrides(pp=1, dp=2, dp_overlap=True, schedule="1f1b", virtual_stages=1)]
    for config in variants:
        config = replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size))
        config.validate()
        _, per_chunk, _, _ = resolve_work(config, profile, shared.device, shared)
        _, by_shape, _, _ = resolve_work(config, profile, shared.device, shared, by_shape=True)
        assert _durations(by_shape) == _durations(per_chunk)
        coverage = _coverage(config, by_shape)
        assert coverage == _per_step_coverage(config, per_chunk)
        assert 0.0 < coverage["measured"] < 1.0


def test_work_by_chunk_shape_shares_the_stages_of_one_shape() -> None:
    """105 one-layer stages: the middle ones share one forward pass (three shapes: first, middle, last)."""
    profile = load_profile(REPO / "profiles" / "a100")
    config = _mtnlg(pp=105, dp=4)
    shared = SharedResolvers(profile, device_for_run(config, profile))
    _, inputs, _, _ = resolve_work(config, profile, shared.device, shared, by_shape=True)
    assert len({id(work) for work in inputs.forward.values()}) == 3
    _, per_chunk, _, _ = resolve_work(config, profile, shared.device, shared)
    assert time_plan(config, shared).iteration_us == iteration_timeline(config.parallelism, per_chunk).iteration_us
