"""Measured iteration times, one run a row, and the run configs they were measured for.

vTrain's ``ground_truth_single.csv`` (1,440 single-node GPT runs on up to 8 A100s with Megatron-DeepSpeed) has the
columns of :data:`VTRAIN_COLUMNS`; its multi-node tables add a leading ``Parameters (billion)`` column. A table from
another cluster, a training log or a paper may name and order its columns otherwise: every column is found by its
name, in any order, among the names of :data:`SHAPE_COLUMNS` (``hidden size`` or ``hidden``, ``tensor parallelism``
or ``tp``, ...), names matched without regard to case, surrounding whitespace, spaces, hyphens or underscores. One
of ``# GPUs`` and ``data parallelism`` may be left out (the other, with t and p, gives it). The measured time is
one of :data:`TIME_COLUMNS`: milliseconds or seconds per iteration, a throughput in samples or tokens per second
(read as ``global batch [x sequence] / throughput``; tokens per second per GPU over all the row's GPUs), achieved
TFLOP/s per GPU (the FLOPs the GPUs ran, as Narayanan et al. count them, over their rate: :func:`_milliseconds`) or
model TFLOP/s per GPU (the same count without recomputation); where a table has several, the first of that list is
read. A file may start with a UTF-8 byte-order mark, and may be a Markdown pipe table (one copied from a
documentation page: :func:`~vtrain.importers._read.csv_rows`) or a Megatron-LM training log (its runs' arguments
and logged iteration times: :mod:`vtrain.importers.megatron_log`).

A table may say more about what ran, in optional columns (:data:`OPTIONAL_COLUMNS`): schedule, virtual stages
(Megatron's virtual pipeline size, ``VP``: more than one, and no schedule column, is the interleaved schedule),
vocabulary, recomputation, gradient all-reduce overlap, sequence parallelism, distributed optimizer, GPUs per node,
inter-node Gbit/s, framework, precision (fp16, bf16, fp32), attention (eager, flash), CUDA graphs (each layer
replayed from graphs: true or false), the MLP's width (``ffn hidden size``), key/value heads (``kv heads``,
grouped-query attention), the MLP (``mlp``: gelu, swiglu), the norm (``norm``: layernorm, rmsnorm), the positions
(``position``: learned, rope), the linear layers' biases (``bias``, ``qkv bias``: true or false), whether the output
projection is the word embedding (``tie embeddings``), the layers of each pipeline stage where a run split them
unevenly, and the gradient accumulation steps (``GA``, checked against the shape). Where a column is absent or a
cell empty (or ``-``, ``n/a``: what published tables write where a value does not apply), the command's flags (or
vTrain's settings) apply; an inter-node rate of ``0`` counts as empty. A row whose context parallelism (``CP``),
expert parallelism (``EP``) or experts are more than 1 ran what vtrain does not simulate and is refused. A column
that is none of these (a job id, notes, a pandas index) is left out with a warning.

Rows that cannot be a measurement (a measured time that is not a positive number, a shape no one can train,
e.g. 2.4e10 layers, judged by the physical bounds of :mod:`vtrain.limits`, an inter-node rate no link has) are kept
with the reason in ``problem`` and are never simulated: :func:`row_problem`.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from vtrain.errors import InputError, InputWarning, some_of, warn_input
from vtrain.flops import LayerShape, hardware_flops
from vtrain.importers._read import LINE, header_names, read_text, text_rows, unique_names
from vtrain.importers.megatron_log import is_megatron_log, megatron_log_rows, unreadable_log
from vtrain.limits import (
    INTEGER_BOUNDS,
    MAX_ITERATION_MS,
    MAX_MICRO_BATCHES,
    MIN_ITERATION_MS,
    real_problem,
    shown,
)
from vtrain.runconfig import (
    HardwareConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
    framework_named,
    word_named,
)

if TYPE_CHECKING:
    from vtrain.architectures import Architecture

#: vTrain's column names (its single-node table, in its order)
VTRAIN_COLUMNS = ["# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
                  "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
                  "iteration time (ms)"]
#: a run's shape: normalised name -> the column names accepted (vTrain's first)
SHAPE_COLUMNS = {
    "gpus": ("# GPUs", "GPUs", "num GPUs", "number of GPUs", "world size"),
    "global_batch": ("global batch", "global batch size", "gbs", "batch size"),
    "micro_batch": ("micro batch", "micro batch size", "mbs"),
    "hidden": ("hidden size", "hidden", "hidden dim", "d model"),
    "heads": ("attention heads", "heads", "num attention heads", "attention heads count"),
    "layers": ("# layers", "layers", "num layers", "number of layers"),
    "seq": ("sequence length", "seq", "seq length", "seq len"),
    "tp": ("tensor parallelism", "tp", "tensor parallel size", "tensor model parallel size", "tp size", "tp degree",
           "tensor parallel degree"),
    "dp": ("data parallelism", "dp", "data parallel size", "dp size", "dp degree", "data parallel degree"),
    "pp": ("pipeline parallelism", "pp", "pipeline parallel size", "pipeline model parallel size", "pp size",
           "pp degree", "pipeline parallel degree"),
}
#: of the shape columns, those a table may leave out: each follows from the other with t and p
DERIVABLE = ("gpus", "dp")
#: the measured time: its form -> the column names accepted, in the order a table's columns are preferred
TIME_COLUMNS = {
    "ms": ("iteration time (ms)", "iteration ms", "iteration time ms", "elapsed time per iteration (ms)",
           "step time (ms)", "time per iteration (ms)", "time/iter (ms)", "iter time (ms)"),
    "s": ("iteration time (s)", "iteration s", "iteration time s", "seconds per iteration", "step time (s)",
          "time per iteration (s)", "time/iter (s)", "iter time (s)", "train step timing (s)"),
    "samples/s": ("samples per second", "samples/s", "samples per sec", "sequences per second"),
    "tokens/s": ("tokens per second", "tokens/s", "tokens per sec"),
    "tokens/s/gpu": ("tokens per second per gpu", "tokens/s/gpu", "tokens/sec/gpu", "tokens per sec per gpu",
                     "tokens/s per gpu", "tokens per gpu per second"),
    "tflops/gpu": ("tflop/s per gpu", "tflops per gpu", "teraflop/s per gpu", "achieved teraflop/s per gpu",
                   "achieved tflop/s per gpu"),
    "model tflops/gpu": ("model tflop/s per gpu", "model tflops per gpu", "model tflop/sec/gpu",
                         "model tflops/gpu", "model tflop/s/gpu", "model teraflop/s per gpu"),
}
#: how each form of measured time becomes an iteration time, as reports say it
TIME_READINGS = {
    "ms": "iteration times in ms, as measured",
    "s": "iteration times in s, as measured",
    "samples/s": "throughputs in samples per second, read as global batch / throughput",
    "tokens/s": "throughputs in tokens per second, read as global batch x sequence / throughput",
    "tokens/s/gpu": "throughputs in tokens per second per GPU, read as global batch x sequence / (throughput x GPUs)",
    "tflops/gpu": ("achieved TFLOP/s per GPU, read as the FLOPs the GPUs ran (Narayanan et al., SC21, Eq. 3, with "
                   "each row's recomputation and vocabulary) over their rate"),
    "model tflops/gpu": ("model TFLOP/s per GPU, read as the model's FLOPs (SC21 Eq. 3 without recomputation, with "
                         "each row's vocabulary) over their rate"),
}
#: the time forms that are FLOP rates, and their unit as a row's problem says it
_FLOP_RATES = {"tflops/gpu": "TFLOP/s per GPU", "model tflops/gpu": "model TFLOP/s per GPU"}
PARAMETERS_COLUMN = "Parameters (billion)"
PARAMETERS_COLUMNS = (PARAMETERS_COLUMN, "parameters (B)", "params (B)", "params billion")
#: optional columns (normalised name -> the names accepted, compared by :func:`_key`) and their types
OPTIONAL_COLUMNS = {
    # a published architecture by name (vtrain.architectures: LLAMA3_70B, gpt-3-175b), giving the shape columns a
    # row leaves out
    "model": (("model", "model name", "architecture"), pl.String),
    "schedule": (("schedule", "pipeline schedule"), pl.String),
    "virtual_stages": (("virtual stages", "virtual pipeline stages", "vp", "virtual pipeline parallel size",
                        "virtual pipeline model parallel size"), pl.Int64),
    "vocab": (("vocabulary", "vocab", "vocab size", "vocabulary size"), pl.Int64),
    "recompute": (("recompute", "recomputation", "activation recomputation"), pl.String),
    "dp_overlap": (("gradient all-reduce overlap", "dp overlap", "overlap grad reduce"), pl.Boolean),
    "sequence_parallel": (("sequence parallelism", "sequence parallel"), pl.Boolean),
    "distributed_optimizer": (("distributed optimizer", "use distributed optimizer", "zero1"), pl.Boolean),
    "gpus_per_node": (("gpus per node", "node size"), pl.Int64),
    "inter_node_gbps": (("inter-node gbps", "inter node gbit/s", "inter-node gbit/s"), pl.Float64),
    "framework": (("framework",), pl.String),
    "precision": (("precision", "dtype"), pl.String),
    "attention": (("attention",), pl.String),
    "ffn_hidden": (("ffn hidden size", "ffn hidden", "ffn size", "intermediate size", "mlp width"), pl.Int64),
    "kv_heads": (("kv heads", "key value heads", "num key value heads", "query groups", "num query groups"),
                 pl.Int64),
    "mlp": (("mlp", "mlp activation"), pl.String),
    "norm": (("norm", "normalization", "normalisation"), pl.String),
    "position": (("position", "position embedding", "position embedding type"), pl.String),
    "bias": (("bias", "linear bias", "add bias linear"), pl.Boolean),
    "qkv_bias": (("qkv bias", "add qkv bias"), pl.Boolean),
    "tie_embeddings": (("tie embeddings", "tied embeddings", "tie word embeddings"), pl.Boolean),
    "dropout": (("dropout",), pl.Boolean),
    "cuda_graphs": (("cuda graphs",), pl.Boolean),
    "fused_kernels": (("fused kernels", "kernel fusion"), pl.Boolean),
    "device": (("device", "gpu", "gpu type"), pl.String),
    # what a row's run did that vtrain does not simulate (refused where more than 1: _unmodelled), and the
    # gradient accumulation steps, checked against the shape (global batch = micro batch x dp x steps)
    "context_parallel": (("context parallelism", "context parallel size", "context parallel", "cp"), pl.Int64),
    "expert_parallel": (("expert parallelism", "expert parallel size", "expert model parallel size", "ep"),
                        pl.Int64),
    "experts": (("experts", "num experts", "number of experts", "moe experts", "num moe experts"), pl.Int64),
    # DeepSpeed's ZeRO stage: 1 and 2 shard the optimizer states (and gradients) as Megatron's distributed optimizer
    # does, with its reduce-scatter and all-gather; 3 (and FSDP) gathers the parameters in every pass: refused
    "zero_stage": (("zero stage", "zero", "zero optimization stage", "zero_optimization.stage",
                    "deepspeed zero stage"), pl.Int64),
    "fsdp": (("fsdp", "fully sharded data parallel", "fully sharded"), pl.Boolean),
    # FSDP's ShardingStrategy: FULL_SHARD and HYBRID_SHARD gather the parameters (refused), SHARD_GRAD_OP is ZeRO 2
    "sharding_strategy": (("sharding strategy", "fsdp sharding strategy"), pl.String),
    "gradient_accumulation": (("gradient accumulation", "gradient accumulation steps", "grad accumulation", "ga"),
                              pl.Int64),
    # the layers of each pipeline stage where a run split them unevenly: whole numbers, first stage to last,
    # apart by spaces, commas or semicolons ("5 6 6 6 6 6 6 6 6 6 6 5", "[5, 6, ..., 5]"); kept as that text, read by
    # measurement_config
    "stage_layers": (("stage layers", "layers per stage"), pl.String),
}
#: the columns of :func:`read_measurements`
COLUMNS = {
    "row": pl.Int64, "params_billion": pl.Float64, **{name: pl.Int64 for name in SHAPE_COLUMNS},
    "iteration_ms": pl.Float64, **{name: dtype for name, (_, dtype) in OPTIONAL_COLUMNS.items()}, "problem": pl.String,
    "measured_as": pl.String,  # the form the table gave the time in (a key of TIME_COLUMNS)
    "file": pl.String,  # the file a row is of, when a folder was read (null for one file: the one given)
    LINE: pl.Int64,  # the row's line in its file (a log's run: the line its arguments start on)
}
#: shape column -> its field in :data:`vtrain.limits.INTEGER_BOUNDS`, the physical bounds every run config is
#: checked against (beyond them a row is refused, not simulated)
SHAPE_FIELDS = {"gpus": "device_count", **{name: name for name in SHAPE_COLUMNS if name != "gpus"}}
#: the column that keeps, while a table is read, the text of a measured time that is no number
UNMEASURED = "unmeasured"
#: vTrain's training settings for these runs (Megatron-DeepSpeed, as in its configs)
VOCAB = ModelConfig.vocab  # GPT-2's
PRECISION = "fp16"
RECOMPUTE = "full"
SCHEDULE = "1f1b"
#: the framework a table's runs are simulated with when it has no framework column
FRAMEWORK = "megatron"
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def read_measurements(path: str | Path, recompute: str = RECOMPUTE) -> pl.DataFrame:
    """The measured runs of a measurement table, one row each: ``row`` (1-based data row number),
    ``params_billion`` (null when the file has no such column), ``gpus``, ``global_batch``, ``micro_batch``,
    ``hidden``, ``heads``, ``layers``, ``seq``, ``tp``, ``dp``, ``pp``, ``iteration_ms`` (milliseconds), the
    optional columns (null where absent), ``problem`` (why the row cannot be simulated, else null) and
    ``measured_as`` (the form of the table's time: a key of :data:`TIME_READINGS`).
    ``recompute``: the activation recomputation of rows without a recomputation column (what achieved TFLOP/s
    count: :func:`_milliseconds`)."""
    path = Path(path)
    rows = _read_folder(path, recompute) if path.is_dir() else read_measurements_text(path, read_text(path),
                                                                                      recompute)
    _warn_spread_repeats(rows.filter(pl.col("problem").is_null()), path)  # over a folder's files too (a rerun's log)
    if path.is_dir():  # a table copied into the folder twice (each file's own repeats are said as it is read)
        _warn_repeated_rows(rows, [name for name in rows.columns if name not in ("row", "file", LINE)], path)
    return rows


def read_measurements_text(path: Path, text: str, recompute: str = RECOMPUTE) -> pl.DataFrame:
    """:func:`read_measurements` of one file whose text was already read (``path`` names it in errors)."""
    if why := unreadable_log(text):
        raise NotATable(why, path)
    names, rows = megatron_log_rows(text, path) if is_megatron_log(text) else text_rows(text, path)
    columns = _columns(names, path)
    rows, read = _with_architectures(rows, columns)
    numeric = {given: meant for given, meant in read.items() if meant in (*SHAPE_COLUMNS, "params_billion")}
    times = [given for form in TIME_COLUMNS for given, meant in read.items() if meant == form]  # by precedence
    # the text of a time that is no number ("OOM", "-"), in the first time column that has any
    unmeasured = rows.select(pl.coalesce(times).alias(UNMEASURED))
    kept = [LINE, *read, *([_MODEL_PROBLEM] if _MODEL_PROBLEM in rows.columns else [])]
    rows = _as_numbers(rows.select(kept).with_columns(pl.col(times).cast(pl.Float64, strict=False)), numeric,
                       path).rename(read)
    rows = _with_derived_shape(rows).with_columns(unmeasured.to_series())
    given_as = {meant: given for given, meant in read.items()}
    for name, (_, dtype) in OPTIONAL_COLUMNS.items():
        if name in rows.columns:
            rows = rows.with_columns(_optional(rows, name, dtype, path, given_as.get(name, name)))
    rows = _with_sharded_optimizer(rows, path)
    forms = [read[given] for given in times]
    rows = rows.with_columns(measured_as=pl.coalesce([pl.when(pl.col(form).is_not_null()).then(pl.lit(form))
                                                      for form in forms] + [pl.lit(forms[0])]))
    each = {form: _milliseconds(rows, form, recompute) for form in forms}
    rows = rows.with_columns(iteration_ms=pl.coalesce([pl.when(pl.col("measured_as") == form).then(each[form])
                                                       for form in forms]))
    _say_time_columns(rows, {read[given]: given for given in times}, path)
    rows = rows.with_row_index("row", offset=1)
    rows = rows.with_columns(problem=pl.Series([_problem(r, r["measured_as"]) for r in rows.iter_rows(named=True)],
                                               dtype=pl.String))
    scored = rows["problem"].is_null()
    _warn_disagreeing_times(rows.filter(scored), {given: each[read[given]].filter(scored) for given in times},
                            {given for given in times if read[given] in _FLOP_RATES}, path)
    _warn_repeated_rows(rows, list(read.values()), path)
    _warn_gated_rows_of_gpt_layers(rows, path)
    if "inter_node_gbps" in rows.columns:
        rows = _with_link_rates(rows)
    rows = rows.with_columns(pl.when(pl.col("problem").is_null()).then(pl.col(name)).alias(name)
                             for name in SHAPE_COLUMNS)
    return rows.select(
        (pl.col(name) if name in rows.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in COLUMNS.items())


#: the shape columns a named architecture gives (a table naming its models may leave them out), and the optional
#: columns it gives where a row has none
_NAMED_SHAPE = ("layers", "hidden", "heads", "seq")
_NAMED_OPTIONAL = ("vocab", "ffn_hidden", "kv_heads", "mlp", "norm", "position", "bias", "qkv_bias",
                   "tie_embeddings", "dropout", "precision", "attention")
#: the column that keeps, while a table is read, why a row's model gives no shape (an unknown name)
_MODEL_PROBLEM = "model problem"


def _with_architectures(rows: pl.DataFrame, read: dict[str, str]) -> tuple[pl.DataFrame, dict[str, str]]:
    """Where a table names its models (a ``model`` column: :mod:`vtrain.architectures`), each row's empty or absent
    shape and layer cells (:data:`_NAMED_SHAPE`, :data:`_NAMED_OPTIONAL`) as its architecture gives them, as
    text like the file's; with the header names -> columns, those added included. A row whose model vtrain does not
    know and whose shape is incomplete gets its reason in :data:`_MODEL_PROBLEM` (and ones in the shape cells,
    read as numbers before :func:`_problem` refuses it)."""
    from vtrain.architectures import architecture

    given = next((name for name, meant in read.items() if meant == "model"), None)
    if given is None:
        return rows, read
    given_by = {meant: name for name, meant in read.items()}
    added = {name: name for name in (*_NAMED_SHAPE, *_NAMED_OPTIONAL) if name not in given_by}
    rows = rows.with_columns(pl.lit(None, dtype=pl.String).alias(name) for name in added)
    given_by |= added
    cells: dict[str, list[str | None]] = {name: rows[given_by[name]].to_list() for name in (*_NAMED_SHAPE,
                                                                                          *_NAMED_OPTIONAL)}
    problems: list[str | None] = []
    for index, name in enumerate(rows[given].to_list()):
        found = architecture(name) if name else None
        missing = [column for column in _NAMED_SHAPE if cells[column][index] is None]
        problems.append(_model_problem(name, found is not None, missing))
        for column, values in cells.items():
            if values[index] is None:
                values[index] = _architecture_cell(found, column) if found else ("1" if column in missing else None)
    rows = rows.with_columns(*(pl.Series(given_by[name], values, dtype=pl.String) for name, values in cells.items()),
                             pl.Series(_MODEL_PROBLEM, problems, dtype=pl.String))
    return rows, read | added


def _model_problem(name: str | None, known: bool, missing: list[str]) -> str | None:
    """Why a row whose shape columns ``missing`` are empty has no shape: its model is none vtrain knows, or it
    names none; None when its model is known or nothing is missing."""
    if known or not missing:
        return None
    if not name:
        return f"no model and no {', '.join(missing)}"
    from vtrain.architectures import known_names

    return f"model {shown(name)} is not one vtrain knows by name ({known_names()}) and the row gives no " \
           f"{', '.join(missing)}"


def _architecture_cell(found: Architecture, column: str) -> str | None:
    """A column's cell as an architecture gives it (text, as a file's), None where it leaves it to the defaults."""
    value = getattr(found, column) if column in ("precision", "attention") else getattr(found.model, column)
    return None if value is None else str(value).lower()


class NotATable(InputError):
    """A file whose header names no measurement table's columns (and that is no Megatron log)."""


def _read_folder(folder: Path, recompute: str) -> pl.DataFrame:
    """Every measurement table and Megatron log of a folder (its files, by name; not its subfolders), as one table,
    rows numbered in that order. Files that are neither (the job scripts and error logs beside a run's log, a
    binary) are left out with one warning; a table or log with a bad value is an error, as alone."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    tables, others = [], []
    for file in files:
        text = _measurements_text(file)
        if text is None:
            others.append(file.name)
        else:
            tables.append(read_measurements_text(file, text, recompute).with_columns(file=pl.lit(file.name)))
    if not tables:
        logs = [(file.name, why) for file in files if file.name in others and (why := _unreadable_log(file))]
        said = f"; {logs[0][0]} holds {logs[0][1]}" if logs else ""
        raise InputError(f"no measurement table or Megatron log among its {len(files)} file(s){said}", folder)
    if others:
        warn_input(f"{len(others)} file(s) neither a measurement table nor a Megatron log, not read ({others[0]}"
                   f"{', ...' if len(others) > 1 else ''})", folder)
    return pl.concat(tables, how="vertical_relaxed").drop("row").with_row_index("row", offset=1).select(
        pl.col(name).cast(dtype) for name, dtype in COLUMNS.items())


def _unreadable_log(path: Path) -> str | None:
    """Why a file that is a training log cannot be read as one (:func:`unreadable_log`), None for any other."""
    try:
        return unreadable_log(read_text(path))
    except InputError:
        return None


def _measurements_text(path: Path) -> str | None:
    """The text of a file that is a Megatron log or whose header names a measurement table's columns, else None."""
    try:
        text = read_text(path)
    except InputError:  # not text, empty, unreadable
        return None
    if is_megatron_log(text):
        return text
    with warnings.catch_warnings():  # the columns it does not read are said when it is read
        warnings.simplefilter("ignore", InputWarning)
        try:
            _columns(header_names(text), path)
        except NotATable:
            return None
    return text


def _warn_repeated_rows(rows: pl.DataFrame, columns: list[str], path: Path) -> None:
    """One warning line for rows that repeat an earlier row in every column read, the measured time to its last
    digit (a table pasted twice): each is scored, so it counts twice in the MAPE. Repeated runs of one
    configuration differ in their times and are not warned of."""
    repeated = rows.filter(pl.struct(columns).is_duplicated() & ~pl.struct(columns).is_first_distinct())
    if repeated.height:
        shown_rows = ", ".join(str(r) for r in repeated["row"].head(5).to_list())
        warn_input(f"{repeated.height} row(s) repeat an earlier row exactly, measured time included (rows "
                   f"{shown_rows}{', ...' if repeated.height > 5 else ''}): each is scored (a table pasted twice?)",
                   path)


#: how far apart (a ratio) two of a row's times, or two measurements of one configuration, may be before they are
#: said: beyond what runs of one configuration vary by, short of a unit read wrong (10x, 1000x) or a run that went
#: wrong
TIMES_APART = 1.2
#: the same where a FLOP rate is one of the two: FLOP counts differ by convention (6N a token against vtrain's
#: count with attention's 12·l·s·h: 1.2x for LLaMA-3-8B at 8,192 tokens, 1.3x for 70B at 16,384: an audit)
FLOP_COUNTS_APART = 1.5
#: the columns of :data:`COLUMNS` that do not describe a run (two rows equal in the others are one configuration)
_NOT_THE_RUN = ("row", "iteration_ms", "problem", "measured_as", "file", LINE, "params_billion", "model")


def _warn_disagreeing_times(rows: pl.DataFrame, times: dict[str, pl.Series], counted: set[str], path: Path) -> None:
    """One warning line for scored rows whose time columns (``times``: the file's name -> the column as milliseconds
    per iteration; ``counted``: those that are FLOP rates) give iteration times more than :data:`TIMES_APART` apart
    (:data:`FLOP_COUNTS_APART` where a FLOP rate is one of them): a unit read wrong, a column pasted from another
    row. The row is scored on its first, which may be the wrong one."""
    if len(times) < 2:
        return
    table = pl.DataFrame(times).with_columns(_row=rows["row"])
    named, exact = list(times), [name for name in times if name not in counted]
    apart = pl.max_horizontal(named) > FLOP_COUNTS_APART * pl.min_horizontal(named)
    if len(exact) > 1:
        apart = apart | (pl.max_horizontal(exact) > TIMES_APART * pl.min_horizontal(exact))
    wrong = table.filter(apart)
    if wrong.is_empty():
        return
    first = wrong.row(0, named=True)
    shown = ", ".join(f"{name!r} {first[name]:,.4g} ms" for name in named if first[name] is not None)
    others = wrong["_row"].to_list()[1:]
    also = f"; also {'row' if len(others) == 1 else 'rows'} {some_of([str(row) for row in others])}" if others else ""
    bounds = f"{TIMES_APART:g}x" + (f" ({FLOP_COUNTS_APART:g}x where a FLOP rate is one of them)" if counted else "")
    warn_input(f"{wrong.height} row(s) give iteration times that disagree by more than {bounds} across their time "
               f"columns (row {first['_row']}: {shown}{also}): each is scored on its first; is a unit or a column "
               f"wrong?", path)


def _warn_spread_repeats(rows: pl.DataFrame, path: Path) -> None:
    """One warning line for a configuration measured more than once in the scored ``rows`` (every column but
    :data:`_NOT_THE_RUN` equal; in one file or in several of a folder) whose times are more than
    :data:`TIMES_APART` apart: one prediction cannot be near both, and one of the runs may have gone wrong (a slow
    node, a first run compiling its kernels), or columns vtrain does not read tell them apart."""
    columns = [name for name in rows.columns if name not in _NOT_THE_RUN]
    runs = rows.filter(pl.col("iteration_ms").is_not_null() & pl.struct(columns).is_duplicated())
    if runs.is_empty():
        return
    named = pl.when(pl.col("file").is_not_null()).then(pl.format("{} ({})", "row", "file")).otherwise(
        pl.col("row").cast(pl.String))
    spread = (runs.with_columns(_named=named).group_by(columns)
              .agg(pl.col("_named"), first=pl.col("row").min(), low=pl.col("iteration_ms").min(),
                   high=pl.col("iteration_ms").max())
              .filter(pl.col("high") > TIMES_APART * pl.col("low")).sort("first"))
    if spread.is_empty():
        return
    first = spread.row(0, named=True)
    warn_input(f"{spread.height} configuration(s) measured more than once take times more than {TIMES_APART:g}x apart "
               f"(rows {some_of(first['_named'])}: {first['low']:,.4g} to {first['high']:,.4g} ms): each row is "
               f"scored; did one of the runs go wrong, or do columns vtrain does not read tell them apart?", path)


#: the columns that say a LLaMA-like layer's parts beyond its widths; absent, a row's layer is GPT's
_LAYER_PARTS = ("norm", "position", "bias", "tie_embeddings")


def _warn_gated_rows_of_gpt_layers(rows: pl.DataFrame, path: Path) -> None:
    """One warning line where rows have a gated (SwiGLU) MLP, LLaMA's, but the table says none of the layer's other
    parts (norm, positions, biases, tied embeddings): they are predicted with GPT's (layer norms, learned positions,
    biases, a tied head under Megatron), which for a LLaMA is a few percent of the parameters and a little time."""
    if "mlp" not in rows.columns or any(name in rows.columns for name in _LAYER_PARTS):
        return
    gated = rows.filter(pl.col("mlp").map_elements(word_named, return_dtype=pl.String) == "swiglu")
    if gated.height:
        warn_input(f"{gated.height} row(s) have a SwiGLU MLP (row {gated['row'][0]}, ...) but no norm, position "
                   f"embedding, add bias linear or tie embeddings column: their layers are placed as GPT's (layer "
                   f"norms, learned positions, biases, the head tied under Megatron); say LLaMA's in those columns "
                   f"(RMSNorm, RoPE, false, false)", path)


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a row of :func:`read_measurements` cannot be simulated (None when it can)."""
    return row.get("problem") or None


def _key(name: str) -> str:
    """A column name as names are compared: lower case, runs of spaces, hyphens and underscores as one space, no
    space around a slash (``Tokens / sec / GPU`` is ``tokens/sec/gpu``)."""
    return re.sub(r" ?/ ?", "/", re.sub(r"[\s_\-]+", " ", name.strip().lower()))


#: every accepted column name (by :func:`_key`) -> the column it gives (a shape, a time form, an optional column)
_ACCEPTED = {_key(alias): name for name, aliases in
             [*SHAPE_COLUMNS.items(), *TIME_COLUMNS.items(), ("params_billion", PARAMETERS_COLUMNS),
              *((name, aliases) for name, (aliases, _) in OPTIONAL_COLUMNS.items())]
             for alias in aliases}


def _columns(names: list[str], path: Path) -> dict[str, str]:
    """The header's names (as :func:`~vtrain.importers._read.csv_rows` made them unique) -> the column each gives;
    an error for a column given twice or a required one missing, a warning for names that are none of them."""
    given: dict[str, str] = {}
    original: dict[str, str] = {}
    ignored = []
    for name, unique in zip(names, unique_names(names), strict=True):
        meant = _ACCEPTED.get(_key(name))
        if meant is None:
            ignored.append(name)
            continue
        twice = [other for other, same in given.items() if same == meant]
        if twice:
            raise InputError(f"columns {original[twice[0]]!r} and {name!r} both give {meant!r}", path)
        given[unique], original[unique] = meant, name
    named = _NAMED_SHAPE if "model" in given.values() else ()
    needed = [name for name in SHAPE_COLUMNS if name not in (*DERIVABLE, *named) and name not in given.values()]
    if all(name not in given.values() for name in DERIVABLE):
        needed.append("gpus")
    missing = [SHAPE_COLUMNS[name][0] for name in needed]
    if not any(form in given.values() for form in TIME_COLUMNS):
        missing.append("an iteration time")
    if missing:
        raise NotATable(f"not a measurement table: no column for {', '.join(missing)} (expected the columns "
                         f"[{PARAMETERS_COLUMN},] {','.join(VTRAIN_COLUMNS)}, in any order, or the short names "
                         f"docs/fit-and-profiles.md lists); found {','.join(names)}", path)
    if ignored:
        warn_input(f"column(s) {', '.join(repr(name) for name in ignored)} not read: none of a measurement "
                   "table's columns (docs/fit-and-profiles.md lists them)", path)
    return given


def _say_time_columns(rows: pl.DataFrame, given: dict[str, str], path: Path) -> None:
    """Where a table gives its measured times in several columns (``given``: form -> the file's name, by
    precedence, :data:`TIME_COLUMNS`): one warning saying which each row's time was read from (its first with a
    number: a table may give TFLOP/s for some rows and tokens/s for others) and which filled cells were not."""
    if len(given) < 2:
        return
    used = rows["measured_as"].value_counts(sort=True)
    read = ", ".join(f"{given[form]!r} for {count} row(s)" for form, count in used.iter_rows())
    unread = [f"{given[form]!r}" for form in given
              if rows.filter((pl.col("measured_as") != form) & pl.col(form).is_not_null()).height]
    warn_input(f"the measured time is read from {read} (a row's first time column with a number)"
               + (f"; filled but not read: {', '.join(unread)}" if unread else ""), path)


def _as_numbers(rows: pl.DataFrame, columns: dict[str, str], path: Path) -> pl.DataFrame:
    """The given columns (name in the file -> the column it gives) as floats; an error naming the line of a missing
    value or of text that is no number (``nan`` and ``inf`` are numbers here: :func:`_problem` refuses them per
    row)."""
    for name, meant in columns.items():
        cast = pl.col(name).cast(pl.Float64, strict=False)
        bad = rows.filter(cast.is_null())
        if not bad.is_empty():
            line, value = bad.row(0, named=True)[LINE], bad.row(0, named=True)[name]
            kind = "an integer" if meant in SHAPE_COLUMNS else "a number"
            problem = "is missing" if value is None else f"is not {kind}: {shown(value)}"
            raise InputError(f"line {line}: {name!r} {problem}", path)
        rows = rows.with_columns(cast)
    return rows


def _with_derived_shape(rows: pl.DataFrame) -> pl.DataFrame:
    """The GPU count or the data-parallel size where a table leaves one out: GPUs = t x d x p."""
    if "gpus" not in rows.columns:
        return rows.with_columns(gpus=pl.col("tp") * pl.col("dp") * pl.col("pp"))
    if "dp" not in rows.columns:
        return rows.with_columns(dp=pl.col("gpus") / (pl.col("tp") * pl.col("pp")))
    return rows


def _milliseconds(rows: pl.DataFrame, form: str, recompute: str) -> pl.Series:
    """The measured time (column ``form``) as milliseconds per iteration: a throughput in samples or tokens per
    second as ``global batch [x sequence] / throughput`` (per GPU: over the throughput of all the row's GPUs),
    achieved TFLOP/s per GPU as the FLOPs the GPUs ran (:func:`vtrain.flops.hardware_flops`: the row's vocabulary
    and recomputation, else vTrain's vocabulary and ``recompute``) over the GPUs' rate, model TFLOP/s per GPU as
    the model's FLOPs (the same count without recomputation) over it."""
    if form not in _FLOP_RATES:
        measured = pl.col(form)
        tokens = pl.col("global_batch") * pl.col("seq")
        return rows.select({"ms": measured, "s": measured * 1000.0,
                            "samples/s": pl.col("global_batch") / measured * 1000.0,
                            "tokens/s": tokens / measured * 1000.0,
                            "tokens/s/gpu": tokens / (measured * pl.col("gpus")) * 1000.0}[form]).to_series()
    columns = ("global_batch", "seq", "layers", "hidden", "gpus", form)
    vocab = _column_or_nulls(rows, "vocab")
    recomputed = _column_or_nulls(rows, "recompute") if form == "tflops/gpu" else pl.repeat("none", rows.height,
                                                                                            eager=True)
    times = [hardware_flops(batch, seq, layers, hidden, v or VOCAB, r or recompute, layer)
             / (tflops * 1e12 * gpus) * 1e3
             if all(x is not None and math.isfinite(x) and x > 0 for x in (batch, seq, layers, hidden, gpus, tflops))
             else None  # a shape or rate that is no number above 0: the row's problem says which
             for (batch, seq, layers, hidden, gpus, tflops), v, r, layer
             in zip(rows.select(columns).iter_rows(), vocab, recomputed, _layer_shapes(rows))]
    return pl.Series(times, dtype=pl.Float64)



def _column_or_nulls(rows: pl.DataFrame, name: str) -> pl.Series:
    return rows[name] if name in rows.columns else pl.repeat(None, rows.height, eager=True)


def _layer_shapes(rows: pl.DataFrame) -> list[LayerShape]:
    """Each row's layer as its FLOPs count it: its MLP width, share of key/value heads and gated MLP where the
    table says them (a key/value head count that is no number above 0 counts as all heads: the row's checks say
    what is wrong with it)."""
    shapes = []
    for heads, ffn, kv, mlp in zip(rows["heads"], _column_or_nulls(rows, "ffn_hidden"),
                                   _column_or_nulls(rows, "kv_heads"), _column_or_nulls(rows, "mlp")):
        share = kv / heads if kv and heads and kv > 0 and heads > 0 else 1.0
        gated = word_named(mlp) == "swiglu"
        shapes.append(LayerShape(ffn=ffn if ffn and ffn > 0 else None, kv_share=share, gated=gated))
    return shapes


def _problem(row: dict[str, Any], form: str) -> str | None:
    """Why a row (shape columns as floats) is not a measurement one can simulate."""
    measured = row[form]
    if measured is None:
        given = row[UNMEASURED]
        return f"no measured time ({shown(given)})" if given is not None else "no measured time (an empty cell)"
    unit = _FLOP_RATES.get(form, form)
    what = "iteration time" if form in ("ms", "s") else "throughput"
    if not math.isfinite(measured) or measured <= 0:
        return f"measured {what} is not a positive number ({measured!r} {unit})"
    if row["iteration_ms"] is not None and row["iteration_ms"] < MIN_ITERATION_MS:
        converted = "" if form == "ms" else f" ({row['iteration_ms']:.3g} ms)"
        return f"measured {what} of {measured!r} {unit}{converted} is shorter than any iteration (1 µs)"
    if row["iteration_ms"] is not None and not row["iteration_ms"] <= MAX_ITERATION_MS:
        converted = "" if form == "ms" else f" ({row['iteration_ms']:.3g} ms)"
        return f"measured {what} of {measured!r} {unit}{converted} is longer than any iteration (a day)"
    unmodelled = row.get(_MODEL_PROBLEM) or _unmodelled(row)
    if unmodelled:
        return unmodelled
    for name, field in SHAPE_FIELDS.items():
        value = row[name]
        if not math.isfinite(value) or value != int(value) or value < 1:
            return f"{name} = {value:g} is not a positive integer"
        low, high = INTEGER_BOUNDS[field]
        if not low <= value <= high:
            return f"{name} = {value:g} is beyond any real run (at most {high:,})"
    micro_batches = row["global_batch"] / (row["dp"] * row["micro_batch"])
    if micro_batches > MAX_MICRO_BATCHES:
        return (f"{micro_batches:g} micro-batches per replica (global batch / (dp x micro batch)) is beyond any real "
                f"run (at most {MAX_MICRO_BATCHES:,})")
    steps = row.get("gradient_accumulation")
    if steps is not None and steps != micro_batches:
        return (f"gradient accumulation {steps} is not global batch / (dp x micro batch) = {micro_batches:g}: the "
                f"row's shape columns disagree")
    return None


#: parallelism vtrain does not simulate: column -> how a row's problem names it
_UNMODELLED = {"context_parallel": "context parallelism (CP = {})", "expert_parallel": "expert parallelism (EP = {})",
               "experts": "a mixture of {} experts"}


def _unmodelled(row: dict[str, Any]) -> str | None:
    """Why a row ran what vtrain does not simulate (context or expert parallelism, a mixture of experts), else
    None: such a row is refused, not predicted as the dense run its other columns describe."""
    for name, what in _UNMODELLED.items():
        value = row.get(name)
        if value is not None and value > 1:
            return f"{what.format(value)} is not modelled: vtrain simulates dense models on t x d x p GPUs"
    strategy = _strategy(row.get("sharding_strategy"))
    optimizer_only = strategy in (*_GRADIENTS_SHARDED, *_NOTHING_SHARDED)
    sharded = (f"ZeRO stage {row['zero_stage']}" if (row.get("zero_stage") or 0) >= 3
               else "FSDP" if row.get("fsdp") and not optimizer_only
               else f"FSDP's {strategy.upper()}" if strategy in _PARAMETERS_SHARDED else None)
    if strategy and not sharded and not optimizer_only:
        return (f"sharding strategy {row['sharding_strategy']!r} is none vtrain knows (FULL_SHARD, HYBRID_SHARD, "
                f"SHARD_GRAD_OP, NO_SHARD): what it shards is not known")
    if sharded:  # (it had been scored as plain data parallelism, the column unread: an audit, OPT-175B +13 %)
        return (f"{sharded} (the parameters gathered from their shards in every pass) is not modelled: vtrain "
                f"simulates replicas that hold their parameters (ZeRO 1 and 2: the distributed optimizer)")
    return None


def _with_link_rates(rows: pl.DataFrame) -> pl.DataFrame:
    """The inter-node Gbit/s column with ``0`` read as absent (the command's flag applies, as for an empty cell:
    tables write 0 for "not measured", and no link runs at 0); a rate outside
    :data:`vtrain.limits.REAL_BOUNDS` (negative, not finite, beyond any network) makes the row's problem."""
    rates = rows["inter_node_gbps"].to_list()
    problems = [problem or (None if rate is None or rate == 0 else real_problem("inter_node_gbps", rate))
                for problem, rate in zip(rows["problem"].to_list(), rates)]
    return rows.with_columns(inter_node_gbps=pl.Series([None if rate == 0 else rate for rate in rates],
                                                       dtype=pl.Float64),
                             problem=pl.Series(problems, dtype=pl.String))


def _optional(rows: pl.DataFrame, name: str, dtype: type[pl.DataType], path: Path, given: str) -> pl.Expr:
    """An optional column as ``dtype``; an error naming the line of a value that is not one, and the column as the
    file names it (``given``)."""
    values = []
    for line, value in rows.select(LINE, name).iter_rows():
        try:
            values.append(None if value is None or value.lower() in _NOT_APPLICABLE else _parse(value, dtype, name))
        except ValueError:
            kind = _ODD_KINDS.get(name) or _KINDS[dtype]
            raise InputError(f"line {line}: {given!r} is not {kind}: {shown(value)}", path) from None
    return pl.Series(name, values, dtype=dtype)


#: what a value of a column read its own way must be, as an error says it
_ODD_KINDS = {"stage_layers": "whole numbers of layers, one a stage", "zero_stage": "a ZeRO stage (0 to 3, ZeRO-3)"}
#: FSDP's sharding strategies (as :func:`_strategy` writes them): those that gather the parameters in every pass
#: (refused), those that shard the optimizer states and gradients only (ZeRO 2), and the one that shards nothing
_PARAMETERS_SHARDED = ("full_shard", "hybrid_shard", "fully_shard", "fsdp2")
_GRADIENTS_SHARDED = ("shard_grad_op", "hybrid_shard_zero2")
_NOTHING_SHARDED = ("no_shard",)


def _strategy(value: str | None) -> str:
    """An FSDP sharding strategy as compared: lower case, words joined by ``_``, without ``ShardingStrategy.``
    (``FULL_SHARD``, ``full shard``, ``ShardingStrategy.SHARD_GRAD_OP``, ``_HYBRID_SHARD_ZERO2``)."""
    words = re.sub(r"[\s\-]+", "_", (value or "").strip().lower()).removeprefix("shardingstrategy.")
    return words.strip("_")


def _with_sharded_optimizer(rows: pl.DataFrame, path: Path) -> pl.DataFrame:
    """``distributed_optimizer`` where a row leaves it out and its ZeRO stage or FSDP sharding strategy says it:
    ZeRO 1 and 2 (and FSDP's SHARD_GRAD_OP) shard the optimizer states as Megatron's distributed optimizer does (a
    row of ZeRO 1 was predicted with it while the defaults' warning said it off: an audit); stage 0 and NO_SHARD do
    not. Stage 3 and FULL_SHARD are refused (:func:`_unmodelled`)."""
    said = []
    if "zero_stage" in rows.columns:
        said.append(pl.when(pl.col("zero_stage").is_in([1, 2])).then(True)
                    .when(pl.col("zero_stage") == 0).then(False))
    if "sharding_strategy" in rows.columns:
        strategy = pl.col("sharding_strategy").map_elements(_strategy, return_dtype=pl.String)
        said.append(pl.when(strategy.is_in(_GRADIENTS_SHARDED)).then(True)
                    .when(strategy.is_in(_NOTHING_SHARDED)).then(False))
    if not said:
        return rows
    sharded = pl.coalesce(*said)
    if "distributed_optimizer" not in rows.columns:
        return rows.with_columns(distributed_optimizer=sharded)
    differ = rows.filter(pl.col("distributed_optimizer").is_not_null() & sharded.is_not_null()
                         & (pl.col("distributed_optimizer") != sharded))
    if differ.height:  # the row's own column is taken, and said (it had been, silently: a review)
        warn_input(f"{differ.height} row(s) whose distributed optimizer column says other than their ZeRO stage or "
                   f"sharding strategy (line {differ[LINE][0]}): the distributed optimizer column is taken", path)
    return rows.with_columns(distributed_optimizer=pl.coalesce("distributed_optimizer", sharded))


#: what published tables write in a cell that does not apply (a virtual pipeline size without interleaving): read
#: as an empty cell
_NOT_APPLICABLE = ("-", "\u2013", "\u2014", "n/a", "na")
_KINDS = {pl.Int64: "an integer", pl.Float64: "a number", pl.Boolean: "true or false", pl.String: "text"}


def _layer_counts(text: str) -> tuple[int, ...]:
    """The whole numbers of a ``stage layers`` cell, in brackets or not (``[5, 6, 5]``, as a run config or Python
    prints a list); ValueError when it holds anything else."""
    inner = text.strip()
    if inner[:1] + inner[-1:] in ("[]", "()"):
        inner = inner[1:-1].strip()
    return tuple(int(part) for part in _SEPARATORS.split(inner))


_SEPARATORS = re.compile(r"[\s,;]+")


def _parse(value: str, dtype: type[pl.DataType], name: str = "") -> Any:
    if name == "stage_layers":
        return " ".join(map(str, _layer_counts(value)))
    if name == "zero_stage":  # 3, ZeRO-3, zero3, stage 3, Z3
        stage = re.fullmatch(r"(?:(?:zero|z)[\s\-_]*)?(?:stage[\s\-_]*)?([0-3])(?:\.0)?(?:[\s\-_,(].*)?",
                             value.strip().lower())  # ZeRO stage 3, ZeRO-3 offload; not -1
        if stage is None:
            raise ValueError(value)
        return int(stage.group(1))
    if dtype == pl.Int64:
        number = float(value)
        if not abs(number) < 2**63 or number != int(number):  # 1e30 and inf are no Int64 (nor any shape)
            raise ValueError(value)
        return int(number)
    if dtype == pl.Float64:
        return float(value)
    if dtype == pl.Boolean:
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise ValueError(value)
    return value.lower()


def measurement_config(row: dict[str, Any], gpus_per_node: int = 8, device: str = "A100-80GB",
                       inter_node_gbps: float | None = None, intra_node_gbps: float | None = None,
                       recompute: str = RECOMPUTE, framework: str = FRAMEWORK, attention: str = "eager") -> RunConfig:
    """The run config of one measured run (a row of :func:`read_measurements`, as a dict): the row's own columns
    where it has them, else the given device, node size, link rates, recomputation, framework and attention and
    vTrain's Megatron-DeepSpeed settings (fp16, 1F1B, vocabulary 50257, no gradient bucketing, no CUDA graphs);
    ``device_count`` = the row's GPUs.

    The config is not validated: ``config.constraint_errors()`` lists what a row breaks (e.g. tp*dp*pp differing
    from its GPU count); :func:`measurement_errors` does so for a whole table.
    """
    def given(name: str, default: Any) -> Any:
        value = row.get(name)
        return default if value is None else value

    return RunConfig(
        model=ModelConfig(layers=int(row["layers"]), hidden=int(row["hidden"]), heads=int(row["heads"]),
                          seq=int(row["seq"]), vocab=int(given("vocab", VOCAB)), ffn_hidden=row.get("ffn_hidden"),
                          kv_heads=row.get("kv_heads"), mlp=str(given("mlp", "gelu")),
                          norm=str(given("norm", "layernorm")), position=str(given("position", "learned")),
                          bias=bool(given("bias", True)), qkv_bias=row.get("qkv_bias"),
                          tie_embeddings=row.get("tie_embeddings"), dropout=row.get("dropout")),
        parallelism=ParallelConfig(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                                   micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]),
                                   schedule=str(given("schedule", _schedule_of(row))),
                                   virtual_stages=int(given("virtual_stages", 1)),
                                   recompute=str(given("recompute", recompute)),
                                   dp_overlap=bool(given("dp_overlap", False)),
                                   sequence_parallel=bool(given("sequence_parallel", False)),
                                   distributed_optimizer=bool(given("distributed_optimizer", False)),
                                   stage_layers=_layer_counts(split) if (split := row.get("stage_layers")) else None),
        precision=str(given("precision", PRECISION)),
        framework=str(framework_named(given("framework", framework))),
        attention=str(word_named(given("attention", attention))),
        cuda_graphs=bool(given("cuda_graphs", False)),
        fused_kernels=bool(given("fused_kernels", True)),
        hardware=HardwareConfig(device=str(given("device", device)), device_count=int(row["gpus"]),
                                gpus_per_node=int(given("gpus_per_node", gpus_per_node)),
                                intra_node_gbps=intra_node_gbps,
                                inter_node_gbps=given("inter_node_gbps", inter_node_gbps)),
    )


def _schedule_of(row: dict[str, Any]) -> str:
    """The schedule of a row without a schedule column: interleaved where it gives more than one virtual stage
    (published tables give Megatron's virtual pipeline size, ``VP``, and no schedule), else vTrain's."""
    return "interleaved" if (row.get("virtual_stages") or 1) > 1 else SCHEDULE


def measurement_errors(measurements: pl.DataFrame, gpus_per_node: int = 8) -> pl.DataFrame:
    """One row (``row``, ``error``) per constraint a measured run's config breaks; empty when all are consistent."""
    errors = [(row["row"], error) for row in measurements.iter_rows(named=True) if not row["problem"]
              for error in measurement_config(row, gpus_per_node).constraint_errors()]
    return pl.DataFrame(errors, schema={"row": pl.Int64, "error": pl.String}, orient="row")
