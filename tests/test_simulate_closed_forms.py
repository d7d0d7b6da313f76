"""The simulator against closed forms, with synthetic profiles where only the transformer layers' GEMMs take time
(so every stage is uniform) and pipeline transfers are free."""

from __future__ import annotations

import math

import pytest

from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.model.ops import Op
from vtrain.runconfig import RunConfig, run_config_from_dict
from vtrain.simulate import simulate
from vtrain.simulate.synthetic import synthetic_profile

FORWARD_GEMM_US = 10.0
BACKWARD_GEMM_US = 17.0
REL = 1e-9


def config(**parallelism: object) -> RunConfig:
    par = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 8, **parallelism}
    gpus = int(par["tp"]) * int(par["pp"]) * int(par["dp"])  # type: ignore[call-overload]
    return run_config_from_dict({
        "model": {"layers": 16, "hidden": 64, "heads": 4, "seq": 32, "vocab": 512},
        "parallelism": par, "precision": "fp32", "hardware": {"device": "A100", "device_count": gpus},
    })


def layer_gemm_profile(cfg: RunConfig, all_reduce_us: float | None = None, send_us: float = 0.0):
    """GEMMs of the layer forward take FORWARD_GEMM_US each, of the backward BACKWARD_GEMM_US, all else 0;
    pipeline sends take ``send_us`` and all-reduces of any size ``all_reduce_us`` (if given)."""
    shape = GptShape.from_config(cfg)
    forward = {s.signature for s in gpt.layer_forward(shape) if isinstance(s, Op) and s.is_gemm}
    backward = {s.signature for acc in (False, True) for s in gpt.layer_backward(shape, acc)
                if isinstance(s, Op) and s.is_gemm} - forward

    def latency(op: Op) -> float:
        if op.signature in forward:
            return FORWARD_GEMM_US
        return BACKWARD_GEMM_US if op.signature in backward else 0.0

    rows: list[dict[str, object]] = [
        {"collective": "send", "group_size": 2, "bytes": shape.activation_bytes, "median_us": send_us}]
    if all_reduce_us is not None:  # flat in size: every bucket lies between these two
        rows += [{"collective": "all_reduce", "group_size": cfg.parallelism.dp, "bytes": size,
                  "median_us": all_reduce_us} for size in (1, 10**12)]
    return synthetic_profile(cfg, latency, rows)


def layer_times(cfg: RunConfig) -> tuple[float, float]:
    """One layer's forward and backward time under :func:`layer_gemm_profile`."""
    shape = GptShape.from_config(cfg)
    forward_gemms = [s for s in gpt.layer_forward(shape) if isinstance(s, Op) and s.is_gemm]
    backward_gemms = [s for s in gpt.layer_backward(shape) if isinstance(s, Op) and s.is_gemm]
    forward_sigs = {s.signature for s in forward_gemms}
    t_b = sum(FORWARD_GEMM_US if s.signature in forward_sigs else BACKWARD_GEMM_US for s in backward_gemms)
    return len(forward_gemms) * FORWARD_GEMM_US, t_b


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (4, 12), (8, 16)])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_stage_times(schedule: str, p: int, m: int) -> None:
    cfg = config(pp=p, global_batch=m, schedule=schedule)
    sim = simulate(cfg, layer_gemm_profile(cfg))
    layer_f, layer_b = layer_times(cfg)
    t_f, t_b = 16 // p * layer_f, 16 // p * layer_b
    assert sim.iteration_us == pytest.approx((m + p - 1) * (t_f + t_b), rel=REL)
    assert sim.breakdown_us["bubble"] == pytest.approx((p - 1) * (t_f + t_b), rel=REL)
    assert sim.breakdown_us["compute"] == pytest.approx(m * (t_f + t_b), rel=REL)
    assert sim.coverage_share["measured"] == 1.0


@pytest.mark.parametrize("v", [2, 4])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (4, 8), (4, 12)])
def test_interleaved_1f1b_shrinks_the_bubble_by_v(v: int, p: int, m: int) -> None:
    cfg = config(pp=p, global_batch=m, schedule="interleaved", virtual_stages=v)
    sim = simulate(cfg, layer_gemm_profile(cfg))
    layer_f, layer_b = layer_times(cfg)
    t_f, t_b = 16 // p * layer_f, 16 // p * layer_b  # a stage's time over all its chunks
    assert sim.breakdown_us["bubble"] == pytest.approx((p - 1) * (t_f + t_b) / v, rel=REL)
    assert sim.iteration_us == pytest.approx(m * (t_f + t_b) + (p - 1) * (t_f + t_b) / v, rel=REL)


def test_pipeline_transfers_lengthen_the_gpipe_fill_and_drain() -> None:
    p, m, delta = 4, 8, 3.0
    cfg = config(pp=p, global_batch=m, schedule="gpipe")
    sim = simulate(cfg, layer_gemm_profile(cfg, send_us=delta))
    layer_f, layer_b = layer_times(cfg)
    t_f, t_b = 16 // p * layer_f, 16 // p * layer_b
    # the first forward crosses p - 1 links on its way down, the first backward p - 1 on its way back
    assert sim.iteration_us == pytest.approx((m + p - 1) * (t_f + t_b) + 2 * (p - 1) * delta, rel=REL)


def test_transfers_slower_than_passes_queue_on_their_senders_stream() -> None:
    """Two stages, GPipe, each transfer twice as long as a pass: a stage's sends leave one after another (its
    transfer stream serves them first come, first served), so the receiver gets one every ``delta`` and the
    iteration is both stages' first and last passes plus the m transfers each way: 2 (t_f + t_b) + 2 m delta."""
    p, m = 2, 6
    cfg = config(pp=p, global_batch=m, schedule="gpipe")
    layer_f, layer_b = layer_times(cfg)
    t_f, t_b = 16 // p * layer_f, 16 // p * layer_b
    delta = 2 * max(t_f, t_b)
    sim = simulate(cfg, layer_gemm_profile(cfg, send_us=delta))
    assert sim.iteration_us == pytest.approx(2 * (t_f + t_b) + 2 * m * delta, rel=REL)
    sends = sorted((sim.schedule.start_us[i], sim.schedule.end_us[i]) for i, task in enumerate(sim.graph.tasks)
                   if task.kind == "pp" and task.phase == "forward")
    assert all(after[0] == pytest.approx(before[1], rel=REL) for before, after in zip(sends, sends[1:]))


def test_pipeline_transfers_show_as_exposed_pp_time_in_1f1b() -> None:
    p, m, delta = 4, 8, 3.0
    cfg = config(pp=p, global_batch=m, schedule="1f1b")
    free = simulate(cfg, layer_gemm_profile(cfg))
    sim = simulate(cfg, layer_gemm_profile(cfg, send_us=delta))
    assert sim.iteration_us >= free.iteration_us + 2 * (p - 1) * delta
    assert sim.breakdown_us["pp"] > 0 and free.breakdown_us["pp"] == 0
    assert sim.breakdown_us["compute"] == pytest.approx(free.breakdown_us["compute"], rel=REL)
    assert sum(sim.breakdown_us.values()) == pytest.approx(sim.iteration_us, rel=REL)


def _dp_run(all_reduce_us: float):
    """pp=1, dp=2, overlapped gradient buckets just under one layer's gradients, flat all-reduce time."""
    probe = config(dp=2, global_batch=4)
    shape = GptShape.from_config(probe)
    layer_bytes = sum(math.prod(p) for p in gpt.layer_parameters(shape)) * shape.element_bytes
    cfg = config(dp=2, global_batch=4, dp_overlap=True, dp_bucket_mb=(layer_bytes - 1) / 2**20)
    return cfg, simulate(cfg, layer_gemm_profile(cfg, all_reduce_us=all_reduce_us))


def test_bucketed_dp_all_reduce_is_hidden_when_backward_is_long_enough() -> None:
    cfg, baseline = _dp_run(all_reduce_us=0.0)
    _, layer_b = layer_times(cfg)
    c = layer_b / 2
    _, sim = _dp_run(all_reduce_us=c)
    assert len([t for t in sim.graph.tasks if t.kind == "dp"]) == 16 + 1  # one per layer, one after embedding
    # every bucket but the last two (layer 0's and the embedding's, both ready when backward ends) is hidden
    assert sim.breakdown_us["dp"] == pytest.approx(2 * c, rel=REL)
    assert sim.iteration_us == pytest.approx(baseline.iteration_us + 2 * c, rel=REL)


def test_bucketed_dp_all_reduce_is_exposed_when_backward_is_short() -> None:
    cfg, baseline = _dp_run(all_reduce_us=0.0)
    _, layer_b = layer_times(cfg)
    c = 2 * layer_b
    _, sim = _dp_run(all_reduce_us=c)
    # the 17 all-reduces queue up from the first bucket, ready after layer 15's backward; backward itself
    # ends 15 layers later
    exposed = 17 * c - 15 * layer_b
    assert sim.breakdown_us["dp"] == pytest.approx(exposed, rel=REL)
    assert sim.iteration_us == pytest.approx(baseline.iteration_us + exposed, rel=REL)


def test_dp_all_reduce_without_overlap_runs_after_the_last_backward() -> None:
    cfg = config(dp=2, global_batch=4, dp_overlap=False, dp_bucket_mb=1000)
    baseline = simulate(cfg, layer_gemm_profile(cfg, all_reduce_us=0.0))
    sim = simulate(cfg, layer_gemm_profile(cfg, all_reduce_us=40.0))
    assert len([t for t in sim.graph.tasks if t.kind == "dp"]) == 1
    assert sim.breakdown_us["dp"] == pytest.approx(40.0, rel=REL)
    assert sim.iteration_us == pytest.approx(baseline.iteration_us + 40.0, rel=REL)
