"""LLaMA-like layers: grouped-query attention (``kv_heads``), a gated MLP (``mlp: swiglu``) and a feed-forward width
of its own (``ffn_hidden``), in the recorder, the workload model, the FLOPs, the checks of a run config and the
commands that take a model.

The recordings are real: `vtrain record` trains such a model on CPU with tensor and pipeline parallelism (eager
and fused attention); ingest builds their profile and the model must place the operators torch recorded. The
memory model is measured against torch's allocator in ``tests/test_memory_model.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import vtrain_in_process
from vtrain.devices.catalog import device_model
from vtrain.errors import InputError
from vtrain.flops import LayerShape, layer_gemm_flops, model_flops, model_flops_per_iteration
from vtrain.ingest.pipeline import ingest_traces
from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.model.memory import (
    mlp_kept_elements,
    model_parameter_count,
    peak_stage_memory,
    qkv_kept_elements,
    stage_parameter_count,
)
from vtrain.model.ops import Collective, Op
from vtrain.parallel import Layout
from vtrain.partition import partition
from vtrain.record.launcher import record
from vtrain.runconfig import (
    HardwareConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    load_run_config,
    run_config_from_dict,
    save_run_config,
)
from vtrain.simulate import MEASURED, simulate
from vtrain.simulate.latency import OpLatencyResolver
from vtrain.simulate.run import resolve_work

#: two query heads a key/value head, an MLP 3/2 as wide as hidden
MODEL = ModelConfig(layers=4, hidden=64, heads=4, seq=32, vocab=512, ffn_hidden=96, kv_heads=2, mlp="swiglu")
SPLIT = ParallelConfig(tp=2, pp=2, micro_batch=2, global_batch=8)


@pytest.fixture(scope="module", params=["eager", "flash"])
def recording(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("llama") / "run"
    result = record(RunConfig(model=MODEL, parallelism=SPLIT, attention=request.param), folder, steps=2, warmup=1,
                    seed=7, device="cpu")
    return result, load_run_config(folder / "run.yaml"), ingest_traces(folder), folder


def test_a_split_trains_to_the_single_rank_loss(recording, tmp_path) -> None:
    """Each rank's shards of the grouped QKV projection and of the gate and up projections are the whole model's:
    tp 2 x pp 2 trains to the loss of one rank (and fused attention to the eager one's)."""
    result, config, _, _ = recording
    assert config.model == MODEL  # run.yaml says what ran
    single = record(RunConfig(model=MODEL, parallelism=replace(SPLIT, tp=1, pp=1)), tmp_path / "one", steps=2,
                    warmup=1, seed=7, device="cpu")
    assert result.losses == pytest.approx(single.losses, rel=1e-5)


def test_the_layer_ops_are_measured_exactly(recording) -> None:
    _, config, profile, _ = recording
    shape = GptShape.from_config(config)
    resolver = OpLatencyResolver(profile, simulate(config).device, "cpu")
    nested = {s.signature for s in gpt._bias_copy(shape, shape.tokens, shape.qkv_width)
              + gpt._bias_copy(shape, shape.tokens, shape.fc1_width)}  # see tests/test_model_signatures.py
    for steps in (gpt.layer_forward(shape), gpt.layer_backward(shape, False), gpt.layer_backward(shape, True)):
        missing = [(op.name, op.input_dims) for op in steps if isinstance(op, Op)
                   and resolver.resolve(op).source != MEASURED and op.signature not in nested]
        assert len(missing) <= 1, missing
    names = {op.name for op in gpt.layer_forward(shape) + gpt.layer_backward(shape) if isinstance(op, Op)}
    assert {"aten::silu", "aten::silu_backward"} <= names and "aten::gelu" not in names
    assert simulate(config, profile).coverage_share[MEASURED] >= 0.95


def test_validate_pairs_every_attention_operator(recording, tmp_path) -> None:
    """The model side of validate finds each measured attention operator among the predicted ones (a fused one
    is recorded with arguments the model leaves out: before, both sides listed it as found on one side only). The
    eager core's operators are GEMMs and the softmax, not this class: nothing to pair there."""
    _, config, _, folder = recording
    ran = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    model = json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]
    classes = {row["op_class"] for row in model["classes"]}
    assert ("attention" in classes) == (config.attention == "flash")
    if config.attention != "flash":
        return
    unpaired = [row for row in model["one_side_only"] if row["op_class"] == "attention"]
    assert not [row for row in unpaired if row["side"] == "measured only"], unpaired
    # a CPU operator whose children take most of its time counts as theirs (the work-op rule): a few backward calls
    measured = next(row["ops"] for row in model["classes"] if row["op_class"] == "attention")
    assert sum(row["calls"] for row in unpaired) <= 0.1 * measured, unpaired


def test_the_flops_are_those_of_the_gemms_the_model_places() -> None:
    """The FLOPs count of a LLaMA-like layer (MFU's numerator) against the FLOPs of the GEMMs the workload model
    places, all tensor-parallel ranks together; GPT-3's layer is Narayanan et al.'s 24·s·h²."""
    config = RunConfig(model=MODEL, parallelism=ParallelConfig(tp=2, micro_batch=1, global_batch=1),
                       hardware=replace(RunConfig(model=MODEL).hardware, device_count=2))
    shape = GptShape.from_config(config)
    placed = sum(op.flops for op in gpt.layer_forward(shape)
                 if isinstance(op, Op) and op.name in ("aten::mm", "aten::addmm")) * shape.t
    layer = LayerShape.of(MODEL)
    assert placed == pytest.approx(layer_gemm_flops(MODEL.seq, MODEL.hidden, layer))
    s, h = 2048, 4096
    assert layer_gemm_flops(s, h) == 24 * s * h * h
    fused = replace(shape, attention="flash")  # grouped keys and values: the queries' heads set the GEMMs
    for made in (gpt.flash_attention, gpt.flash_attention_backward):
        assert made(fused).flops == made(replace(fused, kv_heads=None)).flops > 0
    assert model_flops_per_iteration(config.model, 8) == pytest.approx(model_flops(8, 32, 4, 64, 512, layer))


def _model(**fields: object) -> dict:
    return {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, **fields}, "parallelism": {"tp": 2},
            "hardware": {"device_count": 2}}


@pytest.mark.parametrize("fields,problem", [
    ({"kv_heads": 3}, "heads (4) is not divisible by kv_heads (3)"),
    ({"kv_heads": 1}, "kv_heads (1) is not divisible by tp (2)"),
    ({"ffn_hidden": 97}, "ffn_hidden (97) is not divisible by tp (2)"),
    ({"mlp": "relu"}, "mlp must be one of gelu, swiglu (got 'relu')"),
])
def test_models_that_cannot_run_are_refused(fields: dict, problem: str) -> None:
    errors = run_config_from_dict(_model(**fields), "run.yaml").constraint_errors()
    assert any(problem in error for error in errors), errors


@pytest.mark.parametrize("fields,problem", [
    ({"mlp": 3}, "mlp must be a string"),
    ({"kv_heads": 0}, "kv_heads must be between 1"),
    ({"ffn_hidden": 2.5}, "ffn_hidden must be a whole number"),
])
def test_fields_of_the_wrong_kind_are_refused(fields: dict, problem: str) -> None:
    with pytest.raises(InputError, match=re.escape(problem)):
        run_config_from_dict(_model(**fields), "run.yaml")


@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_megatron_places_them_with_megatron_lms_kernels(attention: str) -> None:
    """``framework: megatron``: Megatron-LM's fused bias + SwiGLU, the grouped QKV projection and, in the eager
    core, the keys and values repeated for their queries; the GEMMs those of the layer's FLOPs count, and a layer
    keeps fc1's output and fc2's input (the fused kernel recomputes the SiLU)."""
    config = RunConfig(model=MODEL, parallelism=ParallelConfig(tp=2, micro_batch=1, global_batch=1),
                       precision="bf16", framework="megatron", attention=attention,
                       hardware=replace(RunConfig(model=MODEL).hardware, device="H100", device_count=2))
    assert not config.constraint_errors()
    shape = GptShape.from_config(config)
    forward, backward = gpt.layer_forward(shape), gpt.layer_backward(shape)
    names = [op.name for op in forward + backward if isinstance(op, Op)]
    assert "megatron::bias_swiglu" in names and "megatron::bias_swiglu_backward" in names
    assert "megatron::bias_gelu" not in names
    repeats = [op for op in forward if isinstance(op, Op) and op.name == "aten::copy_"
               and len(json.loads(op.input_dims)[0]) == 4]
    assert len(repeats) == (2 if attention == "eager" else 0)
    placed = sum(op.flops for op in forward if isinstance(op, Op) and op.name in ("aten::mm", "aten::addmm"))
    layer = LayerShape.of(MODEL)
    assert placed * shape.t == pytest.approx(layer_gemm_flops(MODEL.seq, MODEL.hidden, layer))
    reference = GptShape.from_config(replace(config, framework="reference"))
    assert mlp_kept_elements(shape) == 3 * shape.tokens * shape.ffn
    assert mlp_kept_elements(reference) == 4 * shape.tokens * shape.ffn


def test_a_config_says_swiglu_in_any_case_and_the_shape_in_words() -> None:
    config = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "mlp": " SwiGLU"}})
    assert config.model.mlp == "swiglu"
    assert MODEL.describe() == "4 layers, hidden 64, 4 heads (2 key/value), seq 32, vocab 512, SwiGLU MLP 96 wide"
    assert replace(MODEL, ffn_hidden=None, kv_heads=None, mlp="gelu").describe() == \
        "4 layers, hidden 64, 4 heads, seq 32, vocab 512"


def test_plan_takes_the_shape(tmp_path) -> None:
    """`vtrain plan --kv-heads --ffn-hidden --mlp`: a LLaMA-2-7B-like model; grouped-query attention holds less,
    and the plans' MFU counts the gated MLP's three GEMMs."""
    shape = ["--layers", "8", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--vocab", "32000",
             "--ffn-hidden", "11008", "--mlp", "swiglu", "--global-batch", "64", "--gpus", "8",
             "--device", "A100-80GB", "--price-per-gpu-hour", "2", "--json"]
    runs = {}
    for name, extra in (("mha", []), ("gqa", ["--kv-heads", "8"])):
        ran = vtrain_in_process("plan", *shape, *extra, "-o", tmp_path / name)
        assert ran.returncode == 0, ran.stderr
        runs[name] = json.loads(ran.stdout)
    best = {name: run["frontier"][0] for name, run in runs.items()}
    assert 0 < best["gqa"]["mfu"] < 1
    mha = run_config_from_dict({"model": {"layers": 8, "hidden": 4096, "heads": 32, "seq": 4096, "vocab": 32000,
                                          "ffn_hidden": 11008, "mlp": "swiglu"}, "precision": "fp16",
                                "parallelism": {"global_batch": 8}})
    gqa = replace(mha, model=replace(mha.model, kv_heads=8))
    assert peak_stage_memory(gqa).parameter_bytes < peak_stage_memory(mha).parameter_bytes
    assert "32 heads (8 key/value)" in (tmp_path / "gqa" / "report.md").read_text()
    assert runs["gqa"]["framework"] == "megatron"  # a model given by its shape trains with Megatron's states
    reference = vtrain_in_process("plan", *shape, "--kv-heads", "8", "--framework", "reference", "-o",
                                  tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    assert json.loads(reference.stdout)["framework"] == "reference"
    bf16 = vtrain_in_process("plan", *shape, "--kv-heads", "8", "--precision", "BF16", "-o", tmp_path / "bf16")
    assert bf16.returncode == 0 and json.loads(bf16.stdout)["precision"] == "bf16", bf16.stderr
    fp8 = vtrain_in_process("plan", *shape, "--precision", "fp8", "-o", tmp_path / "fp8")
    assert fp8.returncode == 2 and "precision must be one of fp32, fp16, bf16 (got 'fp8')" in fp8.stderr
    # torch's Adam on 16-bit parameters keeps 8 bytes a parameter, Megatron's mixed precision 16 (fp16)
    key = ["tp", "pp", "dp", "micro_batch", "schedule", "virtual_stages", "recompute", "dp_overlap"]
    plans = {name: pl.read_parquet(tmp_path / name / "plans.parquet").filter(
        ~pl.col("sequence_parallel") & ~pl.col("distributed_optimizer")).select(*key, "memory_gib")
        for name in ("gqa", "reference")}
    both = plans["gqa"].join(plans["reference"], on=key, suffix="_reference")
    assert both.height > 100 and (both["memory_gib_reference"] < both["memory_gib"]).all()
    bad = vtrain_in_process("plan", *shape, "--mlp", "relu", "-o", tmp_path / "bad")
    assert bad.returncode == 2 and "relu" in bad.stderr
    unplannable = vtrain_in_process("plan", *shape, "--kv-heads", "3", "-o", tmp_path / "unplannable")
    assert unplannable.returncode == 2 and not (tmp_path / "unplannable").exists()
    assert unplannable.stderr.strip() == ("error: no plan can train this model: heads (32) is not divisible by "
                                          "kv_heads (3)")  # before: 'N plans: N invalid', exit 0


def test_simulate_says_the_model_it_simulated(tmp_path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(json.dumps({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 512,
                                         "kv_heads": 2, "ffn_hidden": 96, "mlp": "swiglu"}}))
    text = vtrain_in_process("simulate", run)
    assert text.returncode == 0, text.stderr
    assert "model            2 layers, hidden 64, 4 heads (2 key/value), seq 32, vocab 512, SwiGLU MLP 96 wide; " \
           "fp32, the reference model's kernels" in text.stdout.splitlines()
    summary = json.loads(vtrain_in_process("simulate", run, "--json").stdout)
    model = summary["model"]
    assert (model["kv_heads"], model["ffn"], model["mlp"]) == (2, 96, "swiglu")
    assert summary["precision"] == "fp32"  # said nowhere before (an audit: a name and a config.json of one model
    # differ by it alone)


#: the keys of a Hugging Face LLaMA-3-8B config.json (as the model's repository holds it), a smaller model's values
HF_LLAMA = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu", "hidden_size": 512,
            "intermediate_size": 1792, "max_position_embeddings": 1024, "model_type": "llama",
            "num_attention_heads": 8, "num_hidden_layers": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 8192}


#: models as their Hugging Face config.json give them, and the parameters their published weights hold (the
#: safetensors index's total size over two bytes a bf16 parameter)
PUBLISHED_PARAMETERS = {
    "Llama-2-7b": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
                    "max_position_embeddings": 4096, "vocab_size": 32000}, 6_738_415_616),
    "Meta-Llama-3-8B": ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                         "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                         "max_position_embeddings": 8192, "vocab_size": 128256}, 8_030_261_248),
    "Qwen2-7B": ({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
                  "num_hidden_layers": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
                  "vocab_size": 152064}, 7_615_616_512),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMETERS))
def test_a_llama_layer_holds_the_parameters_its_published_weights_do(name) -> None:
    """RMSNorm (a weight, no bias), rotary positions (no position embedding) and linear layers without biases (but
    Qwen2's QKV projection): the parameters counted (memory, optimizer states, gradient buckets) are the published
    model's to the parameter. Placed as GPT's layer they were 18 M (LLaMA 2 7B) to 119 M (Qwen2 7B) too many."""
    data, published = PUBLISHED_PARAMETERS[name]
    with pytest.warns(UserWarning, match="Hugging Face"):
        config = run_config_from_dict(data, f"{name}/config.json")
    assert model_parameter_count(config.model) == published


def test_tied_embeddings_are_one_matrix_and_their_gradients_are_summed_over_the_pipeline(tmp_path) -> None:
    """Megatron ties GPT's output projection to its word embedding (``tie_embeddings``, by default under framework
    megatron): where one stage holds both it is one matrix (GPT-3 1.3B's parameters as Narayanan et al. count
    them; fewer optimizer states, a shorter optimizer step), and where the pipeline splits them the first and the
    last stage all-reduce its gradients before the step. LLaMA's own projection (``tie_word_embeddings: false``)
    stays; the reference model (`vtrain record`'s) has its own head and refuses a tie in one line."""
    model = ModelConfig(layers=24, hidden=2048, heads=16, seq=2048, vocab=51200)
    gpt3_xl = RunConfig(model=model, parallelism=ParallelConfig(global_batch=8), precision="fp16",
                        framework="megatron", hardware=HardwareConfig(device="A100", device_count=1))
    untied = replace(gpt3_xl, model=replace(model, tie_embeddings=False))
    shape = GptShape.from_config(gpt3_xl)
    [chunks] = partition(gpt3_xl)
    l, h, v, s = 24, 2048, 51200, 2048
    assert stage_parameter_count(shape, chunks) == 12 * l * h * h + 13 * l * h + (v + s) * h + 2 * h
    assert stage_parameter_count(GptShape.from_config(untied), partition(untied)[0]) - \
        stage_parameter_count(shape, chunks) == v * h
    tied_run, untied_run = simulate(gpt3_xl), simulate(untied)
    assert tied_run.breakdown_us["optimizer"] < untied_run.breakdown_us["optimizer"]
    assert tied_run.largest_stage_bytes < untied_run.largest_stage_bytes
    split = replace(gpt3_xl, parallelism=ParallelConfig(pp=2, dp=2, global_batch=8),
                    hardware=HardwareConfig(device="A100", device_count=4))
    _, inputs, _, _ = resolve_work(split, None, device_model("A100"))
    for stage in range(2):
        [step, *_] = [resolved.step for resolved in inputs.optimizer[stage].blocks[0].steps]
        assert isinstance(step, Collective) and (step.purpose, step.op, step.bytes) == ("embedding", "all_reduce",
                                                                                       v * h * 2)  # fp16 grads
    assert Layout.of(split).group_stride("embedding") == (2, 2)
    with pytest.warns(UserWarning):
        llama = run_config_from_dict(PUBLISHED_PARAMETERS["Llama-2-7b"][0])
    assert llama.model.tie_embeddings is False and not llama.ties_embeddings
    path = tmp_path / "run.yaml"
    save_run_config(replace(gpt3_xl, framework="reference", model=replace(model, tie_embeddings=True)), path)
    ran = vtrain_in_process("simulate", path)
    assert ran.returncode == 2 and "tie_embeddings is Megatron's" in ran.stderr and len(ran.stderr.splitlines()) == 1


def test_megatron_places_rmsnorm_rotary_positions_and_layers_without_biases(tmp_path) -> None:
    """With ``norm: rmsnorm``, ``position: rope`` and ``bias: false`` Megatron's layer runs the fused RMSNorm, rotates
    its queries and keys (a kernel each way for each), has no QKV ``addmm``, no bias gradients and no position
    embedding, and keeps the rotated queries and keys; Qwen2's QKV bias stays. The reference model (what `vtrain
    record` trains) has GPT's layer: such a model with ``framework: reference`` is one line, exit 2."""
    model = ModelConfig(layers=2, hidden=256, heads=8, seq=128, vocab=1024, kv_heads=2, ffn_hidden=704,
                        mlp="swiglu", norm="RMSNorm", position="RoPE", bias=False)
    config = RunConfig(model=model, parallelism=ParallelConfig(tp=2, global_batch=4), precision="bf16",
                       framework="megatron", attention="flash", hardware=HardwareConfig(device="A100",
                                                                                         device_count=2))
    shape = GptShape.from_config(config.validate())
    names = {"forward": [op.name for op in gpt.layer_forward(shape) if isinstance(op, Op)],
             "backward": [op.name for op in gpt.layer_backward(shape) if isinstance(op, Op)],
             "embedding": [op.name for op in gpt.embedding_forward(shape) if isinstance(op, Op)]}
    assert names["forward"].count("apex::fused_rms_norm") == 2 and "apex::fused_layer_norm" not in names["forward"]
    assert names["forward"].count("megatron::fused_rope") == 2
    assert names["backward"].count("megatron::fused_rope_backward") == 2
    assert "aten::addmm" not in names["forward"] and "megatron::swiglu" in names["forward"]
    assert "aten::sum" not in names["backward"]  # no bias gradients (nor eager attention's key/value sums)
    assert names["embedding"].count("aten::embedding") == 1  # the words only
    qwen = replace(shape, qkv_bias=True)
    assert "aten::addmm" in [op.name for op in gpt.layer_forward(qwen) if isinstance(op, Op)]
    assert [op.name for op in gpt.layer_backward(qwen) if isinstance(op, Op)].count("aten::sum") == 1
    rotated = shape.tokens * (shape.a // shape.t + shape.kv_per_rank) * shape.d
    assert qkv_kept_elements(shape) == qkv_kept_elements(replace(shape, position="learned")) + rotated
    assert "RMSNorm, rotary positions, no biases" in model.describe()
    path = tmp_path / "run.yaml"
    save_run_config(replace(config, framework="reference"), path)
    ran = vtrain_in_process("simulate", path)
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 2 and len(lines) == 1 and "framework megatron" in lines[0], ran.stderr
    planned = vtrain_in_process("plan", "--layers", "2", "--hidden", "256", "--heads", "8", "--kv-heads", "2",
                                "--ffn-hidden", "704", "--mlp", "swiglu", "--norm", "rmsnorm", "--position", "rope",
                                "--no-bias", "--untie-embeddings", "--seq", "128", "--vocab", "1024", "--global-batch",
                                "4", "--gpus", "2", "--attention", "flash", "--precision", "bf16", "--json", "-o",
                                tmp_path / "plan")
    assert planned.returncode == 0, planned.stderr
    assert "RMSNorm, rotary positions, no biases" in json.loads(planned.stdout)["model"]
    with_config = vtrain_in_process("plan", path, "--untie-embeddings", "--gpus", "2", "-o", tmp_path / "refused")
    assert with_config.returncode == 2 and "--untie-embeddings" in with_config.stderr


def test_a_stretched_context_is_planned_at_the_pretraining_length_or_at_seq(tmp_path) -> None:
    """LLaMA 3.1's config.json says 131,072 positions (its rotary embeddings stretched after pretraining) and keeps the
    8,192 it was pretrained at under ``rope_scaling``: a plan at 131,072 tokens a sequence was every user's surprise
    (a 8B model at 660 s an iteration). It is read at 8,192, the warning naming the key; ``--seq`` trains any run
    config's model at another length, in ``plan`` and ``simulate``; the model's other flags still refuse a config."""
    stretched = {**HF_LLAMA, "max_position_embeddings": 131072,
                 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 512, "rope_type": "llama3"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(stretched))
    with pytest.warns(UserWarning, match=r"sequence 512 \(rope_scaling.original_max_position_embeddings"):
        assert load_run_config(path).model.seq == 512
    phi3 = tmp_path / "phi3.json"  # Phi-3's long-context configs keep it at the top level
    phi3.write_text(json.dumps({**HF_LLAMA, "model_type": "phi3", "max_position_embeddings": 131072,
                                "original_max_position_embeddings": 256, "rope_scaling": {"type": "longrope"}}))
    with pytest.warns(UserWarning, match=r"phi3 config: sequence 256 \(original_max_position_embeddings"):
        assert load_run_config(phi3).model.seq == 256
    mistral = tmp_path / "mistral.json"
    mistral.write_text(json.dumps({**HF_LLAMA, "model_type": "mistral", "sliding_window": 256}))
    with pytest.warns(UserWarning, match=r"sliding-window attention \(256 tokens\) is placed as attention over the "
                                         r"whole sequence; sequence 1024 \(max_position_embeddings"):
        load_run_config(mistral)
    qwen2 = tmp_path / "qwen2.json"  # a window it does not use: nothing said of it
    qwen2.write_text(json.dumps({**HF_LLAMA, "model_type": "qwen2", "sliding_window": 256,
                                 "use_sliding_window": False}))
    with pytest.warns(UserWarning) as said:
        load_run_config(qwen2)
    assert "sliding" not in str(said[0].message)
    common = ("--gpus", "4", "--global-batch", "16", "--device", "A100-80GB", "--price-per-gpu-hour", "2", "--json")
    at = {}
    for seq in (None, "256"):
        planned = vtrain_in_process("plan", path, *common, "-o", tmp_path / f"plan-{seq}",
                                    *(("--seq", seq) if seq else ()))
        assert planned.returncode == 0, planned.stderr
        at[seq] = pl.read_csv(tmp_path / f"plan-{seq}" / "plans.csv").filter(pl.col("fits"))["iteration_ms"].min()
    assert at["256"] < 0.7 * at[None]  # half the tokens: less than 70 % of the time (attention's share halves too)
    simulated = vtrain_in_process("simulate", "examples/mtnlg-530b.json", "--seq", "1024", "--json")
    assert simulated.returncode == 0, simulated.stderr
    assert json.loads(simulated.stdout)["model"]["seq"] == 1024
    both = vtrain_in_process("plan", path, *common, "--layers", "2", "-o", tmp_path / "refused")
    assert both.returncode == 2 and "not both" in both.stderr and "--layers" in both.stderr
    assert "--seq" not in both.stderr


@pytest.mark.parametrize(("data", "model", "said"), [
    ({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "n_inner": 100,
      "activation_function": "relu"}, {"ffn_hidden": 100}, "its MLP's 'relu' is placed as GELU (the same GEMMs)"),
    ({**HF_LLAMA, "hidden_act": "gelu_pytorch_tanh"}, {}, "its MLP's 'gelu_pytorch_tanh' is placed as SiLU"),
    ({**HF_LLAMA, "mlp_bias": True}, {"bias": False}, "its MLP's biases (mlp_bias) are placed as none")],
    ids=["gpt2-inner-relu", "llama-gelu", "llama-mlp-bias"])
def test_what_a_hugging_face_config_says_of_its_mlp_is_read_or_said(data: dict, model: dict, said: str,
                                                                    tmp_path) -> None:
    """GPT-2's ``n_inner`` (its MLP's width) was ignored for 4 x hidden, and an activation other than the MLP's
    own (GPT-2's ReLU, a LLaMA's GELU) and LLaMA's MLP biases without the attention's were placed otherwise without
    a word (an audit). The width is read; the others are said."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.warns(UserWarning, match=re.escape(said)):
        config = load_run_config(path)
    for key, value in model.items():
        assert getattr(config.model, key) == value


def test_a_hugging_face_config_is_a_model_to_plan(tmp_path) -> None:
    """A model's ``config.json`` as Hugging Face ships it: its layer (grouped-query attention, SwiGLU and its width,
    RMSNorm, rotary positions, no biases, no dropout), bf16, Megatron's kernels, its context as the sequence; what
    vtrain assumes said; a plan of it has no reference plan of its own. A mixture of experts, or a model_type vtrain
    does not place, is one line, exit 2."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(HF_LLAMA))
    with pytest.warns(UserWarning, match="Hugging Face llama config: sequence 1024"):
        config = load_run_config(path)
    assert config.model == ModelConfig(layers=4, hidden=512, heads=8, seq=1024, vocab=8192, ffn_hidden=1792,
                                       kv_heads=2, mlp="swiglu", norm="rmsnorm", position="rope", bias=False,
                                       qkv_bias=False, tie_embeddings=False, dropout=False)
    assert (config.precision, config.framework) == ("bf16", "megatron")
    planned = vtrain_in_process("plan", path, "--gpus", "4", "--global-batch", "16", "--device", "A100-80GB",
                                "--price-per-gpu-hour", "2", "-o", tmp_path / "plan", "--json")
    assert planned.returncode == 0, planned.stderr
    summary = json.loads(planned.stdout)
    assert summary["reference"] is None and summary["simulated"] > 0
    folder = tmp_path / "Meta-Llama-3-8B"  # the model's folder, as downloaded: its config.json is read
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_LLAMA))
    with pytest.warns(UserWarning, match="Hugging Face llama config"):
        assert load_run_config(folder) == config
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                                "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new"}))
    with pytest.warns(UserWarning, match=r"gpt2 config: sequence 1024 \(n_positions; --seq trains at another "
                                         r"length\), bf16"):
        assert load_run_config(gpt2).model == ModelConfig(layers=12, hidden=768, heads=12, seq=1024, vocab=50257,
                                                          tie_embeddings=True)
    path.write_text(json.dumps({**HF_LLAMA, "torch_dtype": "float8_e4m3fn"}))
    with pytest.warns(UserWarning, match="bf16 \\(torch_dtype 'float8_e4m3fn'\\)"):
        assert load_run_config(path).precision == "bf16"
    for name, data, said in (("mixtral", {**HF_LLAMA, "model_type": "mixtral", "num_local_experts": 8},
                              "mixture of experts: not modelled"),
                             ("t5", {"model_type": "t5", "d_model": 512}, "model_type 't5': vtrain places"),
                             ("listed", {**HF_LLAMA, "model_type": ["llama"]}, "model_type ['llama']: vtrain places"),
                             ("no-kv", {**HF_LLAMA, "num_key_value_heads": 0}, "kv_heads must be between 1"),
                             ("odd-kv", {**HF_LLAMA, "num_key_value_heads": 3}, "heads (8) is not divisible by"),
                             ("qwen3-32b-like", {**HF_LLAMA, "model_type": "qwen3", "head_dim": 128},
                              "head_dim 128 is not hidden_size / num_attention_heads (64)"),
                             ("broken", {**HF_LLAMA, "num_hidden_layers": 2.5}, "has a bad value"),
                             ("short", {k: v for k, v in HF_LLAMA.items() if k != "intermediate_size"},
                              "is missing 'intermediate_size'")):
        bad = tmp_path / f"{name}.json"
        bad.write_text(json.dumps(data))
        ran = vtrain_in_process("simulate", bad)
        lines = ran.stderr.strip().splitlines()
        assert ran.returncode == 2 and len(lines) == 1 and said in lines[0] and str(bad) in lines[0], ran.stderr


def test_starcoders_multi_query_attention_is_one_key_value_head(tmp_path: Path) -> None:
    """A gpt_bigcode config (StarCoder 15.5B: multi_query, by default true) was read with 48 key/value heads: 18.5B
    parameters, 13 % slower; GPT-2 keeps all its heads."""
    starcoder = {"model_type": "gpt_bigcode", "n_layer": 40, "n_embd": 6144, "n_head": 48, "n_positions": 8192,
                 "n_inner": 24576, "vocab_size": 49152, "multi_query": True, "activation_function": "gelu_pytorch_tanh"}
    path = tmp_path / "config.json"
    for multi_query, kv_heads in ((True, 1), (False, None)):
        path.write_text(json.dumps({**starcoder, "multi_query": multi_query}))
        with pytest.warns(UserWarning, match="gpt_bigcode config"):
            assert load_run_config(path).model.kv_heads == kv_heads


def test_weights_saved_in_float32_train_in_bf16_said_and_a_missing_vocabulary_is_refused(tmp_path: Path) -> None:
    """``torch_dtype`` (``dtype`` since transformers 4.56) is how a checkpoint was saved: OLMo's and StarCoder's
    float32 trained them in fp32 (15x slower) and with FlashAttention refused any --precision; a LLaMA config without
    ``vocab_size`` got GPT-2's 50,257."""
    path = tmp_path / "config.json"
    for key in ("torch_dtype", "dtype"):
        saved = {name: value for name, value in HF_LLAMA.items() if name != "torch_dtype"}
        path.write_text(json.dumps({**saved, key: "float32"}))
        with pytest.warns(UserWarning, match="bf16 \\(its weights were saved in 'float32', which is not how it "
                                             "trained: --precision fp32 trains in it\\)"):
            assert load_run_config(path).precision == "bf16"
    path.write_text(json.dumps({key: value for key, value in HF_LLAMA.items() if key != "vocab_size"}))
    with pytest.raises(InputError, match="llama config is missing 'vocab_size'"):
        load_run_config(path)


def test_a_missing_path_is_not_read_as_a_published_models_name(tmp_path: Path) -> None:
    """`simulate /data/ft/Llama-2-70b-hf` (mistyped) simulated the published LLaMA-2-70B; a Hugging Face
    repository's name (meta-llama/Llama-2-70b-hf) still names it, said."""
    for path in (str(tmp_path / "nope" / "Llama-2-70b-hf"), "./Llama-2-70b-hf", "a/b/Llama-2-70b-hf"):
        with pytest.raises(InputError, match="no such"):
            load_run_config(path)
    with pytest.warns(UserWarning, match="as published \\(no such file or folder: read as a repository's name\\)"):
        assert load_run_config("meta-llama/Llama-2-70b-hf").model.layers == 80


def test_a_path_from_the_current_folder_on_the_command_line_is_not_a_published_models_name(tmp_path: Path) -> None:
    """`vtrain simulate ./llama-2-70b` and `vtrain plan ./llama-2-70b` (a file the user meant, not there): the command
    line turned the argument into a path, which drops the `./`, so the published LLaMA-2-70B was simulated and
    planned. The argument is read as typed."""
    from tests.conftest import vtrain_in_process

    for command in (("simulate", "./llama-2-70b"), ("plan", "./llama-2-70b", "--gpus", "8", "--global-batch", "8")):
        ran = vtrain_in_process(*command, cwd=tmp_path)
        assert ran.returncode == 2 and "no such run config" in ran.stderr and "as published" not in ran.stderr, \
            ran.stderr


def test_what_a_models_line_says_was_assumed_leaves_out_what_the_command_line_gives(tmp_path: Path) -> None:
    """`vtrain simulate qwen.json --seq 4096 --precision fp16` said "sequence 131072 ..., bf16 (its weights were saved
    in 'float32' ...: --precision fp32 trains in it)" while it ran 4,096 tokens in fp16: the line named the config's
    values over the flags that replaced them. So did a published name's line with `--precision`."""
    from tests.conftest import vtrain_in_process

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**HF_LLAMA, "model_type": "qwen2", "max_position_embeddings": 131072,
                                  "torch_dtype": "float32"}))
    plain = vtrain_in_process("simulate", config, "--json")
    assert plain.returncode == 0 and "sequence 131072" in plain.stderr and "saved in 'float32'" in plain.stderr
    flags = vtrain_in_process("simulate", config, "--seq", "4096", "--precision", "fp16", "--json")
    said = [line for line in flags.stderr.splitlines() if "a Hugging Face qwen2 config" in line]
    assert flags.returncode == 0 and len(said) == 1, flags.stderr
    assert "131072" not in said[0] and "float32" not in said[0] and "bf16" not in said[0], said[0]
    assert json.loads(flags.stdout)["model"]["seq"] == 4096
    every = vtrain_in_process("simulate", config, "--seq", "4096", "--precision", "fp16", "--framework", "megatron",
                              "--attention", "flash", "--json")
    assert every.returncode == 0 and "a Hugging Face" not in every.stderr, every.stderr
    named = vtrain_in_process("simulate", "llama-2-7b", "--precision", "fp16", "--json")
    assert named.returncode == 0 and "trained here with Megatron's kernels" in named.stderr, named.stderr


def test_a_long_context_is_said_and_experts_counted_in_text_are_a_mixture(tmp_path: Path) -> None:
    """Qwen2.5's max_position_embeddings (131,072) was trained at as said, without a word that it is the context it
    serves; an expert count written "8" or 8.0 was simulated as a dense model."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_LLAMA, "model_type": "qwen2", "max_position_embeddings": 131072}))
    with pytest.warns(UserWarning, match="the longest context it serves: most models pretrain shorter"):
        assert load_run_config(path).model.seq == 131072
    for experts in ("8", 8.0):
        path.write_text(json.dumps({**HF_LLAMA, "num_local_experts": experts}))
        with pytest.raises(InputError, match="mixture of experts: not modelled"):
            load_run_config(path)
