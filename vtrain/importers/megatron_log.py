"""A Megatron-LM (or Megatron-DeepSpeed) training log as a measurement table: one row per run it logs.

Megatron prints its arguments when it starts, one a line between two rules::

    ------------------------ arguments ------------------------
      hidden_size ..................................... 4096
      ...
    -------------------- end of arguments ---------------------

then, every ``--log-interval`` iterations, the mean time of the iterations since the last line::

     iteration       20/     500 | consumed samples:         1280 | elapsed time per iteration (ms): 1234.5 | ...

(BigScience's Megatron-DeepSpeed, which trained BLOOM, writes ``elapsed time per iteration (s): 105.22``.)

A run is the arguments and the iteration lines after them (a log that restarts holds several; a restart that
timed nothing is said and left out). Its measured time is the median of its logged intervals but the first
(which holds the first iterations' start-up: allocation, kernel selection, NCCL's set-up); a run with one interval
is that one, with a warning. Under a batch ramp-up (``--rampup-batch-size``) only the intervals at the run's
global batch are timed (each line prints its batch); a run that never reached it is timed at the last batch it
logged, said. Lines may carry the
launcher's prefix (``[default0]:``, ``0:``, a timestamp): the patterns are searched anywhere in a line.

The arguments become the columns of :mod:`vtrain.importers.measurements` (:data:`_COLUMNS`): the shape, the
parallelism, the padded vocabulary Megatron prints (``> padded vocab (size: 50257) with 175 dummy tokens (new size:
50432)``), recomputation, sequence parallelism, the distributed optimizer (DeepSpeed's ZeRO stage 1 and up), the
gradient reduction's overlap, precision, the layer (SwiGLU, RMSNorm, rotary positions, biases, tied embeddings,
grouped-query attention), fused attention, and context and expert parallelism (a row with either is refused there,
as in any table). Arguments of every era are read: Megatron-LM's 2021 ``checkpoint_activations``, 2022's
``activations_checkpoint_method``, Megatron-core's uneven first and last stages; Megatron-DeepSpeed's ZeRO stages,
its enum of positions (``PositionEmbeddingType.alibi``), its pipeline engine's split of the layers and its LLaMA
recipes' ``num_key_value_heads``, ``use_rotary_position_embeddings``, ``use_flash_attn_v2``; GPT-NeoX's names (its
values printed with ``....updated``) and Megatron-LM v1's (2019-20: ``model_parallel_size``, a GPU's ``batch_size``);
a T5 run is refused, a NeMo (Lightning) log said to be one. What a row cannot say
(partial recomputation, ZeRO stages 2 and 3, ALiBi, a squared ReLU, a vocabulary the log does not print) is said,
with what is predicted instead. The GPU, GPUs per node and links are not in a log: the command's flags give
them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from pathlib import Path

import polars as pl

from vtrain.errors import InputError, warn_input
from vtrain.importers._read import LINE
from vtrain.runconfig import ModelConfig, balanced_stage_layers

_ARGUMENTS = re.compile(r"-{3,} arguments -{3,}")
_END = re.compile(r"-{3,} end of arguments -{3,}")
_ARGUMENT = re.compile(r"(\w+) \.{2,} (.*?)\s*$")
_INTERVAL = re.compile(r"elapsed time per iteration \((ms|s)\): ([0-9]+(?:\.[0-9]*)?)")
#: the global batch an interval's iterations ran (Megatron prints it on every line: it grows under --rampup-batch-size)
_INTERVAL_BATCH = re.compile(r"global batch size:\s*([0-9]+)")
#: milliseconds per unit of an interval's time (BigScience's Megatron-DeepSpeed logs seconds)
_MS = {"ms": 1.0, "s": 1000.0}
#: overlaps of communication with computation a run may turn on that the simulator does not model: argument -> what
_UNMODELLED_OVERLAPS = {
    "tp_comm_overlap": "its tensor-parallel communication with its GEMMs (--tp-comm-overlap)",
    "overlap_param_gather": "its distributed optimizer's parameter all-gathers with the next forward "
                            "(--overlap-param-gather)",
}
#: NeMo's step time on its progress lines (``train_step_timing in s=3.51``)
_NEMO_STEP = re.compile(r"train_step_timing(?: in s)?=")
_WORLD = re.compile(r"using world size:\s*(\d+)")
_PADDED = re.compile(r"> padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")


def is_megatron_log(text: str) -> bool:
    """Whether a text is a Megatron training log: it prints its arguments and times iterations."""
    return _ARGUMENTS.search(text) is not None and _INTERVAL.search(text) is not None


def unreadable_log(text: str) -> str | None:
    """Why a text that is a training log cannot be read as one, said; None for any other text: half of a Megatron
    log (Megatron prints its arguments on rank 0, its iteration times on the last rank: in a multi-node run each
    node's output holds one half), or NeMo's (PyTorch Lightning's progress lines)."""
    if _NEMO_STEP.search(text) and not is_megatron_log(text):
        return ("a NeMo (PyTorch Lightning) log, which vtrain does not read: give its run as a measurement table "
                "(its train_step_timing as 'iteration time (s)', the shape and parallelism from its hparams.yaml)")
    arguments, timed = _ARGUMENTS.search(text) is not None, _INTERVAL.search(text) is not None
    if arguments and not timed:
        return ("a Megatron log's arguments without a timed iteration: Megatron prints its iteration times on the "
                "last rank (in a multi-node run, another node's output: give the file that holds them, or the "
                "nodes' outputs joined into one)")
    if timed and not arguments:
        return ("a Megatron log's iteration times without its arguments: Megatron prints them on rank 0 when it "
                "starts (in a multi-node run, the first node's output: give the nodes' outputs joined into one)")
    return None


def megatron_log_rows(text: str, path: Path) -> tuple[list[str], pl.DataFrame]:
    """The runs of a Megatron log as :func:`~vtrain.importers._read.csv_rows` gives a table: the column names and
    one row of text cells per run (and the line its arguments start on)."""
    lines = text.splitlines()
    read = [(start, _run(block, start, path, _announced_world(lines[:start]))) for start, block in _blocks(lines)]
    runs = [run for _, run in read if run is not None]
    if not runs:
        raise InputError("a Megatron log without a timed iteration after its arguments", path)
    untimed = [start for start, run in read if run is None]
    if untimed:
        warn_input(f"the run(s) whose arguments start on line(s) {', '.join(map(str, untimed))} timed no iteration "
                   "(stopped before the first logged interval): left out", path)
    names = list(dict.fromkeys(name for run in runs for name in run if name != LINE))
    frame = pl.DataFrame({name: [run.get(name) for run in runs] for name in names},
                         schema={name: pl.String for name in names})
    return names, frame.with_columns(pl.Series(LINE, [int(run[LINE]) for run in runs], dtype=pl.Int64))


def _blocks(lines: list[str]) -> list[tuple[int, list[str]]]:
    """Each run's lines, from its arguments' rule (its 1-based line number) to the next run's."""
    starts = [index for index, line in enumerate(lines) if _ARGUMENTS.search(line)]
    return [(start + 1, lines[start:end]) for start, end in zip(starts, [*starts[1:], len(lines)])]


def _announced_world(lines: list[str]) -> str | None:
    """The world size the last ``using world size: N`` line before a run's arguments announces (Megatron-LM's
    launch, of every era: v1's arguments do not hold it)."""
    found = [match.group(1) for line in lines if (match := _WORLD.search(line))]
    return found[-1] if found else None


def _run(block: list[str], start: int, path: Path, world: str | None) -> dict[str, str] | None:
    """One run's row (text cells by column name), None when it timed no iteration."""
    end = next((index for index, line in enumerate(block) if _END.search(line)), len(block))
    arguments = {found.group(1): _NEOX_SOURCE.sub("", found.group(2))
                 for line in block[1:end] if (found := _ARGUMENT.search(line))}
    intervals = [_interval(found, line) for line in block[end:] if (found := _INTERVAL.search(line))]
    if not intervals:
        return None
    where = f"the run whose arguments start on line {start}"
    arguments = _in_megatron_lm_names(arguments, world, where, path)
    _refuse_encoder_decoder(arguments, where, path)
    batch, timed = _timed_intervals(intervals, arguments.get("global_batch_size"), where, path)
    if len(timed) == 1:
        warn_input(f"{where} logged one interval: its time includes the start-up of its first iterations", path)
    padded = next((found.group(1) for line in block[end:] if (found := _PADDED.search(line))), None)
    overlapped = [what for name, what in _UNMODELLED_OVERLAPS.items() if arguments.get(name) == "True"]
    if overlapped:
        warn_input(f"{where} overlapped {' and '.join(overlapped)}, which vtrain does not model: predicted in the "
                   "open", path)
    for problem in _unread(arguments, padded):
        warn_input(f"{where}: {problem}", path)
    columns = _columns(arguments, padded)
    if batch is not None:
        columns["global batch"] = batch
    row = {column: value for column, value in columns.items() if value is not None}
    return {**row, "iteration time (ms)": repr(statistics.median(timed)), LINE: str(start)}


def _interval(found: re.Match[str], line: str) -> tuple[float, str | None]:
    """An iteration line's interval: its mean time in ms and the global batch it ran (None where not printed)."""
    batch = _INTERVAL_BATCH.search(line)
    return float(found.group(2)) * _MS[found.group(1)], batch.group(1) if batch else None


def _timed_intervals(intervals: list[tuple[float, str | None]], final_batch: str | None, where: str,
                     path: Path) -> tuple[str | None, list[float]]:
    """The global batch the run is timed at where it is not its arguments' (None where it is) and the intervals
    that ran it, the run's first aside (its start-up) unless it is the only one. Under a batch ramp-up
    (``--rampup-batch-size``) the intervals at smaller batches are left out, said; a run that never reached its
    final batch is timed at the last batch it logged, said."""
    batches = [batch for _, batch in intervals if batch is not None]
    batch = final_batch if final_batch in batches or not batches else batches[-1]
    at_batch = [(index, ms) for index, (ms, logged) in enumerate(intervals) if logged in (None, batch)]
    timed = [ms for index, ms in at_batch if index > 0] or [ms for _, ms in at_batch]
    others = sorted({int(logged) for _, logged in intervals if logged not in (None, batch)})
    said = []
    if others:
        shown = ", ".join(map(str, others[:3])) + (", ..." if len(others) > 3 else "")
        said.append(f"{len(intervals) - len(at_batch)} interval(s) at global batch {shown} left out")
    if final_batch not in (None, batch):
        said.append(f"it never reached its global batch {final_batch}: timed at {batch}, the last it logged")
    if said:
        warn_input(f"{where} ramped its batch up: {'; '.join(said)}", path)
    return (batch if batch != final_batch else None), timed


def _columns(args: dict[str, str], padded_vocab: str | None) -> dict[str, str | None]:
    """A run's arguments as the measurement table's columns (None: the argument is not in this log, or says
    nothing the table would)."""
    given, flag = _given(args), _flag(args)
    return {
        "gpus": given("world_size"), "global batch": given("global_batch_size"),
        "micro batch": given("micro_batch_size"), "hidden size": given("hidden_size"),
        "attention heads": given("num_attention_heads"), "# layers": given("num_layers"),
        "sequence length": given("seq_length"), "tp": given("tensor_model_parallel_size"),
        "pp": given("pipeline_model_parallel_size"), "dp": given("data_parallel_size"),
        "virtual stages": given("virtual_pipeline_model_parallel_size"), "stage layers": _stage_layers(args),
        "vocabulary": padded_vocab or given("padded_vocab_size") or given("vocab_size"),
        "recompute": _recompute(args)[0],
        "sequence parallel": given("sequence_parallel"),
        "distributed optimizer": "True" if flag("use_distributed_optimizer") or _zero_stage(args) >= 1 else
        given("use_distributed_optimizer"),
        # stage 3 gathers the parameters in every pass: the row is refused, as a table's of stage 3 is
        "zero stage": str(_zero_stage(args)) if _zero_stage(args) >= 3 else None,
        "gradient all-reduce overlap": given("overlap_grad_reduce") or ("True" if given("DDP_impl") == "torch"
                                                                         else None),
        "precision": _precision(args),
        "ffn hidden size": given("ffn_hidden_size"),
        "kv heads": _kv_heads(args),
        "mlp": ("swiglu" if flag("swiglu") else "gelu") if "swiglu" in args else None,
        "norm": given("normalization"), "position": _position(args),
        "bias": given("add_bias_linear"),
        "qkv bias": "True" if flag("add_qkv_bias") else None,  # Megatron's QKV has a bias with either flag
        "tie embeddings": None if "untie_embeddings_and_output_weights" not in args else
        str(not flag("untie_embeddings_and_output_weights")),
        "attention": _attention(args), "framework": "megatron", "fused kernels": _fused_kernels(args),
        "context parallel size": given("context_parallel_size"), "experts": given("num_experts"),
        "expert parallel size": given("expert_model_parallel_size"),
    }


def _in_megatron_lm_names(args: dict[str, str], world: str | None, where: str, path: Path) -> dict[str, str]:
    """A run's arguments in Megatron-LM's names, where GPT-NeoX or Megatron-LM v1 (2019-20) wrote others
    (:data:`_NEOX_NAMES`; v1's ``model_parallel_size`` is its tensor parallelism and its ``batch_size`` a GPU's
    batch, with no accumulation: the global batch is that times the data-parallel ranks)."""
    given = _given(args)
    renamed = {_NEOX_NAMES.get(name, name) if _NEOX_NAMES.get(name, name) not in args else name: value
               for name, value in args.items()}
    if "world_size" not in renamed and world:
        renamed["world_size"] = world
    if renamed.get("pipeline_model_parallel_size") == "0":  # NeoX: 0 is no pipeline module at all
        renamed["pipeline_model_parallel_size"] = "1"
    neox = any(name in args for name in ("pipe_parallel_size", "train_micro_batch_size_per_gpu", "global_num_gpus"))
    if neox:
        renamed |= _neox_settings(args)
    elif "batch_size" in args and "micro_batch_size" not in args:  # Megatron-LM v1: no pipeline yet
        renamed |= {"micro_batch_size": args["batch_size"], "pipeline_model_parallel_size": "1"}
        tp, gpus, batch = given("model_parallel_size") or "1", renamed.get("world_size"), args["batch_size"]
        if gpus and all(value.isdigit() and int(value) > 0 for value in (tp, gpus, batch)):
            renamed["global_batch_size"] = str(int(batch) * max(1, int(gpus) // int(tp)))
    if neox and _flag(args)("gpt_j_residual"):
        warn_input(f"{where}: its attention and MLP run in parallel (GPT-NeoX's gpt_j_residual): predicted one "
                   "after the other (the same kernels)", path)
    return renamed


#: GPT-NeoX's (and Megatron-LM v1's ``model_parallel_size``) argument names -> Megatron-LM's
_NEOX_NAMES = {"model_parallel_size": "tensor_model_parallel_size",
               "pipe_parallel_size": "pipeline_model_parallel_size",
               "train_micro_batch_size_per_gpu": "micro_batch_size", "train_batch_size": "global_batch_size",
               "global_num_gpus": "world_size"}
#: GPT-NeoX prints each argument's value followed by dots and whether it is its ``default`` or ``updated``
_NEOX_SOURCE = re.compile(r"\.{3,}(?:updated|default)$")


def _neox_settings(args: dict[str, str]) -> dict[str, str]:
    """GPT-NeoX's precision, positions, norm and ZeRO stage as Megatron-DeepSpeed's arguments say them (NeoX runs
    its pipeline on DeepSpeed's engine)."""
    settings = {"deepspeed": "True"}
    precision = args.get("precision", "")
    if precision in ("fp16", "bfloat16", "bf16", "fp32"):
        settings |= {"fp16": str(precision == "fp16"), "bf16": str(precision in ("bfloat16", "bf16"))}
    positions = {"rotary": "rope", "learned": "learned_absolute", "alibi": "PositionEmbeddingType.alibi"}
    if args.get("pos_emb") in positions:
        settings["position_embedding_type"] = positions[args["pos_emb"]]
    if args.get("norm") == "rmsnorm":
        settings["normalization"] = "RMSNorm"
    if stage := re.search(r"['\"]stage['\"]:\s*(\d)", args.get("zero_optimization", "")):
        settings["zero_stage"] = stage.group(1)
    return settings


def _given(args: dict[str, str]) -> Callable[[str], str | None]:
    """An argument's value, None where the log has it not or as ``None``."""
    return lambda name: None if args.get(name) in (None, "None") else args[name]


def _refuse_encoder_decoder(args: dict[str, str], where: str, path: Path) -> None:
    """Refuse a T5 run: Megatron prints ``decoder_num_layers`` and ``decoder_seq_length`` as ``None`` for a GPT
    (and ``encoder_num_layers`` as its layers), numbers only for an encoder-decoder, whose decoder's cross-attention
    and two sequence lengths vtrain does not model."""
    given = _given(args)
    decoder = given("decoder_num_layers") or given("decoder_seq_length")
    if decoder:
        raise InputError(f"{where} is an encoder-decoder (T5: decoder_num_layers/decoder_seq_length {decoder}): "
                         "vtrain models GPT-style decoders only", path)


def _flag(args: dict[str, str]) -> Callable[[str], bool]:
    """Whether a switch is on."""
    return lambda name: args.get(name) == "True"


def _unread(args: dict[str, str], padded_vocab: str | None) -> list[str]:
    """What a run's arguments say that its row cannot, each as predicted instead."""
    given, flag = _given(args), _flag(args)
    problems = [partial for partial in [_recompute(args)[1]] if partial]
    if not (padded_vocab or given("padded_vocab_size") or given("vocab_size")):
        problems.append("its vocabulary is not in the log (no '> padded vocab' line): predicted with "
                        f"{ModelConfig.vocab:,} tokens, GPT-2's")
    if _zero_stage(args) == 2:
        problems.append("DeepSpeed's ZeRO stage 2 partitions its gradients: predicted as the distributed optimizer "
                        "(ZeRO stage 1)")
    if (given("tokenizer_type") or "").startswith("BertWordPiece"):
        problems.append(f"its tokenizer ({given('tokenizer_type')}) is BERT's: predicted as a GPT of its shape (the "
                        "same layers; its attention unmasked, its pooler and binary head left out)")
    if flag("squared_relu"):
        problems.append("its MLP's squared ReLU is predicted as GELU (the same GEMMs; another element-wise kernel)")
    if "alibi" in (given("position_embedding_type") or "").lower():
        problems.append("its ALiBi positions (a bias added to the attention scores) are predicted as learned "
                        "positions")
    return problems


def _stage_layers(args: dict[str, str]) -> str | None:
    """Each pipeline stage's layers: DeepSpeed's pipeline engine's split (:func:`_deepspeed_pipeline`), or where
    a Megatron run gave its first or last stage other than an even share
    (Megatron-core's ``--decoder-first-pipeline-num-layers``, ``--decoder-last-pipeline-num-layers``, later
    ``--num-layers-in-first-pipeline-stage``, ``--num-layers-in-last-pipeline-stage``): the rest split evenly over
    the stages between. None where it gave neither, or where the rest do not split evenly (the row then says how
    the layers do not split)."""
    given = _given(args)
    layers, stages = given("num_layers"), given("pipeline_model_parallel_size")
    if _deepspeed_pipeline(args) and layers and stages and layers.isdigit() and stages.isdigit() and int(stages):
        return " ".join(map(str, _deepspeed_split(int(layers), int(stages), given("pp_partition_method"))))
    first = given("decoder_first_pipeline_num_layers") or given("num_layers_in_first_pipeline_stage")
    last = given("decoder_last_pipeline_num_layers") or given("num_layers_in_last_pipeline_stage")
    if (first is None and last is None) or not all(v.isdigit() for v in (layers, stages, first or "0", last or "0")):
        return None
    stages_left = int(stages) - (first is not None) - (last is not None)
    left = int(layers) - int(first or 0) - int(last or 0)
    if stages_left < 0 or (stages_left == 0 and left != 0) or (stages_left and left % stages_left):
        return None
    middle = [left // stages_left] * stages_left if stages_left else []
    return " ".join(map(str, [*([first] if first else []), *middle, *([last] if last else [])]))


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


def _recompute(args: dict[str, str]) -> tuple[str, str | None]:
    """Megatron's recomputation and, where it recomputed some of each stage's layers only, how that is placed.
    ``--recompute-granularity full|selective``; before it (Megatron-LM 2.6 to 3, NeMo 1)
    ``--activations-checkpoint-method uniform|block`` (full); before that ``--checkpoint-activations`` (full) and
    ``--recompute-activations`` (selective); none without them. ``block`` with fewer layers
    (``--recompute-num-layers``, ``--activations-checkpoint-num-layers``) than a stage holds recomputes those
    alone: placed as the nearer of full and none."""
    given, flag = _given(args), _flag(args)
    granularity, old_method = given("recompute_granularity"), given("activations_checkpoint_method")
    if granularity == "selective" or (granularity is None and old_method is None):
        return granularity or ("full" if flag("checkpoint_activations") else
                               "selective" if flag("recompute_activations") else "none"), None
    if granularity not in (None, "full"):
        return granularity, None
    method = given("recompute_method") if granularity == "full" else old_method
    some = given("recompute_num_layers") if granularity == "full" else given("activations_checkpoint_num_layers")
    stage = _layers_per_stage(args)
    if method != "block" or some is None or not some.isdigit() or stage is None or int(some) >= stage:
        return "full", None
    placed = "full" if 2 * int(some) >= stage else "none"
    return placed, (f"it recomputed {some} of each stage's {stage} layers (block): predicted "
                    f"{'with full' if placed == 'full' else 'without'} recomputation, the nearer")


def _layers_per_stage(args: dict[str, str]) -> int | None:
    given = _given(args)
    layers, stages = given("num_layers"), given("pipeline_model_parallel_size") or "1"
    chunks = given("virtual_pipeline_model_parallel_size") or "1"
    if not all(value.isdigit() and int(value) > 0 for value in (layers or "", stages, chunks)):
        return None
    return max(1, int(layers or 0) // (int(stages) * int(chunks)))


def _deepspeed_pipeline(args: dict[str, str]) -> bool:
    """Whether a Megatron-DeepSpeed run's pipeline ran on DeepSpeed's engine (``--deepspeed`` without
    ``--no-pipeline-parallel``), which splits the layers its own way (:func:`_deepspeed_split`)."""
    return args.get("deepspeed") == "True" and args.get("no_pipeline_parallel") != "True" and \
        (_given(args)("pipeline_model_parallel_size") or "1") != "1"


def _deepspeed_split(layers: int, stages: int, method: str | None) -> list[int]:
    """The layers of each stage DeepSpeed's pipeline engine gives a GPT: ``type:transformer`` (the default) by
    :func:`~vtrain.runconfig.balanced_stage_layers`; ``type:transformer|embedding`` (BigScience's
    ``--pp-partition-method``, BLOOM's) counting the first stage's and the last stage's embedding as a layer each."""
    if stages < 2 or "embedding" not in (method or ""):
        return list(balanced_stage_layers(layers, stages))
    split = list(balanced_stage_layers(layers + 2, stages))
    split[0], split[-1] = split[0] - 1, split[-1] - 1
    return split


def _zero_stage(args: dict[str, str]) -> int:
    """The ZeRO stage of a Megatron-DeepSpeed run (0 without DeepSpeed): from 1 its optimizer states are
    partitioned, as Megatron's distributed optimizer partitions them."""
    stage = args.get("zero_stage")
    return int(stage) if args.get("deepspeed") == "True" and stage is not None and stage.isdigit() else 0


def _kv_heads(args: dict[str, str]) -> str | None:
    """Grouped-query attention's key-value heads: Megatron-LM's ``--num-query-groups`` (with
    ``--group-query-attention``), Megatron-DeepSpeed's ``--num-key-value-heads``."""
    given, flag = _given(args), _flag(args)
    if flag("group_query_attention"):
        return given("num_query_groups")
    return given("num_key_value_heads")


#: Megatron's ``position_embedding_type`` as the table names it: Megatron-LM's words, and Megatron-DeepSpeed's
#: enum as its arguments print it (``PositionEmbeddingType.absolute``); ALiBi, said, as learned
_POSITIONS = {"learned_absolute": "learned", "rope": "rope", "positionembeddingtype.absolute": "learned",
              "positionembeddingtype.rotary": "rope", "positionembeddingtype.alibi": "learned"}


def _position(args: dict[str, str]) -> str | None:
    """Where positions enter (others, as written: the run's row says what is not modelled). Megatron-DeepSpeed's
    LLaMA recipes switch rotary on with ``--use-rotary-position-embeddings``."""
    given = _given(args)
    if _flag(args)("use_rotary_position_embeddings"):
        return "rope"
    kind = given("position_embedding_type")
    return None if kind is None else _POSITIONS.get(kind.lower(), kind)


#: switches of FlashAttention: Megatron-LM's, Megatron-DeepSpeed's (v2, Triton)
_FLASH = ("use_flash_attn", "use_flash_attn_v2", "use_flash_attn_triton")


def _attention(args: dict[str, str]) -> str:
    """Fused attention where the run used FlashAttention (:data:`_FLASH`) or Transformer Engine's attention
    with a fused backend (its default); eager otherwise."""
    backend = (args.get("attention_backend") or "").lower()
    if any(args.get(name) == "True" for name in _FLASH) or any(word in backend for word in ("flash", "fused")):
        return "flash"
    if args.get("transformer_impl") == "transformer_engine" and not any(w in backend for w in ("unfused", "local")):
        return "flash"
    return "eager"
