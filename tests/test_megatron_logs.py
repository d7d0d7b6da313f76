"""Megatron-LM training logs as measurement tables (vtrain/importers/megatron_log.py): the runs in a user's own
logs, scored as a table's rows are.

The logs are written here as Megatron-LM writes them: its ``_print_args`` (``'  {} {} {}'.format(arg, '.' * (48 -
len(arg)), value)``, sorted, between the two rules), the tokenizer's padded-vocabulary line and ``training_log``'s
iteration lines; the launcher's prefixes (``[default0]:``) and Megatron-DeepSpeed's older arguments
(``checkpoint_activations``, ``deepspeed``, ``zero_stage``) are the variants checked. The times are round numbers,
not a measurement: what is checked is how a log is read."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.errors import InputError, InputWarning
from vtrain.importers import measurement_config, read_measurements
from vtrain.importers.megatron_log import is_megatron_log

#: a GPT run's arguments as Megatron-LM (core, 2024) prints them, with a few that are not the run's shape
ARGS: dict[str, Any] = {
    "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
    "max_position_embeddings": 2048, "micro_batch_size": 4, "global_batch_size": 64, "tensor_model_parallel_size": 2,
    "pipeline_model_parallel_size": 2, "data_parallel_size": 2, "world_size": 8,
    "virtual_pipeline_model_parallel_size": None, "recompute_granularity": None, "sequence_parallel": True,
    "use_distributed_optimizer": True, "overlap_grad_reduce": False, "fp16": False, "bf16": True,
    "ffn_hidden_size": 8192, "group_query_attention": False, "num_query_groups": 1, "swiglu": False,
    "normalization": "LayerNorm", "position_embedding_type": "learned_absolute", "add_bias_linear": True,
    "add_qkv_bias": False, "untie_embeddings_and_output_weights": False, "use_flash_attn": True,
    "transformer_impl": "local", "context_parallel_size": 1, "num_experts": None, "expert_model_parallel_size": 1,
    "lr": 0.0003, "data_path": ["/data/my_text_document"], "log_interval": 10,
}
TIMES = (2510.3, 1250.1, 1248.7, 1251.9, 1249.5)  # ms; the first interval holds the start-up


def log_text(args: dict[str, Any] = ARGS, times: tuple[float, ...] = TIMES, prefix: str = "",
             padded: int | None = 50432, batches: tuple[int, ...] | None = None) -> str:
    """A log as Megatron prints it; ``batches``: the global batch of each interval (``--rampup-batch-size``), by
    default the arguments' own."""
    lines = ["using world size: 8, data-parallel size: 2, tensor-model-parallel size: 2",
             "------------------------ arguments ------------------------"]
    lines += sorted(("  {} {} {}".format(arg, "." * (48 - len(arg)), value) for arg, value in args.items()),
                    key=str.lower)
    lines += ["-------------------- end of arguments ---------------------", "> building GPT2BPETokenizer ..."]
    if padded:
        lines.append(f" > padded vocab (size: 50257) with {padded - 50257} dummy tokens (new size: {padded})")
    for step, ms, batch in zip(range(10, 10 * len(times) + 1, 10), times,
                               batches or [args["global_batch_size"]] * len(times)):
        lines.append(f" [2026-11-27 10:00:{step:02d}] iteration {step:8d}/{500:8d} | consumed samples: "
                     f"{step * 64:12d} | elapsed time per iteration (ms): {ms:.1f} | throughput per GPU (TFLOP/s/GPU): "
                     f"140.2 | learning rate: 3.000000E-04 | global batch size: {batch:5d} | lm "
                     f"loss: 7.123E+00 | loss "
                     f"scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:"
                     f"   0 |")
    return "\n".join(prefix + line for line in lines) + "\n"


def read(tmp_path: Path, text: str, name: str = "train.log"):
    path = tmp_path / name
    path.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        return read_measurements(path)


def test_a_log_is_one_run_with_its_shape_and_the_median_of_its_intervals_but_the_first(tmp_path: Path) -> None:
    row = read(tmp_path, log_text()).row(0, named=True)
    assert (row["gpus"], row["global_batch"], row["micro_batch"], row["tp"], row["pp"], row["dp"]) == (8, 64, 4, 2,
                                                                                                      2, 2)
    assert (row["hidden"], row["heads"], row["layers"], row["seq"], row["vocab"]) == (2048, 16, 24, 2048, 50432)
    assert row["iteration_ms"] == pytest.approx(1249.8)  # median of the last four
    assert row["problem"] is None and row["measured_as"] == "ms"


def test_the_runs_settings_become_its_config(tmp_path: Path) -> None:
    config = measurement_config(read(tmp_path, log_text()).row(0, named=True))
    par = config.parallelism
    assert (par.recompute, par.sequence_parallel, par.distributed_optimizer, par.dp_overlap) == ("none", True, True,
                                                                                                 False)
    assert (config.precision, config.attention, config.framework) == ("bf16", "flash", "megatron")
    assert (config.model.ffn, config.model.mlp, config.model.norm, config.model.position) == (8192, "gelu",
                                                                                              "layernorm", "learned")
    assert config.model.tie_embeddings is True and config.constraint_errors() == []


@pytest.mark.parametrize(("switches", "fused"), [
    ({}, True),  # a log without the switches: Megatron's defaults, fused
    ({"masked_softmax_fusion": False, "bias_gelu_fusion": False, "bias_dropout_fusion": False}, False),
    ({"masked_softmax_fusion": True, "bias_gelu_fusion": False, "bias_dropout_fusion": False}, True),
    ({"masked_softmax_fusion": False, "bias_gelu_fusion": False, "bias_dropout_fusion": False,
      "transformer_impl": "transformer_engine"}, True),  # Transformer Engine's layers fuse regardless
])
def test_a_run_without_megatrons_fused_kernels_says_so(tmp_path: Path, switches: dict[str, bool],
                                                       fused: bool) -> None:
    """``--no-masked-softmax-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion``: PyTorch's operators run."""
    config = measurement_config(read(tmp_path, log_text({**ARGS, **switches})).row(0, named=True))
    assert config.fused_kernels is fused


def test_a_llama_run_with_interleaving_and_selective_recomputation(tmp_path: Path) -> None:
    args = {**ARGS, "swiglu": True, "normalization": "RMSNorm", "position_embedding_type": "rope",
            "add_bias_linear": False, "untie_embeddings_and_output_weights": True, "group_query_attention": True,
            "num_query_groups": 4, "ffn_hidden_size": 5632, "virtual_pipeline_model_parallel_size": 3,
            "recompute_granularity": "selective", "use_flash_attn": False, "transformer_impl": "transformer_engine"}
    config = measurement_config(read(tmp_path, log_text(args)).row(0, named=True))
    assert (config.parallelism.schedule, config.parallelism.virtual_stages) == ("interleaved", 3)
    assert config.parallelism.recompute == "selective" and config.attention == "flash"
    model = config.model
    assert (model.mlp, model.norm, model.position, model.bias, model.tie_embeddings, model.query_groups) == (
        "swiglu", "rmsnorm", "rope", False, False, 4)


@pytest.mark.parametrize(("old", "recompute", "optimizer"), [
    ({"checkpoint_activations": True}, "full", False),
    ({"recompute_activations": True}, "selective", False),
    ({"deepspeed": True, "zero_stage": 1}, "none", True),
    ({"deepspeed": True, "zero_stage": 0}, "none", False),
])
def test_megatron_deepspeeds_older_arguments(tmp_path: Path, old: dict[str, Any], recompute: str,
                                             optimizer: bool) -> None:
    args = {key: value for key, value in ARGS.items() if key not in ("recompute_granularity",
                                                                      "use_distributed_optimizer")}
    config = measurement_config(read(tmp_path, log_text({**args, **old})).row(0, named=True))
    assert (config.parallelism.recompute, config.parallelism.distributed_optimizer) == (recompute, optimizer)


def test_a_launchers_prefix_on_every_line_is_read_through(tmp_path: Path) -> None:
    plain = read(tmp_path, log_text(), "a.log").drop("row")
    assert read(tmp_path, log_text(prefix="[default0]:"), "b.log").drop("row").equals(plain)
    assert read(tmp_path, log_text(prefix="0: "), "c.log").drop("row").equals(plain)


def test_a_log_that_restarts_holds_a_run_each_time(tmp_path: Path) -> None:
    second = {**ARGS, "micro_batch_size": 2}
    rows = read(tmp_path, log_text() + "Traceback: NCCL timeout\n" + log_text(second, (3000.0, 1300.0, 1302.0)))
    assert rows["micro_batch"].to_list() == [4, 2]
    assert rows["iteration_ms"].to_list() == pytest.approx([1249.8, 1301.0])


def test_one_logged_interval_is_its_time_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "short.log"
    path.write_text(log_text(times=(2510.3,)))
    with pytest.warns(InputWarning, match="logged one interval: its time includes the start-up"):
        rows = read_measurements(path)
    assert rows["iteration_ms"].to_list() == [2510.3]


def test_without_the_padded_vocabulary_line_the_vocabulary_is_the_tables_default_said(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_text(log_text(padded=None))
    with pytest.warns(InputWarning, match="its vocabulary is not in the log .* predicted with 50,257 tokens"):
        assert read_measurements(path)["vocab"].to_list() == [None]


def read_warned(tmp_path: Path, text: str) -> tuple[dict[str, Any], list[str]]:
    """A log's one run and the warnings reading it gave."""
    path = tmp_path / "train.log"
    path.write_text(text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        rows = read_measurements(path)
    return rows.row(rows.height - 1, named=True), [str(w.message) for w in caught]


def test_a_batch_ramp_up_is_timed_at_the_runs_batch_or_the_last_it_reached(tmp_path: Path) -> None:
    """``--rampup-batch-size 16 16 ...``: Megatron prints each interval's global batch; intervals at a smaller
    batch are no iteration of the run its arguments describe (before, a BLOOM-style log was predicted at 2,048
    where its intervals ran 192: 520 % off)."""
    times = (3000.0, 400.0, 410.0, 800.0, 1250.0, 1248.0, 1252.0)
    row, said = read_warned(tmp_path, log_text(times=times, batches=(16, 16, 16, 32, 64, 64, 64)))
    assert (row["global_batch"], row["iteration_ms"]) == (64, 1250.0)
    assert any("ramped its batch up: 4 interval(s) at global batch 16, 32 left out" in line for line in said)
    row, said = read_warned(tmp_path, log_text(times=times[:4], batches=(16, 16, 16, 32)))
    assert (row["global_batch"], row["iteration_ms"]) == (32, 800.0)
    assert any("it never reached its global batch 64: timed at 32, the last it logged" in line for line in said)
    row, said = read_warned(tmp_path, log_text())
    assert row["global_batch"] == 64 and not [line for line in said if "ramped" in line]


#: Megatron-DeepSpeed's arguments as BigScience's fork prints them (BLOOM): ``--position-embedding-type`` is an
#: enum, DeepSpeed's pipeline engine splits 70 layers over 12 stages (``partition_method='type:transformer'``)
_BLOOM = {**{key: value for key, value in ARGS.items() if key not in (
    "position_embedding_type", "use_distributed_optimizer", "recompute_granularity", "normalization",
    "add_bias_linear", "add_qkv_bias", "untie_embeddings_and_output_weights", "swiglu", "group_query_attention",
    "num_query_groups", "transformer_impl", "context_parallel_size", "expert_model_parallel_size", "num_experts")},
    "num_layers": 70, "pipeline_model_parallel_size": 12, "tensor_model_parallel_size": 4, "data_parallel_size": 1,
    "world_size": 48, "global_batch_size": 16, "deepspeed": True, "zero_stage": 1, "checkpoint_activations": True,
    "position_embedding_type": "PositionEmbeddingType.alibi", "use_flash_attn": False}


@pytest.mark.parametrize(("changes", "expected", "warned"), [
    ({}, {"position": "learned", "stage_layers": "6 6 6 6 6 6 6 6 6 6 6 4", "recompute": "full",
          "distributed_optimizer": True}, "its ALiBi positions .* are predicted as learned positions"),
    ({"position_embedding_type": "PositionEmbeddingType.absolute"}, {"position": "learned"}, None),
    ({"position_embedding_type": "PositionEmbeddingType.absolute", "pp_partition_method":
      "type:transformer|embedding"}, {"stage_layers": "5 6 6 6 6 6 6 6 6 6 6 5"}, None),  # BLOOM's launch script
    ({"position_embedding_type": "PositionEmbeddingType.rotary"}, {"position": "rope"}, None),
    ({"position_embedding_type": "PositionEmbeddingType.absolute", "use_rotary_position_embeddings": True,
      "num_key_value_heads": 4, "use_flash_attn_v2": True},
     {"position": "rope", "kv_heads": 4, "attention": "flash"}, None),  # its LLaMA recipes
    ({"zero_stage": 2}, {"distributed_optimizer": True}, "ZeRO stage 2 partitions its gradients"),
])
def test_megatron_deepspeeds_arguments_as_bigscience_and_its_llama_recipes_print_them(
        tmp_path: Path, changes: dict[str, Any], expected: dict[str, Any], warned: str | None) -> None:
    """Before, every BLOOM log was refused ("position must be one of learned, rope (got
    'positionembeddingtype.absolute')"), and a LLaMA recipe's GQA, rotary positions and FlashAttention read as
    none, silently (+28 % on LLaMA-2-70B)."""
    row, said = read_warned(tmp_path, log_text({**_BLOOM, **changes}))
    assert {key: row[key] for key in expected} == expected and row["problem"] is None
    assert any(re.search(warned, line) for line in said) if warned else not said, said


def test_a_deepspeed_run_of_zero_stage_3_is_refused_as_a_tables_row_is(tmp_path: Path) -> None:
    """A Megatron-DeepSpeed log of ZeRO stage 3 was scored as the distributed optimizer (warned), where a table's
    row of stage 3 is refused (an audit): the parameters gathered in every pass are not modelled, either way."""
    row, _ = read_warned(tmp_path, log_text({**_BLOOM, "zero_stage": 3}))
    assert row["problem"].startswith("ZeRO stage 3 (the parameters gathered from their shards in every pass) is not "
                                     "modelled")


@pytest.mark.parametrize(("changes", "recompute", "warned"), [
    ({"activations_checkpoint_method": "uniform", "activations_checkpoint_num_layers": 1}, "full", None),
    ({"activations_checkpoint_method": "block", "activations_checkpoint_num_layers": 12}, "full", None),
    ({"activations_checkpoint_method": "block", "activations_checkpoint_num_layers": 2}, "none",
     "recomputed 2 of each stage's 12 layers .block.: predicted without recomputation"),
    ({"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 8}, "full",
     "recomputed 8 of each stage's 12 layers .block.: predicted with full recomputation"),
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, "full", None),
])
def test_recomputation_as_every_megatron_since_2021_names_it(tmp_path: Path, changes: dict[str, Any],
                                                             recompute: str, warned: str | None) -> None:
    """Megatron-LM 2.6 to 3 (and NeMo 1) named full recomputation ``--activations-checkpoint-method`` (read as
    none before: -24 %); a block of fewer layers than a stage holds is partial, placed as the nearer and said."""
    row, said = read_warned(tmp_path, log_text({**ARGS, **changes}))
    assert row["recompute"] == recompute
    assert any(re.search(warned, line) for line in said) if warned else not said, said


def test_what_a_megatron_log_says_and_a_row_cannot_is_read_or_said(tmp_path: Path) -> None:
    """An uneven pipeline (Megatron-core's first and last stages), PyTorch's DDP (it overlaps the gradient
    all-reduce), a squared-ReLU MLP, a restart that crashed before its first interval: each read silently
    otherwise."""
    uneven = {**ARGS, "num_layers": 28, "decoder_first_pipeline_num_layers": 4,
              "pipeline_model_parallel_size": 4, "data_parallel_size": 1}
    assert read_warned(tmp_path, log_text(uneven))[0]["stage_layers"] == "4 8 8 8"
    row, said = read_warned(tmp_path, log_text({**uneven, "decoder_last_pipeline_num_layers": 4}))
    assert row["stage_layers"] == "4 10 10 4" and not said
    args = {key: value for key, value in ARGS.items() if key != "overlap_grad_reduce"}
    assert read_warned(tmp_path, log_text({**args, "DDP_impl": "torch"}))[0]["dp_overlap"] is True
    assert read_warned(tmp_path, log_text({**args, "DDP_impl": "local"}))[0]["dp_overlap"] is None
    row, said = read_warned(tmp_path, log_text({**ARGS, "squared_relu": True}))
    assert any("squared ReLU is predicted as GELU" in line for line in said)
    crashed = log_text() + log_text({**ARGS, "micro_batch_size": 8}).split("> building")[0] + "CUDA out of memory\n"
    row, said = read_warned(tmp_path, crashed)
    assert row["micro_batch"] == 4
    assert any(re.search(r"whose arguments start on line\(s\) \d+ timed no iteration .*: left out", line)
               for line in said)


def test_iteration_times_without_the_arguments_are_one_line_saying_where_they_are(tmp_path: Path) -> None:
    """The last node's output of a multi-node run: its iteration lines alone (before: "not valid YAML" from
    simulate, a table whose header is a log line from validate)."""
    path = tmp_path / "node3.out"
    path.write_text("\n".join(line for line in log_text().splitlines() if "elapsed time" in line) + "\n")
    with pytest.raises(InputError, match="iteration times without its arguments: Megatron prints them on rank 0"):
        read_measurements(path)
    ran = vtrain_in_process("simulate", path, "--profile", REPO / "profiles" / "a100")
    assert ran.returncode == 2 and "iteration times without its arguments" in ran.stderr, ran.stderr


def test_context_parallel_and_experts_are_refused_as_in_a_table(tmp_path: Path) -> None:
    rows = read(tmp_path, log_text({**ARGS, "context_parallel_size": 2}), "cp.log")
    assert rows["problem"][0].startswith("context parallelism (CP = 2) is not modelled")
    rows = read(tmp_path, log_text({**ARGS, "num_experts": 8}), "moe.log")
    assert rows["problem"][0].startswith("a mixture of 8 experts is not modelled")


def test_a_log_that_timed_nothing_is_one_error(tmp_path: Path) -> None:
    """A run that crashed before its first logged interval, or a rank's output that holds the arguments but not the
    iteration times (printed by the last rank): one error line saying so; one whose only timed line comes before the
    arguments has no run to score."""
    untimed = log_text(times=()) + " iteration       10/     500 | consumed samples: 640 | lm loss: 7.1 |\n"
    assert not is_megatron_log(untimed)
    path = tmp_path / "crashed.log"
    path.write_text(untimed)
    with pytest.raises(InputError, match="a Megatron log's arguments without a timed iteration: Megatron prints its "
                                         "iteration times on the last rank"):
        read_measurements(path)
    path.write_text(log_text(times=(900.0,)).split("------------------------ arguments")[0].replace("using", "x")
                    + " elapsed time per iteration (ms): 900.0 |\n" + log_text(times=()))
    with pytest.raises(InputError, match="a Megatron log without a timed iteration after its arguments"):
        read_measurements(path)


def test_validate_scores_a_log_end_to_end(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(log_text())
    ran = vtrain_in_process("validate", "--measurements", log, "--profile", REPO / "profiles" / "a100",
                            "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "over 1 rows" in ran.stdout  # the one line: the GPU, which a log does not say
    assert ran.stderr.splitlines() == [f"warning: {log}: rows that do not say it are predicted with: GPU A100-40GB "
                                       "(--device) for 1 of 1"]


def test_flags_a_log_leaves_nothing_to_are_said(tmp_path: Path) -> None:
    """`validate --measurements LOG --attention eager --recompute full` predicted the log's flash attention and no
    recomputation (a log states both; the flags stand in only for rows that leave a setting out), silently, where
    `simulate LOG` takes the same flags as overrides (an audit of one predictor: 1,037.5 against 1,703.9 ms)."""
    log = tmp_path / "train.log"
    log.write_text(log_text())
    args = ("validate", "--measurements", log, "--profile", REPO / "profiles" / "a100")
    plain = vtrain_in_process(*args, "-o", tmp_path / "a", "--json")
    flagged = vtrain_in_process(*args, "--attention", "eager", "--recompute", "full", "-o", tmp_path / "b", "--json")
    assert plain.returncode == 0 and flagged.returncode == 0, flagged.stderr
    assert "warning: --recompute full, --attention eager: every row gives its own, so these flags set no row" \
        in flagged.stderr, flagged.stderr
    assert "every row gives its own" not in plain.stderr
    assert json.loads(flagged.stdout)["mape_pct"] == json.loads(plain.stdout)["mape_pct"]


# --- a folder of runs --------------------------------------------------------------------------------------------

def runs_folder(tmp_path: Path) -> Path:
    """A run's folder as users keep them: logs, a table, the job script and a core dump beside them."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a-train.log").write_text(log_text())
    (folder / "b-train.log").write_text(log_text({**ARGS, "micro_batch_size": 2}, (3000.0, 1300.0, 1302.0)))
    (folder / "c-table.csv").write_text("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,iteration time (ms)\n"
                                        "8,64,4,2048,2,2,2048,24,16,1260\n")
    (folder / "job.sh").write_text("#!/bin/bash\nsrun python pretrain_gpt.py --num-layers 24\n")
    (folder / "core.bin").write_bytes(bytes(range(256)))
    (folder / ".hidden.csv").write_text("not read")
    return folder


def test_a_folder_is_its_logs_and_tables_in_name_order_the_other_files_warned_of(tmp_path: Path) -> None:
    with pytest.warns(InputWarning, match=r"runs: 2 file\(s\) neither a measurement table nor a Megatron log, not "
                                          r"read \(core.bin, ...\)"):
        rows = read_measurements(runs_folder(tmp_path))
    assert rows["row"].to_list() == [1, 2, 3]
    assert rows["micro_batch"].to_list() == [4, 2, 4]
    assert rows["iteration_ms"].to_list() == pytest.approx([1249.8, 1301.0, 1260.0])


def test_a_broken_table_in_a_folder_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = runs_folder(tmp_path)
    (folder / "c-table.csv").write_text("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,iteration time (ms)\n"
                                        "8,64,4,2048,2,2,2048,twenty,16,1260\n")
    with pytest.raises(InputError, match=r"c-table.csv: line 2: 'layers' is not an integer"):
        read_measurements(folder)


def test_a_folder_without_runs_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text("#!/bin/bash\n")
    with pytest.raises(InputError, match=r"no measurement table or Megatron log among its 1 file\(s\)"):
        read_measurements(tmp_path)


def test_a_folders_digest_follows_its_files(tmp_path: Path) -> None:
    """A profile fitted on a folder's rows knows the folder again by this digest, and not once a file changed."""
    from vtrain.importers import file_digest

    folder = runs_folder(tmp_path)
    before = file_digest(folder)
    assert file_digest(folder) == before
    (folder / "b-train.log").write_text(log_text())
    assert file_digest(folder) != before


def test_validate_scores_a_folder_of_runs(tmp_path: Path) -> None:
    ran = vtrain_in_process("validate", "--measurements", runs_folder(tmp_path), "--profile",
                            REPO / "profiles" / "a100", "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert "over 3 rows" in ran.stdout and "2 file(s) neither a measurement table nor a Megatron log" in ran.stderr


@pytest.mark.parametrize(("bias", "qkv", "expected"), [(True, False, True), (False, False, False),
                                                       (False, True, True), (True, True, True)])
def test_the_qkv_projection_has_a_bias_with_either_of_megatrons_flags(tmp_path: Path, bias: bool, qkv: bool,
                                                                      expected: bool) -> None:
    """Megatron-core's QKV projection adds a bias where ``add_bias_linear`` or ``add_qkv_bias`` says so."""
    row = read(tmp_path, log_text({**ARGS, "add_bias_linear": bias, "add_qkv_bias": qkv})).row(0, named=True)
    assert measurement_config(row).model.has_qkv_bias is expected


def test_simulate_a_log_is_the_prediction_validate_scores(tmp_path: Path) -> None:
    """One predictor: `simulate train.log` (on the profile's GPU, as validate puts a log's runs) predicts what
    `validate --measurements train.log` scored, and says what the log measured."""
    import json

    log = tmp_path / "train.log"
    log.write_text(log_text())
    profile = REPO / "profiles" / "a100"
    simulated = vtrain_in_process("simulate", log, "--profile", profile, "--json")
    assert simulated.returncode == 0, simulated.stderr
    assert "a Megatron log: the run it logs, measured 1,249.8 ms an iteration" in simulated.stderr
    validated = vtrain_in_process("validate", "--measurements", log, "--profile", profile, "-o", tmp_path / "r",
                                  "--json")
    assert validated.returncode == 0, validated.stderr
    predicted = pl.read_parquet(tmp_path / "r" / "rows.parquet")["predicted_ms"].to_list()
    assert predicted == [pytest.approx(json.loads(simulated.stdout)["iteration_time_ms"], rel=1e-12)]


def test_plan_a_log_sweeps_its_model_and_batch_with_its_layout_as_the_reference(tmp_path: Path) -> None:
    import json

    log = tmp_path / "train.log"
    log.write_text(log_text())
    ran = vtrain_in_process("plan", log, "--gpus", "8", "--profile", REPO / "profiles" / "a100", "-o",
                            tmp_path / "out", "--json", "--max-micro-batch", "4")
    assert ran.returncode == 0, ran.stderr
    summary = json.loads(ran.stdout)
    assert summary["reference"]["tp"] == 2 and summary["reference"]["micro_batch"] == 4


def test_a_log_of_a_run_vtrain_does_not_simulate_is_one_error(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text(log_text({**ARGS, "context_parallel_size": 2}))
    ran = vtrain_in_process("simulate", log, "--profile", REPO / "profiles" / "a100")
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1
    assert "the run it logs: context parallelism (CP = 2) is not modelled" in ran.stderr


def test_megatron_deepspeed_logs_iterations_in_seconds(tmp_path: Path) -> None:
    """BigScience's fork (BLOOM's training) writes ``elapsed time per iteration (s): 105.22``."""
    text = log_text().replace("elapsed time per iteration (ms): 1250.1", "elapsed time per iteration (s): 1.2501")
    text = text.replace("elapsed time per iteration (ms): 1248.7", "elapsed time per iteration (s): 1.2487")
    assert read(tmp_path, text)["iteration_ms"].to_list() == pytest.approx([1249.8])


def test_an_fp8_run_is_refused_not_predicted_in_bf16(tmp_path: Path) -> None:
    rows = read(tmp_path, log_text({**ARGS, "fp8": "hybrid"}))
    assert rows["precision"].to_list() == ["fp8"]
    ran = vtrain_in_process("validate", "--measurements", tmp_path / "train.log", "--profile",
                            REPO / "profiles" / "a100", "-o", tmp_path / "out")
    assert ran.returncode == 2 and "precision must be one of fp32, fp16, bf16 (got 'fp8')" in ran.stderr
    assert read(tmp_path, log_text({**ARGS, "fp8": None}), "b.log")["precision"].to_list() == ["bf16"]


def test_overlaps_the_simulator_does_not_model_are_said(tmp_path: Path) -> None:
    path = tmp_path / "overlap.log"
    path.write_text(log_text({**ARGS, "tp_comm_overlap": True, "overlap_param_gather": True}))
    with pytest.warns(InputWarning, match=r"line 2 overlapped its tensor-parallel communication with its GEMMs "
                                          r"\(--tp-comm-overlap\) and its distributed optimizer's parameter "
                                          r"all-gathers with the next forward"):
        read_measurements(path)


@pytest.mark.parametrize("garbled", [".", "1.2.3", "nan", "-5", "", "1e3"])
def test_a_garbled_interval_time_is_not_an_interval(tmp_path: Path, garbled: str) -> None:
    """A line cut or mangled where its time is (a crash mid-write, two ranks' output interleaved) does not count;
    ``1.2.3`` reads as its number, ``1.2``, as the pattern stops there."""
    text = log_text().replace("elapsed time per iteration (ms): 1251.9", f"elapsed time per iteration (ms): {garbled}")
    rows = read(tmp_path, text)
    assert rows["problem"].to_list() == [None] and 1249 < rows["iteration_ms"][0] < 1251


def test_a_multi_node_runs_outputs_split_over_files_say_where_the_times_are(tmp_path: Path) -> None:
    """Slurm writing one output file a node: the first node's holds Megatron's arguments, the last node's the
    iteration times (the last rank prints them). Neither alone is a run; the error says why and what to give."""
    lines = log_text().splitlines()
    (tmp_path / "node0.out").write_text("\n".join(line for line in lines if "elapsed time" not in line) + "\n")
    (tmp_path / "node1.out").write_text("\n".join(line for line in lines if "elapsed time" in line) + "\n")
    with pytest.raises(InputError, match=r"no measurement table or Megatron log among its 2 file\(s\); node0.out "
                                         r"holds a Megatron log's arguments without a timed iteration"):
        read_measurements(tmp_path)
    joined = tmp_path / "joined.log"
    joined.write_text((tmp_path / "node0.out").read_text() + (tmp_path / "node1.out").read_text())
    assert read(tmp_path, joined.read_text(), "joined.log")["iteration_ms"].to_list() == pytest.approx([1249.8])


def test_validate_takes_the_runs_log_for_traces_recorded_without_a_run_yaml(tmp_path: Path) -> None:
    """Megatron-core's own run on an H200 (`traces/gpu/h200-mcore-gpt1.3b-none`), its traces without their run.yaml,
    and a log of that run as Megatron prints it: `validate --config train.log` simulates the run the log describes,
    on the GPU the traces name (the log does not say it): the model's prediction is the one run.yaml gives."""
    recorded = REPO / "traces" / "gpu" / "h200-mcore-gpt1.3b-none"
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(recorded / "rank-0.json.gz", traces)
    args = {**ARGS, "micro_batch_size": 4, "global_batch_size": 8, "tensor_model_parallel_size": 1,
            "pipeline_model_parallel_size": 1, "data_parallel_size": 1, "world_size": 1, "sequence_parallel": False,
            "use_distributed_optimizer": False, "use_flash_attn": False, "masked_softmax_fusion": False,
            "bias_gelu_fusion": False, "bias_dropout_fusion": False}  # no apex: PyTorch's operators
    log = tmp_path / "train.log"
    log.write_text(log_text(args, padded=51200))

    def model_ms(*config: object) -> float:
        ran = vtrain_in_process("validate", traces, "--no-hta", "--json", "-o", tmp_path / f"report{len(config)}",
                                *config)
        assert ran.returncode == 0, ran.stderr
        return json.loads(ran.stdout)["model"]["predicted_ms"]

    on_h200 = model_ms("--config", recorded / "run.yaml")
    assert model_ms("--config", log) == pytest.approx(on_h200, rel=1e-9)
    on_a100 = tmp_path / "a100.yaml"  # where the log's run would go without the traces' GPU
    on_a100.write_text((recorded / "run.yaml").read_text().replace("NVIDIA H200", "A100-80GB"))
    assert model_ms("--config", on_a100) != pytest.approx(on_h200, rel=1e-3)


def test_validate_refuses_a_bare_model_for_traces(tmp_path: Path) -> None:
    """A published architecture's name says nothing of the traced run's parallelism and batch: one line."""
    ran = vtrain_in_process("validate", REPO / "traces" / "t1p1d2", "--config", "llama-2-7b", "-o", tmp_path / "r")
    assert ran.returncode == 2
    assert ran.stderr.strip().splitlines()[-1] == ("error: llama-2-7b: gives a model, not the run the traces recorded "
                                                   "(its parallelism and batch): give the run's config (run.yaml) or "
                                                   "its Megatron log")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kept_as", ["utf-16", "gzip", "a latin-1 host name"])
def test_a_log_as_windows_writes_it_kept_compressed_or_with_a_stray_byte_is_read(tmp_path: Path,
                                                                                 kept_as: str) -> None:
    """PowerShell's ``>`` writes UTF-16 with a byte-order mark; logs are kept gzipped; a host name in Latin-1 puts
    one byte that is no UTF-8 in a long log. Each was refused whole ("not a text file")."""
    text = log_text()
    data = {"utf-16": text.encode("utf-16"), "gzip": gzip.compress(text.encode()),
            "a latin-1 host name": ("node-é01: " + text).encode("latin-1")}[kept_as]
    path = tmp_path / "train.log"
    path.write_bytes(data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        rows = read_measurements(path)
    assert rows.drop("row").equals(read(tmp_path, text, "plain.log").drop("row"))
    said = [str(w.message) for w in caught]
    assert said == ([f"{path}: 1 byte(s) that are no UTF-8 (the first at byte 5) read as U+FFFD"]
                    if kept_as.startswith("a latin") else []), said
    path.write_bytes(bytes(range(256)) * 4)  # a binary file is still none
    with pytest.raises(InputError, match="not a text file"):
        read_measurements(path)


#: what Megatron-LM prints for every model: a GPT's encoder is its layers, its decoder None
ENCODER_ARGS = {"encoder_num_layers": 24, "encoder_seq_length": 2048, "decoder_num_layers": None,
                "decoder_seq_length": None, "bert_binary_head": True, "tokenizer_type": "GPT2BPETokenizer"}


def test_a_t5_run_is_refused_and_a_gpt_printing_encoder_arguments_is_read(tmp_path: Path) -> None:
    """A T5 log (pretrain_t5.py) was predicted as a GPT of 24 layers, silently: its decoder's cross-attention and
    second sequence length are not modelled."""
    row = read(tmp_path, log_text({**ARGS, **ENCODER_ARGS})).row(0, named=True)
    assert row["layers"] == 24 and row["problem"] is None
    t5 = {**ARGS, **ENCODER_ARGS, "encoder_num_layers": 12, "decoder_num_layers": 12, "decoder_seq_length": 128,
          "tokenizer_type": "BertWordPieceCase"}
    with pytest.raises(InputError, match="is an encoder-decoder .T5"):
        read(tmp_path, log_text(t5))


def test_a_bert_run_is_predicted_as_a_gpt_of_its_shape_and_said(tmp_path: Path) -> None:
    _, said = read_warned(tmp_path, log_text({**ARGS, **ENCODER_ARGS, "tokenizer_type": "BertWordPieceLowerCase"}))
    assert [line for line in said if "is BERT's: predicted as a GPT of its shape" in line], said
    _, said = read_warned(tmp_path, log_text({**ARGS, **ENCODER_ARGS}))
    assert not [line for line in said if "BERT" in line], said


def _neox_log(args: dict[str, Any], times: tuple[float, ...] = TIMES) -> str:
    """A GPT-NeoX log as its ``NeoXArgs.print`` writes the arguments (each padded with dots to 64 characters, then
    ``updated`` or ``default``) and its ``training_log`` the iterations."""
    lines = ["NeoXArgs.configure_distributed_args() using world size: 96 and model-parallel size: 2 ",
             "-------------------- arguments --------------------"]
    for arg, value in sorted(args.items()):
        shown = "  {} {} {}".format(arg, "." * (32 - len(arg)), value)
        lines.append(shown + "." * (64 - len(shown)) + "updated")
    lines += ["---------------- end of arguments ----------------",
              " > padded vocab (size: 50277) with 235 dummy tokens (new size: 50512)"]
    lines += [f" samples/sec: 32.2 | iteration {step:8d}/  150000 | elapsed time per iteration (ms): {ms:.1f} | "
              "learning rate: 9.7E-05 | approx flops per GPU: 117.0TFLOPS | lm_loss: 2.1E+00 |"
              for step, ms in zip(range(10, 10 * len(times) + 1, 10), times)]
    return "\n".join(lines) + "\n"


#: GPT-NeoX-20B's arguments (its configs/20B.yml, as NeoX prints them)
NEOX_20B = {"num_layers": 44, "hidden_size": 6144, "num_attention_heads": 64, "seq_length": 2048,
            "max_position_embeddings": 2048, "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": True,
            "model_parallel_size": 2, "pipe_parallel_size": 4, "train_micro_batch_size_per_gpu": 4,
            "train_batch_size": 1536, "gradient_accumulation_steps": 32, "global_num_gpus": 96,
            "precision": "fp16", "checkpoint_activations": True, "zero_optimization": {"stage": 1},
            "norm": "layernorm"}


def test_a_gpt_neox_log_is_read_in_its_own_names(tmp_path: Path) -> None:
    """GPT-NeoX's log (NeoX-20B: 96 A100s, t2 p4 d12) was "not a measurement table": its arguments carry
    "....updated", and tp, pp, the batches and the GPUs have other names."""
    row, said = read_warned(tmp_path, _neox_log(NEOX_20B))
    assert (row["gpus"], row["tp"], row["pp"], row["dp"], row["micro_batch"], row["global_batch"]) == (
        96, 2, 4, 12, 4, 1536)
    assert (row["layers"], row["hidden"], row["heads"], row["vocab"]) == (44, 6144, 64, 50512)
    assert (row["recompute"], row["precision"], row["position"], row["distributed_optimizer"]) == (
        "full", "fp16", "rope", True)
    assert row["iteration_ms"] == pytest.approx(1249.8)
    assert [line for line in said if "gpt_j_residual" in line], said


def test_a_megatron_lm_v1_log_is_read_with_its_per_gpu_batch(tmp_path: Path) -> None:
    """Megatron-LM v1 (2019-20): ``model_parallel_size`` is its tensor parallelism, ``batch_size`` a GPU's
    batch, the world size only in the line before the arguments; it was "not a measurement table"."""
    v1 = {"batch_size": 8, "checkpoint_activations": True, "fp16": True, "hidden_size": 1024, "num_layers": 24,
          "num_attention_heads": 16, "seq_length": 1024, "max_position_embeddings": 1024, "model_parallel_size": 2}
    text = log_text(v1, batches=(32,) * len(TIMES)).replace(
        "using world size: 8, data-parallel size: 2, tensor-model-parallel size: 2",
        "using world size: 8 and model-parallel size: 2 ")
    text = re.sub(r" global batch size: +32 \|", "", text)  # v1 printed none
    row, _ = read_warned(tmp_path, text)
    assert (row["gpus"], row["tp"], row["pp"], row["dp"], row["micro_batch"], row["global_batch"]) == (
        8, 2, 1, 4, 8, 32)
    assert (row["recompute"], row["precision"]) == ("full", "fp16")


def test_a_nemo_log_is_said_to_be_one_and_what_to_give_instead(tmp_path: Path) -> None:
    """NeMo's Lightning log was "not valid YAML" to simulate and "not a measurement table" to validate."""
    log = tmp_path / "nemo_log_globalrank-0_localrank-0.txt"
    log.write_text("[NeMo I 2024-01-10 10:00:00 megatron_gpt_pretraining:40] Hydra config: ...\n" + "".join(
        f"Epoch 0: :   1%|          | {step}/1000 [00:40<1:06:00, reduced_train_loss=9.12, global_step={step - 1}.0, "
        f"consumed_samples={step * 256}.0, train_step_timing in s=3.51]\n" for step in (10, 20, 30)))
    for command in (["simulate", log, "--profile", REPO / "profiles" / "a100"],
                    ["validate", "--measurements", log, "--profile", REPO / "profiles" / "a100", "-o", tmp_path / "r"]):
        ran = vtrain_in_process(*command)
        assert ran.returncode == 2 and ran.stderr.splitlines() == [
            f"error: {log}: a NeMo (PyTorch Lightning) log, which vtrain does not read: give its run as a measurement "
            "table (its train_step_timing as 'iteration time (s)', the shape and parallelism from its hparams.yaml)"]
