"""Time the operations of one GPT decoder layer on the local GPU and write them as vidur ``<model>-mlp.csv`` files.

What it measures: for each model, tensor-parallel degree ``tp`` and token count ``T``, the nine operations that
vidur's MLP profiler times for one of ``tp`` workers of a sequential (non-parallel) GPT block with learned
positions (so no ``attn_rope``), non-gated GELU MLP and no GQA (``n_kv_head = n_head``); h = ``n_embd``,
F = ``n_expanded_embd``:

* ``emb``: ``F.embedding`` of T int64 token ids from a [vocab_size, h] table
* ``input_layernorm``, ``post_attention_layernorm``: ``F.layer_norm`` over [T, h] with weight and bias
* ``attn_pre_proj`` (QKV): ``F.linear`` [T, h] x [3h/tp, h]^T
* ``attn_post_proj``: ``F.linear`` [T, h/tp] x [h, h/tp]^T
* ``mlp_up_proj``: ``F.linear`` [T, h] x [F/tp, h]^T
* ``mlp_act``: ``F.gelu`` on [T, F/tp]
* ``mlp_down_proj``: ``F.linear`` [T, F/tp] x [h, F/tp]^T
* ``add`` (residual): ``x + y`` on [T, h]

The linears have no bias (vtrain's importer counts none). These are the shapes vtrain's importer
(``vtrain/importers/vidur.py``, ``read_vidur_compute``) gives each column, so the file needs no other description.

How: each op runs ``--warmup`` times, then ``--reps`` times, each call bracketed by its own pair of
``torch.cuda.Event(enable_timing=True)`` (vidur's CUDA-event timing). Every op is a single kernel launch. So that
the events measure the kernel and not the CPU's launch gap before it, the ``reps`` (event, op, event) triples are
queued behind a ``torch.cuda._sleep`` spin of a few milliseconds: the GPU finds them all waiting and runs them
back to back. Nothing is flushed between calls (vidur flushes nothing either): weights that fit in L2 are read
from it on repeated calls. On ``--device cpu`` (a smoke test) each call is timed with ``time.perf_counter``.
Statistics per op: min, max, mean, median and the population standard deviation (``statistics.pstdev``, as
numpy's ``np.std``, which vidur uses), in milliseconds like vidur's.

Output: ``OUT/<model>-mlp.csv`` in vidur's format: the ``time_stats.<op>.{min,max,mean,median,std}`` columns in
vidur's op order, then ``n_head, n_kv_head, n_embd, n_expanded_embd, vocab_size, use_gated_mlp, num_tokens,
num_tensor_parallel_workers``; rows by ascending tp, then descending token count, as vidur writes them. vidur's
format has no dtype column: ``--dtype`` (fp16 by default, vidur's) is recorded only in ``OUT/PROVENANCE.md``,
with the GPU, torch and CUDA versions, reps and date; vtrain's importer reads every file as fp16. Read the files
with ``vtrain fit --vidur-compute OUT`` (a folder stands for its .csv files; the option is repeatable). The
importer takes the GPU from a folder in the path naming ``a100``, ``h100`` or ``a40``; other GPUs get the fitted
profile's ``--device``.

Run: ``python validators/gpu/layer_kernels.py --out DIR`` (defaults: GPT-3-shaped models from 1.3B to
MT-NLG 530B, tp 1,2,4,8, T 128..16384). ``--max-seconds`` bounds the run: once spent, the remaining
(model, tp) pairs are skipped with a warning and each file holds the rows measured. Needs only torch.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

#: vidur's op columns of a sequential block without rotary embeddings, in vidur's order
OPS = ["emb", "input_layernorm", "attn_pre_proj", "attn_post_proj", "post_attention_layernorm", "mlp_up_proj",
       "mlp_act", "mlp_down_proj", "add"]
STATS = ["min", "max", "mean", "median", "std"]
SHAPE_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers"]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_MODELS = ("gpt-1.3b:16:2048:8192:51200,gpt-2.7b:32:2560:10240:51200,gpt-6.7b:32:4096:16384:51200,"
                  "gpt-13b:40:5120:20480:51200,gpt-30b:56:7168:28672:51200,gpt-175b:96:12288:49152:51200,"
                  "mt-nlg-530b:128:20480:81920:51200")
DEFAULT_TOKENS = "128,256,512,1024,2048,4096,8192,16384"
#: GPU time the spin ahead of each op's timed calls should cover, per call (generous for a CPU launch of
#: two events and one op)
BACKLOG_MS_PER_CALL = 0.1


@dataclass(frozen=True)
class Model:
    """One decoder layer's shape."""

    name: str
    heads: int
    hidden: int
    ffn: int
    vocab: int


@dataclass
class Layer:
    """The weights and largest inputs of one of ``tp`` workers of a model's layer; ops slice the first T rows."""

    ids: torch.Tensor  # [T_max] int64
    x: torch.Tensor  # [T_max, h]: layer norm, QKV and up-projection input, and one addend
    y: torch.Tensor  # [T_max, h]: the residual addend
    attn: torch.Tensor  # [T_max, h/tp]: attention output
    act: torch.Tensor  # [T_max, F/tp]: up-projection output
    table: torch.Tensor  # [vocab, h]
    norm_weight: torch.Tensor  # [h]
    norm_bias: torch.Tensor  # [h]
    w_qkv: torch.Tensor  # [3h/tp, h]
    w_out: torch.Tensor  # [h, h/tp]
    w_up: torch.Tensor  # [F/tp, h]
    w_down: torch.Tensor  # [h, F/tp]


def parse_models(text: str) -> list[Model]:
    """``NAME:heads:hidden:ffn:vocab,...`` as models, checking that heads divide hidden."""
    models = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        fields = item.split(":")
        if len(fields) != 5:
            raise SystemExit(f"--models: {item!r} is not NAME:heads:hidden:ffn:vocab")
        try:
            heads, hidden, ffn, vocab = (int(field) for field in fields[1:])
        except ValueError:
            raise SystemExit(f"--models: {item!r} has a size that is not an integer") from None
        if min(heads, hidden, ffn, vocab) <= 0 or hidden % heads:
            raise SystemExit(f"--models: {item!r}: sizes must be positive and heads must divide hidden")
        models.append(Model(fields[0], heads, hidden, ffn, vocab))
    return models


def parse_ints(text: str, option: str) -> list[int]:
    """A comma-separated list of positive integers."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"{option}: {text!r} is not a list of integers") from None
    if not values or min(values) <= 0:
        raise SystemExit(f"{option}: give positive integers")
    return values


def build_layer(model: Model, tp: int, max_tokens: int, dtype: torch.dtype, device: torch.device) -> Layer:
    """Random weights and inputs for one of ``tp`` workers (values scaled so that fp16 GEMMs stay finite)."""
    h, shard_h, shard_f = model.hidden, model.hidden // tp, model.ffn // tp

    def activation(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=device)

    def rand(*shape: int) -> torch.Tensor:
        return activation(*shape) * 0.02

    return Layer(
        ids=torch.randint(0, model.vocab, (max_tokens,), device=device),
        x=activation(max_tokens, h), y=activation(max_tokens, h), attn=activation(max_tokens, shard_h),
        act=activation(max_tokens, shard_f),
        table=rand(model.vocab, h), norm_weight=torch.ones(h, dtype=dtype, device=device),
        norm_bias=torch.zeros(h, dtype=dtype, device=device),
        w_qkv=rand(3 * shard_h, h), w_out=rand(h, shard_h), w_up=rand(shard_f, h), w_down=rand(h, shard_f),
    )


def layer_ops(layer: Layer, tokens: int) -> dict[str, Callable[[], torch.Tensor]]:
    """The op calls for the first ``tokens`` rows, keyed and ordered as :data:`OPS`."""
    ids, x, y, attn, act = (t[:tokens] for t in (layer.ids, layer.x, layer.y, layer.attn, layer.act))
    shape = (layer.x.shape[1],)

    def norm() -> torch.Tensor:
        return F.layer_norm(x, shape, layer.norm_weight, layer.norm_bias)

    return {
        "emb": lambda: F.embedding(ids, layer.table),
        "input_layernorm": norm,
        "attn_pre_proj": lambda: F.linear(x, layer.w_qkv),
        "attn_post_proj": lambda: F.linear(attn, layer.w_out),
        "post_attention_layernorm": norm,
        "mlp_up_proj": lambda: F.linear(x, layer.w_up),
        "mlp_act": lambda: F.gelu(act),
        "mlp_down_proj": lambda: F.linear(act, layer.w_down),
        "add": lambda: x + y,
    }


class Timer:
    """Times single calls of an op: CUDA events behind a spin on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device, reps: int, warmup: int) -> None:
        self.device, self.reps, self.warmup = device, reps, warmup
        self.cuda = device.type == "cuda"
        self.spin_cycles = self._spin_cycles(BACKLOG_MS_PER_CALL * reps) if self.cuda else 0

    def _spin_cycles(self, milliseconds: float) -> int:
        """GPU clock cycles ``torch.cuda._sleep`` takes to spin for about ``milliseconds`` (0 if unavailable)."""
        if not hasattr(torch.cuda, "_sleep"):
            return 0
        probe = 1_000_000
        torch.cuda._sleep(probe)  # first call: module load
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        torch.cuda.synchronize()
        return int(probe * milliseconds / max(start.elapsed_time(end), 1e-3))

    def times_ms(self, op: Callable[[], torch.Tensor]) -> list[float]:
        """``reps`` single-call times of ``op`` in milliseconds, after ``warmup`` calls."""
        for _ in range(self.warmup):
            op()
        if not self.cuda:
            return [self._cpu_call_ms(op) for _ in range(self.reps)]
        torch.cuda.synchronize()
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(self.reps)]
        if self.spin_cycles:
            torch.cuda._sleep(self.spin_cycles)  # queue the timed calls while the GPU is busy
        for start, end in pairs:
            start.record()
            op()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in pairs]

    @staticmethod
    def _cpu_call_ms(op: Callable[[], torch.Tensor]) -> float:
        start = time.perf_counter()
        op()
        return (time.perf_counter() - start) * 1e3


def summary(times: list[float]) -> list[float]:
    """min, max, mean, median and population standard deviation, as :data:`STATS`."""
    return [min(times), max(times), statistics.fmean(times), statistics.median(times), statistics.pstdev(times)]


def header() -> list[str]:
    """vidur's column names."""
    return [f"time_stats.{op}.{stat}" for op in OPS for stat in STATS] + SHAPE_COLUMNS


def measure_rows(model: Model, tp: int, tokens: list[int], timer: Timer, dtype: torch.dtype,
                 device: torch.device) -> list[list[object]]:
    """One CSV row per token count (descending, as vidur) for one of ``tp`` workers of ``model``."""
    layer = build_layer(model, tp, max(tokens), dtype, device)
    rows = []
    for count in sorted(tokens, reverse=True):
        ops = layer_ops(layer, count)
        stats = [value for op in OPS for value in summary(timer.times_ms(ops[op]))]
        rows.append(stats + [model.heads, model.heads, model.hidden, model.ffn, model.vocab, False, count, tp])
    del layer
    return rows


def profile_model(model: Model, tps: list[int], tokens: list[int], timer: Timer, dtype: torch.dtype,
                  device: torch.device, deadline: float) -> tuple[list[list[object]], list[int]]:
    """Rows for every tp that divides the model's heads and FFN width, by ascending tp, until ``deadline``
    (``time.monotonic``); also the tp values measured."""
    rows: list[list[object]] = []
    done = []
    for tp in sorted(tps):
        if model.heads % tp or model.ffn % tp:
            warn(f"{model.name}: tp {tp} does not divide {model.heads} heads and FFN {model.ffn}; skipped")
            continue
        if time.monotonic() > deadline:
            warn(f"{model.name}: --max-seconds spent; tp {tp} and above skipped")
            break
        rows.extend(measure_rows(model, tp, tokens, timer, dtype, device))
        done.append(tp)
        release(device)
    return rows, done


def release(device: torch.device) -> None:
    """Hand cached GPU memory back between (model, tp) pairs."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def write_csv(path: Path, rows: list[list[object]]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")  # vidur's files end lines with LF
        writer.writerow(header())
        writer.writerows(rows)


def write_provenance(out: Path, args: argparse.Namespace, device: torch.device, timer: Timer,
                     written: list[tuple[Path, str]], skipped: list[str]) -> None:
    """``OUT/PROVENANCE.md``: where and how the CSVs were measured (vidur's format has no room for it)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs)"
        timing = (f"CUDA events around each call, queued behind a {timer.spin_cycles}-cycle torch.cuda._sleep spin"
                  if timer.spin_cycles else "CUDA events around each call (no spin: torch.cuda._sleep missing)")
    else:
        gpu, timing = "none (CPU)", "time.perf_counter around each call"
    lines = [
        "# Layer kernel timings (vidur mlp.csv format)", "",
        f"- date: {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}",
        f"- device: {gpu}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}",
        f"- dtype: {args.dtype} (the CSVs have no dtype column; vtrain's importer reads them as fp16)",
        f"- warm-up calls {args.warmup}, timed calls {args.reps} per op; statistics in ms, std population",
        f"- timing: {timing}",
        f"- command: {' '.join(sys.argv)}", "",
        "Files:", "", *(f"- {path.name}: {description}" for path, description in written), "",
    ]
    if skipped:
        lines += ["Skipped:", "", *(f"- {line}" for line in skipped), ""]
    (out / "PROVENANCE.md").write_text("\n".join(lines))


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for <model>-mlp.csv and PROVENANCE.md")
    parser.add_argument("--device", default="cuda", help="torch device (cuda, cuda:1, cpu)")
    parser.add_argument("--models", default=DEFAULT_MODELS, help="NAME:heads:hidden:ffn:vocab,... (measured in "
                                                                 "this order)")
    parser.add_argument("--tp", default="1,2,4,8", help="tensor-parallel degrees (those not dividing heads "
                                                        "are skipped)")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help="token counts T")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per op")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls per op before them")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--max-seconds", type=float, default=240.0,
                        help="measuring budget; once spent, remaining models (and tp values) are skipped")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be at least 1 and --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    models, tps = parse_models(args.models), parse_ints(args.tp, "--tp")
    tokens = sorted(set(parse_ints(args.tokens, "--tokens")))
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    deadline = began + args.max_seconds
    timer = Timer(device, args.reps, args.warmup)
    written: list[tuple[Path, str]] = []
    skipped: list[str] = []
    for model in models:
        if time.monotonic() > deadline:
            warn(f"--max-seconds ({args.max_seconds:g}) spent; {model.name} skipped")
            skipped.append(f"{model.name} (time budget spent)")
            continue
        start = time.monotonic()
        rows, done = profile_model(model, tps, tokens, timer, dtype, device, deadline)
        missing = [tp for tp in tps if tp not in done]
        if missing:
            skipped.append(f"{model.name} tp {','.join(map(str, missing))}")
        if not rows:
            continue
        path = args.out / f"{model.name}-mlp.csv"
        write_csv(path, rows)
        written.append((path, f"{len(rows)} rows, tp {','.join(map(str, done))}, T {tokens[0]}..{tokens[-1]}"))
        now = time.monotonic()
        print(f"[{now - began:7.1f} s] {model.name}: {len(rows)} rows in {now - start:.1f} s", file=sys.stderr,
              flush=True)
    write_provenance(args.out, args, device, timer, written, skipped)
    for path, description in written:
        print(f"wrote {path} ({description})")
    print(f"wrote {args.out / 'PROVENANCE.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
