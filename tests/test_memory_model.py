"""The memory model against memory measured by torch's allocator (CPU, profiler memory events) for the reference
model that `vtrain record` trains, and its micro-batches in flight against the schedules' own orders.

No GPU was lent while this was written: the measurements are the CPU allocator's (``torch.profiler`` with
``profile_memory=True``), which allocates exactly the tensors the model keeps (no caching allocator).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from vtrain.model.gpt import GptShape
from vtrain.model.memory import (
    head_activation_bytes,
    in_flight_micro_batches,
    attention_score_bytes,
    layer_activation_bytes,
    peak_stage_memory,
    stage_memory,
)
from vtrain.partition import partition
from vtrain.parallel import FORWARD, stage_order
from vtrain.record.model import Init, build_chunks
from vtrain.record.process_groups import TensorParallel
from vtrain.runconfig import RunConfig, run_config_from_dict

SHAPES = [  # layers, hidden, heads, seq, vocab, micro-batch
    (4, 256, 8, 256, 1024, 2),   # attention scores dominate the activations
    (2, 512, 8, 128, 2048, 4),   # hidden-sized tensors dominate
    (3, 384, 6, 64, 4096, 2),    # the head's vocabulary softmax is large
]


#: LLaMA-like layers: grouped-query attention (two query heads a key/value head), a gated MLP 8/3 as wide as hidden
LLAMA = {"kv_heads": 0, "mlp": "swiglu", "ffn_hidden": 0}


def _config(shape: tuple[int, ...], recompute: str, attention: str = "eager", model: dict | None = None,
            **parallelism: object) -> RunConfig:
    layers, hidden, heads, seq, vocab, micro_batch = shape
    extra = {} if model is None else {**model, "kv_heads": heads // 2, "ffn_hidden": 8 * hidden // 3}
    return run_config_from_dict({
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "seq": seq, "vocab": vocab, **extra},
        "parallelism": {"micro_batch": micro_batch, "global_batch": micro_batch, "recompute": recompute,
                        **parallelism},
        "precision": "fp32", "attention": attention})


def _live_bytes(prof: profile, tmp_path: Path) -> tuple[int, int]:
    """Peak and final bytes of the allocations made while profiling (each free paired with its allocation by
    address; blocks allocated before the profiler started are left out)."""
    path = tmp_path / "memory.json"
    prof.export_chrome_trace(str(path))
    events = sorted((e["ts"], e["args"]["Ev Idx"], e["args"]["Addr"], e["args"]["Bytes"])
                    for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "[memory]")
    live: dict[int, int] = {}
    total = peak = 0
    for _, _, address, nbytes in events:
        if nbytes > 0:
            live[address] = nbytes
            total += nbytes
        elif address in live:
            total -= live.pop(address)
        peak = max(peak, total)
    return peak, total


def _reference_model(config: RunConfig) -> torch.nn.Module:
    init = Init(1, TensorParallel(), torch.float32, torch.device("cpu"))
    return build_chunks(config, 0, init, recompute=config.parallelism.recompute == "full")[0]


def _batch(config: RunConfig) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    size = (config.parallelism.micro_batch, config.model.seq)
    return (torch.randint(0, config.model.vocab, size, generator=generator),
            torch.randint(0, config.model.vocab, size, generator=generator))


@pytest.mark.parametrize("layer", ["gpt", "llama"])
@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("shape", SHAPES)
def test_activations_kept_by_a_forward_pass_match_the_formula(shape: tuple[int, ...], recompute: str, attention: str,
                                                              layer: str, tmp_path: Path) -> None:
    """GPT-3's layers, and LLaMA-like ones (grouped-query attention, a gated MLP of its own width)."""
    config = _config(shape, recompute, attention, LLAMA if layer == "llama" else None)
    model = _reference_model(config)
    ids, labels = _batch(config)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = model(ids, labels)
    _, kept = _live_bytes(prof, tmp_path)
    gpt = GptShape.from_config(config)
    predicted = (config.model.layers * layer_activation_bytes(gpt, recompute)
                 + head_activation_bytes(gpt))
    assert loss.requires_grad
    assert kept == pytest.approx(predicted, rel=0.10)


@pytest.mark.parametrize("layer", ["gpt", "llama"])
@pytest.mark.parametrize("attention", ["eager", "flash"])
@pytest.mark.parametrize("recompute", ["none", "full"])
@pytest.mark.parametrize("shape", SHAPES)
def test_peak_of_training_steps_matches_the_model(shape: tuple[int, ...], recompute: str, attention: str, layer: str,
                                                  tmp_path: Path) -> None:
    """Model built, two Adam steps, gradients kept between steps (as Megatron's gradient buffer keeps them):
    the allocator's peak against parameters + gradients + Adam moments + activations, with the attention's scores
    in memory or flash attention's none; GPT-3's layers and LLaMA-like ones."""
    config = _config(shape, recompute, attention, LLAMA if layer == "llama" else None)
    ids, labels = _batch(config)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = _reference_model(config)
        optimizer = torch.optim.Adam(model.parameters())
        for _ in range(2):
            model(ids, labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    peak, _ = _live_bytes(prof, tmp_path)
    assert peak_stage_memory(config).total_bytes == pytest.approx(peak, rel=0.07)


def _walked_peak(schedule: str, p: int, m: int, stage: int, v: int) -> int:
    """The most forward passes whose backward has not run, walking the stage's order."""
    held = peak = 0
    for phase, _, _ in stage_order(schedule, p, m, stage, v):
        held += 1 if phase == FORWARD else -1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("schedule,p,m,v", [
    ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("gpipe", 3, 6, 1), ("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2),
    ("interleaved", 4, 4, 3), ("interleaved", 3, 9, 5)])
def test_micro_batches_in_flight_follow_the_schedule(schedule: str, p: int, m: int, v: int) -> None:
    config = run_config_from_dict({
        "model": {"layers": p * v * 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 128},
        "parallelism": {"pp": p, "micro_batch": 1, "global_batch": m, "schedule": schedule, "virtual_stages": v},
        "hardware": {"device_count": p}})
    for stage in range(p):
        assert in_flight_micro_batches(config, stage) == _walked_peak(schedule, p, m, stage, v)


def test_mixed_precision_keeps_16_bytes_per_parameter_and_half_the_activations() -> None:
    """Megatron's 16-bit runs keep fp32 master weights and moments (16 bytes a parameter), its fp16 runs copy the
    gradients to fp32 for the step (20 at its peak) and its bf16 runs accumulate them in fp32 (18), as Megatron-LM's
    own table counts (an audit found vtrain at 16 for both); the reference model's bf16 runs keep torch's Adam
    moments in bf16 (8 bytes); fp32 runs 16 bytes in both."""
    fp32 = _config(SHAPES[0], "none")
    fp16 = run_config_from_dict({**fp32.to_dict(), "precision": "fp16"})
    wide, half = peak_stage_memory(fp32), peak_stage_memory(fp16)
    params = wide.parameter_bytes // 4
    assert half.parameter_bytes + half.gradient_bytes + half.optimizer_bytes == 8 * params
    assert wide.parameter_bytes + wide.gradient_bytes + wide.optimizer_bytes == 16 * params
    untied = {**fp16.to_dict(), "model": {**fp16.to_dict()["model"], "tie_embeddings": False}}  # the same parameters
    megatron = peak_stage_memory(run_config_from_dict({**untied, "framework": "megatron"}))
    assert megatron.parameter_bytes + megatron.gradient_bytes + megatron.optimizer_bytes == 16 * params
    assert megatron.step_bytes == 4 * params  # the step's fp32 copies of the fp16 gradients
    bf16 = peak_stage_memory(run_config_from_dict({**untied, "framework": "megatron", "precision": "bf16"}))
    assert (bf16.parameter_bytes, bf16.gradient_bytes, bf16.step_bytes) == (2 * params, 4 * params, 0)
    softmax = GptShape.from_config(fp16).tokens * fp16.model.vocab * 4  # the head's softmax stays fp32, and the
    fp32 = 2 * softmax  # logits it is computed from are held beside it at the head's peak
    assert half.activation_bytes - fp32 == pytest.approx((wide.activation_bytes - fp32) / 2, rel=1e-6)


def test_pipeline_and_data_parallel_buffers() -> None:
    alone = peak_stage_memory(_config(SHAPES[1], "none"))
    parallel = peak_stage_memory(_config(SHAPES[1], "none", pp=2, dp=2, global_batch=8, dp_bucket_mb=25))
    gpt = GptShape.from_config(_config(SHAPES[1], "none"))
    assert alone.buffer_bytes == 0
    assert parallel.buffer_bytes == 4 * gpt.activation_bytes + 2 * 25 * 2**20


def test_selective_recomputation_keeps_all_but_the_attention_scores() -> None:
    """Korthikanti et al.: selective recomputation drops the attention scores (a·s²·b/t) from what a layer keeps
    and holds them again for the layer whose attention core is being re-run and backpropagated; full keeps the
    layer input only."""
    config = _config((3, 64, 4, 32, 64, 2), "none")
    shape = GptShape.from_config(config)
    none, selective, full = (layer_activation_bytes(shape, mode) for mode in ("none", "selective", "full"))
    scores = (shape.a // shape.t) * shape.b * shape.s * shape.s * shape.element_bytes  # no dropout: softmax only
    assert none - selective == scores == attention_score_bytes(shape)
    assert full == shape.b * shape.s * shape.h * shape.element_bytes
    chunks = partition(config)[0]
    memory = {mode: stage_memory(config.with_overrides(recompute=mode), shape, chunks).activation_bytes
              for mode in ("none", "selective", "full")}
    assert memory["full"] < memory["selective"] < memory["none"]
    layers = config.model.layers
    assert (layers - 1) * scores <= memory["none"] - memory["selective"] <= layers * scores


def test_a_megatron_layer_whose_softmax_is_pytorchs_keeps_it_in_fp32() -> None:
    """Where Megatron's fused softmax does not take the shape (16 heads over t = 8 at micro-batch 1: 2 score
    matrices), PyTorch's softmax runs in fp32 and its output, kept for the backward, is 4 bytes an element: the
    scores cost 4 + 2 + 1 bytes (softmax, dropout output, mask) where Korthikanti et al.'s fused kernel keeps
    2 + 2 + 1."""
    fused, torch_softmax = (GptShape(b=b, s=1024, h=1024, a=16, t=8, vocab=51200, dtype="c10::Half",
                                     device_type="cuda", framework="megatron") for b in (2, 1))
    assert attention_score_bytes(fused) == 2 * 16 // 8 * 1024 * 1024 * (2 + 2 + 1)
    assert attention_score_bytes(torch_softmax) == 16 // 8 * 1024 * 1024 * (4 + 2 + 1)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_megatron_layers_keep_what_korthikanti_et_al_count(t: int) -> None:
    """Their Table 2 (fp16, with dropout): sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht))
    with sequence parallelism too, 34·sbh/t with selective recomputation as well, 2·sbh with full recomputation."""
    s, b, h, a = 2048, 2, 4096, 32
    shape = GptShape(b=b, s=s, h=h, a=a, t=t, vocab=51200, dtype="c10::Half", device_type="cuda",
                     framework="megatron")
    split = replace(shape, sequence_parallel=t > 1)
    sbh = s * b * h
    assert layer_activation_bytes(shape, "none") == sbh * 10 + sbh * 24 // t + 5 * a * s * s * b // t
    assert layer_activation_bytes(shape, "full") == 2 * sbh
    if t > 1:
        assert layer_activation_bytes(split, "none") == sbh * 34 // t + 5 * a * s * s * b // t
        assert layer_activation_bytes(split, "selective") == sbh * 34 // t


@pytest.mark.parametrize("fused", [True, False])
def test_megatron_without_dropout_keeps_no_masks_and_runs_no_dropout(fused: bool) -> None:
    """LLaMA's recipes train Megatron with a dropout of 0 (``--attention-dropout 0 --hidden-dropout 0``; Hugging
    Face's ``attention_dropout: 0.0``), where PyTorch's dropout returns its input: no mask kept, no kernel run. The
    model had counted both for every Megatron run: llama-3-70b's first stage at t4 p8 held 3 GiB a layer and
    micro-batch of attention-dropout state it does not have (found by an audit). Korthikanti et al.'s count less
    the dropouts' rows: sbh(8 + 24/t + 2as/(ht)) in fp16."""
    from vtrain.architectures import architecture
    from vtrain.model import megatron

    s, b, h, a, t = 2048, 2, 4096, 32, 2
    shape = GptShape(b=b, s=s, h=h, a=a, t=t, vocab=51200, dtype="c10::Half", device_type="cuda",
                     framework="megatron", fused=fused, dropout=False)
    sbh = s * b * h
    if fused:
        assert layer_activation_bytes(shape, "none") == sbh * 8 + sbh * 24 // t + 2 * a * s * s * b // t
    steps = megatron.layer_forward(shape) + megatron.layer_backward(shape)
    names = {getattr(step, "name", "") for step in steps}
    assert not {name for name in names if "dropout" in name and "add" not in name}, names
    assert "aten::native_dropout" in {getattr(step, "name", "") for step in
                                      megatron.layer_forward(replace(shape, dropout=True))}
    llama = architecture("llama-3-70b").model
    assert llama.dropout is False
    config = run_config_from_dict({"model": {**llama.__dict__}, "framework": "megatron", "precision": "bf16",
                                   "parallelism": {"tp": 4, "pp": 8, "dp": 2, "micro_batch": 1, "global_batch": 128},
                                   "hardware": {"device": "H100", "device_count": 64}})
    assert GptShape.from_config(config).dropout is False


def test_the_peak_stage_is_found_where_uneven_stages_hold_more_layers_than_the_first() -> None:
    """BLOOM's split (5, then ten stages of 6, then 5) of 70 layers on 12 stages: the second stage keeps 11
    micro-batches of 6 layers in flight against the first's 12 of 5, and needs the most. Only the first and the last
    stage were looked at, so `plan` called the layout 24.06 GiB and fitting in 26.3 where `simulate` said stage 1
    needs 26.49 (an audit)."""
    config = run_config_from_dict({
        "model": {"layers": 70, "hidden": 1024, "heads": 16, "seq": 2048, "vocab": 1024},
        "parallelism": {"tp": 1, "pp": 12, "dp": 1, "micro_batch": 1, "global_batch": 64, "recompute": "none",
                        "stage_layers": [5, *[6] * 10, 5]},
        "precision": "bf16", "framework": "megatron",
        "hardware": {"device": "A100-80GB", "device_count": 12}})
    shape = GptShape.from_config(config)
    every = [stage_memory(config, shape, stage_chunks).total_bytes for stage_chunks in partition(config)]
    assert max(every) > every[0] and max(every) > every[-1]
    assert peak_stage_memory(config).total_bytes == max(every)
