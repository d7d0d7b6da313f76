"""vidur's A100 profiling tables (``data/profiling`` of the vidur artifact) as ``nccl_latency`` and
``op_benchmarks`` rows.

Times in vidur's CSVs are milliseconds: a 1-token Llama-2-7B QKV projection reads 0.065, and streaming its
100 MB of weights takes at least 49 µs at the A100's 2 TB/s; the tables here hold microseconds.

Network (``network/all_reduce.csv``, ``network/send_recv.csv``): ``size`` is the message in bytes (read as
elements of fp16, the 2-GPU NVLink send/recv would move 456 GB/s, beyond the link's 300 GB/s); ``num_workers``
is the group, spread over ``ceil(num_workers / devices_per_node)`` nodes. vidur times each size
:data:`COLLECTIVE_SAMPLES` times and keeps min/max/mean/median/std (every row of the shipped files satisfies
3 x mean = min + median + max): ``count`` is 3, ``median_us`` the median and ``p10_us``/``p90_us`` the min and
max (with three samples these bound the true percentiles).

Compute (``compute/a100/<model>/mlp.csv``): one row per (model, ``num_tokens``, ``num_tensor_parallel_workers``) with a
``time_stats.<op>.{min,max,mean,median,std}`` group per operation of vidur's profiled decoder layer. Each group
becomes ``op_benchmarks`` rows, shaped as vidur builds the layer for one of ``tp`` workers (T = num_tokens,
h = n_embd, d = h / n_head, F = n_expanded_embd; ``elements`` counts the output):

* ``attn_pre_proj`` (QKV), gemm: m=T, k=h, n=(n_head + 2 n_kv_head) d / tp
* ``attn_post_proj``, gemm: m=T, k=n_head d / tp, n=h
* ``mlp_up_proj``, gemm: m=T, k=h, n=2F/tp when gated (gate and up in one GEMM), else F/tp
* ``mlp_down_proj``, gemm: m=T, k=F/tp, n=h
* ``input_layernorm``, ``post_attention_layernorm``, layernorm (RMSNorm for the Llamas): m=T, n=h, elements T h;
  bytes of the input, the weight and the output (a LayerNorm's bias is not counted)
* ``mlp_act``: SiLU-and-mul when gated (elementwise; elements T F/tp, input 2 T F/tp), else GELU (gelu: vidur's
  non-gated models use it; elements and input T F/tp); bytes of the input and the output
* ``add`` (residual), elementwise: elements T h; bytes of two inputs and the output. In a parallel block (phi-2's:
  attention and MLP both read the one layer norm's output, so the file times no ``post_attention_layernorm``) it
  adds the attention output, the MLP output and the residual: two such adds (measured: about twice the Llamas' time
  per element)
* ``attn_rope``, elementwise: elements T (n_head + n_kv_head) d / tp (q and k); bytes of q and k in and out and of
  the int64 positions
* ``emb``, embedding: elements T h; bytes of the int64 token ids, the T rows read and the output

GEMM ``flops`` = 2 m k n, ``bytes`` = 2 (mk + kn + mn). Other ``time_stats`` groups become ``other`` rows without
shape. vidur runs the layer in fp16 (``dtype`` ``c10::Half``) on the GPU its profiling folder names
(:func:`device_of_path`: ``a100``, its A100-80GB DGX nodes; ``h100``; ``h200``; ``a40``), which the kernel model's
roofline depends on; a file whose path names none has no ``device`` (then the fitted profile's own);
the sample count is not in the file (``count`` null); ``median_us`` is the median, ``p10_us``/``p90_us`` the min
and max.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from vtrain.collective_cost import with_bandwidths
from vtrain.errors import InputError, warn_input
from vtrain.importers._read import LINE, csv_rows, numbers, positive, require_columns
from vtrain.importers._work import HALF, HALF_DTYPE, gemm_work
from vtrain.tables.store import conform

SOURCE = "vidur"
#: vidur's profiling folders (``data/profiling/compute/<device>/...``) -> the datasheet GPU they ran on
DEVICES = {"a100": "A100-80GB", "h100": "H100", "h200": "H200", "a40": "A40"}
#: how many times vidur's collective profiler times each message size
COLLECTIVE_SAMPLES = 3
#: vidur's collective names -> vtrain's
COLLECTIVES = {"all_reduce": "all_reduce", "send_recv": "send_recv"}

_MS = 1e3  # microseconds per millisecond
_INT64 = 8  # bytes of a token id or position
_COMPUTE_COLUMNS = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "num_tokens", "num_tensor_parallel_workers"]


def read_vidur_network(path: str | Path) -> pl.DataFrame:
    """vidur's ``all_reduce.csv`` or ``send_recv.csv`` as ``nccl_latency`` rows (see the module docstring).

    ``group_size`` is ``num_workers`` (2 for send/recv), ``nodes`` ``ceil(num_workers / devices_per_node)``,
    ``source`` ``"vidur"``.
    """
    path = Path(path)
    _, rows = csv_rows(path)
    rows = numbers(rows, {"num_workers": pl.Int64, "size": pl.Int64, "devices_per_node": pl.Int64}, path)
    positive(rows, ["num_workers", "devices_per_node"], path)
    require_columns(rows, ["collective"], path)
    unknown = rows.filter((~pl.col("collective").is_in(list(COLLECTIVES))).fill_null(True))
    if not unknown.is_empty():
        name = unknown["collective"][0]
        problem = "'collective' is missing" if name is None else (
            f"unknown collective {name!r} (known: {', '.join(COLLECTIVES)})")
        raise InputError(f"line {unknown[LINE][0]}: {problem}", path)
    parts = []
    for (name,), part in rows.group_by("collective", maintain_order=True):
        stat = {kind: f"time_stats.{name}.{kind}" for kind in ("min", "median", "max")}
        part = numbers(part, dict.fromkeys(stat.values(), pl.Float64), path)
        parts.append(part.select(
            collective=pl.lit(COLLECTIVES[name]),
            group_size=pl.lit(2) if name == "send_recv" else pl.col("num_workers"),
            bytes=pl.col("size"),
            nodes=(pl.col("num_workers") + pl.col("devices_per_node") - 1) // pl.col("devices_per_node"),
            count=pl.lit(COLLECTIVE_SAMPLES), median_us=pl.col(stat["median"]) * _MS,
            p10_us=pl.col(stat["min"]) * _MS, p90_us=pl.col(stat["max"]) * _MS,
            device_type=pl.lit("cuda"), source=pl.lit(SOURCE),
        ))
    return conform(with_bandwidths(pl.concat(parts)), "nccl_latency")


def read_vidur_compute(path: str | Path) -> pl.DataFrame:
    """vidur's per-model ``mlp.csv`` as ``op_benchmarks`` rows, one per operation and CSV row (see the module
    docstring for the shapes, elements and bytes); ``tp`` is ``num_tensor_parallel_workers``."""
    path = Path(path)
    names, rows = csv_rows(path)
    rows = numbers(rows, dict.fromkeys(_COMPUTE_COLUMNS, pl.Int64), path)
    positive(rows, _COMPUTE_COLUMNS, path)
    rows = _with_gated(rows, path)
    _check_divisible(rows, path)
    ops = list(dict.fromkeys(name.split(".")[1] for name in names
                             if name.startswith("time_stats.") and name.count(".") == 2))
    if not ops:
        raise InputError("no time_stats.<op>.<statistic> columns", path)
    # a parallel block: the file times the layer's input norm but no post-attention norm (a file timing neither
    # says nothing of its block, and is read as a serial one)
    parallel = "input_layernorm" in ops and "post_attention_layernorm" not in ops
    parts = []
    for op in ops:
        stat = {kind: f"time_stats.{op}.{kind}" for kind in ("min", "median", "max")}
        timed = numbers(rows, dict.fromkeys(stat.values(), pl.Float64), path)
        op_class, shape = _shape(op, parallel)
        part = timed.select(
            label=pl.lit(op), op_class=op_class, **shape, tp=pl.col("num_tensor_parallel_workers"),
            median_us=pl.col(stat["median"]) * _MS, p10_us=pl.col(stat["min"]) * _MS,
            p90_us=pl.col(stat["max"]) * _MS,
        )
        is_gemm = "k" in shape
        parts.append(part.with_columns(batch=pl.lit(1)).with_columns(gemm_work()) if is_gemm else part)
    device = device_of_path(path)
    if device is None:
        warn_input(f"which GPU vidur profiled it on is not in its path (vidur keeps compute/<gpu>/<model>/mlp.csv, "
                   f"<gpu> one of {', '.join(DEVICES)}): taken as the profile's own (--device)", path)
    table = pl.concat(parts, how="diagonal_relaxed").with_columns(
        source=pl.lit(SOURCE), dtype=pl.lit(HALF_DTYPE), device=pl.lit(device, dtype=pl.String))
    return conform(table, "op_benchmarks")


def device_of_path(path: Path) -> str | None:
    """The GPU vidur profiled ``path`` on, by the device folder its path names (the nearest one: vidur's
    ``compute/h100/...``, this project's ``vidur-a100/``); None when it names none: an H100 file read as an
    A100's would put its kernels on the wrong roofline."""
    for part in reversed(Path(path).resolve().parts):
        for name, device in DEVICES.items():
            if name in part.lower().split("-") or part.lower() == name:
                return device
    return None


def _with_gated(rows: pl.DataFrame, path: Path) -> pl.DataFrame:
    require_columns(rows, ["use_gated_mlp"], path)
    gated = pl.col("use_gated_mlp").str.to_lowercase().replace_strict(
        {"true": True, "false": False, "1": True, "0": False}, default=None, return_dtype=pl.Boolean)
    bad = rows.filter(gated.is_null())
    if not bad.is_empty():
        raise InputError(f"line {bad[LINE][0]}: 'use_gated_mlp' is not True or False: {bad['use_gated_mlp'][0]!r}",
                         path)
    return rows.with_columns(gated)


def _check_divisible(rows: pl.DataFrame, path: Path) -> None:
    tp = pl.col("num_tensor_parallel_workers")
    bad = rows.filter((pl.col("n_embd") % pl.col("n_head") != 0) | (pl.col("n_head") % tp != 0)
                      | (pl.col("n_kv_head") % tp != 0) | (pl.col("n_expanded_embd") % tp != 0))
    if not bad.is_empty():
        raise InputError(f"line {bad[LINE][0]}: n_embd is not divisible by n_head, or n_head, n_kv_head or "
                         f"n_expanded_embd by num_tensor_parallel_workers", path)


def _shape(op: str, parallel: bool) -> tuple[pl.Expr, dict[str, pl.Expr]]:
    """The op class and the shape columns (m, k, n for GEMMs; elements, bytes otherwise) of one vidur op;
    ``parallel``: the layer is a parallel block (its residual add sums three tensors)."""
    tokens, hidden, tp = pl.col("num_tokens"), pl.col("n_embd"), pl.col("num_tensor_parallel_workers")
    heads, kv_heads, gated = pl.col("n_head"), pl.col("n_kv_head"), pl.col("use_gated_mlp")
    head_dim = hidden // heads
    ffn = pl.col("n_expanded_embd") // tp
    if op == "attn_pre_proj":
        return pl.lit("gemm"), {"m": tokens, "k": hidden, "n": (heads + 2 * kv_heads) * head_dim // tp}
    if op == "attn_post_proj":
        return pl.lit("gemm"), {"m": tokens, "k": heads * head_dim // tp, "n": hidden}
    if op == "mlp_up_proj":
        return pl.lit("gemm"), {"m": tokens, "k": hidden, "n": pl.when(gated).then(2 * ffn).otherwise(ffn)}
    if op == "mlp_down_proj":
        return pl.lit("gemm"), {"m": tokens, "k": ffn, "n": hidden}
    if op in ("input_layernorm", "post_attention_layernorm"):
        return pl.lit("layernorm"), {"m": tokens, "n": hidden, "elements": tokens * hidden,
                                     "bytes": HALF * (2 * tokens * hidden + hidden)}
    if op == "mlp_act":
        return pl.when(gated).then(pl.lit("elementwise")).otherwise(pl.lit("gelu")), {
            "elements": tokens * ffn,
            "bytes": HALF * tokens * ffn * pl.when(gated).then(3).otherwise(2)}
    if op == "add":
        adds = 2 if parallel else 1  # a + b + c runs as two two-input adds
        return pl.lit("elementwise"), {"elements": adds * tokens * hidden,
                                       "bytes": adds * HALF * 3 * tokens * hidden}
    if op == "attn_rope":
        rotated = tokens * (heads + kv_heads) * head_dim // tp
        return pl.lit("elementwise"), {"elements": rotated, "bytes": HALF * 2 * rotated + _INT64 * tokens}
    if op == "emb":
        return pl.lit("embedding"), {"elements": tokens * hidden,
                                     "bytes": _INT64 * tokens + HALF * 2 * tokens * hidden}
    return pl.lit("other"), {}
