"""Measurement tables as projects publish their runs today: Markdown tables copied from a documentation page,
throughputs per GPU (tokens/s/GPU, model TFLOP/s per GPU), Megatron's virtual pipeline size (``VP``), the gradient
accumulation steps (``GA``), and columns of parallelism vtrain does not simulate (context, expert: ``CP``, ``EP``).

The tables here are written for the test, in the layout of NVIDIA NeMo's performance summary (``Model, #-GPUs,
GBS, MBS, Sequence Length, TP, PP, CP, VP, EP, GA, Tokens / sec / GPU, Model TFLOP / sec / GPU``) with shape
columns added; their throughputs are round numbers, not published ones: what is checked is how they are read."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from vtrain.errors import InputError, InputWarning
from vtrain.flops import LayerShape, hardware_flops
from vtrain.importers import measurement_config, read_measurements
from vtrain.importers._read import csv_rows

HEADER = ("Model,#-GPUs,GBS,MBS,Sequence Length,TP,PP,CP,VP,EP,GA,Tokens / sec / GPU,Model TFLOP / sec / GPU,"
          "hidden,layers,heads")


def write(tmp_path: Path, text: str, name: str = "runs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def read_quietly(path: Path, **kwargs: object):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputWarning)
        return read_measurements(path, **kwargs)


def test_tokens_per_second_per_gpu_is_the_global_batch_over_the_throughput_of_all_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\nGPT3_5B,64,2048,4,2048,1,1,1,1,1,8,20000,,4096,24,32\n")
    row = read_quietly(path).row(0, named=True)
    assert row["measured_as"] == "tokens/s/gpu" and row["problem"] is None
    assert row["dp"] == 64  # 64 GPUs over t1 p1
    assert row["iteration_ms"] == pytest.approx(2048 * 2048 / (20000 * 64) * 1e3)  # 3,276.8 ms


def test_model_tflops_per_gpu_count_the_model_flops_without_recomputation(tmp_path: Path) -> None:
    """Model TFLOP/s leave the recomputed forward out whatever the run recomputed (what MFU counts); achieved
    TFLOP/s (Megatron's SC21 table) count it."""
    text = ("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,kv heads,ffn hidden size,mlp,vocab,recompute,"
            "model TFLOP/s per GPU\n64,128,1,8192,4,8,8192,80,64,8,28672,swiglu,128256,full,400\n")
    row = read_quietly(write(tmp_path, text)).row(0, named=True)
    layer = LayerShape(ffn=28672, kv_share=8 / 64, gated=True)
    model = hardware_flops(128, 8192, 80, 8192, 128256, "none", layer)
    assert row["measured_as"] == "model tflops/gpu"
    assert row["iteration_ms"] == pytest.approx(model / (400e12 * 64) * 1e3)
    assert hardware_flops(128, 8192, 80, 8192, 128256, "full", layer) > 1.3 * model  # the two forms differ


def test_tokens_per_gpu_is_preferred_to_the_model_flops_derived_from_it(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\nGPT3_5B,64,2048,4,2048,1,1,1,1,1,8,20000,600,4096,24,32\n")
    with pytest.warns(InputWarning, match="read from 'Tokens / sec / GPU' for 1 row.*; filled but not read: "
                                          "'Model TFLOP / sec / GPU'"):
        rows = read_measurements(path)
    assert rows["measured_as"].to_list() == ["tokens/s/gpu"]


@pytest.mark.parametrize(("cells", "reason"), [
    ("1,1,2,1,1,16", "context parallelism (CP = 2) is not modelled"),
    ("1,1,1,1,8,16", "expert parallelism (EP = 8) is not modelled"),
])
def test_context_and_expert_parallel_rows_are_refused_with_their_reason(tmp_path: Path, cells: str,
                                                                        reason: str) -> None:
    """A row that ran context or expert parallelism is refused, not predicted as the dense t x d x p run its other
    columns describe (its dp, read as GPUs / (t x p), would count the CP ranks as replicas)."""
    tp, pp, cp, vp, ep, ga = cells.split(",")
    path = write(tmp_path, f"{HEADER}\nX,8,128,1,8192,{tp},{pp},{cp},{vp},{ep},{ga},1000,,4096,32,32\n")
    row = read_quietly(path).row(0, named=True)
    assert row["problem"].startswith(reason)


def test_a_mixture_of_experts_is_refused(tmp_path: Path) -> None:
    text = ("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,num experts,iteration time (ms)\n"
            "8,64,1,4096,1,1,4096,32,32,8,900\n")
    assert read_quietly(write(tmp_path, text)).row(0, named=True)["problem"].startswith(
        "a mixture of 8 experts is not modelled")


def test_parameters_sharded_as_zero_3_or_fsdp_are_refused_and_zero_1_is_the_distributed_optimizer(
        tmp_path: Path) -> None:
    """OPT-175B's row with ``zero stage`` 3 and ``fsdp`` true was scored as plain data parallelism (the columns
    "not read": an audit). ZeRO-3 and FSDP gather the parameters in every pass, which vtrain does not simulate:
    refused with the reason. ZeRO 1 and 2 shard the optimizer states as Megatron's distributed optimizer does."""
    text = ("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,zero stage,fsdp,iteration time (ms)\n"
            "64,512,1,2048,8,1,12288,96,96,3,,20000\n64,512,1,2048,8,1,12288,96,96,,true,20000\n"
            "64,512,1,2048,8,1,12288,96,96,1,false,20000\n64,512,1,2048,8,1,12288,96,96,0,false,20000\n")
    rows = read_quietly(write(tmp_path, text)).to_dicts()
    assert rows[0]["problem"].startswith("ZeRO stage 3 (the parameters gathered from their shards in every pass) is "
                                         "not modelled")
    assert rows[1]["problem"].startswith("FSDP (the parameters gathered")
    assert rows[2]["problem"] is None and rows[3]["problem"] is None
    assert measurement_config(rows[2]).parallelism.distributed_optimizer
    assert not measurement_config(rows[3]).parallelism.distributed_optimizer
    assert [row["distributed_optimizer"] for row in rows[2:]] == [True, False]  # as the defaults' warning reads it


@pytest.mark.parametrize(("header", "cell", "stage"), [
    ("zero stage", "ZeRO-3", 3), ("ZeRO", "stage 3", 3), ("zero_optimization.stage", "2", 2), ("zero stage", "z1", 1),
    ("zero stage", "ZeRO stage 3", 3), ("zero stage", "ZeRO-3 offload", 3)])
def test_zero_stages_as_tables_write_them(tmp_path: Path, header: str, cell: str, stage: int) -> None:
    """``ZeRO-3`` or ``stage 3`` stopped the whole table ("'zero_stage' is not an integer", a key of vtrain's), and
    a column named ``ZeRO`` went unread, its stage-3 row scored (an audit)."""
    text = f"GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,{header},iteration time (ms)\n" \
           f"64,512,1,2048,8,1,12288,96,96,{cell},20000\n"
    row = read_quietly(write(tmp_path, text)).row(0, named=True)
    assert row["zero_stage"] == stage and (row["problem"] is not None) == (stage == 3)


def test_fsdp_sharding_strategies(tmp_path: Path) -> None:
    """FSDP's FULL_SHARD gathers the parameters in every pass: refused; SHARD_GRAD_OP is ZeRO 2 (the distributed
    optimizer), NO_SHARD plain data parallelism. A value no number is named by the file's own column."""
    strategies = ("FULL_SHARD", "ShardingStrategy.SHARD_GRAD_OP", "NO_SHARD", "full shard", "fully_shard", "FOO")
    text = "GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,sharding strategy,iteration time (ms)\n" + "".join(
        f"64,512,1,2048,8,1,12288,96,96,{strategy},20000\n" for strategy in strategies)
    rows = read_quietly(write(tmp_path, text)).to_dicts()
    assert rows[0]["problem"].startswith("FSDP's FULL_SHARD (the parameters gathered")
    assert [row["distributed_optimizer"] for row in rows[1:3]] == [True, False]
    # written otherwise (FSDP2's fully_shard), or not known: refused, not scored as plain data parallelism (a review)
    assert rows[3]["problem"].startswith("FSDP's FULL_SHARD") and rows[4]["problem"].startswith("FSDP's FULLY_SHARD")
    assert rows[5]["problem"].startswith("sharding strategy 'foo' is none vtrain knows")
    both = write(tmp_path, "GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,zero stage,distributed optimizer,"
                           "iteration time (ms)\n64,512,1,2048,8,1,12288,96,96,2,false,20000\n", "both.csv")
    with pytest.warns(InputWarning, match=r"1 row\(s\) whose distributed optimizer column says other than their ZeRO "
                                          r"stage or sharding strategy \(line 2\): the distributed optimizer column"):
        assert read_measurements(both)["distributed_optimizer"].to_list() == [False]
    minus = write(tmp_path, "GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,zero stage,iteration time (ms)\n"
                            "64,512,1,2048,8,1,12288,96,96,-1,20000\n", "minus.csv")
    with pytest.raises(InputError, match="line 2: 'zero stage' is not a ZeRO stage"):  # was read as stage 1
        read_quietly(minus)
    bad = write(tmp_path, "GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,Zero Stage,iteration time (ms)\n"
                          "64,512,1,2048,8,1,12288,96,96,full,20000\n", "bad.csv")
    with pytest.raises(InputError, match="line 2: 'Zero Stage' is not a ZeRO stage"):
        read_quietly(bad)


def test_ones_in_the_unmodelled_columns_are_dense_runs(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\nGPT3_5B,64,2048,4,2048,1,1,1,1,1,8,20000,,4096,24,32\n")
    assert read_quietly(path)["problem"].to_list() == [None]


def test_gradient_accumulation_that_the_shape_contradicts_is_the_rows_problem(tmp_path: Path) -> None:
    """GBS 2048 over 64 replicas of micro-batch 4 is 8 steps: a GA of 16 says one of the columns is wrong."""
    path = write(tmp_path, f"{HEADER}\nA,64,2048,4,2048,1,1,1,1,1,16,20000,,4096,24,32\nB,64,2048,4,2048,1,1,1,1,1,8,"
                           f"20000,,4096,24,32\n")
    problems = read_quietly(path)["problem"].to_list()
    assert problems[0] == ("gradient accumulation 16 is not global batch / (dp x micro batch) = 8: the row's shape "
                           "columns disagree")
    assert problems[1] is None


@pytest.mark.parametrize("placeholder", ["n/a", "-", "\u2013", "NA", ""])
def test_a_virtual_pipeline_size_that_does_not_apply_is_an_empty_cell(tmp_path: Path, placeholder: str) -> None:
    path = write(tmp_path, f"{HEADER}\nGPT3_20B,64,256,2,2048,2,1,1,{placeholder},1,4,5000,,6144,44,48\n")
    row = read_quietly(path).row(0, named=True)
    assert row["virtual_stages"] is None and row["problem"] is None
    assert measurement_config(row).parallelism.schedule == "1f1b"


def test_a_virtual_pipeline_size_runs_the_interleaved_schedule(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\nX,64,128,1,4096,4,8,1,5,1,64,1200,,8192,80,64\n")
    row = read_quietly(path).row(0, named=True)
    parallelism = measurement_config(row).parallelism
    assert (parallelism.schedule, parallelism.virtual_stages) == ("interleaved", 5)
    assert measurement_config(row).constraint_errors() == []


def test_a_schedule_column_is_kept_beside_a_virtual_pipeline_size(tmp_path: Path) -> None:
    text = "GPUs,GBS,MBS,seq,TP,PP,VP,schedule,hidden,layers,heads,iteration time (ms)\n" \
           "32,64,1,2048,4,8,1,gpipe,4096,32,32,900\n"
    assert measurement_config(read_quietly(write(tmp_path, text)).row(0, named=True)).parallelism.schedule == "gpipe"


# --- Markdown tables ---------------------------------------------------------------------------------------------

MARKDOWN = """\
Performance of the runs (copied from a documentation page):

| Model | #-GPUs | GBS | MBS | Sequence Length | TP | PP | CP | VP | GA | Tokens / sec / GPU | hidden | layers | heads
|---|:-:|--:|:--|---|---|---|---|---|---|---|---|---|---|
| GPT3_5B | 64 | 2048 | 4 | 2048 | 1 | 1 | 1 | 1 | 8 | 20000 | 4096 | 24 | 32 |
| GPT3_20B | 64 | 256 | 2 | 2048 | 2 | 1 | 1 | n/a | 4 | 5000 | 6144 | 44 | 48 |

Footnote: measured in bf16.
"""


def test_a_markdown_table_is_read_as_its_rows_with_their_line_numbers(tmp_path: Path) -> None:
    path = write(tmp_path, MARKDOWN, "runs.md")
    with pytest.warns(InputWarning, match=r"read the Markdown table on lines 3-6; 2 other line\(s\) not read"):
        names, rows = csv_rows(path)
    assert names[:3] == ["Model", "#-GPUs", "GBS"] and len(names) == 14
    assert rows["line"].to_list() == [5, 6]
    assert rows["Model"].to_list() == ["GPT3_5B", "GPT3_20B"] and rows["VP"].to_list() == ["1", "n/a"]
    table = read_quietly(path)
    assert table["layers"].to_list() == [24, 44] and table["problem"].to_list() == [None, None]


def test_a_markdown_table_alone_reads_without_a_warning(tmp_path: Path) -> None:
    lines = MARKDOWN.splitlines()[2:6]
    path = write(tmp_path, "\n".join(lines) + "\n", "runs.md")
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        names, rows = csv_rows(path)
    assert rows.height == 2


def test_markdown_cells_keep_escaped_pipes_and_rows_of_dashes(tmp_path: Path) -> None:
    """Only the rule under the header is left out: a data row of dashes is a row (a run without values), and
    ``\\|`` is a pipe inside a cell."""
    text = "| name | value |\n| --- | --- |\n| a \\| b | 1 |\n| - | - |\n"
    names, rows = csv_rows(write(tmp_path, text, "t.md"))
    assert names == ["name", "value"]
    assert rows["name"].to_list() == ["a | b", "-"] and rows["value"].to_list() == ["1", "-"]


def test_a_csv_whose_first_cell_starts_with_a_pipe_is_still_csv(tmp_path: Path) -> None:
    """Without the rule of dashes under it, a line starting with ``|`` is no Markdown table."""
    names, rows = csv_rows(write(tmp_path, "|name,value\nx,1\n"))
    assert names == ["|name", "value"] and rows["value"].to_list() == ["1"]


def test_thousands_separators_and_bold_figures_are_numbers(tmp_path: Path) -> None:
    """Documentation tables print ``16,797`` and put their best figure in bold; a spreadsheet's CSV quotes
    ``"1,024"``. Groups of three digits only: ``5,6,6`` (a stage-layers list) and ``812,5`` stay as written."""
    text = ("| GPUs | GBS | MBS | seq | TP | PP | hidden | layers | heads | stage layers | Tokens / sec / GPU |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n"
            "| 1,024 | 2,048 | 1 | 2,048 | 8 | 2 | 12,288 | 96 | 96 | 48,48 | **1,234.5** |\n")
    row = read_quietly(write(tmp_path, text, "t.md")).row(0, named=True)
    assert (row["gpus"], row["global_batch"], row["hidden"], row["stage_layers"]) == (1024, 2048, 12288, "48 48")
    assert row["iteration_ms"] == pytest.approx(2048 * 2048 / (1234.5 * 1024) * 1e3)
    names, rows = csv_rows(write(tmp_path, 'a,b,c\n"1,024","5,6,6",x\n'))
    assert rows.row(0)[:3] == ("1024", "5,6,6", "x")


@pytest.mark.parametrize(("given", "meant"), [("BF16", "bf16"), ("bfloat16", "bf16"), ("bf16-mixed", "bf16"),
                                              ("16-mixed", "fp16"), ("float16", "fp16"), ("float32", "fp32"),
                                              ("FP16", "fp16")])
def test_precisions_as_frameworks_name_them(tmp_path: Path, given: str, meant: str) -> None:
    """PyTorch's dtypes and Lightning's (NeMo's) ``bf16-mixed`` in a precision column are the precisions they name;
    an unknown one (``fp8``) stays as written, and the row's checks refuse it."""
    text = ("GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,precision,iteration time (ms)\n"
            f"8,64,1,2048,1,1,1024,4,16,{given},9\n")
    assert measurement_config(read_quietly(write(tmp_path, text)).row(0, named=True)).precision == meant


def test_an_unknown_precision_is_refused_by_the_config_checks(tmp_path: Path) -> None:
    text = "GPUs,GBS,MBS,seq,TP,PP,hidden,layers,heads,precision,iteration time (ms)\n8,64,1,2048,1,1,1024,4,16,fp8,9\n"
    config = measurement_config(read_quietly(write(tmp_path, text)).row(0, named=True))
    assert config.precision == "fp8" and any("precision must be one of" in e for e in config.constraint_errors())


@pytest.mark.parametrize("header", [
    "gpus,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
    "pipeline parallelism,iteration time (s)",
    "num_gpus,global_batch_size,micro_batch_size,hidden_size,num_attention_heads,num_layers,seq_length,"
    "tensor_model_parallel_size,pipeline_model_parallel_size,time per iteration (s)",
    "GPUs,Batch size,MBS,Hidden,Heads,Layers,Seq Len,TP size,PP size,Time/iter (s)",
    "GPUs,GBS,mbs,d_model,heads,layers,seq-len,TP degree,PP degree,train_step_timing (s)",
])
def test_a_runs_columns_as_people_name_them(tmp_path: Path, header: str) -> None:
    """The same run under the column names of vTrain, of Megatron's arguments, and of papers' and users' tables."""
    row = read_quietly(write(tmp_path, f"{header}\n8,64,4,2048,16,24,2048,2,2,1.25\n")).row(0, named=True)
    assert row["problem"] is None and row["iteration_ms"] == pytest.approx(1250.0)
    assert (row["gpus"], row["global_batch"], row["micro_batch"], row["hidden"], row["heads"], row["layers"],
            row["seq"], row["tp"], row["pp"], row["dp"]) == (8, 64, 4, 2048, 16, 24, 2048, 2, 2, 2)
