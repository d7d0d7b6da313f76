"""The workload model: operator costs from signatures, the ops of a layer, partition and memory."""

from __future__ import annotations

import json
import math

from vtrain.fit.operators import kernel_shape
from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.model.memory import stage_memory, stage_parameters
from vtrain.model.ops import Collective, Op, make_op, op_cost
from vtrain.partition import partition
from vtrain.runconfig import run_config_from_dict


def test_gemm_flops_and_bytes() -> None:
    assert op_cost("aten::mm", [[256, 64], [64, 192]], ["float", "float"]) == (
        2 * 256 * 64 * 192, 4 * (256 * 64 + 64 * 192 + 256 * 64))
    flops, _ = op_cost("aten::addmm", [[192], [256, 64], [64, 192], [], []],
                       ["float", "float", "float", "Scalar", "Scalar"])
    assert flops == 2 * 256 * 64 * 192
    flops, _ = op_cost("aten::bmm", [[8, 128, 32], [8, 32, 128]], ["c10::Half", "c10::Half"])
    assert flops == 2 * 8 * 128 * 32 * 128


def test_memory_bound_bytes() -> None:
    _, nbytes = op_cost("aten::gelu", [[4, 128, 256], []], ["c10::BFloat16", ""])
    assert nbytes == 2 * 2 * 4 * 128 * 256  # read and write
    _, copy = op_cost("aten::copy_", [[64, 96], [64, 96], []], ["float", "float", "Scalar"])
    assert copy == 2 * 4 * 64 * 96  # the destination is written, not read
    _, cat = op_cost("aten::cat", [[[2, 4], [2, 4]], []], ["TensorList", "Scalar"])
    assert cat == 4 * (8 + 8) + 4 * 16


def test_masked_fill_reads_the_tensor_it_fills() -> None:
    """``masked_fill_`` keeps an element's value where the mask is false, so it reads its target as well as writing
    it; ``fill_`` only writes. Megatron-core's causal mask on the scores [4, 16, 2048, 2048] (bf16, the mask
    broadcast) took 718.6 us on the H200 where ``fill_`` of as many elements took 158.7 us
    (``traces/gpu/h200-mcore-gpt1.3b-none``, kernel medians). Counted write-only, ``profiles/h200`` modelled it at
    a fill's bytes."""
    scores, mask = [4, 16, 2048, 2048], [1, 1, 2048, 2048]
    _, masked = op_cost("aten::masked_fill_", [scores, mask, []], ["c10::BFloat16", "bool", "Scalar"])
    _, filled = op_cost("aten::fill_", [[4 * 16 * 2048 * 2048], []], ["c10::BFloat16", "Scalar"])
    assert filled == 2 * 4 * 16 * 2048 * 2048
    assert masked == 2 * filled + 2048 * 2048  # the scores read and written, the mask read


def test_make_op_serialises_like_the_profiler() -> None:
    op = make_op("aten::mm", [[256, 64], [64, 192]], ["float", "float"])
    assert op.input_dims == "[[256, 64], [64, 192]]" and op.input_types == '["float", "float"]'
    assert json.loads(op.input_dims) == [[256, 64], [64, 192]]


def shape(t: int = 2, device_type: str = "cuda", dtype: str = "c10::Half") -> GptShape:
    return GptShape(b=2, s=128, h=256, a=8, t=t, vocab=1000, dtype=dtype, device_type=device_type)


def collectives(steps: list) -> list[Collective]:
    return [s for s in steps if isinstance(s, Collective)]


def test_layer_has_two_tp_all_reduces_each_way_and_none_without_tp() -> None:
    for phase in (gpt.layer_forward(shape()), gpt.layer_backward(shape())):
        reduces = collectives(phase)
        assert [(c.purpose, c.op, c.bytes) for c in reduces] == [("tp", "all_reduce", 2 * 128 * 256 * 2)] * 2
    assert not collectives(gpt.layer_forward(shape(t=1))) and not collectives(gpt.layer_backward(shape(t=1)))


def test_layer_gemm_flops_match_the_closed_form() -> None:
    sh = shape()
    b, s, h, t = sh.b, sh.s, sh.h, sh.t
    forward = sum(op.flops for op in gpt.layer_forward(sh) if isinstance(op, Op))
    # QKV, attention output and the two MLP GEMMs: 24bsh^2/t; scores and context: 4bs^2h/t
    assert forward == 24 * b * s * h * h / t + 4 * b * s * s * h / t
    backward = sum(op.flops for op in gpt.layer_backward(sh) if isinstance(op, Op))
    assert backward == 2 * forward


def test_vocabulary_is_padded_only_when_not_divisible() -> None:
    assert shape(t=2).vocab_per_rank == 500
    assert GptShape(b=1, s=8, h=64, a=4, t=8, vocab=50257).vocab_per_rank == 51200 // 8  # Megatron: 128*t


def test_megatron_always_pads_the_vocabulary() -> None:
    """``--make-vocab-size-divisible-by 128`` (times t): GPT-2's 50,257 words are 50,304 rows at t = 1."""
    megatron = {t: GptShape(b=1, s=8, h=64, a=4, t=t, vocab=50257, framework="megatron").vocab_per_rank
                for t in (1, 2, 8)}
    assert megatron == {1: 50304, 2: 50432 // 2, 8: 51200 // 8}
    assert GptShape(b=1, s=8, h=64, a=4, t=1, vocab=50257).vocab_per_rank == 50257  # the reference model


def test_a_reduction_writes_its_output_not_its_input() -> None:
    """The cross-entropy's max and sum over a [tokens, vocabulary] fp32 tensor read it and write one value per
    token; ``aten::max`` of two tensors is element-wise."""
    n, v = 1024, 50304
    _, row_max = op_cost("aten::max", [[1, n, v], [], []], ["float", "Scalar", "Scalar"])
    assert row_max == 4 * n * v + 4 * n
    _, total = op_cost("aten::sum", [[n, v], [], [], []], ["float", "ScalarList", "Scalar", ""])
    assert total == 4 * n * v + 4 * n
    _, pairwise = op_cost("aten::max", [[n, v], [n, v]], ["float", "float"])
    assert pairwise == 3 * 4 * n * v


def test_a_gather_through_an_index_touches_the_indexed_elements() -> None:
    """``logits[rows, targets]`` reads one logit per token, not the [tokens, vocabulary] tensor it indexes: the
    kernel model sees those elements and bytes."""
    n, v = 1024, 50304
    gather = make_op("aten::index", [[n, v], []], ["float", ""], indexed=n)
    assert gather.elements == n and gather.bytes == n * (4 + 4 + 8)
    assert kernel_shape(gather).elements == n
    whole = make_op("aten::index", [[n, v], []], ["float", ""])
    assert whole.elements is None and kernel_shape(whole).elements == n * v
    head = [op for op in gpt.head_forward(GptShape(b=1, s=n, h=64, a=4, t=1, vocab=v, framework="megatron"))
            if isinstance(op, Op) and op.name == "aten::index"]
    assert [op.elements for op in head] == [n]


def test_cpu_addmm_copies_the_bias_and_the_head_runs_in_fp32() -> None:
    cpu = [op.name for op in gpt.layer_forward(shape(device_type="cpu")) if isinstance(op, Op)]
    gpu = [op.name for op in gpt.layer_forward(shape(device_type="cuda")) if isinstance(op, Op)]
    assert len(cpu) == len(gpu) + 2 and cpu.count("aten::copy_") == gpu.count("aten::copy_") + 2
    head = [op for op in gpt.head_forward(shape()) if isinstance(op, Op)]
    assert json.loads(head[2].input_types)[:2] == ["float", "c10::Half"]  # logits converted to fp32
    assert all(json.loads(op.input_types)[0] == "float" for op in head[3:] if op.name in ("aten::exp_", "aten::max"))


def config(**parallelism: object):
    par = {"tp": 2, "pp": 2, "dp": 1, "micro_batch": 2, "global_batch": 8, **parallelism}
    return run_config_from_dict({
        "model": {"layers": 8, "hidden": 256, "heads": 8, "seq": 128, "vocab": 1000},
        "parallelism": par, "precision": "bf16", "hardware": {"device": "H100", "device_count": 4}})


def test_partition_places_layers_embedding_and_head() -> None:
    chunks = partition(config(schedule="interleaved", virtual_stages=2))
    assert [[list(c.layer_ids) for c in stage] for stage in chunks] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert chunks[0][0].has_embedding and chunks[1][1].has_head
    assert sum(c.has_embedding + c.has_head for stage in chunks for c in stage) == 2


def test_parameters_sum_to_the_model_size_over_tensor_ranks() -> None:
    cfg = config(tp=1, pp=1)
    sh = GptShape.from_config(cfg)
    params = sum(math.prod(p) for p in stage_parameters(sh, partition(cfg)[0]))
    h, layers = 256, 8
    assert params == layers * (12 * h * h + 13 * h) + 2 * 1000 * h + 128 * h + 2 * h


def test_recomputation_shrinks_activation_memory() -> None:
    full = config(recompute="none")
    sh = GptShape.from_config(full)
    kept = stage_memory(full, sh, partition(full)[0])
    recomputed = stage_memory(config(recompute="full"), sh, partition(full)[0])
    assert recomputed.activation_bytes < kept.activation_bytes
    assert kept.in_flight == 2  # 1F1B: stage 0 of 2 holds two micro-batches
    assert kept.optimizer_bytes == 2 * kept.parameter_bytes  # the reference model's bf16: two bf16 Adam moments


def test_optimizer_updates_every_parameter() -> None:
    cpu, cuda = shape(device_type="cpu"), shape(device_type="cuda")
    params = gpt.layer_parameters(cpu)
    loop = [op for op in gpt.optimizer_step(cpu, params) if isinstance(op, Op)]
    assert [json.loads(op.input_dims)[0] for op in loop if op.name == "aten::lerp_"] == [list(p) for p in params]
    assert len(loop) == 7 * len(params)  # Adam's per-tensor loop on CPU tensors
    foreach = [op for op in gpt.optimizer_step(cuda, params) if isinstance(op, Op)]
    assert len(foreach) == 7 and json.loads(foreach[0].input_dims)[0] == [list(p) for p in params]


def test_an_ops_dtype_is_its_first_tensors_wherever_it_is_read() -> None:
    """One reading of a signature's dtype for ingest, the device models and the kernel fits (there were two: the
    model's took the first quoted name, so a scalar first input made an op's dtype ``Scalar``, and its elements 2
    bytes in the fitted memory-bound model whatever its tensors held)."""
    from vtrain.kineto import first_dtype

    assert first_dtype('["Scalar", "c10::BFloat16", "c10::BFloat16"]') == "c10::BFloat16"
    assert first_dtype('["TensorList", "", "float"]') == "float"
    assert first_dtype("[]", "float") == "float" and first_dtype("[]") is None
    assert first_dtype("not json", "float") == "float" and first_dtype('{"float": 1}') is None
    assert first_dtype(None, "float") == "float"


def test_megatron_fuses_the_softmax_only_where_its_kernel_takes_the_shape() -> None:
    """Megatron's ``FusedScaleMaskSoftmax.is_kernel_available``: half precision, 16 < s <= 4,096, and the rank's
    score matrices (micro-batch x heads per rank) a multiple of 4 (of 8 up to s = 128). vTrain's single-node runs
    have 16 heads: at t = 8 and micro-batch 1 that is 2 matrices, and Megatron runs PyTorch's softmax in fp32 (five
    operators each way, where the fused kernel is one); their prediction was 30 % fast there."""
    from vtrain.model import megatron

    def names(b: int, t: int, s: int = 1024, dtype: str = "c10::Half") -> tuple[list[str], list[str]]:
        layer = GptShape(b=b, s=s, h=1024, a=16, t=t, vocab=50257, dtype=dtype, device_type="cuda",
                         framework="megatron")
        forward = [step.name for step in megatron.attention_core(layer) if isinstance(step, Op)]
        backward = [step.name for step in megatron.layer_backward(layer) if isinstance(step, Op)]
        return forward, backward

    fused = "megatron::scaled_upper_triang_masked_softmax"
    for b, t, s in ((1, 4, 1024), (2, 8, 1024), (4, 8, 1024), (1, 1, 1024), (2, 4, 64)):
        forward, backward = names(b, t, s)
        assert fused in forward and f"{fused}_backward" in backward and "aten::_softmax" not in forward
    for b, t, s, dtype in ((1, 8, 1024, "c10::Half"), (3, 8, 1024, "c10::BFloat16"), (1, 1, 8192, "c10::Half"),
                           (1, 2, 16, "c10::Half"), (1, 4, 64, "c10::Half"), (1, 1, 1024, "float")):
        forward, backward = names(b, t, s, dtype)
        assert fused not in " ".join(forward + backward), (b, t, s, dtype)
        assert {"aten::_softmax", "aten::masked_fill_"} <= set(forward)
        assert "aten::_softmax_backward_data" in backward
    forward, backward = names(1, 8)
    assert forward.count("aten::copy_") == 2 and len(forward) == 2 + 5 + 1  # scores, softmax's five, dropout, bmm
    assert len(names(1, 1, dtype="float")[0]) == 2 + 3 + 1  # fp32 scores: no conversions
