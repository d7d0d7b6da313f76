"""Megatron's sequence parallelism (Korthikanti et al., 2022): the ops between tensor-parallel regions (layer norms,
bias-dropout-add, the embedding's dropout) split the sequence over the t ranks; each region is entered by an
all-gather and left by a reduce-scatter instead of an all-reduce; the stored activations outside the regions and
the pipeline transfers shrink by t."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest

from tests.conftest import REPO
from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.model.memory import layer_activation_bytes
from vtrain.model.ops import Collective, Op
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.tables.store import load_profile

MTNLG = REPO / "examples" / "mtnlg-530b.json"  # vTrain's JSON: Megatron's kernels


def _shapes() -> tuple[GptShape, GptShape]:
    config = load_run_config(MTNLG)
    plain = GptShape.from_config(config)
    return plain, GptShape.from_config(config.with_overrides(sequence_parallel=True))


def _collectives(steps: list) -> list[tuple[str, int]]:
    return [(s.op, s.bytes) for s in steps if isinstance(s, Collective)]


def test_a_layer_enters_and_leaves_its_regions_by_all_gather_and_reduce_scatter() -> None:
    plain, split = _shapes()
    whole = plain.activation_bytes
    for phase in (gpt.layer_forward, lambda s: gpt.layer_backward(s, True)):
        assert _collectives(phase(plain)) == [("all_reduce", whole)] * 2
        ops = _collectives(phase(split))
        assert sorted(ops) == [("all_gather", whole)] * 2 + [("reduce_scatter", whole)] * 2
    assert [op for op, _ in _collectives(gpt.layer_forward(split))] == ["all_gather", "reduce_scatter"] * 2
    assert [op for op, _ in _collectives(gpt.layer_backward(split, True))] == ["all_gather", "reduce_scatter"] * 2
    # norms and bias-dropout-add on this rank's 1/t of the tokens; GEMMs and attention unchanged
    tokens = {op.name: op.input_dims for op in gpt.layer_forward(split) if isinstance(op, Op)}
    assert tokens["apex::fused_layer_norm"].startswith(f"[[{plain.tokens // 8}, ")
    assert tokens["megatron::bias_dropout_add"].startswith(f"[[{plain.tokens // 8}, ")
    gemms = [op for op in gpt.layer_forward(split) if isinstance(op, Op) and op.is_gemm]
    assert gemms == [op for op in gpt.layer_forward(plain) if isinstance(op, Op) and op.is_gemm]


def test_embedding_and_head_split_and_gather_the_sequence() -> None:
    plain, split = _shapes()
    assert ("all_gather", plain.activation_bytes) in _collectives(gpt.head_forward(split))
    assert ("reduce_scatter", plain.activation_bytes) in _collectives(gpt.head_backward(split, False))
    assert ("all_reduce", plain.activation_bytes) not in _collectives(gpt.head_backward(split, False))
    assert ("all_gather", plain.activation_bytes) in _collectives(gpt.embedding_backward(split, False))


def test_memory_and_transfers_shrink_and_the_iteration_is_faster() -> None:
    plain, split = _shapes()
    assert split.pipeline_bytes * 8 == plain.pipeline_bytes == plain.activation_bytes
    b, s, h, t = plain.b, plain.s, plain.h, plain.t
    assert layer_activation_bytes(split, "selective") == 34 * b * s * h // t  # Korthikanti et al., fp16
    assert layer_activation_bytes(split, "full") * t == layer_activation_bytes(plain, "full") == 2 * b * s * h
    config = load_run_config(MTNLG).with_overrides(recompute="selective")
    profile = load_profile(REPO / "profiles" / "a100")
    without, with_sp = simulate(config, profile), simulate(config.with_overrides(sequence_parallel=True), profile)
    assert with_sp.iteration_us < without.iteration_us
    assert with_sp.largest_stage_bytes < 0.7 * without.largest_stage_bytes
    assert with_sp.breakdown_us["tp"] == pytest.approx(without.breakdown_us["tp"], rel=0.05)  # AG + RS ~ AR


def test_sequence_parallelism_needs_megatron_and_a_divisible_sequence() -> None:
    config = load_run_config(MTNLG).with_overrides(sequence_parallel=True)
    assert config.constraint_errors() == []
    assert any("needs framework megatron" in e for e in replace(config, framework="reference").constraint_errors())
    odd = replace(config, model=replace(config.model, seq=2047))
    assert any("seq (2047) divisible by tp (8)" in e for e in odd.constraint_errors())


def test_a_measured_run_with_sequence_parallelism_is_simulated(tmp_path) -> None:
    """The measurement table's optional column: such rows used to be refused ("not modelled yet")."""
    from vtrain.importers.measurements import measurement_config, read_measurements, row_problem

    path = tmp_path / "published.csv"
    path.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms),"
                    "sequence parallelism,recomputation\n"
                    "64,64,1,12288,96,8,2048,8,1,8,1500,true,selective\n")
    row = read_measurements(path).row(0, named=True)
    assert row_problem(row) is None
    config = measurement_config(row)
    assert config.constraint_errors() == []
    assert (config.parallelism.sequence_parallel, config.parallelism.recompute) == (True, "selective")


def test_the_recorder_refuses_sequence_parallelism(tmp_path) -> None:
    from vtrain.record.launcher import check_recordable
    from vtrain.errors import InputError
    from vtrain.runconfig import run_config_from_dict

    config = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 64},
                                   "parallelism": {"tp": 2, "micro_batch": 1, "global_batch": 1,
                                                   "sequence_parallel": True},
                                   "framework": "megatron", "hardware": {"device": "cpu", "device_count": 2}})
    with pytest.raises(InputError, match="sequence_parallel is not recorded"):
        check_recordable(config, 1, 1, "cpu")


def test_predicted_traces_name_all_gathers_and_reduce_scatters_as_torch_does(tmp_path) -> None:
    """The predicted Chrome traces record each collective as torch does (``_allgather_base`` with the shard in
    and the whole out, NCCL's AllGather / ReduceScatter kernels), so that `vtrain ingest` reads them back as what
    they are: they were written as all-reduce kernels."""
    from vtrain.ingest.pipeline import ingest_traces
    from vtrain.runconfig import run_config_from_dict
    from vtrain.simulate.chrome_trace import write_chrome_traces

    config = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 512},
                                   "parallelism": {"tp": 4, "micro_batch": 1, "global_batch": 2,
                                                   "sequence_parallel": True},
                                   "framework": "megatron", "hardware": {"device": "A100", "device_count": 4}})
    write_chrome_traces(simulate(config), tmp_path / "traces")
    (tmp_path / "traces" / "run.yaml").unlink(missing_ok=True)
    collectives = ingest_traces(tmp_path / "traces").tables["collectives"]
    whole = 1 * 32 * 64 * 4  # one fp32 [b, s, h] activation
    found = [(row["collective"], row["bytes"]) for row in collectives.iter_rows(named=True)]
    assert {("all_gather", whole), ("reduce_scatter", whole)} <= set(found)
    assert found.count(("all_reduce", whole)) == 2  # the embedding's, once a micro-batch; no layer all-reduces
    events = json.loads(gzip.decompress((tmp_path / "traces" / "rank-0.json.gz").read_bytes()))["traceEvents"]
    kernels = {e["name"].split("(")[0] for e in events if e.get("cat") == "kernel" and "nccl" in e["name"]}
    assert {"ncclDevKernel_AllGather_RING_LL", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"} <= kernels
    gathers = [e["args"] for e in events if e.get("name") == "record_param_comms"
               and e["args"].get("Collective name") == "_allgather_base"]
    assert gathers and all(g["In msg nelems"] * 4 == g["Out msg nelems"] == whole // 4 for g in gathers)


def test_without_sequence_parallelism_megatron_scatters_the_pipeline_transfer_and_gathers_it() -> None:
    """Megatron's scatter-gather between stages (DeepSpeed's pipeline engine partitions alike): each of a stage's t
    ranks sends its 1/t of the activation through its share of the node's network, and the receiving ranks
    all-gather it over NVLink. Before, every rank of MT-NLG's t = 8 stages sent the whole 84 MB (its pipeline
    transfers: 582 ms of the iteration, now 143 ms); the reference model (vtrain record's) still sends it whole."""
    from vtrain.fit.device import device_for_run
    from vtrain.parallel import Layout
    from vtrain.simulate.run import resolve_work

    plain, split = _shapes()
    whole = plain.pipeline_bytes
    assert _collectives(gpt.pipeline_handoff(plain)) == [("send", whole // 8), ("all_gather", whole)]
    assert _collectives(gpt.pipeline_handoff(split)) == [("send", whole // 8)]
    assert _collectives(gpt.pipeline_handoff(replace(plain, framework="reference"))) == [("send", whole)]
    config = load_run_config(MTNLG)
    profile = load_profile(REPO / "profiles" / "a100")
    _, inputs, _, collectives = resolve_work(config, profile, device_for_run(config, profile))
    layout, world = Layout.of(config), config.hardware.device_count
    pair, apart = layout.group_stride("pp")
    send = collectives.resolve("send", pair, whole // 8, apart, world)
    gather = collectives.resolve("all_gather", 8, whole, 1, world)  # the stage's t = 8 ranks, adjacent
    assert inputs.pp_transfer.latency_us == pytest.approx(send.latency_us + gather.latency_us, rel=1e-12)
    assert "then all_gather" in inputs.pp_transfer.resolution.detail
    sent_whole = collectives.resolve("send", pair, whole, apart, world)
    assert inputs.pp_transfer.latency_us < 0.5 * sent_whole.latency_us
