"""Speed and memory of `simulate()` on vTrain's MT-NLG 530B example (t=8, d=12, p=35, 160 micro-batches of 1,
105 layers, hidden 20480, 128 heads, seq 2048, full recomputation, 3,360 GPUs) with a synthetic profile of about
20 forward and 40 backward kernels per layer. Targets: <= 0.3 s per simulation (vTrain's own simulator takes
about 9 s for it on this machine) and peak memory that does not grow with the data-parallel degree.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from dataclasses import replace

import pytest

from tests.conftest import REPO
from vtrain.devices import device_for_config
from vtrain.model.ops import Op
from vtrain.runconfig import RunConfig, load_run_config
from vtrain.simulate import simulate
from vtrain.simulate.synthetic import synthetic_profile
from vtrain.tables.store import Profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"
TARGET_SECONDS = 0.3
VTRAIN_PREDICTOR_S = 9.0  # vTrain's own predictor on one configuration (its paper)


def mtnlg(dp: int = 12) -> RunConfig:
    config = load_run_config(MTNLG)
    par = config.parallelism
    micro_batches = par.micro_batches  # 160 per replica, whatever the replica count
    config = config.with_overrides(dp=dp, global_batch=micro_batches * dp * par.micro_batch)
    return replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size))


def profile_for(config: RunConfig) -> Profile:
    """Every workload op measured (at the device model's latency), GEMMs as 2 kernels; NCCL curves for the
    tensor-parallel, data-parallel and pipeline groups at a few sizes, so collectives are interpolated."""
    device = device_for_config(config)
    par = config.parallelism
    sizes = [2**k for k in range(16, 34, 2)]
    rows = [{"collective": name, "group_size": group, "bytes": size,
             "median_us": device.intra_node.collective_us(name, group, size)[0]}
            for name, group in (("all_reduce", par.tp), ("all_reduce", par.dp), ("send", 2)) for size in sizes]
    return synthetic_profile(config, device.op_latency_us, rows, kernels_per_op=lambda op: 2 if op.is_gemm else 1)


def test_mtnlg_profile_has_about_20_forward_and_40_backward_kernels_per_layer() -> None:
    from vtrain.model import gpt
    from vtrain.model.gpt import GptShape

    shape = GptShape.from_config(mtnlg())
    forward = [s for s in gpt.layer_forward(shape) if isinstance(s, Op)]
    backward = [s for s in gpt.layer_backward(shape, accumulate=True) if isinstance(s, Op)]
    assert 20 <= _kernels(forward) <= 30 and 40 <= _kernels(backward) <= 70


def _kernels(ops: list[Op]) -> int:
    """Kernels per op as :func:`profile_for` gives them."""
    return sum(2 if op.is_gemm else 1 for op in ops)


def test_simulate_mtnlg_530b(benchmark) -> None:
    config = mtnlg()
    profile = profile_for(config)
    benchmark.group = "simulate MT-NLG 530B (3,360 GPUs)"
    sim = benchmark(simulate, config, profile)
    assert sim.coverage_share["measured"] > 0.9
    assert sim.config.parallelism.world_size == 3360
    benchmark.extra_info["iteration_time_ms"] = round(sim.iteration_us / 1e3, 1)
    benchmark.extra_info["tasks"] = len(sim.graph)
    if benchmark.stats is not None:  # timing only when benchmarks are enabled (make bench)
        assert benchmark.stats.stats.min <= TARGET_SECONDS


@pytest.mark.parametrize(("pp", "dp"), [(35, 12), (105, 4)])
def test_simulate_mtnlg_p35_against_p105(benchmark, pp: int, dp: int) -> None:
    """The same model on the same 3,360 GPUs and global batch, with three times the stages (and three times the
    micro-batches per pipeline): 22,749 tasks against 201,379. Goal: p = 105 no slower than p = 35 (compare the
    two rows of the group)."""
    config = load_run_config(MTNLG).with_overrides(pp=pp, dp=dp)
    profile = profile_for(config)
    simulate(config, profile)  # warm the imports and the device model
    benchmark.group = "simulate MT-NLG 530B, p = 35 against p = 105"
    sim = benchmark(simulate, config, profile)
    benchmark.extra_info["tasks"] = len(sim.graph)
    assert sim.config.parallelism.world_size == 3360


def _peak_bytes(config: RunConfig, profile: Profile) -> int:
    gc.collect()
    tracemalloc.start()
    simulate(config, profile)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


@pytest.mark.parametrize("dp", [96])
def test_simulate_memory_does_not_grow_with_dp(benchmark, dp: int) -> None:
    base, wide = mtnlg(12), mtnlg(dp)
    base_profile, wide_profile = profile_for(base), profile_for(wide)
    simulate(base, base_profile)  # warm caches (device model, imports) before measuring
    benchmark.group = "simulate MT-NLG 530B, peak memory"
    peaks = benchmark.pedantic(lambda: (_peak_bytes(base, base_profile), _peak_bytes(wide, wide_profile)),
                               rounds=1, iterations=1)
    benchmark.extra_info["peak_mb_d12"] = round(peaks[0] / 2**20, 1)
    benchmark.extra_info[f"peak_mb_d{dp}"] = round(peaks[1] / 2**20, 1)
    assert wide.parallelism.world_size == 8 * 35 * dp
    assert peaks[1] <= 1.05 * peaks[0]


def test_vtrain_simulate_mtnlg_530b_process(benchmark) -> None:
    """`vtrain simulate examples/mtnlg-530b.json --profile profiles/a100` as a whole process: interpreter start,
    imports, the profile read and its device model built, the simulation and the summary; the profile read before
    (by the warm-up run: what vtrain derives from it is then in its cache, vtrain/cache.py), as every run after a
    profile's first. Goal: <= 0.3 s, i.e. >= 30x faster than vTrain's predictor on the same configuration."""
    command = [sys.executable, "-m", "vtrain.cli.main", "simulate", str(MTNLG), "--profile",
               str(REPO / "profiles" / "a100")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run(command, capture_output=True, cwd=REPO, env=env, check=True)  # warm the file and vtrain's cache
    benchmark.group = "vtrain simulate MT-NLG 530B as a process"
    result = benchmark.pedantic(lambda: subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env,
                                                       check=False),
                                rounds=5, iterations=1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("iteration time")
    if benchmark.stats is not None:
        benchmark.extra_info["times_faster_than_vtrain"] = round(VTRAIN_PREDICTOR_S / benchmark.stats.stats.min, 1)
        assert benchmark.stats.stats.min <= TARGET_SECONDS
