"""A Megatron-LM (or Megatron-DeepSpeed) training log as a measurement table: one row per run it logs.

Megatron prints its arguments when it starts, one a line between two rules::

    ------------------------ arguments ------------------------
      hidden_size ..................................... 4096
      ...
    -------------------- end of arguments ---------------------

then, every ``--log-interval`` iterations, the mean time of the iterations since the last line::

     iteration       20/     500 | consumed samples:         1280 | elapsed time per iteration (ms): 1234.5 | ...

(BigScience's Megatron-DeepSpeed, which trained BLOOM, writes ``elapsed time per iteration (s): 105.22``.)

A run is the arguments and the iteration lines after them (a log that restarts holds several). Its measured time
is the median of its logged intervals but the first (which holds the first iterations' start-up: allocation,
kernel selection, NCCL's set-up); a run with one interval is that one, with a warning. Lines may carry the
launcher's prefix (``[default0]:``, ``0:``, a timestamp): the patterns are searched anywhere in a line.

The arguments become the columns of :mod:`vtrain.importers.measurements` (:data:`_COLUMNS`): the shape, the
parallelism, the padded vocabulary Megatron prints (``> padded vocab (size: 50257) with 175 dummy tokens (new size:
50432)``), recomputation, sequence parallelism, the distributed optimizer (DeepSpeed's ZeRO stage 1 and up), the
gradient reduction's overlap, precision, the layer (SwiGLU, RMSNorm, rotary positions, biases, tied embeddings,
grouped-query attention), fused attention, and context and expert parallelism (a row with either is refused there,
as in any table). The GPU, GPUs per node and links are not in a log: the command's flags give them.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import polars as pl

from vtrain.errors import InputError, warn_input
from vtrain.importers._read import LINE

_ARGUMENTS = re.compile(r"-{3,} arguments -{3,}")
_END = re.compile(r"-{3,} end of arguments -{3,}")
_ARGUMENT = re.compile(r"(\w+) \.{2,} (.*?)\s*$")
_INTERVAL = re.compile(r"elapsed time per iteration \((ms|s)\): ([0-9]+(?:\.[0-9]*)?)")
#: milliseconds per unit of an interval's time (BigScience's Megatron-DeepSpeed logs seconds)
_MS = {"ms": 1.0, "s": 1000.0}
#: overlaps of communication with computation a run may turn on that the simulator does not model: argument -> what
_UNMODELLED_OVERLAPS = {
    "tp_comm_overlap": "its tensor-parallel communication with its GEMMs (--tp-comm-overlap)",
    "overlap_param_gather": "its distributed optimizer's parameter all-gathers with the next forward "
                            "(--overlap-param-gather)",
}
_PADDED = re.compile(r"> padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")


def is_megatron_log(text: str) -> bool:
    """Whether a text is a Megatron training log: it prints its arguments and times iterations."""
    return _ARGUMENTS.search(text) is not None and _INTERVAL.search(text) is not None


def untimed_log(text: str) -> bool:
    """Whether a text holds Megatron's arguments but no timed iteration: the output of a rank that does not print
    them (Megatron prints its iteration times on the last rank: in a multi-node run, another node's output)."""
    return _ARGUMENTS.search(text) is not None and _INTERVAL.search(text) is None


#: why such a text is no run, said where one is read
UNTIMED = ("a Megatron log's arguments without a timed iteration: Megatron prints its iteration times on the last "
           "rank (in a multi-node run, another node's output: give the file that holds them, or the nodes' "
           "outputs joined into one)")


def megatron_log_rows(text: str, path: Path) -> tuple[list[str], pl.DataFrame]:
    """The runs of a Megatron log as :func:`~vtrain.importers._read.csv_rows` gives a table: the column names and
    one row of text cells per run (and the line its arguments start on)."""
    runs = [_run(block, start, path) for start, block in _blocks(text.splitlines())]
    runs = [run for run in runs if run is not None]
    if not runs:
        raise InputError("a Megatron log without a timed iteration after its arguments", path)
    names = list(dict.fromkeys(name for run in runs for name in run if name != LINE))
    frame = pl.DataFrame({name: [run.get(name) for run in runs] for name in names},
                         schema={name: pl.String for name in names})
    return names, frame.with_columns(pl.Series(LINE, [int(run[LINE]) for run in runs], dtype=pl.Int64))


def _blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Each run's lines, from its arguments' rule (its 1-based line number) to the next run's."""
    starts = [index for index, line in enumerate(lines) if _ARGUMENTS.search(line)]
    return [(start + 1, lines[start:end]) for start, end in zip(starts, [*starts[1:], len(lines)])]


def _run(block: list[str], start: int, path: Path) -> dict[str, str] | None:
    """One run's row (text cells by column name), None when it timed no iteration."""
    end = next((index for index, line in enumerate(block) if _END.search(line)), len(block))
    arguments = {found.group(1): found.group(2) for line in block[1:end] if (found := _ARGUMENT.search(line))}
    intervals = [float(found.group(2)) * _MS[found.group(1)] for line in block[end:]
                 if (found := _INTERVAL.search(line))]
    if not intervals:
        return None
    if len(intervals) == 1:
        warn_input(f"the run whose arguments start on line {start} logged one interval: its time includes the "
                   f"start-up of its first iterations", path)
    padded = next((found.group(1) for line in block[end:] if (found := _PADDED.search(line))), None)
    overlapped = [what for name, what in _UNMODELLED_OVERLAPS.items() if arguments.get(name) == "True"]
    if overlapped:
        warn_input(f"the run whose arguments start on line {start} overlapped {' and '.join(overlapped)}, which "
                   f"vtrain does not model: predicted in the open", path)
    row = {column: value for column, value in _columns(arguments, padded).items() if value is not None}
    return {**row, "iteration time (ms)": repr(statistics.median(intervals[1:] or intervals)), LINE: str(start)}


def _columns(args: dict[str, str], padded_vocab: str | None) -> dict[str, str | None]:
    """A run's arguments as the measurement table's columns (None: the argument is not in this log, or says
    nothing the table would)."""
    def given(name: str) -> str | None:
        value = args.get(name)
        return None if value in (None, "None") else value

    def flag(name: str) -> bool:
        return given(name) == "True"

    return {
        "gpus": given("world_size"), "global batch": given("global_batch_size"),
        "micro batch": given("micro_batch_size"), "hidden size": given("hidden_size"),
        "attention heads": given("num_attention_heads"), "# layers": given("num_layers"),
        "sequence length": given("seq_length"), "tp": given("tensor_model_parallel_size"),
        "pp": given("pipeline_model_parallel_size"), "dp": given("data_parallel_size"),
        "virtual stages": given("virtual_pipeline_model_parallel_size"),
        "vocabulary": padded_vocab or given("padded_vocab_size") or given("vocab_size"),
        "recompute": _recompute(given("recompute_granularity"), flag("checkpoint_activations"),
                                flag("recompute_activations")),
        "sequence parallel": given("sequence_parallel"),
        "distributed optimizer": "True" if flag("use_distributed_optimizer") or _zero(args) else
        given("use_distributed_optimizer"),
        "gradient all-reduce overlap": given("overlap_grad_reduce"),
        "precision": _precision(args),
        "ffn hidden size": given("ffn_hidden_size"),
        "kv heads": given("num_query_groups") if flag("group_query_attention") else None,
        "mlp": ("swiglu" if flag("swiglu") else "gelu") if "swiglu" in args else None,
        "norm": given("normalization"), "position": _position(given("position_embedding_type")),
        "bias": given("add_bias_linear"),
        "qkv bias": "True" if flag("add_qkv_bias") else None,  # Megatron's QKV has a bias with either flag
        "tie embeddings": None if "untie_embeddings_and_output_weights" not in args else
        str(not flag("untie_embeddings_and_output_weights")),
        "attention": _attention(args), "framework": "megatron", "fused kernels": _fused_kernels(args),
        "context parallel size": given("context_parallel_size"), "experts": given("num_experts"),
        "expert parallel size": given("expert_model_parallel_size"),
    }


#: Megatron's switches of its fused kernels (``--no-masked-softmax-fusion``, ...)
_FUSIONS = ("masked_softmax_fusion", "bias_gelu_fusion", "bias_dropout_fusion")


def _fused_kernels(args: dict[str, str]) -> str | None:
    """``False`` where the run switched every fused kernel off that it logs a switch of (its layers then ran
    PyTorch's operators), ``True`` where it kept one or ran Transformer Engine's layers (which fuse whatever the
    switches say), None in a log without them."""
    if args.get("transformer_impl") == "transformer_engine":
        return "True"
    switches = [args[name] for name in _FUSIONS if name in args]
    return None if not switches else str(any(value == "True" for value in switches))


def _precision(args: dict[str, str]) -> str | None:
    """The run's precision: ``fp8`` where Megatron ran its GEMMs in FP8 (``--fp8-format``: the row is then refused,
    not predicted in bf16), else bf16, fp16 or fp32 as its flags say; None in a log without them."""
    if args.get("fp8") not in (None, "None", "False"):
        return "fp8"
    if "fp16" not in args and "bf16" not in args:
        return None
    return "bf16" if args.get("bf16") == "True" else "fp16" if args.get("fp16") == "True" else "fp32"


def _recompute(granularity: str | None, checkpoint_activations: bool, recompute_activations: bool) -> str:
    """Megatron's recomputation: ``--recompute-granularity full|selective``, or the older
    ``--checkpoint-activations`` (full) and ``--recompute-activations`` (selective); none without them."""
    if granularity in ("full", "selective"):
        return granularity
    return "full" if checkpoint_activations else "selective" if recompute_activations else "none"


def _zero(args: dict[str, str]) -> bool:
    """Whether a Megatron-DeepSpeed run partitioned its optimizer states (ZeRO stage 1 or above)."""
    stage = args.get("zero_stage")
    return args.get("deepspeed") == "True" and stage is not None and stage.isdigit() and int(stage) >= 1


def _position(kind: str | None) -> str | None:
    """Megatron's ``position_embedding_type`` as the table names it (``learned_absolute`` is learned; others, RoPE
    aside, as written: the run's row says what is not modelled)."""
    return {"learned_absolute": "learned", "rope": "rope"}.get(kind or "", kind)


def _attention(args: dict[str, str]) -> str:
    """Fused attention where the run used FlashAttention (``--use-flash-attn``) or Transformer Engine's attention
    with a fused backend (its default); eager otherwise."""
    backend = (args.get("attention_backend") or "").lower()
    if args.get("use_flash_attn") == "True" or any(word in backend for word in ("flash", "fused")):
        return "flash"
    if args.get("transformer_impl") == "transformer_engine" and not any(w in backend for w in ("unfused", "local")):
        return "flash"
    return "eager"
