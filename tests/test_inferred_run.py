"""The run read off a trace set's operator shapes (``vtrain/ingest/inferred_run.py``), for traces recorded without a
``run.yaml`` (a training script of one's own, Megatron-core, one rank of many).

Scored against every shipped recording that has its ``run.yaml``, read as if it had none: vtrain's own CPU runs in
every layout (tensor, pipeline, data parallel, recomputation, the GPipe and interleaved schedules), its GPU runs on
an H100 and an H200 (bf16, fp32), and Megatron-core 0.16.1's own training on an H200 (no recomputation, full,
selective), the gradient all-reduce's overlap and buckets included (a bucket is a flat tensor, a tensor-parallel
all-reduce an activation)."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.inferred_run import infer_run
from vtrain.runconfig import load_run_config
from vtrain.tables.store import load_profile
from vtrain.validate.predictions import DESCRIBES_TRACES

TRACES = REPO / "traces"
#: recordings whose run.yaml the shapes give back whole (model, layout, batch, recomputation, precision, kernels)
WHOLE = ["t2p2d2", "t1p2d1", "t1p2d1-gpipe", "t1p2d1-interleaved", "t2p1d1-recompute", "t1p1d2",
         "gpu/h100-val-gpt1.3b-8l-mb8-full", "gpu/h200-mem-fp32-none", "gpu/h200-mcore-gpt1.3b-full",
         "gpu/h200-mcore-gpt1.3b-selective", "gpu/h200-mcore-6l-h4096-none"]


def _inferred(folder: Path, tmp_path: Path):
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    profile = load_profile(tmp_path / "profile")
    first = sorted(folder.glob("*.json*"))[0]
    text = gzip.decompress(first.read_bytes()) if first.suffix == ".gz" else first.read_bytes()
    groups = (json.loads(text).get("distributedInfo") or {}).get("pg_config")
    device = (profile.metadata.get("device") or {}).get("name")
    return infer_run(profile["cpu_ops"], profile.metadata["world_size"], device, groups)


@pytest.mark.parametrize("traced", [[0, 1, 2, 3], [0, 2, 4, 6], [0, 4]])
def test_some_ranks_of_a_pipeline_give_its_layers_said_as_their_stages(traced: list[int], tmp_path: Path) -> None:
    """t2p2d2's 4 layers, 2 a stage, traced on some of its 8 ranks with Megatron's pipeline group named: the
    attention calls of the traced ranks were divided as if every rank were traced (2 layers, and a warning against
    the true run.yaml: a review). Each stage is taken to hold the traced ranks' layers, and that is said; the layers
    are not compared with a run config's."""
    folder = tmp_path / "some"
    folder.mkdir()
    for rank in traced:
        shutil.copy(TRACES / "t2p2d2" / f"rank-{rank}.json.gz", folder / f"rank-{rank}.json.gz")
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    profile = load_profile(tmp_path / "profile")
    inferred = infer_run(profile["cpu_ops"], 8, "cpu", [{"pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP", "pg_size": 2,
                                                        "ranks": [traced[0], traced[0] + 4]}])
    assert inferred.config is not None and inferred.config.model.layers == 4, inferred.reason
    assert "layers" in inferred.unsure and f"holding the 2 layers of the traced ranks' (the traces hold " \
        f"{len(traced)} of the 8 ranks)" in inferred.assumed


@pytest.mark.parametrize("name", WHOLE)
def test_the_shapes_give_the_recorded_run_back(name: str, tmp_path: Path) -> None:
    folder = TRACES / name
    inferred = _inferred(folder, tmp_path)
    assert inferred.reason is None
    run, recorded = inferred.config, load_run_config(folder / "run.yaml")
    # the output layer read as tied or not where the optimizer's parameters show it (the run.yaml's None: the
    # framework's default)
    assert replace(run.model, tie_embeddings=None) == recorded.model
    assert run.ties_embeddings == recorded.ties_embeddings
    layout = dict(recorded.parallelism.__dict__)
    # a bucket closes once it holds its MiB: the median bucket is at least that (25.05 MiB for t1p1d2's 25)
    assert run.parallelism.dp_bucket_mb == pytest.approx(layout.pop("dp_bucket_mb"), rel=0.01)
    assert {**run.parallelism.__dict__, "dp_bucket_mb": None} == {**layout, "dp_bucket_mb": None}
    assert (run.precision, run.framework, run.attention, run.fused_kernels) == (
        recorded.precision, recorded.framework, recorded.attention, recorded.fused_kernels)
    assert "not overlapped" not in inferred.assumed


def test_a_gradient_all_reduce_overlapped_with_the_backward_pass_is_read(tmp_path: Path) -> None:
    """vtrain's t1p1d2-overlap without its run.yaml: its buckets are all-reduced as the backward pass goes (the
    first before the embedding's backward begins). Taken as not overlapped, the model said +11.9 %."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for trace in (TRACES / "t1p1d2-overlap").glob("rank-*.json.gz"):
        shutil.copy(trace, bare)
    assert _inferred(bare, tmp_path).config.parallelism.dp_overlap
    ran = vtrain_in_process("validate", bare, "--no-hta", "--json", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert abs(json.loads(ran.stdout)["model"]["error_pct"]) < 5


def test_one_rank_of_many_is_data_parallel_when_it_holds_the_whole_model(tmp_path: Path) -> None:
    """Rank 2 of four, the others unprofiled: it holds the embedding and the final norm, so one stage; its attention
    holds every head, so no tensor parallelism: four replicas."""
    layout = _inferred(TRACES / "gpu" / "h100-gloo-one-of-four", tmp_path).config.parallelism
    assert (layout.tp, layout.pp, layout.dp, layout.global_batch) == (1, 1, 4, 32)


def test_a_users_script_with_checkpointing_and_accumulation(tmp_path: Path) -> None:
    """A training script of a user's (`traces/gpu/README.md`: bf16 autocast, every layer checkpointed, four
    micro-batches of 8 accumulated a step, PyTorch's fused attention): all of it is in the shapes."""
    run = _inferred(TRACES / "gpu" / "h100-user-ckpt-accum", tmp_path).config
    assert (run.precision, run.attention, run.parallelism.recompute) == ("bf16", "flash", "full")
    assert (run.parallelism.micro_batch, run.parallelism.global_batch) == (8, 32)


@pytest.mark.parametrize(("name", "why"), [
    ("wild/a100-alexnet", "no word embedding"),  # a CNN
    ("gpu/h200-small-graphs", "no attention scores"),  # CUDA graphs replay the layers: no operator of theirs runs
])
def test_traces_of_anything_else_give_no_run_and_say_why(name: str, why: str, tmp_path: Path) -> None:
    inferred = _inferred(TRACES / name, tmp_path)
    assert inferred.config is None and inferred.reason.startswith(why)


def test_validate_without_run_yaml_simulates_the_run_read_off_the_traces(tmp_path: Path) -> None:
    """Megatron-core's run on an H200 without its run.yaml: one warning line gives the run read off the shapes, and
    the model's prediction is the one its run.yaml gives."""
    recorded = TRACES / "gpu" / "h200-mcore-gpt1.3b-none"
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(recorded / "rank-0.json.gz", bare)

    def validate(folder: Path, out: str):
        ran = vtrain_in_process("validate", folder, "--no-hta", "--json", "-o", tmp_path / out)
        assert ran.returncode == 0, ran.stderr
        return ran

    without, with_yaml = validate(bare, "bare-report"), validate(recorded, "report")
    said = [line for line in without.stderr.splitlines() if "read off the traces' shapes:" in line]
    assert len(said) == 1 and "24 layers, hidden 2048, 16 heads, seq 2048" in said[0] and "NVIDIA H200" in said[0]
    assert json.loads(without.stdout)["model"]["predicted_ms"] == pytest.approx(
        json.loads(with_yaml.stdout)["model"]["predicted_ms"], rel=1e-9)


@pytest.mark.parametrize(("was", "made"), [
    ("[[32000, 1024], [", "[[32000000000000, 1024], ["),  # a vocabulary no run has
    ("[[32000, 1024], [", "[[-32000, 1024], ["),  # a negative table
    ('"aten::_softmax_backward_data"', '"aten::_softmax_backward_data_x"'),  # no attention's backward
    ("[[32000, 1024], [", '[["32000", 1024], ['),  # a dim that is text
])
def test_shapes_no_run_has_are_said_and_the_traces_replayed(was: str, made: str, tmp_path: Path) -> None:
    """The H100 recording with one shape made impossible, without its run.yaml: validate replays it, says in one
    line that no run is read off it, and never fails for it."""
    folder = tmp_path / "odd"
    folder.mkdir()
    text = gzip.decompress((TRACES / "gpu" / "h100-small-eager" / "rank-0.json.gz").read_bytes()).decode()
    assert was in text
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(text.replace(was, made).encode()))
    ran = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    said = [line for line in ran.stderr.splitlines()
            if line.startswith(f"warning: {folder}: model-driven prediction skipped")]  # naming the folder
    assert len(said) == 1
    assert "none read off the traces" in said[0] or "the one read off the traces is none" in said[0]


def _record_llama_like(target: Path, attention: str = "sdpa-gqa", marked: bool = True,
                       optimizers: int = 1, training: bool = True, compiled: str | None = None,
                       norm: str = "fused", mlp: str = "swiglu", lengths: tuple[int, ...] = (),
                       rotary: str = "", evaluated: tuple[int, ...] = (), checkpointed: str = "",
                       tied: bool | None = None) -> None:
    """A LLaMA-style model trained by a script of its own, profiled as a user would (torch.profiler with
    record_shapes, a schedule, export_chrome_trace): RMSNorm, grouped-query attention (8 heads, 2 key/value heads),
    a SwiGLU MLP 352 wide, linear layers without biases; 2 layers, hidden 128, sequence 64, vocabulary 256,
    micro-batch 2, fp32 on the CPU. ``attention``: PyTorch's fused attention taking the 2 key/value heads
    (``sdpa-gqa``), or, as Hugging Face's LLaMA does, taking them repeated to 8 (``repeat_kv``: ``sdpa-repeated``),
    or its scores written out of matmul and softmax on the repeated ones (``eager-repeated``), or repeated as
    torchtitan does (``expand`` on ``[b, s, kv, 1, d]``) or by ``repeat_interleave`` on the heads' dim. Not
    ``marked``: the profiler taken around four steps without a schedule or ``step()``, as many scripts do (no
    ProfilerStep#N). Two ``optimizers``: AdamW for the matrices, SGD for the rest, stepped one after the other. Not
    ``training``: the model evaluated under ``torch.no_grad()`` (no backward pass, no optimizer step). ``compiled``:
    each layer compiled by ``torch.compile`` with that backend, the embedding and head eager (as torchtitan compiles
    its blocks). ``norm``: PyTorch's ``nn.RMSNorm`` (``fused``), RMSNorm written out as Hugging Face's LLaMA writes it
    (``rms-written``), or a LayerNorm written out of the mean, variance and square root (``layer-written``; with the
    reciprocal root, ``layer-written-rsqrt``), or that LayerNorm in an autograd function named as apex's fused one,
    which Megatron runs (``apex-named``), or each token scaled by its vector norm (``l2-written``: RMSNorm by
    another name, of no operator vtrain reads). ``mlp``: the
    SwiGLU MLP, or Gemma's gated GELU (``geglu``), or one of two linear layers around GPT-2's GELU as Hugging Face
    writes it (``gelu-written``: tanh's approximation of element-wise operators, its ``gelu_new``), around OPT's
    ReLU (``relu``) or a SiLU (``silu``), or GELU with dropout after it (``gelu-dropout``), or Megatron's fused
    activations (autograd functions named as its own, whose kernels record no activation operator): its bias-GELU
    (``megatron-gelu``) or SwiGLU on one GEMM's two halves (``megatron-swiglu``). ``lengths``: the sequence length
    of each step in turn (a batch padded to its longest sample, as Hugging Face's collators pad), else 64 every
    step. ``rotary``: the queries and keys rotated as Hugging Face's LLaMA rotates them (``full``: its
    ``rotate_half``, the head's two halves swapped, one negated, of element-wise operators), or only the first
    quarter of each head's width, the rest passed through (``partial``: GPT-NeoX's and Pythia's ``rotary_pct``
    0.25); else no positions. ``evaluated``: the steps (0 to 4; 1 to 3 are traced) after whose optimizer step the
    model is evaluated on one batch in eval mode under ``torch.no_grad()``, as nanoGPT's ``estimate_loss`` does.
    ``checkpointed``: activation checkpointing (``torch.utils.checkpoint``, non-reentrant) of the first layer only
    (``first-layer``) or of every layer's MLP (``mlp``). ``tied`` (True or False): the output layer the word
    embedding's matrix or one of its own, trained by AdamW over lists of parameters (``foreach``, the default on
    GPUs; on the CPU a loop over them)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    vocab, hidden, heads, kv, seq, batch, ffn = 256, 128, 8, 2, 64, 2, 352
    width = hidden // heads

    class WrittenNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if norm == "rms-written":  # Hugging Face's LlamaRMSNorm
                return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
            if norm == "apex-named":
                return FusedLayerNormAffineFunction.apply(x, self.weight)
            if norm == "l2-written":
                return self.weight * x / x.norm(dim=-1, keepdim=True) * hidden ** 0.5
            return written_layer_norm(x, self.weight)

    def written_layer_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        variance = centred.pow(2).mean(-1, keepdim=True) + 1e-5
        if norm == "layer-written-rsqrt":
            return weight * centred * torch.rsqrt(variance)
        return weight * centred / torch.sqrt(variance)

    class FusedLayerNormAffineFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, weight)
            return written_layer_norm(x, weight)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, weight = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                return torch.autograd.grad(written_layer_norm(x, weight), (x, weight), grad)

    def erf_gelu(x: torch.Tensor) -> torch.Tensor:  # no operator vtrain reads, as a fused kernel records none
        return x * 0.5 * (1.0 + torch.erf(x / 2 ** 0.5))

    class GeLUFunction(torch.autograd.Function):  # Megatron's bias-GELU (fused by torch.compile or TorchScript)
        @staticmethod
        def forward(ctx, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x, bias)
            return erf_gelu(x + bias)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, bias = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                return torch.autograd.grad(erf_gelu(x + bias), (x, bias), grad)

    def swiglu(x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.chunk(x, 2, -1)
        return gate * torch.sigmoid(gate) * up

    class SwiGLUFunction(torch.autograd.Function):  # Megatron-core's fused SwiGLU
        @staticmethod
        def forward(ctx, x: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(x)
            return swiglu(x)

        @staticmethod
        def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
            (x,) = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                return torch.autograd.grad(swiglu(x), x, grad)

    def make_norm() -> nn.Module:
        return nn.RMSNorm(hidden) if norm == "fused" else WrittenNorm()

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norms = nn.ModuleList([make_norm(), make_norm()])
            self.q, self.o = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
            self.k, self.v = (nn.Linear(hidden, kv * width, bias=False) for _ in range(2))
            self.gate, self.up = (nn.Linear(hidden, ffn, bias=False) for _ in range(2))
            self.down = nn.Linear(ffn, hidden, bias=False)
            self.bias = nn.Parameter(torch.zeros(ffn))

        def mlp(self, h: torch.Tensor) -> torch.Tensor:
            if mlp in ("swiglu", "geglu"):
                activation = F.silu if mlp == "swiglu" else functools.partial(F.gelu, approximate="tanh")
                return self.down(activation(self.gate(h)) * self.up(h))
            if mlp == "megatron-swiglu":  # one GEMM makes both halves
                return self.down(SwiGLUFunction.apply(torch.cat((self.gate(h), self.up(h)), dim=-1)))
            up = self.up(h)
            if mlp in ("relu", "silu"):
                return self.down(F.relu(up) if mlp == "relu" else F.silu(up))
            if mlp == "gelu-dropout":  # PyTorch's TransformerEncoderLayer: dropout between the two linear layers
                return self.down(F.dropout(F.gelu(up), p=0.1, training=self.training))
            if mlp == "megatron-gelu":  # Megatron's fc1 leaves its bias to the fused bias-GELU
                return self.down(GeLUFunction.apply(up, self.bias))
            return self.down(0.5 * up * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (up + 0.044715 * up.pow(3.0)))))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seq = x.shape[1]
            h = self.norms[0](x)
            q, k, v = (proj(h).view(batch, seq, n, width).transpose(1, 2)
                       for proj, n in ((self.q, heads), (self.k, kv), (self.v, kv)))
            if rotary == "complex":  # Meta's LLaMA and torchtitan: pairs of a head's width turned as complex numbers
                angles = torch.arange(seq)[:, None] / 10000 ** (torch.arange(0, width, 2) / width)
                turns = torch.polar(torch.ones_like(angles), angles)
                q, k = (torch.view_as_real(torch.view_as_complex(t.reshape(*t.shape[:-1], -1, 2)) * turns).flatten(3)
                        for t in (q, k))
            elif rotary:
                rotated = width if rotary == "full" else width // 4
                angles = torch.arange(seq)[:, None] / 10000 ** (torch.arange(0, rotated, 2) / rotated)
                cos, sin = (f(torch.cat((angles, angles), dim=-1)) for f in (torch.cos, torch.sin))

                def rotate(t: torch.Tensor) -> torch.Tensor:
                    turned, kept = t[..., :rotated], t[..., rotated:]
                    half = rotated // 2
                    turned = turned * cos + torch.cat((-turned[..., half:], turned[..., :half]), dim=-1) * sin
                    return torch.cat((turned, kept), dim=-1) if kept.shape[-1] else turned

                q, k = rotate(q), rotate(k)
            if attention == "sdpa-gqa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            elif attention == "torchtitan":  # its repeat_kv, on [b, s, kv, d]
                k, v = (t.transpose(1, 2)[:, :, :, None].expand(batch, seq, kv, heads // kv, width)
                        .reshape(batch, seq, heads, width).transpose(1, 2) for t in (k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif attention == "interleaved":
                k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # Hugging Face's repeat_kv
                k, v = (t[:, :, None].expand(batch, kv, heads // kv, seq, width).reshape(batch, heads, seq, width)
                        for t in (k, v))
                if attention == "sdpa-repeated":
                    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                else:
                    scores = torch.matmul(q, k.transpose(2, 3)) / width ** 0.5
                    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
                    y = torch.matmul(F.softmax(scores, dim=-1), v)
            x = x + self.o(y.transpose(1, 2).reshape(batch, seq, hidden))
            h = self.norms[1](x)
            if checkpointed == "mlp":
                return x + torch.utils.checkpoint.checkpoint(self.mlp, h, use_reentrant=False)
            return x + self.mlp(h)

    class Checkpointed(nn.Module):
        def __init__(self, layer: nn.Module) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(self.layer, x, use_reentrant=False)

    torch.manual_seed(0)
    layers = [Layer(), Layer()]
    if checkpointed == "first-layer":
        layers[0] = Checkpointed(layers[0])
    if compiled:
        layers = [torch.compile(layer, backend=compiled) for layer in layers]
    model = nn.Sequential(nn.Embedding(vocab, hidden), *layers, make_norm(),
                          nn.Linear(hidden, vocab, bias=False))
    if tied:
        model[-1].weight = model[0].weight
    matrices = [p for p in model.parameters() if p.dim() == 2]
    stepped = [torch.optim.AdamW(matrices if optimizers == 2 else model.parameters(),
                                 foreach=True if tied is not None else None)] + (
        [torch.optim.SGD([p for p in model.parameters() if p.dim() != 2])] if optimizers == 2 else [])

    steps = iter(range(10))

    def step() -> None:
        index = next(steps)
        tokens = torch.randint(0, vocab, (batch, lengths[index % len(lengths)] if lengths else seq))
        if not training:
            with torch.no_grad():
                model(tokens)
            return
        F.cross_entropy(model(tokens).view(-1, vocab), tokens.view(-1)).backward()
        for optimizer in stepped:
            optimizer.step()
            optimizer.zero_grad()
        if index in evaluated:
            model.eval()
            with torch.no_grad():
                model(tokens)
            model.train()

    target.mkdir()
    if not marked:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profiler:
            for _ in range(4):
                step()
        profiler.export_chrome_trace(str(target / "trace.json"))
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                                on_trace_ready=lambda done: done.export_chrome_trace(str(target / "trace.json"))
                                ) as profiler:
        for _ in range(5):
            step()
            profiler.step()


@pytest.mark.parametrize("attention", ["sdpa-gqa", "sdpa-repeated", "eager-repeated", "torchtitan", "interleaved"])
def test_a_llama_like_script_of_ones_own(attention: str, tmp_path: Path) -> None:
    """Recorded here by torch, outside vtrain: every part of its shape is read back but its positions (it has none;
    taken as learned, said), its 2 key/value heads too where they are repeated to 8 before the attention (they read as
    8: the key and value projections' FLOPs four times theirs)."""
    _record_llama_like(tmp_path / "llama", attention)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.reason is None
    model = inferred.config.model
    assert (model.layers, model.hidden, model.heads, model.kv_heads, model.seq, model.vocab) == (2, 128, 8, 2, 64, 256)
    assert (model.mlp, model.ffn_hidden, model.norm, model.bias) == ("swiglu", 352, "rmsnorm", False)
    layout = inferred.config.parallelism
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batch, layout.global_batch) == (1, 1, 1, 2, 2)
    assert (inferred.config.precision, inferred.config.attention) == (
        "fp32", "eager" if attention.startswith("eager") else "flash")
    # vtrain's reference model has GPT's layer only: a LLaMA layer is placed with Megatron's kernels, and said
    assert inferred.config.framework == "megatron" and "Megatron's kernels" in inferred.assumed


def test_heads_as_wide_as_the_sequence_is_long_are_read(tmp_path: Path) -> None:
    """Scores written out (matmul and softmax, as nanoGPT's attention without flash) over 16 tokens, heads 16 wide:
    the scores' product by the values, [.., 16, 16] by [.., 16, 16], had been taken for no product by values
    ("no attention scores", no run: an audit found it on nanoGPT and PyTorch's TransformerEncoder at seq 32)."""
    _record_llama_like(tmp_path / "llama", "eager-repeated", lengths=(16,))
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.reason is None, inferred.reason
    model = inferred.config.model
    assert (model.layers, model.hidden, model.heads, model.kv_heads, model.seq) == (2, 128, 8, 2, 16)


@pytest.mark.parametrize("norm", ["rms-written", "layer-written", "layer-written-rsqrt", "apex-named", "l2-written"])
def test_a_norm_written_out_is_read_or_said(norm: str, tmp_path: Path) -> None:
    """The LLaMA-style script with its norms written out of element-wise operators: Hugging Face's RMSNorm (the
    reciprocal square root of each token's mean square) is read as RMSNorm, nothing assumed; a LayerNorm written
    out (its mean subtracted, then the root of the variance) was read as RMSNorm without a word, and is now read
    as LayerNorm; so is one inside an autograd function named as apex's fused LayerNorm (Megatron's, which records
    no shapes: only its name shows). Each token scaled by its vector norm (no operator vtrain reads) is said to be
    taken as RMSNorm."""
    _record_llama_like(tmp_path / "llama", norm=norm)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.config.model.norm == ("rmsnorm" if norm in ("rms-written", "l2-written") else "layernorm")
    said = "the layers' norm taken as RMSNorm (no norm operator recorded: a fused kernel of an extension, or " \
        "written out of element-wise operators)"
    assert (said in inferred.assumed) == (norm == "l2-written"), inferred.assumed
    if norm == "l2-written":
        ran = vtrain_in_process("validate", tmp_path / "llama", "--no-hta", "-o", tmp_path / "report")
        assert ran.returncode == 0 and said in ran.stderr, ran.stderr


@pytest.mark.parametrize(("mlp", "read", "said"), [
    ("gelu-written", "gelu", ""),
    ("relu", "gelu", "its ReLU MLP (not gated) placed as a GELU MLP of the same width (the same GEMMs)"),
    ("silu", "gelu", "its SiLU MLP (not gated) placed as a GELU MLP of the same width (the same GEMMs)"),
    ("geglu", "swiglu", "its gated GELU MLP placed as a SwiGLU MLP of the same width (the same GEMMs)"),
    ("gelu-dropout", "gelu", ""),
    ("megatron-gelu", "gelu", ""),
    ("megatron-swiglu", "swiglu", "")],
    ids=["gelu-written", "relu", "silu", "geglu", "gelu-dropout", "megatron-gelu", "megatron-swiglu"])
def test_an_mlp_of_another_activation_is_read(mlp: str, read: str, said: str, tmp_path: Path) -> None:
    """The LLaMA-style script with another MLP. Before: a plain MLP around GPT-2's GELU as Hugging Face writes it
    (``gelu_new``: tanh's approximation of element-wise operators, no ``aten::gelu``) or around OPT's ReLU: "no MLP
    activation" and no run; around a SiLU: read as SwiGLU (three GEMMs for its two); Gemma's gated GELU: read as a
    GELU MLP (two GEMMs for its three); Megatron's fused bias-GELU and SwiGLU, whose kernels record no activation
    operator: no run. Now the gating is read (the activation's output multiplied by a tensor of its shape; on the
    CPU a dropout after the activation multiplies by its mask too: no gating, as PyTorch's TransformerEncoderLayer
    runs it), and
    Megatron's activations by their autograd functions' names (a SwiGLU's input is its two halves: 704 wide);
    every MLP is 352 wide, placed as the MLP of its GEMMs, and said where its activation is another."""
    _record_llama_like(tmp_path / "llama", mlp=mlp)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.reason is None, inferred.reason
    assert (inferred.config.model.mlp, inferred.config.model.ffn_hidden) == (read, 352)
    placed = [part for part in inferred.assumed.split(", ") if "MLP" in part]
    assert placed == ([said] if said else []), inferred.assumed


@pytest.mark.parametrize("evaluated", [(2,), (1, 2, 3)], ids=["in-one-step", "in-every-step"])
def test_an_evaluation_among_the_traced_steps_is_not_training(evaluated: tuple[int, ...], tmp_path: Path) -> None:
    """The LLaMA-style script evaluated on one batch after the optimizer step (nanoGPT's ``estimate_loss``, in
    eval mode under ``torch.no_grad()``) in a traced step. Before, the middle traced step was read whatever it held:
    its evaluation forward counted as a second micro-batch, so the run was read as one layer, global batch 4, full
    recomputation, silently (an audit found it on a nanoGPT-style script). Now a step whose every embedding lookup
    is back-propagated is read where there is one; where there is none, no run, and why."""
    _record_llama_like(tmp_path / "llama", evaluated=evaluated)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    if len(evaluated) == 1:
        assert inferred.reason is None, inferred.reason
        layout = inferred.config.parallelism
        assert (inferred.config.model.layers, layout.micro_batch, layout.global_batch, layout.recompute) == (
            2, 2, 2, "none")
    else:
        assert inferred.config is None
        assert "looks up its embeddings more often (2 times in one) than it back-propagates them (1): forwards " \
            "without a backward (an evaluation among the training steps)" in inferred.reason, inferred.reason


def test_sequences_of_other_lengths_in_other_iterations_are_said(tmp_path: Path) -> None:
    """The LLaMA-style script fed batches padded to their longest sample, as Hugging Face's collators pad them: 48,
    80 and 64 tokens in the three traced iterations. The run was read off the middle iteration's (80) without a
    word, and every iteration compared with it; now the lengths are said."""
    _record_llama_like(tmp_path / "llama", lengths=(32, 48, 80, 64, 96))
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.config.model.seq == 80
    said = "every micro-batch 80 tokens long, as in one iteration (its micro-batches embed sequences of 48 to 80 " \
        "tokens, 2 a micro-batch: one length is simulated)"
    assert said in inferred.assumed, inferred.assumed


def _record_gpt2_like(target: Path) -> None:
    """Hugging Face's GPT-2 as its ``modeling_gpt2`` writes it, small (2 layers, hidden 128, 4 heads, sequence 64,
    vocabulary 512, micro-batch 2, fp32 on the CPU), trained and profiled as a user would: its linear layers
    ``Conv1D`` (``torch.addmm`` of a bias, the input and a ``[in, out]`` weight), eager attention masked by
    ``torch.where``, ``gelu_new`` (tanh's approximation written out), dropout, learned positions, the output layer the
    word embedding's weight (no bias)."""
    import math

    import torch
    import torch.nn.functional as F
    from torch import nn

    vocab, hidden, heads, seq, batch = 512, 128, 4, 64, 2

    class Conv1D(nn.Module):
        def __init__(self, outputs: int, inputs: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(inputs, outputs) * 0.02)
            self.bias = nn.Parameter(torch.zeros(outputs))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.c_attn, self.attn_proj = Conv1D(3 * hidden, hidden), Conv1D(hidden, hidden)
            self.c_fc, self.mlp_proj = Conv1D(4 * hidden, hidden), Conv1D(hidden, 4 * hidden)
            self.drop = nn.Dropout(0.1)
            self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril().view(1, 1, seq, seq))

        def attention(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = (t.view(batch, seq, heads, -1).permute(0, 2, 1, 3) for t in self.c_attn(x).split(hidden, 2))
            scores = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5)
            scores = torch.where(self.causal, scores, torch.full([], torch.finfo(scores.dtype).min))
            y = torch.matmul(self.drop(F.softmax(scores, dim=-1)), v).permute(0, 2, 1, 3).reshape(batch, seq, hidden)
            return self.drop(self.attn_proj(y))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.ln_1(x))
            h = self.c_fc(self.ln_2(x))
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
            return x + self.drop(self.mlp_proj(h))

    class GPT2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.h, self.ln_f = nn.ModuleList(Block() for _ in range(2)), nn.LayerNorm(hidden)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.wte(tokens) + self.wpe(torch.arange(seq).unsqueeze(0))
            for block in self.h:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    torch.manual_seed(0)
    model = GPT2()
    optimizer = torch.optim.AdamW(model.parameters())
    target.mkdir()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                                on_trace_ready=lambda done: done.export_chrome_trace(str(target / "trace.json"))
                                ) as profiler:
        for _ in range(5):
            tokens = torch.randint(0, vocab, (batch, seq))
            F.cross_entropy(model(tokens)[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1)).backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()


def test_hugging_faces_gpt2_is_read_as_gpt(tmp_path: Path) -> None:
    """Hugging Face's GPT-2 layers, recorded here: read as GPT's (layer norms, learned positions, a GELU MLP four
    times as wide, biased linear layers) and simulated with the reference model's kernels. Its GELU written out
    made it "no MLP activation", and then its linear layers, ``torch.addmm`` where the only ``aten::linear`` is the
    output layer's (no bias), were read as bias-free: Megatron's kernels for "a layer other than GPT's"."""
    _record_gpt2_like(tmp_path / "gpt2")
    inferred = _inferred(tmp_path / "gpt2", tmp_path)
    assert inferred.reason is None, inferred.reason
    model = inferred.config.model
    assert (model.layers, model.hidden, model.heads, model.seq, model.vocab) == (2, 128, 4, 64, 512)
    assert (model.mlp, model.ffn_hidden, model.norm, model.position, model.bias) == (
        "gelu", None, "layernorm", "learned", True)
    assert (inferred.config.framework, inferred.config.attention) == ("reference", "eager")
    assert inferred.assumed == "the output layer its own (the traces do not show whether it is the word " \
        "embedding's) as vtrain's reference model has it"


@pytest.mark.parametrize("tied", [True, False])
def test_an_output_layer_tied_or_not_is_read_off_the_optimizers_parameters(tied: bool, tmp_path: Path) -> None:
    """The LLaMA-style script with its output layer the word embedding's matrix or one of its own, trained by
    AdamW over lists of parameters (as it runs on GPUs): one ``[vocabulary, hidden]`` matrix in the lists, or two.
    Every run was said to be tied before (LLaMA's is not: its optimizer steps a second matrix of 256 x 128 here,
    Llama 3 8B's 0.5B parameters); now it is read."""
    _record_llama_like(tmp_path / "llama", tied=tied)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.config.framework == "megatron" and inferred.config.model.tie_embeddings is tied
    assert "output layer" not in inferred.assumed, inferred.assumed


@pytest.mark.parametrize("rotary", ["full", "partial", "complex", ""])
def test_positions_are_read_from_what_runs(rotary: str, tmp_path: Path) -> None:
    """The LLaMA-style script with its queries and keys rotated as Hugging Face's LLaMA does it (``rotate_half``, of
    element-wise operators: no operator named for rotary) was read as learned positions (a lookup it does not make);
    now as rotary, by the head's halves concatenated (and a quarter of it rotated, GPT-NeoX's way, by the rotated
    part and the rest concatenated back into a head). Rotated as Meta's LLaMA and torchtitan do it (each pair of a
    head's width viewed as a complex number and multiplied by the position's turn), likewise: read by the head
    viewed as complex numbers. Without any positions it is still simulated with learned ones
    (the smaller guess), now said; GPT-2's looked-up positions are learned, nothing said
    (:func:`test_hugging_faces_gpt2_is_read_as_gpt`)."""
    _record_llama_like(tmp_path / "llama", rotary=rotary)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.config.model.position == ("rope" if rotary else "learned")
    said = "learned positions (none seen: no position embedding looked up, no rotary operator)"
    assert (said in inferred.assumed) == (not rotary), inferred.assumed


def test_hugging_faces_llama_layers_are_read_whole(tmp_path: Path) -> None:
    """The LLaMA-style script written as Hugging Face's LLaMA writes its layers: RMSNorm of element-wise operators,
    queries and keys rotated by ``rotate_half``, keys and values repeated to the queries' heads (``repeat_kv``)
    before PyTorch's fused attention, SwiGLU: every part read, nothing assumed but the tied output layer and the
    kernels (Megatron's, for a layer other than GPT's). It had been read with learned positions, silently."""
    _record_llama_like(tmp_path / "llama", attention="sdpa-repeated", norm="rms-written", rotary="full")
    inferred = _inferred(tmp_path / "llama", tmp_path)
    model = inferred.config.model
    assert (model.norm, model.position, model.mlp, model.heads, model.kv_heads, model.bias) == (
        "rmsnorm", "rope", "swiglu", 8, 2, False)
    assert inferred.assumed == "the output layer tied to the embedding, Megatron's kernels for a layer other than GPT's"


def test_the_flash_attn_packages_attention_is_read(tmp_path: Path) -> None:
    """Hugging Face's ``flash_attention_2`` runs the flash-attn package's operators (``flash_attn::_flash_attn_forward``
    since 2.6: query ``[b, s, a, d]``, key ``[b, s, kv, d]``; CUDA only): the LLaMA-style script's trace with its
    PyTorch attention written as those. It was "no attention scores"."""
    _record_llama_like(tmp_path / "llama")
    trace = json.loads((tmp_path / "llama" / "trace.json").read_text())
    renamed = {"aten::_scaled_dot_product_flash_attention_for_cpu": "flash_attn::_flash_attn_forward",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "flash_attn::_flash_attn_backward"}
    for event in trace["traceEvents"]:
        if event.get("name") in renamed:
            event["name"] = renamed[event["name"]]
            dims = event["args"]["Input Dims"]
            event["args"]["Input Dims"] = [[d[0], d[2], d[1], d[3]] if len(d) == 4 else d for d in dims]
    folder = tmp_path / "flash-attn"
    folder.mkdir()
    (folder / "trace.json").write_text(json.dumps(trace))
    inferred = _inferred(folder, tmp_path)
    assert inferred.reason is None
    model = inferred.config.model
    assert (model.layers, model.heads, model.kv_heads, model.hidden) == (2, 8, 2, 128)
    assert inferred.config.attention == "flash"


def _packed_trace(source: Path, target: Path, sequences: int) -> None:
    """The LLaMA-style script's trace (2 x 64 tokens) rewritten as one packed row of 128 tokens whose attention is
    flash-attn's varlen operator over ``sequences`` (its cumulative lengths, ``[sequences + 1]``)."""
    trace = json.loads((source / "trace.json").read_text())
    packed = {"aten::_scaled_dot_product_flash_attention_for_cpu": "flash_attn::_flash_attn_varlen_forward",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "flash_attn::_flash_attn_varlen_backward"}
    for event in trace["traceEvents"]:
        args = event.get("args", {})
        if event.get("name") in packed:
            event["name"] = packed[event["name"]]
            tensors = [[d[0] * d[2], d[1], d[3]] for d in args["Input Dims"] if len(d) == 4]
            args["Input Dims"] = tensors[:3] + [[sequences + 1], [sequences + 1], [], []]
            args["Input type"] = ["float"] * 3 + ["int", "int", "Scalar", "Scalar"]
        elif event.get("name") in ("aten::embedding", "aten::embedding_dense_backward"):
            args["Input Dims"] = [[1, 128] if d == [2, 64] else [1, 128, 128] if d == [2, 64, 128] else d
                                  for d in args["Input Dims"]]
    target.mkdir()
    (target / "trace.json").write_text(json.dumps(trace))


def test_packed_sequences_are_read_as_their_count(tmp_path: Path) -> None:
    """Documents packed into one row of tokens and attended to each on its own (flash-attn's varlen operator, as
    Hugging Face's ``DataCollatorWithFlattening`` runs it: tokens ``[1, 128]``, queries ``[128, heads, d]``, the
    cumulative lengths of 2 sequences ``[3]``): the LLaMA-style script's trace written as that. Read as one sequence
    of 128 tokens, its attention was four times the work of two of 64; the trace says how many, not how long, and
    the run says it assumed one length."""
    _record_llama_like(tmp_path / "llama")
    folder = tmp_path / "packed"
    _packed_trace(tmp_path / "llama", folder, 2)
    inferred = _inferred(folder, tmp_path)
    assert inferred.reason is None
    layout, model = inferred.config.parallelism, inferred.config.model
    assert (layout.micro_batch, model.seq, model.heads, model.kv_heads) == (2, 64, 8, 2)
    assert "the 2 sequences packed in a micro-batch of one length (64 tokens" in inferred.assumed


def test_more_packed_sequences_than_tokens_is_said_not_a_traceback(tmp_path: Path) -> None:
    """A hostile count: cumulative lengths of a million sequences over a row of 128 tokens. No run is read off it,
    one line says why, and the traces are still replayed."""
    _record_llama_like(tmp_path / "llama")
    _packed_trace(tmp_path / "llama", tmp_path / "absurd", 1_000_000)
    inferred = _inferred(tmp_path / "absurd", tmp_path)
    assert inferred.config is None
    assert inferred.reason == "its attention packs 1,000,000 sequences into a row of 128 tokens"
    ran = vtrain_in_process("validate", tmp_path / "absurd", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr


def test_a_users_span_named_like_an_all_to_all_is_no_exchange(tmp_path: Path) -> None:
    """``record_function("log_all_to_all_stats")`` in a dense run's step: only c10d's and the backends' operators
    are exchanges (the span alone had declined the run as a mixture of experts)."""
    _record_llama_like(tmp_path / "llama")
    trace = json.loads((tmp_path / "llama" / "trace.json").read_text())
    step = next(event for event in trace["traceEvents"] if event.get("name") == "ProfilerStep#2")
    trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": "log_all_to_all_stats",
                                 "pid": step["pid"], "tid": step["tid"], "ts": step["ts"] + 1, "dur": 1})
    (tmp_path / "spanned").mkdir()
    (tmp_path / "spanned" / "trace.json").write_text(json.dumps(trace))
    assert _inferred(tmp_path / "spanned", tmp_path).reason is None


def test_a_model_compiled_whole_says_so(tmp_path: Path) -> None:
    """``traces/gpu/h200-compiled-gpt``: a GPT trained under ``torch.compile(mode="reduce-overhead")`` on the H200,
    made outside vtrain (``validators/gpu/compiled_trace.py``): Inductor's kernels record no operator's shapes, not
    even the embedding's. It was declined as "not a language model's training, or recorded without
    record_shapes". Given its run, the model's operators are PyTorch's where the run's were fused: the warning that
    the run config may not describe the traces says why (it said "other operators or shapes")."""
    reason = _inferred(TRACES / "gpu" / "h200-compiled-gpt", tmp_path).reason
    assert reason.startswith("the model runs compiled (") and "Torch-Compiled Region" in reason
    assert "--config gives the run" in reason
    config = tmp_path / "run.yaml"  # its script's run (validators/gpu/compiled_trace.py)
    config.write_text("model: {layers: 4, hidden: 1024, heads: 16, seq: 1024, vocab: 32000}\n"
                      "parallelism: {micro_batch: 4, global_batch: 4}\nprecision: bf16\ncuda_graphs: true\n"
                      "hardware: {device: NVIDIA H200, device_count: 1}\n")
    ran = vtrain_in_process("validate", TRACES / "gpu" / "h200-compiled-gpt", "--config", config, "--no-hta", "-o",
                            tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "of the simulated operators' time was measured" in line]
    assert len(said) == 1 and "its model ran compiled (" in said[0]  # the model places PyTorch's operators


def test_layers_compiled_by_inductor_say_so_and_by_aot_eager_are_read(tmp_path: Path) -> None:
    """The LLaMA-style script with each layer compiled, its embedding and head eager, as torchtitan compiles its
    blocks. Inductor fuses the layers' element-wise work (its attention stays PyTorch's): the SwiGLU's activation
    is in no operator, which was the reason given, as if the model had none; now the compilation is. AOTAutograd
    without Inductor runs PyTorch's operators, whose shapes give the run as the eager script's."""
    _record_llama_like(tmp_path / "inductor", compiled="inductor")
    reason = _inferred(tmp_path / "inductor", tmp_path / "a").reason
    assert reason.startswith("the model runs compiled (") and "(no MLP activation" in reason
    _record_llama_like(tmp_path / "aot", compiled="aot_eager")
    _record_llama_like(tmp_path / "eager")
    assert _inferred(tmp_path / "aot", tmp_path / "b").config == _inferred(tmp_path / "eager", tmp_path / "c").config


def test_an_inference_trace_gives_no_training_run(tmp_path: Path) -> None:
    """The same script evaluating its model under ``torch.no_grad()``: the embedding and the attention are there,
    the backward pass and the optimizer are not; vtrain simulates training, so no run is read off it (it had said
    "0 attention backward calls are not one a layer"), and validate still replays it."""
    _record_llama_like(tmp_path / "eval", training=False)
    inferred = _inferred(tmp_path / "eval", tmp_path)
    assert inferred.config is None and inferred.reason.startswith("no backward pass")
    ran = vtrain_in_process("validate", tmp_path / "eval", "--no-hta", "--json", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "no backward pass" in ran.stderr, ran.stderr
    assert json.loads(ran.stdout)["replay"]["error_pct"] == pytest.approx(0.0, abs=2.0)


def test_a_llama_like_script_of_ones_own_is_validated_from_its_own_host_time(tmp_path: Path) -> None:
    """The script's trace holds fewer than half the operators Megatron's layer places (its SwiGLU's two GEMMs are
    one there, its Adam a loop of ``aten::`` ops): the time between those found, the script's own operators in it,
    is the iteration's host time once, spread over the model's operators. Counted per operator found it made
    11.2 ms of an iteration of 7.6 (+91 % from the profiled iteration itself, +105 % from the tested one). Scored
    on the profiled iteration: the tested one's own time moves with the machine's load."""
    _record_llama_like(tmp_path / "llama")
    ran = vtrain_in_process("validate", tmp_path / "llama", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    model = json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]
    assert model["simulated_terms"]["gap_ms"] < model["profile_iterations_measured_ms"]
    # -22 % to +5 % on a loaded machine; -72 % once, under the full suite's load (a profiled iteration the machine
    # stretched: its own time is the measurement): the fault was an over-count (+91 %), so the bound is one-sided
    assert model["in_sample_error_pct"] < 50


def test_little_measured_of_a_run_read_off_the_traces_says_why(tmp_path: Path) -> None:
    """The LLaMA-style script with its key/value heads repeated before the attention: under half the simulated
    time is measured (vtrain places grouped-query attention on 2 heads, one GEMM for the SwiGLU's two). The
    warning asked "does it describe these traces?" of the run validate itself read off them; it now says why.
    The share measured is the recording's: 26 % here, over half once under CI's load (its steps 45 and 346 ms, the
    measured operators stretched, the modelled ones not), so the rule is checked against the share the report gives."""
    _record_llama_like(tmp_path / "llama", "sdpa-repeated")
    ran = vtrain_in_process("validate", tmp_path / "llama", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    measured = json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]["coverage"]["measured"]
    said = [line for line in ran.stderr.splitlines() if "of the simulated operators' time was measured" in line]
    assert len(said) == (measured < DESCRIBES_TRACES), (measured, ran.stderr)
    assert all(line.endswith("(the run read off them is simulated with the operators vtrain places for its layer, "
                             "which the traces ran otherwise); the rest is modelled") for line in said), ran.stderr
    if said:
        assert f"only {measured:.0%} of the simulated" in said[0]


def _data_parallel_rank(rank: int, world: int, store: str, target: str, sharded: bool = False,
                        experts: bool = False, zero: bool = False, megatron_groups: bool = False,
                        coalesced: str = "", accumulated: str = "") -> None:
    """One rank of a GPT trained under PyTorch's DistributedDataParallel (buckets of 0.25 MiB), or, ``zero``, with
    its optimizer sharded as ZeRO's stage 1 does it: after the backward pass each bucket of about 0.25 MiB of
    gradients (flat, parameters in reverse order) reduce-scattered, AdamW stepping this rank's share of the flat
    parameters, then the shares all-gathered back (``megatron_groups``: with the process groups Megatron makes,
    named as it names them; ``coalesced``: ``"scatter"``, the buckets reduce-scattered and gathered as
    Megatron-core's distributed optimizer issues them, all in one ``_coalescing_manager``; ``"reduce"``, as its
    data parallelism without it: every bucket all-reduced in one, AdamW on the whole); or, ``sharded``,
    FSDP2's ``fully_shard`` on each layer and the whole, with ``nn.TransformerEncoderLayer`` (GELU, pre-norm,
    causal: its attention PyTorch's SDPA on the math path). With ``experts`` each layer is followed by a mixture of
    experts, one a rank: a router weighs the tokens, which go to the experts and back by differentiable
    all-to-all exchanges (expert parallelism). ``accumulated``: two micro-batches a step, the first's backward pass
    under DDP's ``no_sync`` (``no_sync``) or not (``synced``: its gradients all-reduced in both)."""
    import contextlib

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    if megatron_groups:  # one tensor-parallel group a rank, the data-parallel group of both
        for each in range(world):
            dist.new_group([each], group_desc="TENSOR_MODEL_PARALLEL_GROUP")
        dist.new_group(list(range(world)), group_desc="DATA_PARALLEL_GROUP")
    torch.set_num_threads(1)
    vocab, hidden, seq, batch = 256, 128, 64, 2
    torch.manual_seed(0)

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words, self.positions = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.layers = nn.ModuleList(nn.TransformerEncoderLayer(hidden, 4, 4 * hidden, activation="gelu",
                                                                   batch_first=True, norm_first=True)
                                        for _ in range(2))
            self.norm, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)
            self.routers = nn.ModuleList(nn.Linear(hidden, world) for _ in range(2 if experts else 0))
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(),
                                                       nn.Linear(2 * hidden, hidden)) for _ in self.routers)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.words(tokens) + self.positions(torch.arange(seq))
            mask = nn.Transformer.generate_square_subsequent_mask(seq)
            for index, layer in enumerate(self.layers):
                x = layer(x, src_mask=mask, is_causal=True)
                if experts:
                    x = x + self._moe(index, x)
            return self.out(self.norm(x))

        def _moe(self, index: int, x: torch.Tensor) -> torch.Tensor:
            from torch.distributed._functional_collectives import all_to_all_single_autograd as exchange

            flat = x.reshape(-1, hidden)
            weight = self.routers[index](flat).softmax(-1).max(-1, keepdim=True).values
            sent = exchange(flat, None, None, dist.group.WORLD)  # each rank's expert takes its share
            back = exchange(self.experts[index](sent), None, None, dist.group.WORLD)
            return (weight * back).view_as(x)

    if sharded:  # (FSDP2)
        from torch.distributed.fsdp import fully_shard

        model = GPT()
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif zero or coalesced:
        model = GPT()
    else:
        model = nn.parallel.DistributedDataParallel(GPT(), bucket_cap_mb=0.25)
    if coalesced == "reduce":
        step = _coalesced_all_reduce(model, world)
    else:
        step = _zero_stage_one(model, world, coalesced == "scatter") if zero or coalesced else \
            torch.optim.AdamW(model.parameters()).step
    zero_grad = (lambda: model.zero_grad(set_to_none=True)) if zero or coalesced else None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1),
                                on_trace_ready=lambda done: done.export_chrome_trace(f"{target}/rank-{rank}.json")
                                ) as profiler:
        for _ in range(3):
            for micro_batch in range(2 if accumulated else 1):
                tokens = torch.randint(0, vocab, (batch, seq))
                unsynced = accumulated == "no_sync" and micro_batch == 0
                with model.no_sync() if unsynced else contextlib.nullcontext():
                    F.cross_entropy(model(tokens).view(-1, vocab), tokens.view(-1)).backward()
            step()
            (zero_grad or (lambda: None))()
            profiler.step()
    dist.destroy_process_group()


def _buckets(model) -> list[list[Any]]:
    """``model``'s parameters in reverse order, in buckets of about 0.25 MiB (a bucket closes past it)."""
    buckets, filled = [[]], 0
    for param in reversed(list(model.parameters())):
        buckets[-1].append(param)
        filled += param.numel() * param.element_size()
        if filled >= 0.25 * 2**20:
            buckets.append([])
            filled = 0
    return [bucket for bucket in buckets if bucket]


def _coalesced_all_reduce(model, world: int):
    """A step that all-reduces the flat gradients of each bucket of ``model``'s parameters, every bucket in one
    ``_coalescing_manager`` (as Megatron-core's data parallelism issues a bucket group's), then AdamW."""
    import torch
    import torch.distributed as dist

    buckets = _buckets(model)
    optimizer = torch.optim.AdamW(model.parameters())

    def step() -> None:
        flats = [torch.cat([p.grad.reshape(-1) for p in bucket]) for bucket in buckets]
        with dist._coalescing_manager(async_ops=True) as coalesced:
            for flat in flats:
                dist.all_reduce(flat)
        coalesced.wait()
        for bucket, flat in zip(buckets, flats):
            offset = 0
            for param in bucket:
                param.grad.copy_(flat[offset:offset + param.numel()].view_as(param)).div_(world)
                offset += param.numel()
        optimizer.step()

    return step


def _zero_stage_one(model, world: int, coalesced: bool = False):
    """The step of ZeRO's stage 1 over ``model``'s parameters, in buckets of about 0.25 MiB (a bucket padded to a
    multiple of ``world``): reduce-scatter each bucket's flat gradients, AdamW on this rank's share of its flat
    parameters, all-gather the shares and copy them back; ``coalesced``: every bucket's reduce-scatter in one
    ``_coalescing_manager``, and every all-gather in another (Megatron-core's distributed optimizer)."""
    import contextlib

    import torch
    import torch.distributed as dist

    buckets = _buckets(model)
    sizes = [-(-sum(p.numel() for p in bucket) // world) * world for bucket in buckets]
    shares = [torch.zeros(size // world, requires_grad=True) for size in sizes]
    rank = dist.get_rank()
    with torch.no_grad():
        for bucket, size, share in zip(buckets, sizes, shares):
            flat = torch.cat([p.reshape(-1) for p in bucket] + [torch.zeros(size - sum(p.numel() for p in bucket))])
            share.copy_(flat.chunk(world)[rank])
    optimizer = torch.optim.AdamW(shares)

    def together():
        return dist._coalescing_manager(async_ops=True) if coalesced else contextlib.nullcontext()

    def step() -> None:
        grads = [torch.cat([p.grad.reshape(-1) for p in bucket] + [torch.zeros(size - sum(p.numel() for p in bucket))])
                 for bucket, size in zip(buckets, sizes)]
        with together() as scattering:
            for grad, share in zip(grads, shares):
                share.grad = torch.empty_like(share)
                dist.reduce_scatter_tensor(share.grad, grad)
        if scattering is not None:
            scattering.wait()
        for share in shares:
            share.grad.div_(world)
        optimizer.step()
        with torch.no_grad():
            gathered = [torch.empty(size) for size in sizes]
            with together() as gathering:
                for whole, share in zip(gathered, shares):
                    dist.all_gather_into_tensor(whole, share)
            if gathering is not None:
                gathering.wait()
            for bucket, whole in zip(buckets, gathered):
                offset = 0
                for param in bucket:
                    param.copy_(whole[offset:offset + param.numel()].view_as(param))
                    offset += param.numel()

    return step


def test_a_ddp_script_of_ones_own_overlaps_its_buckets(tmp_path: Path) -> None:
    """Two ranks of a user's DDP script, recorded here: its gradients all-reduced during the backward pass, in
    buckets of about the 0.25 MiB it asked for (a bucket closes past it); its attention is SDPA's math path,
    which computes the scores: eager, with no word of a fused attention that did not run."""
    target = _record_data_parallel(tmp_path / "ddp", sharded=False)
    run = _inferred(target, tmp_path).config
    assert (run.parallelism.dp, run.parallelism.dp_overlap, run.attention) == (2, True, "eager")
    assert 0.25 <= run.parallelism.dp_bucket_mb < 0.5
    ran = vtrain_in_process("validate", target, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert "overlapped with the backward pass" in ran.stderr and "fused attention" not in ran.stderr


def _record_data_parallel(target: Path, sharded: bool, experts: bool = False, zero: bool = False,
                          megatron_groups: bool = False, coalesced: str = "", accumulated: str = "") -> Path:
    import torch.multiprocessing as mp

    target.mkdir()
    mp.start_processes(_data_parallel_rank, args=(2, str(target.parent / f"{target.name}.store"), str(target),
                                                  sharded, experts, zero, megatron_groups, coalesced, accumulated),
                       nprocs=2, join=True, start_method="spawn")
    return target


@pytest.mark.parametrize("accumulated", ["no_sync", "synced"])
def test_gradients_reduced_in_every_micro_batch_are_said(accumulated: str, tmp_path: Path) -> None:
    """Two ranks of a DDP script accumulating two micro-batches a step: with ``no_sync`` on the first (as nanoGPT
    and Hugging Face's Trainer do) the gradients are all-reduced once a step, as vtrain simulates; without it DDP
    all-reduces them in both backward passes, which was read as the same run, silently (an audit found it: -19.7 %
    on its model). Now that is said."""
    target = _record_data_parallel(tmp_path / "ddp", sharded=False, accumulated=accumulated)
    inferred = _inferred(target, tmp_path)
    layout = inferred.config.parallelism
    assert (layout.dp, layout.micro_batch, layout.global_batch, layout.dp_overlap) == (2, 2, 8, True)
    said = "its gradients reduced in every micro-batch's backward pass ("
    assert (said in inferred.assumed) == (accumulated == "synced"), inferred.assumed


@pytest.mark.parametrize(("checkpointed", "said"), [
    ("first-layer", "1 of its 2 layers' forward passes run again (a layer and micro-batch each: some layers "
                    "recomputed) simulated as full recomputation of every layer"),
    ("mlp", "its MLPs recomputed (4 activations for 2 layers' backward passes, a layer and micro-batch each) "
            "simulated without recomputation")])
def test_some_layers_or_parts_recomputed_are_said(checkpointed: str, said: str, tmp_path: Path) -> None:
    """The LLaMA-style script with activation checkpointing of its first layer only, or of every layer's MLP (common
    ways to save memory): vtrain simulates every layer recomputed or none. They were read as full recomputation and
    as none, silently (an audit found both on nanoGPT-style scripts); now each says what it placed."""
    _record_llama_like(tmp_path / "llama", checkpointed=checkpointed)
    inferred = _inferred(tmp_path / "llama", tmp_path)
    assert inferred.config.parallelism.recompute == ("full" if checkpointed == "first-layer" else "none")
    assert said in inferred.assumed, inferred.assumed


def test_gradients_reduce_scattered_are_read_as_zero_and_priced_as_all_reduced(tmp_path: Path) -> None:
    """Two ranks of a GPT whose optimizer is sharded as ZeRO's stage 1 does it, recorded here: its gradients
    reduce-scattered in buckets of about 0.25 MiB after the backward pass (none all-reduced), its parameters
    all-gathered after the step. It was read as all-reducing its buckets only because gloo runs a reduce-scatter as
    an all-reduce inside it (with NCCL's own reduce-scatter: no bucket, taken as the default 25 MiB, not
    overlapped); now the buckets are the reduce-scatters', and the run is said to be priced as all-reducing them (the
    reference model's optimizer is not sharded: as many bytes). The same run with the process groups Megatron names
    is read as Megatron's distributed optimizer."""
    target = _record_data_parallel(tmp_path / "zero", sharded=False, zero=True)
    inferred = _inferred(target, tmp_path)
    layout = inferred.config.parallelism
    assert (layout.dp, layout.dp_overlap, layout.distributed_optimizer) == (2, False, False)
    assert 0.25 <= layout.dp_bucket_mb < 0.5
    assert "reduce-scattered and parameters all-gathered" in inferred.assumed and "MiB" not in inferred.assumed
    ran = vtrain_in_process("validate", target, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert "reduce-scattered" in ran.stderr
    megatron = _record_data_parallel(tmp_path / "megatron", sharded=False, zero=True, megatron_groups=True)
    inferred = _inferred(megatron, tmp_path / "m")
    assert inferred.config.framework == "megatron" and inferred.config.parallelism.distributed_optimizer
    assert "reduce-scattered" not in inferred.assumed and "reduce-scatter (distributed optimizer)" in \
        inferred.describe()


def test_buckets_coalesced_as_megatron_core_issues_them_are_read(tmp_path: Path) -> None:
    """Megatron-core issues a bucket group's collectives in one ``_coalescing_manager``: its distributed optimizer's
    reduce-scatters are then one ``c10d::reduce_scatter_tensor_coalesced_`` of a list of buckets, and its
    all-reduces without it one ``c10d::allreduce_coalesced_`` (gloo's ``gloo:all_reduce`` of the list). Recorded
    here on two ranks: the first was read as no gradient reduction at all (taken as the default 25 MiB, a plain
    all-reduce), the second as one bucket of the list's first tensor. Each bucket is now one, of about the 0.25
    MiB asked for, and with Megatron's process groups the first is its distributed optimizer."""
    scattered = _record_data_parallel(tmp_path / "scatter", sharded=False, megatron_groups=True, coalesced="scatter")
    layout = _inferred(scattered, tmp_path / "s").config.parallelism
    assert (layout.dp, layout.dp_overlap, layout.distributed_optimizer) == (2, False, True)
    assert 0.25 <= layout.dp_bucket_mb < 0.5
    reduced = _record_data_parallel(tmp_path / "reduce", sharded=False, coalesced="reduce")
    layout = _inferred(reduced, tmp_path / "r").config.parallelism
    assert (layout.dp, layout.dp_overlap, layout.distributed_optimizer) == (2, False, False)
    assert 0.25 <= layout.dp_bucket_mb < 0.5


def test_a_mixture_of_experts_is_declined(tmp_path: Path) -> None:
    """Two ranks of a GPT whose layers send their tokens to an expert a rank and back by all-to-all exchanges
    (expert parallelism), recorded here: vtrain simulates dense layers, so no run is read off it (it was read as
    4 layers and predicted), and validate still replays it."""
    target = _record_data_parallel(tmp_path / "experts", sharded=False, experts=True)
    inferred = _inferred(target, tmp_path)
    assert inferred.config is None and inferred.reason.startswith("all-to-all exchanges in the training step (")
    ran = vtrain_in_process("validate", target, "--no-hta", "--json", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "a mixture of experts" in ran.stderr, ran.stderr
    assert json.loads(ran.stdout)["model"] is None


def test_parameters_gathered_in_the_backward_pass_are_a_sharded_run(tmp_path: Path) -> None:
    """FSDP2 recorded here, its ``FSDP::`` spans and ``fsdp::`` operators taken out (DeepSpeed's ZeRO-3 records
    none): its flat all-gathers during the backward pass say the parameters are sharded. It was read as a
    replicated run whose gradients are all-reduced."""
    recorded = _record_data_parallel(tmp_path / "fsdp", sharded=True)
    bare = tmp_path / "bare"
    bare.mkdir()
    for trace in recorded.glob("rank-*.json"):
        events = json.loads(trace.read_text())
        events["traceEvents"] = [event for event in events["traceEvents"]
                                 if not str(event.get("name", "")).lower().startswith("fsdp::")]
        (bare / trace.name).write_text(json.dumps(events))
    inferred = _inferred(bare, tmp_path)
    assert inferred.config is None and inferred.reason.startswith(
        "a sharded data-parallel run (parameters all-gathered in the backward pass)")


def test_a_profile_taken_without_step_has_its_optimizer_steps_for_iterations(tmp_path: Path) -> None:
    """The LLaMA-style script profiled around four steps without step(): no ProfilerStep#N span. Its iterations end
    where its optimizer's steps end (``Optimizer.step#AdamW.step``), said in one line; the run is read off it and
    the model validated. It was one iteration, the whole trace, and no run ("no iteration marks")."""
    _record_llama_like(tmp_path / "llama", marked=False)
    ran = vtrain_in_process("validate", tmp_path / "llama", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "iterations are taken to end where its optimizer's" in line]
    assert len(said) == 1 and "its 4 iterations" in said[0]
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert (metrics["iterations"], metrics["steady_iterations"]) == ([1, 2, 3, 4], [2, 3, 4])
    model = metrics["model"]
    assert model is not None and model["profile_iterations"] and model["test_iterations"]
    # The model predicts one iteration, not the trace nor a fraction of one. This CPU run's times are the machine's
    # load's as much as its work's (on CI's 2 cores beside another test: 100, 228 and 547 ms where 25 are usual;
    # predicted 58 from the first): no tighter bound holds for a live recording.
    measured = [model["profile_iterations_measured_ms"]] + [it["measured_ms"] for it in model["iterations"]]
    predicted = model["iterations"][0]["predicted_ms"]
    assert len(measured) == 3 and 0.1 * min(measured) < predicted <= 1.05 * max(measured)


def test_two_optimizers_stepped_in_turn_end_one_iteration(tmp_path: Path) -> None:
    """AdamW for the matrices and SGD for the rest, stepped one after the other (as runs with a second optimizer
    for some parameters do), profiled without step(): four iterations, not eight (no backward pass lies between an
    iteration's two steps)."""
    _record_llama_like(tmp_path / "llama", marked=False, optimizers=2)
    ran = vtrain_in_process("validate", tmp_path / "llama", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "report" / "metrics.json").read_text())["iterations"] == [1, 2, 3, 4]


def test_a_sharded_data_parallel_run_is_declined(tmp_path: Path) -> None:
    """FSDP's spans in the H100 recording (each iteration's forward under ``FullyShardedDataParallel.forward``, as
    torch's FSDP records it): the run is not read as a replicated one, whose gradients vtrain would all-reduce."""
    trace = json.loads(gzip.decompress((TRACES / "gpu" / "h100-small-eager" / "rank-0.json.gz").read_bytes()))
    steps = [event for event in trace["traceEvents"] if str(event.get("name", "")).startswith("ProfilerStep#")]
    trace["traceEvents"] += [{"ph": "X", "cat": "user_annotation", "name": "FullyShardedDataParallel.forward",
                              "pid": step["pid"], "tid": step["tid"], "ts": step["ts"] + 1, "dur": 1.0}
                             for step in steps]
    folder = tmp_path / "fsdp"
    folder.mkdir()
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    inferred = _inferred(folder, tmp_path)
    assert inferred.config is None and inferred.reason.startswith("a sharded data-parallel run")


def test_traces_without_iteration_marks_say_so(tmp_path: Path) -> None:
    """No ProfilerStep#N spans and no optimizer step either (a training loop of one's own optimizer): the
    micro-batches of one iteration cannot be counted, and that is the reason given (it was "no word embedding")."""
    trace = json.loads(gzip.decompress((TRACES / "gpu" / "h100-small-eager" / "rank-0.json.gz").read_bytes()))
    trace["traceEvents"] = [event for event in trace["traceEvents"]
                            if not str(event.get("name", "")).startswith(("ProfilerStep#", "Optimizer.step#"))]
    folder = tmp_path / "unmarked"
    folder.mkdir()
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    inferred = _inferred(folder, tmp_path)
    assert inferred.config is None and inferred.reason.startswith("no iteration marks")


def test_a_gpu_trace_that_names_no_gpu_is_not_predicted_as_a_cpu_run(tmp_path: Path) -> None:
    """The H100 recording without its deviceProperties and distributedInfo (an exporter that drops Kineto's
    header): its 1,140 kernels were read as a CPU run and predicted 49,380 ms against 16.1 ms measured, with only
    a warning that blamed the run's device, and `"passed": true` (no --max-error was given)."""
    trace = json.loads(gzip.decompress((TRACES / "gpu" / "h100-small-eager" / "rank-0.json.gz").read_bytes()))
    del trace["deviceProperties"], trace["distributedInfo"]
    folder = tmp_path / "nometa"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    ran = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report", "--json")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["model"] is None and "a GPU (cuda) the traces do not name" in summary["model_reason"], summary
    assert summary["max_error"] is None and summary["passed"] is None  # was true at any error without --max-error
    assert "is on cpu" not in ran.stderr, ran.stderr


def test_a_cpu_trace_set_is_not_said_to_have_been_traced_on_a_gpu(tmp_path: Path) -> None:
    """validate's own profile had no device in its metadata: every CPU set heard "the profile  was traced on a GPU
    and the run is on cpu"."""
    ran = vtrain_in_process("validate", TRACES / "t1p2d1", "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "traced on" not in ran.stderr, ran.stderr


def test_the_pipeline_group_is_the_ranks_it_lists_not_its_pg_size(tmp_path: Path) -> None:
    """Ranks 0 and 4 of t2p2d2 (4 layers, 2 a stage), whose pipeline group lists 2 ranks but whose ``pg_size`` says
    4: the stages were taken from ``pg_size`` (4 stages of 2 layers: 8 layers), unlike ingest's and the replay's
    reading of the same group (its ranks); a group beyond the job of 8 ranks is no group at all."""
    folder = tmp_path / "some"
    folder.mkdir()
    for rank in (0, 4):
        shutil.copy(TRACES / "t2p2d2" / f"rank-{rank}.json.gz", folder / f"rank-{rank}.json.gz")
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    profile = load_profile(tmp_path / "profile")
    pipeline = {"pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP"}
    claims_4 = infer_run(profile["cpu_ops"], 8, "cpu", [dict(pipeline, pg_size=4, ranks=[0, 4])])
    assert claims_4.config is not None and claims_4.config.parallelism.pp == 2, claims_4.reason
    assert claims_4.config.model.layers == 4
    beyond = infer_run(profile["cpu_ops"], 8, "cpu", [dict(pipeline, pg_size=4, ranks=[0, 4, 8, 12])])
    assert beyond.config is None or beyond.config.parallelism.pp != 4
