"""LLMCompass' A100-80GB fp16 GPU measurements (its artifact's ``*_A100.csv`` files) as ``op_benchmarks`` rows,
and the two all-reduces of its GPT-3 layer as ``nccl_latency`` rows.

The files have no header line:

* ``matmul_A100.csv``: ``M, K, N, time, TFLOP/s`` with units inside the values (``0.1900ms``, ``101.7124Tflops``);
  a GEMM (M x K) @ (K x N), TFLOP/s = 2 M K N / time.
* ``softmax_A100.csv``, ``layernorm_A100.csv``: ``M, N, throughput`` (softmax / layer norm over rows of N);
  ``gelu_A100.csv``: ``elements, throughput``.
* ``transformer_A100.csv``: seconds per op of one GPT-3 layer (:data:`GPT3_LAYER`: hidden 12288, 96 heads, batch 8,
  sequence 2048, fp16, tensor parallel 4), one per line: QKV GEMM, Q×K, A×V, output projection, FFN up, FFN down,
  softmax, layernorm, layernorm, GELU, all-reduce, all-reduce.

The "throughput" of softmax, layernorm and GELU is :data:`THROUGHPUT_UNIT`: giga-elements per second (elements of
the input tensor per nanosecond), not GB/s. The evidence:

* the transformer file times ops of known size, and read as elements per second they land on the kernel files'
  curves: its GELU (16384 x 12288 = 201M elements in 524.3 µs) runs at 384 G elements/s, between
  ``gelu_A100.csv``'s 360 at 134M elements and 380 at 268M; its softmax (8 x 24 heads x 2048 x 2048 = 805M elements
  in 2801.5 µs) at 287, where ``softmax_A100.csv`` reaches 279 at 32768 x 4096; its layer norm (16384 x 12288 in
  681.6 µs) at 295, within ``layernorm_A100.csv``'s 199 to 386. Read as GB/s of fp16 input and output (4 bytes per
  element) the same rows would say 1536, 1150 and 1181: four times the kernel files' values.
* it is physical: ``gelu_A100.csv`` peaks at 390 for 537M elements, i.e. 1561 GB/s of fp16 read and written, 77 %
  of the A100-80GB's 2039 GB/s; as GB/s it would be 19 % of it for a 1 GiB elementwise op.
* it is the matmul file's convention, work / time / 1e12 = TFLOP/s (checked to its four decimals), with elements /
  time / 1e9. The transformer file's GEMMs agree with the matmul file too (FFN up, 16384 x 12288 x 12288: 17.46 ms
  there, 17.03 ms in ``matmul_A100.csv``), so the two files are the same kind of measurement.

**Rows that time the host, not the kernel, are left out.** The kernel files were timed the same way, from the
host, per call: a call's time is the host's cost of issuing it or the kernel's, whichever is longer. Their small
sizes sit on a flat floor that does not grow with the work: ``gelu_A100.csv`` takes 46.8–48.6 µs per call from
1,024 to 4,194,304 elements (a GELU kernel of 1,024 elements runs in a few µs: vidur times phi-2's, measured with
CUDA events, at 2–3 µs), ``layernorm_A100.csv`` 52.1–54.1 µs up to 4M elements, ``softmax_A100.csv``
13.1–15.5 µs at its smallest. A row measures the kernel only once its time is clearly above that floor: the reader keeps the
rows of a kernel file that take at least :data:`HOST_FLOOR_MARGIN` times the file's smallest time (its host
floor), and drops the others (here gelu 15 of 20 rows, layernorm 16 of 22, softmax 10 of 22). The GEMM file's
smallest matmul (29.6 µs) is a 2.4-GFLOP GEMM, not a floor, and the GPT-3 layer's ops take 0.5 ms or more: both are
kept whole.

The transformer file's compute rows are multiples of 2^-23 s: medians of ``time.time()`` differences, whose
resolution is 2^-22 s today. Its two all-reduces are not: 2890.9 µs each, nccl-tests' one-decimal microseconds,
for the layer's activations (16384 x 12288 fp16 = 384 MiB) among the 4 GPUs, close to what vTrain's nccl-tests
file measured for 384 MiB on 4 A100s (2821 µs).

Rows: ``source`` ``"llmcompass"``, ``dtype`` ``c10::Half``, ``device`` ``A100-80GB``; GEMM ``flops`` = 2 batch m k n
and ``bytes`` = 2 batch (mk + kn + mn); softmax, layernorm and GELU rows have ``elements`` and ``bytes`` = 4
elements (fp16 input and output; affine weights, if the benchmark used any, are not counted), softmax and
layernorm rows also ``m`` (rows) and ``n`` (row length). Each file holds one time per op and says neither how
many runs it summarises nor how: ``median_us`` is that time; ``count``, ``p10_us`` and ``p90_us`` are null. ``tp``
is 4 for the transformer rows and null for the single-GPU kernel files.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from vtrain.collective_cost import with_bandwidths
from vtrain.errors import InputError, some_of, warn_input
from vtrain.importers._read import LINE, csv_rows, numbers
from vtrain.importers._work import HALF, HALF_DTYPE, gemm_work
from vtrain.tables.store import conform

SOURCE = "llmcompass"
DEVICE = "A100-80GB"
#: elements per second of one unit of the softmax / layernorm / GELU "throughput" (G elements/s)
THROUGHPUT_UNIT = 1e9
#: the GPT-3 layer of ``transformer_A100.csv``
GPT3_LAYER = {"batch": 8, "seq": 2048, "hidden": 12288, "heads": 96, "tp": 4}
#: the ops of ``transformer_A100.csv``, in its order
TRANSFORMER_OPS = ["QKV GEMM", "Q×K", "A×V", "output projection", "FFN up", "FFN down", "softmax", "layernorm",
                   "layernorm", "GELU", "all-reduce", "all-reduce"]
FILES = {"matmul": "matmul_A100.csv", "softmax": "softmax_A100.csv", "layernorm": "layernorm_A100.csv",
         "gelu": "gelu_A100.csv", "transformer": "transformer_A100.csv"}

#: a host-timed kernel row measures the kernel when it takes at least this multiple of its file's smallest time
#: (the host's per-call floor): at twice the floor the kernel, not the host, sets the call's time
HOST_FLOOR_MARGIN = 2.0

_US_PER = {"s": 1e6, "ms": 1e3, "us": 1.0, "µs": 1.0, "ns": 1e-3}


def read_llmcompass(folder: str | Path) -> pl.DataFrame:
    """The ``op_benchmarks`` rows of every LLMCompass file in ``folder`` (:data:`FILES`; at least one must be
    there): the matmul, softmax, layernorm and GELU kernel measurements and the ten compute ops of the GPT-3
    layer (its all-reduces are in :func:`read_llmcompass_network`). See the module docstring for the columns."""
    files = _files(folder)
    readers = {"matmul": _matmul, "softmax": _rows_kernel, "layernorm": _rows_kernel, "gelu": _gelu,
               "transformer": _transformer_ops}
    parts = [readers[kind](path, kind) for kind, path in files.items()]
    table = pl.concat(parts, how="diagonal_relaxed").with_columns(
        source=pl.lit(SOURCE), dtype=pl.lit(HALF_DTYPE), device=pl.lit(DEVICE))
    return conform(table, "op_benchmarks")


def read_llmcompass_network(folder: str | Path) -> pl.DataFrame:
    """The all-reduces of ``transformer_A100.csv`` as one ``nccl_latency`` row: all_reduce among the layer's 4 GPUs
    (one node) of its activations (batch x seq x hidden fp16 bytes), ``count`` 2, median/p10/p90 of the two."""
    path = Path(folder) / FILES["transformer"]
    seconds = _transformer_seconds(path)
    layer = GPT3_LAYER
    times_us = [value * 1e6 for label, value in zip(TRANSFORMER_OPS, seconds, strict=True) if label == "all-reduce"]
    frame = pl.DataFrame({
        "collective": ["all_reduce"], "group_size": [layer["tp"]],
        "bytes": [layer["batch"] * layer["seq"] * layer["hidden"] * HALF], "times_us": [times_us],
    }).with_columns(
        count=pl.col("times_us").list.len(), median_us=pl.col("times_us").list.median(),
        p10_us=pl.col("times_us").list.min(), p90_us=pl.col("times_us").list.max(),
        device_type=pl.lit("cuda"), nodes=pl.lit(1), source=pl.lit(SOURCE),
    )
    return conform(with_bandwidths(frame), "nccl_latency")


def _files(folder: str | Path) -> dict[str, Path]:
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("no such folder", folder)
    files = {kind: folder / name for kind, name in FILES.items() if (folder / name).is_file()}
    if not files:
        raise InputError(f"no LLMCompass files ({', '.join(FILES.values())})", folder)
    unread = sorted(path.name for path in folder.iterdir() if path.suffix == ".csv" and path.name not in FILES.values())
    if unread:
        names = ", ".join(FILES.values())
        warn_input(f"{len(unread)} file(s) not read: {some_of(unread)} (vtrain reads LLMCompass's A100 files by "
                   f"their names, {names}: another GPU's measurements need a profile of their own)", folder)
    return files


def _columns(path: Path, names: list[str]) -> pl.DataFrame:
    """The rows of a headerless file, its columns named ``names``."""
    found, rows = csv_rows(path, header=False)
    if len(found) != len(names):
        raise InputError(f"expected {len(names)} columns ({', '.join(names)}); found {len(found)}", path)
    return rows.rename(dict(zip(found, names, strict=True)))


def _matmul(path: Path, kind: str) -> pl.DataFrame:
    rows = _columns(path, ["M", "K", "N", "time", "TFLOP/s"])
    unit = pl.col("time").str.extract(r"^[-+0-9.eE]+\s*(\S+)$", 1)
    bad = rows.filter(unit.is_null() | ~unit.is_in(list(_US_PER)))
    if not bad.is_empty():
        raise InputError(f"line {bad[LINE][0]}: 'time' has no unit of {', '.join(_US_PER)}: {bad['time'][0]!r}",
                         path)
    rows = rows.with_columns(factor=unit.replace_strict(_US_PER, return_dtype=pl.Float64),
                             time=pl.col("time").str.extract(r"^([-+0-9.eE]+)", 1))
    rows = numbers(rows, {"M": pl.Int64, "K": pl.Int64, "N": pl.Int64, "time": pl.Float64}, path)
    return rows.select(
        label=pl.lit(kind), op_class=pl.lit("gemm"), batch=pl.lit(1), m="M", k="K", n="N",
        median_us=pl.col("time") * pl.col("factor"),
    ).with_columns(gemm_work())


def _rows_kernel(path: Path, kind: str) -> pl.DataFrame:
    rows = numbers(_columns(path, ["M", "N", "throughput"]),
                   {"M": pl.Int64, "N": pl.Int64, "throughput": pl.Float64}, path)
    elements = pl.col("M") * pl.col("N")
    return _above_host_floor(rows.select(label=pl.lit(kind), op_class=pl.lit(kind), m="M", n="N", elements=elements,
                                         bytes=2 * HALF * elements, median_us=_throughput_us(elements)), path)


def _gelu(path: Path, kind: str) -> pl.DataFrame:
    rows = numbers(_columns(path, ["elements", "throughput"]), {"elements": pl.Int64, "throughput": pl.Float64}, path)
    return _above_host_floor(rows.select(label=pl.lit(kind), op_class=pl.lit("gelu"), elements="elements",
                                         bytes=2 * HALF * pl.col("elements"),
                                         median_us=_throughput_us(pl.col("elements"))), path)


def _above_host_floor(rows: pl.DataFrame, path: Path) -> pl.DataFrame:
    """The rows of one host-timed kernel file that measure the kernel: at least :data:`HOST_FLOOR_MARGIN` times
    the file's smallest time (see the module docstring); how many were left out is said."""
    kept = rows.filter(pl.col("median_us") >= HOST_FLOOR_MARGIN * pl.col("median_us").min())
    if kept.height < rows.height:
        warn_input(f"{rows.height - kept.height} of its {rows.height} rows take less than {HOST_FLOOR_MARGIN:g}x its "
                   f"smallest time ({rows['median_us'].min():.1f} us), the host's per-call floor, not the kernel's "
                   f"time: left out", path)
    return kept


def _throughput_us(elements: pl.Expr) -> pl.Expr:
    return elements / (pl.col("throughput") * THROUGHPUT_UNIT) * 1e6


def _transformer_seconds(path: Path) -> list[float]:
    rows = numbers(_columns(path, ["seconds"]), {"seconds": pl.Float64}, path)
    if rows.height != len(TRANSFORMER_OPS):
        raise InputError(f"expected {len(TRANSFORMER_OPS)} lines ({', '.join(TRANSFORMER_OPS)}); found "
                         f"{rows.height}", path)
    return rows["seconds"].to_list()


def _transformer_ops(path: Path, kind: str) -> pl.DataFrame:
    b, s, h, tp = (GPT3_LAYER[key] for key in ("batch", "seq", "hidden", "tp"))
    heads = GPT3_LAYER["heads"] // tp  # per GPU
    tokens, head_dim = b * s, h // GPT3_LAYER["heads"]
    gemm = {"op_class": "gemm", "batch": 1, "m": tokens}
    shapes = [
        {**gemm, "k": h, "n": 3 * h // tp},  # QKV GEMM
        {**gemm, "batch": b * heads, "m": s, "k": head_dim, "n": s},  # Q×K
        {**gemm, "batch": b * heads, "m": s, "k": s, "n": head_dim},  # A×V
        {**gemm, "k": h // tp, "n": h},  # output projection
        {**gemm, "k": h, "n": 4 * h // tp},  # FFN up
        {**gemm, "k": 4 * h // tp, "n": h},  # FFN down
        {"op_class": "softmax", "m": b * heads * s, "n": s, "elements": b * heads * s * s},
        {"op_class": "layernorm", "m": tokens, "n": h, "elements": tokens * h},
        {"op_class": "layernorm", "m": tokens, "n": h, "elements": tokens * h},
        {"op_class": "gelu", "elements": tokens * 4 * h // tp},
    ]
    seconds = _transformer_seconds(path)
    frame = pl.DataFrame([{"label": label, **shape, "median_us": value * 1e6}
                          for label, shape, value in zip(TRANSFORMER_OPS, shapes, seconds, strict=False)])
    is_gemm = pl.col("op_class") == "gemm"
    flops, gemm_bytes = gemm_work()
    return frame.with_columns(
        flops=pl.when(is_gemm).then(flops),
        bytes=pl.when(is_gemm).then(gemm_bytes).otherwise(2 * HALF * pl.col("elements")),
        tp=pl.lit(tp),
    )
