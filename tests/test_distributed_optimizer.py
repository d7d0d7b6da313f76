"""Megatron's distributed optimizer (ZeRO stage 1, `distributed_optimizer: true`): each data-parallel rank holds and
updates 1/d of the optimizer states; the gradient buckets are reduce-scattered and, after the step, the updated
parameters all-gathered. Checked against Megatron-LM's own accounting (docs/distrib_optimizer.md) and against the
structure of the iteration it runs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tests.conftest import REPO
from vtrain.fit.device import device_for_run
from vtrain.graph.build import build_graph
from vtrain.model.gpt import GptShape
from vtrain.model.memory import stage_memory, stage_parameter_count
from vtrain.partition import partition
from vtrain.runconfig import RunConfig, load_run_config
from vtrain.simulate import simulate
from vtrain.simulate.run import resolve_work
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"
#: Megatron-LM's bytes per parameter (docs/distrib_optimizer.md): (without, with the distributed optimizer at d)
MEGATRON_TABLE = {"fp16": (20, lambda d: 4 + 16 / d), "bf16": (18, lambda d: 6 + 12 / d),
                  "fp32": (16, lambda d: 8 + 8 / d)}


def _mtnlg(**parallelism: object) -> RunConfig:
    config = load_run_config(MTNLG).with_overrides(**parallelism)
    return replace(config, hardware=replace(config.hardware, device_count=config.parallelism.world_size))


@pytest.mark.parametrize("precision", sorted(MEGATRON_TABLE))
@pytest.mark.parametrize("dp", [2, 12])
def test_model_states_per_parameter_are_megatrons(precision: str, dp: int) -> None:
    for sharded in (False, True):
        config = replace(_mtnlg(dp=dp, global_batch=160 * dp, distributed_optimizer=sharded), precision=precision)
        chunks = partition(config)[1]  # a middle stage: layers only
        shape = GptShape.from_config(config)
        memory = stage_memory(config, shape, chunks)
        params = stage_parameter_count(shape, chunks)
        states = memory.parameter_bytes + memory.gradient_bytes + memory.optimizer_bytes + memory.step_bytes
        without, with_d = MEGATRON_TABLE[precision]
        assert states / params == pytest.approx(with_d(dp) if sharded else without, rel=1e-6)


def test_the_iteration_reduce_scatters_steps_on_its_share_and_all_gathers() -> None:
    profile = load_profile(REPO / "profiles" / "a100")
    config = _mtnlg(distributed_optimizer=True, dp_overlap=False)
    plain = _mtnlg(dp_overlap=False)
    device = device_for_run(config, profile)
    _, inputs, _, _ = resolve_work(config, profile, device)
    _, plain_inputs, _, _ = resolve_work(plain, profile, device)
    buckets, plain_buckets = inputs.dp_buckets[(1, 0)], plain_inputs.dp_buckets[(1, 0)]
    assert [b.comm.op for b in buckets] == ["reduce_scatter"] * len(plain_buckets)
    assert [b.comm.bytes for b in buckets] == [b.comm.bytes for b in plain_buckets]
    assert [b.gather.op for b in buckets] == ["all_gather"] * len(buckets)
    assert [b.gather.bytes for b in buckets] == [b.comm.bytes for b in buckets]
    assert all(b.gather is None for b in plain_buckets)
    # the step updates this rank's 1/12 of the stage's parameters, and zeroes the whole gradient buffer
    adam = {done.step.name: done.step for block in inputs.optimizer[1].blocks for done in block.steps}
    plain_adam = {done.step.name: done.step for block in plain_inputs.optimizer[1].blocks for done in block.steps}
    assert adam["apex::multi_tensor_adam"].bytes == 28 * math.ceil(plain_adam["apex::multi_tensor_adam"].bytes / 28 / 12)
    assert adam["aten::zero_"].bytes == plain_adam["aten::zero_"].bytes
    graph = build_graph(config, inputs)
    tasks = [graph.task(i) for i in range(len(graph))]
    optimizer = next(i for i, t in enumerate(tasks) if t.kind == "optimizer" and t.stage == 1)
    gathers = [i for i, t in enumerate(tasks) if t.kind == "dp" and t.stage == 1 and t.work.op == "all_gather"]
    assert len(gathers) == len(buckets)
    waited = {int(t) for s, t in zip(graph.sources, graph.targets) if int(s) == optimizer}
    assert set(gathers) <= waited
    sim = simulate(config, profile)
    result = sim.schedule
    assert min(result.start_us[i] for i in gathers) >= result.end_us[optimizer]


def test_it_is_megatrons_and_is_never_recorded() -> None:
    config = replace(_mtnlg(distributed_optimizer=True), framework="reference")
    assert any("distributed_optimizer is Megatron's" in error for error in config.constraint_errors())


def test_plan_searches_it_when_asked() -> None:
    """`vtrain plan --distributed-optimizer`: every plan with d > 1 also with it. MT-NLG's own layout, 40.02 GiB a GPU
    on the 40 GB part without it, fits with it (its optimizer states split 12 ways)."""
    from vtrain.plan.sweep import sweep

    profile = load_profile(REPO / "profiles" / "a100")
    base = _mtnlg()
    within = lambda c: c.tp == 8 and c.schedule == "1f1b" and c.micro_batch == 1  # noqa: E731 (a small part)
    from vtrain.plan.report import render_markdown

    plain = sweep(base, [3360], profile, within=within, time_reference=False).plans
    searched = sweep(base, [3360], profile, within=within, distributed_optimizer=True, time_reference=False)
    assert "with and without Megatron's distributed optimizer" in render_markdown(searched, [])
    both = searched.plans
    assert not plain["distributed_optimizer"].any()
    assert both.height == plain.height + plain.filter(plain["dp"] > 1).height
    sharded = both.filter(both["distributed_optimizer"])
    assert (sharded["dp"] > 1).all()
    own = sharded.filter((sharded["pp"] == 35) & (sharded["recompute"] == "full") & sharded["dp_overlap"]
                         & ~sharded["sequence_parallel"])
    unsharded = plain.filter((plain["pp"] == 35) & (plain["recompute"] == "full") & plain["dp_overlap"]
                             & ~plain["sequence_parallel"])
    assert unsharded["fits"].to_list() == [False] and own["fits"].to_list() == [True]
    assert own["memory_gib"][0] == pytest.approx(unsharded["memory_gib"][0] - 21.12, abs=0.01)


def test_a_measurement_table_says_so_in_a_column(tmp_path) -> None:
    from vtrain.importers.measurements import measurement_config, read_measurements

    table = tmp_path / "runs.csv"
    table.write_text("gpus,tp,pp,global batch,micro batch,hidden,heads,layers,seq,framework,distributed optimizer,"
                     "iteration time (s)\n3360,8,35,1920,1,20480,128,105,2048,megatron,true,40\n"
                     "3360,8,35,1920,1,20480,128,105,2048,megatron,,40\n")
    rows = list(read_measurements(table).iter_rows(named=True))
    assert [measurement_config(row).parallelism.distributed_optimizer for row in rows] == [True, False]


def test_simulate_says_it() -> None:
    from tests.conftest import vtrain_in_process

    done = vtrain_in_process("simulate", MTNLG, "--profile", REPO / "profiles" / "a100", "--distributed-optimizer")
    assert done.returncode == 0, done.stderr
    assert "distributed optimizer" in done.stdout.splitlines()[1]
    assert "would not fit" not in done.stderr  # 18.90 GiB of the 40 GB part's 40
    assert "shards nothing" not in done.stderr


def test_without_data_parallelism_it_is_said_to_shard_nothing() -> None:
    """At d = 1 the distributed optimizer is the plain one (a config written for another d, say): predicted as
    without it, and said."""
    from tests.conftest import vtrain_in_process

    runs = {flag: vtrain_in_process("simulate", MTNLG, "--profile", REPO / "profiles" / "a100", "--dp", "1",
                                    "--pp", "35", "--gpus", "280", "--global-batch", "160", flag)
            for flag in ("--distributed-optimizer", "--no-distributed-optimizer")}
    sharded, plain = runs["--distributed-optimizer"], runs["--no-distributed-optimizer"]
    assert sharded.returncode == plain.returncode == 0, sharded.stderr
    assert sharded.stdout.splitlines()[0] == plain.stdout.splitlines()[0]  # the iteration time
    assert "with dp = 1 it shards nothing" in sharded.stderr and "shards nothing" not in plain.stderr


def test_plan_refuses_a_run_config_and_a_shape_given_together(tmp_path) -> None:
    """`plan examples/mtnlg-530b.json --layers 4 --hidden 1024 ...` swept MT-NLG's 105 layers in silence (the flags'
    help says they replace a run config)."""
    from tests.conftest import vtrain_in_process

    done = vtrain_in_process("plan", MTNLG, "--gpus", "8", "--layers", "4", "--hidden", "1024", "-o", tmp_path / "p")
    assert done.returncode == 2 and "not both" in done.stderr and "--layers, --hidden" in done.stderr
    assert not (tmp_path / "p").exists()
