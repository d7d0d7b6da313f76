"""Importers of measurements made by others, on the real A100 files copied in tests/data/a100/."""

from __future__ import annotations

import csv
import math
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from vtrain.errors import InputError, InputWarning
from vtrain.importers import (
    measurement_config,
    measurement_errors,
    read_llmcompass,
    read_llmcompass_network,
    read_measurements,
    read_nccl_tests,
    read_vidur_compute,
    read_vidur_network,
)
from vtrain.importers.llmcompass import HOST_FLOOR_MARGIN, THROUGHPUT_UNIT
from vtrain.importers.measurements import OPTIONAL_COLUMNS
from vtrain.tables.schema import NCCL_LATENCY, OP_BENCHMARKS

DATA = Path(__file__).parent / "data" / "a100"
NCCL = DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"
GROUND_TRUTH = DATA / "vtrain-a100" / "ground_truth_single.csv"
LLMCOMPASS = DATA / "llmcompass-a100"
VIDUR = DATA / "vidur-a100"
GIB = 1 << 30


def raw_rows(path: Path) -> list[list[str]]:
    """The file's rows as the csv module reads them (an independent reading to check the importers against)."""
    with path.open(newline="", encoding="utf-8-sig") as f:
        return [[value.strip() for value in row] for row in csv.reader(f) if row]


def row_where(frame: pl.DataFrame, **values: object) -> dict:
    rows = frame.filter(**values)
    assert rows.height == 1, f"{rows.height} rows match {values}"
    return rows.row(0, named=True)


# --- nccl-tests -------------------------------------------------------------------------------------------------

def test_nccl_tests_csv_8gpu_1gib_is_the_files_timings():
    table = read_nccl_tests(NCCL / "allreduce_8gpu.csv")
    assert table.schema == pl.Schema(NCCL_LATENCY)
    assert table.height == 1024  # 1 MiB to 1 GiB in 1 MiB steps
    assert set(table["collective"]) == {"all_reduce"} and set(table["group_size"]) == {8}
    assert set(table["nodes"]) == {1} and set(table["source"]) == {"nccl-tests"}
    assert set(table["device_type"]) == {"cuda"} and set(table["count"]) == {2}
    gib = row_where(table, bytes=GIB)  # 1073741824,268435456,float,8193000,229.35,8196400,229.25
    assert gib["median_us"] == pytest.approx(8194.7)
    assert (gib["p10_us"], gib["p90_us"]) == pytest.approx((8193.0, 8196.4))
    assert gib["algbw_gbps"] == pytest.approx(GIB / 8194.7e-6 / 1e9)
    assert gib["busbw_gbps"] == pytest.approx(gib["algbw_gbps"] * 2 * 7 / 8)


@pytest.mark.parametrize("gpus", range(2, 9))
def test_nccl_tests_csv_busbw_recomputed_agrees_with_the_file(gpus):
    path = NCCL / f"allreduce_{gpus}gpu.csv"
    table = read_nccl_tests(path).sort("bytes")
    assert set(table["group_size"]) == {gpus}
    rows = raw_rows(path)[1:]
    assert table["bytes"].to_list() == [int(row[0]) for row in rows]
    for ours, row in zip(table.iter_rows(named=True), rows, strict=True):
        out_bw, in_bw = float(row[4]), float(row[6])
        # nccl-tests computed busbw from the unrounded time; the file rounds times to 100 ns and busbw to 0.01
        slack = 0.005 + max(out_bw, in_bw) * 50 / min(float(row[3]), float(row[5])) + 1e-9
        # busbw of the median time lies between the two timings' busbw
        assert min(out_bw, in_bw) - slack <= ours["busbw_gbps"] <= max(out_bw, in_bw) + slack, row
        if row[3] == row[5]:
            assert ours["busbw_gbps"] == pytest.approx(out_bw, abs=slack)


def test_nccl_tests_group_size_argument_overrides_the_file_name():
    table = read_nccl_tests(NCCL / "allreduce_4gpu.csv", group_size=2, nodes=2)
    assert set(table["group_size"]) == {2} and set(table["nodes"]) == {2}
    first = table.row(0, named=True)
    assert first["busbw_gbps"] == pytest.approx(first["algbw_gbps"])  # 2(n-1)/n = 1 for two ranks


def test_nccl_tests_collective_argument(tmp_path):
    results = write(tmp_path / "results.csv", ["size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)",
                                               "8388608,262144,float,100000,73.40,100000,73.40"])
    table = read_nccl_tests(results, group_size=8, collective="all_gather_perf")
    assert table.select("collective", "group_size", "bytes", "median_us").row(0) == ("all_gather", 8, 8388608, 100.0)
    assert table["busbw_gbps"][0] == pytest.approx(8388608 / 100e-6 / 1e9 * 7 / 8)
    with pytest.raises(InputError, match="unknown collective 'gather'"):
        read_nccl_tests(results, group_size=8, collective="gather")


def perf_output(csv_path: Path, sizes: int, *, ranks: int) -> str:
    """nccl-tests' all_reduce_perf text for the first ``sizes`` rows of one of vTrain's CSVs (times in µs)."""
    lines = [
        "# nThread 1 nGpus 1 minBytes 1048576 maxBytes 1073741824 step: 1048576(bytes) warmup iters: 5 iters: 20",
        "#", "# Using devices",
        *(f"#  Rank {r:2d} Group  0 Pid  4242 on  dgx-a100 device {r:2d} [0x{r:02x}] NVIDIA A100-SXM4-80GB"
          for r in range(ranks)),
        "# Collective test starting: all_reduce_perf",
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw"
        " #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for row in raw_rows(csv_path)[1:sizes + 1]:
        size, count, dtype, t_out, bw_out, t_in, bw_in = row
        algbw = [int(size) / float(t) for t in (t_out, t_in)]
        lines.append(f"{size:>12} {count:>12} {dtype:>8} {'sum':>6} {-1:>6} {float(t_out) / 1e3:8.1f} "
                     f"{algbw[0]:6.2f} {bw_out:>6} {0:6d} {float(t_in) / 1e3:8.1f} {algbw[1]:6.2f} {bw_in:>6} {0:6d}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 80.5", "#"]
    return "\n".join(lines) + "\n"


def test_nccl_tests_stdout_reads_like_the_csv(tmp_path):
    out = tmp_path / "run.log"
    out.write_text(perf_output(NCCL / "allreduce_8gpu.csv", 16, ranks=8))
    from_text = read_nccl_tests(out)
    from_csv = read_nccl_tests(NCCL / "allreduce_8gpu.csv").head(16)
    assert from_text.select("collective", "group_size", "bytes", "count").equals(
        from_csv.select("collective", "group_size", "bytes", "count"))
    # the text has 0.1 µs resolution where the CSV has 10 ns
    assert from_text["median_us"].to_list() == pytest.approx(from_csv["median_us"].to_list(), abs=0.05)
    assert from_text["busbw_gbps"].to_list() == pytest.approx(from_csv["busbw_gbps"].to_list(), rel=1e-3)


def test_nccl_tests_stdout_older_layout_all_gather(tmp_path):
    out = tmp_path / "gather.txt"
    out.write_text(
        "$ ./build/all_gather_perf -b 8M -e 16M -f 2 -g 1\n"
        "# nThread 1 nGpus 1 minBytes 8388608 maxBytes 16777216 step: 2(factor) warmup iters: 5 iters: 20\n"
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "#        (B)    (elements)                        (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        "dgx:123:123 [0] NCCL INFO Launch mode Parallel\n"
        "     8388608      262144     float    none    100.0   83.89   73.40  0e+00    102.0   82.24   71.96  0e+00\n"
        "    16777216      524288     float    none    180.0   93.21   81.56  0e+00    180.0   93.21   81.56  0e+00\n")
    table = read_nccl_tests(out, group_size=8)
    assert set(table["collective"]) == {"all_gather"} and set(table["group_size"]) == {8}
    big = row_where(table, bytes=16777216)
    assert big["median_us"] == 180.0
    assert big["busbw_gbps"] == pytest.approx(81.56, abs=0.005)  # algbw x (n-1)/n, as the file says


def test_nccl_tests_stdout_group_size_contradiction(tmp_path):
    out = tmp_path / "run.log"
    out.write_text(perf_output(NCCL / "allreduce_8gpu.csv", 2, ranks=8))
    with pytest.raises(InputError, match="group size 4 was given but the output lists 8 ranks"):
        read_nccl_tests(out, group_size=4)


def _as_launched(text: str, how: str) -> str:
    """nccl-tests' output as a launcher prints it: ``mpirun --tag-output``, ``srun --label``, a two-node run's rank
    lines (ranks 8-15 on a second host), or nccl-tests before 2.10 (rank lines without ``Group``)."""
    lines = text.splitlines()
    if how == "mpirun --tag-output":
        lines = [f"[1,0]<stdout>:{line}" for line in lines]
    elif how == "srun --label":
        lines = [f"0: {line}" for line in lines]
    elif how == "two nodes":
        ranks = [line for line in lines if line.startswith("#  Rank")]
        at = lines.index(ranks[-1]) + 1
        lines[at:at] = [line.replace(f"Rank {r:2d}", f"Rank {r + 8:2d}").replace("dgx-a100", "dgx-b")
                        for r, line in enumerate(ranks)]
    elif how == "before 2.10":
        lines = [line.replace(" Group  0", "") for line in lines]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("how", "ranks", "nodes"), [("mpirun --tag-output", 8, 1), ("srun --label", 8, 1),
                                                     ("two nodes", 16, 2), ("before 2.10", 8, 1)])
def test_nccl_tests_stdout_as_launchers_and_older_versions_print_it(how: str, ranks: int, nodes: int,
                                                                    tmp_path: Path) -> None:
    """Each was refused ("no nccl-tests results", "group size unknown"), or read as one node: a 16-GPU all-reduce
    over two hosts got the bus bandwidth of one node's NVLink."""
    out = tmp_path / "all_reduce_perf.out"
    out.write_text(_as_launched(perf_output(NCCL / "allreduce_8gpu.csv", 4, ranks=8), how))
    table = read_nccl_tests(out)
    assert table.height == 4 and set(table["group_size"]) == {ranks} and set(table["nodes"]) == {nodes}
    assert set(table["collective"]) == {"all_reduce"}


def test_nccl_tests_a_table_given_twice_is_said_and_a_group_of_no_gpus_refused(tmp_path: Path) -> None:
    """Sizes timed twice in one table (``-d all``) are said and taken together. Two runs appended to one file were
    too, with their '#  Rank' lines added up: two 8-GPU runs read as one 16-GPU all-reduce, sixteen one-GPU runs
    of a build without MPI under ``mpirun`` as a 16-GPU one at 3,546 GB/s (an audit). A rank listed twice is
    several runs: refused."""
    out = tmp_path / "run.log"
    text = perf_output(NCCL / "allreduce_8gpu.csv", 4, ranks=8)
    head, rows = text.split("(GB/s)            (us)  (GB/s)  (GB/s)\n")
    table = rows.split("# Out of bounds")[0]
    out.write_text(head + "(GB/s)            (us)  (GB/s)  (GB/s)\n" + table + rows)
    with pytest.warns(InputWarning, match="4 of its 4 message sizes are timed more than once"):
        read = read_nccl_tests(out)
        assert read["count"].to_list() == [4] * 4 and set(read["group_size"]) == {8}
    out.write_text(text * 2)
    with pytest.raises(InputError, match="rank 0 is listed 2 times: the output holds several runs"):
        read_nccl_tests(out)
    none = write(tmp_path / "allreduce_0gpu.csv", ["size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)",
                                                   "8388608,262144,float,100000,73.40,100000,73.40"])
    with pytest.raises(InputError, match="a group of 0 GPUs"):
        read_nccl_tests(none)


def test_nccl_tests_rows_with_wrong_results_are_left_out_and_said(tmp_path: Path) -> None:
    """A row whose ``#wrong`` is not 0 (nccl-tests found the collective's data wrong: "Out of bounds values : 1536
    FAILED") was fitted like any other, silently (an audit). It is left out, and said; ``N/A`` (``-c 0``) is kept."""
    lines = perf_output(NCCL / "allreduce_8gpu.csv", 4, ranks=8).splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip() and line.split()[0].isdigit()]
    lines[rows[0]] = lines[rows[0]][:-6] + f"{512:6d}"  # the in-place result of the first size is wrong
    lines[rows[1]] = lines[rows[1]].replace("      0 ", "    N/A ")  # not checked
    out = tmp_path / "all_reduce_perf.out"
    out.write_text("\n".join(lines) + "\n")
    with pytest.warns(InputWarning, match="1 of its 4 rows report wrong results"):
        table = read_nccl_tests(out)
    assert table.height == 3


def test_nccl_tests_a_cut_off_last_row_is_left_out_and_said_a_short_row_before_it_refused(tmp_path: Path) -> None:
    """An output copied while nccl-tests still wrote it (or a run stopped mid-line) ends in a row with fewer fields
    than the header: the whole table was refused for it. That row is left out, and said; a short row anywhere
    else is a damaged table, refused."""
    lines = perf_output(NCCL / "allreduce_8gpu.csv", 4, ranks=8).splitlines()
    rows = [i for i, line in enumerate(lines) if line.strip() and line.split()[0].isdigit()]
    out = tmp_path / "all_reduce_perf.out"
    out.write_text("\n".join(lines[:rows[-1]] + [" ".join(lines[rows[-1]].split()[:7])]) + "\n")
    with pytest.warns(InputWarning, match=r"its last row \(line \d+, \d+ bytes\) has 7 of the header's 13 fields"):
        table = read_nccl_tests(out)
    assert table.height == 3
    lines[rows[1]] = " ".join(lines[rows[1]].split()[:7])
    out.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="7 fields where the table header has 13"):
        read_nccl_tests(out)


def test_llmcompass_says_the_rows_it_leaves_at_the_hosts_floor_and_the_files_it_does_not_read(tmp_path: Path) -> None:
    """The host-timed kernel files' rows at the host's per-call floor were left out silently, and a folder's files
    of another GPU (``matmul_H100.csv``) skipped silently: each is said."""
    folder = tmp_path / "llmcompass"
    shutil.copytree(LLMCOMPASS, folder)
    (folder / "matmul_H100.csv").write_text((LLMCOMPASS / "matmul_A100.csv").read_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = read_llmcompass(folder)
    said = [str(w.message) for w in caught if issubclass(w.category, InputWarning)]
    assert f"{folder}: 1 file(s) not read: matmul_H100.csv (vtrain reads LLMCompass's A100 files" in said[0]
    floor = {line.split(": ")[0].rsplit("/", 1)[1]: line for line in said[1:]}
    assert sorted(floor) == ["gelu_A100.csv", "layernorm_A100.csv", "softmax_A100.csv"]
    assert "10 of its 22 rows take less than 2x its smallest time (13.1 us)" in floor["softmax_A100.csv"]
    assert table.filter((pl.col("label") == "softmax") & pl.col("tp").is_null()).height == 22 - 10


# --- vidur ------------------------------------------------------------------------------------------------------

def test_vidur_all_reduce():
    table = read_vidur_network(VIDUR / "network" / "all_reduce.csv")
    assert table.schema == pl.Schema(NCCL_LATENCY)
    assert set(table["source"]) == {"vidur"} and set(table["count"]) == {3}
    groups = set(table.select("group_size", "nodes").iter_rows())
    assert groups == {(2, 2), (2, 1), (4, 2), (4, 1), (8, 2), (8, 1), (16, 2)}
    # first data row: 0,0.031,0.077,0.0503,0.043,...,num_workers 2,size 2048,all_reduce,devices_per_node 1
    first = row_where(table, group_size=2, nodes=2, bytes=2048)
    assert (first["median_us"], first["p10_us"], first["p90_us"]) == pytest.approx((43.0, 31.0, 77.0))
    # size is bytes: 64 MiB among 8 NVLink GPUs stays below the A100's ~235 GB/s bus bandwidth
    nvlink = row_where(table, group_size=8, nodes=1, bytes=64 << 20)
    assert 150 < nvlink["busbw_gbps"] < 235
    assert nvlink["busbw_gbps"] == pytest.approx(nvlink["algbw_gbps"] * 2 * 7 / 8)


def test_vidur_send_recv():
    table = read_vidur_network(VIDUR / "network" / "send_recv.csv")
    assert set(table["collective"]) == {"send_recv"} and set(table["group_size"]) == {2}
    assert table["busbw_gbps"].to_list() == table["algbw_gbps"].to_list()
    assert set(table["nodes"]) == {1, 2}


def test_vidur_compute_llama2_7b_shapes():
    table = read_vidur_compute(VIDUR / "compute" / "Llama-2-7b-hf-mlp.csv")
    assert table.schema == pl.Schema(OP_BENCHMARKS)
    assert table.height == 1044 * 10
    assert set(table["dtype"]) == {"c10::Half"} and set(table["device"]) == {"A100-80GB"}
    gemms = table.filter(op_class="gemm")
    shapes = {(label, tp): (k, n) for label, tp, k, n in gemms.select("label", "tp", "k", "n").unique().iter_rows()}
    assert shapes[("attn_pre_proj", 1)] == (4096, 12288)
    assert shapes[("attn_post_proj", 1)] == (4096, 4096)
    assert shapes[("mlp_up_proj", 1)] == (4096, 2 * 11008)  # gate and up projections in one GEMM
    assert shapes[("mlp_down_proj", 1)] == (11008, 4096)
    assert shapes[("attn_pre_proj", 2)] == (4096, 6144)
    assert shapes[("mlp_up_proj", 8)] == (4096, 2 * 11008 // 8)
    assert shapes[("mlp_down_proj", 4)] == (11008 // 4, 4096)
    assert (gemms["flops"] == 2.0 * gemms["m"] * gemms["k"] * gemms["n"]).all()
    # first file row: 4096 tokens, tp 1; attn_pre_proj min 1.711, max 1.912, median 1.911 ms
    qkv = table.filter(label="attn_pre_proj", m=4096, tp=1).row(0, named=True)
    assert (qkv["median_us"], qkv["p10_us"], qkv["p90_us"]) == pytest.approx((1911.0, 1711.0, 1912.0))
    assert qkv["bytes"] == 2 * (4096 * 4096 + 4096 * 12288 + 4096 * 12288)
    act = table.filter(label="mlp_act", elements=4096 * 11008, tp=1)
    assert set(act["op_class"]) == {"elementwise"} and set(act["bytes"]) == {2 * 3 * 4096 * 11008}
    assert set(table.filter(label="input_layernorm")["op_class"]) == {"layernorm"}
    assert set(table.filter(label="emb")["op_class"]) == {"embedding"}


def test_vidur_compute_phi2_is_not_gated():
    table = read_vidur_compute(VIDUR / "compute" / "phi-2-mlp.csv")
    assert "post_attention_layernorm" not in set(table["label"])
    assert set(table.filter(label="mlp_up_proj")["n"]) == {10240}
    assert set(table.filter(label="attn_pre_proj")["n"]) == {3 * 2560}
    assert set(table.filter(label="mlp_act")["op_class"]) == {"gelu"}


def test_vidur_parallel_block_adds_three_tensors(tmp_path):
    """phi-2's block has one layer norm, read by attention and MLP alike; their outputs and the residual are
    summed, two adds (its measured add takes about twice the Llamas' time per element). A file that times a
    post-attention layer norm has one add per layer."""
    phi2 = read_vidur_compute(VIDUR / "compute" / "phi-2-mlp.csv").filter(label="add")
    llama = read_vidur_compute(VIDUR / "compute" / "Llama-2-7b-hf-mlp.csv").filter(label="add")
    tokens = 4096
    assert set(phi2.filter(elements=2 * tokens * 2560)["bytes"]) == {2 * 2 * 3 * tokens * 2560}
    assert set(llama.filter(elements=tokens * 4096)["bytes"]) == {2 * 3 * tokens * 4096}
    per_element = {name: (t["median_us"] / t["elements"]).median() for name, t in (("phi-2", phi2), ("llama", llama))}
    assert per_element["phi-2"] == pytest.approx(per_element["llama"], rel=0.3)  # counted as two adds: alike
    # the same phi-2 rows with a post-attention layer norm column: one add again
    text = (VIDUR / "compute" / "phi-2-mlp.csv").read_text().splitlines()
    extra = ",".join(f"time_stats.post_attention_layernorm.{k}" for k in ("min", "max", "mean", "median", "std"))
    rows = [f"{text[0]},{extra}"] + [f"{line},0.01,0.01,0.01,0.01,0.0" for line in text[1:3]]
    (tmp_path / "serial-mlp.csv").write_text("\n".join(rows) + "\n")
    serial = read_vidur_compute(tmp_path / "serial-mlp.csv").filter(label="add")
    assert (serial["bytes"] == 2 * 3 * serial["elements"]).all()
    # a file timing no layer norm at all (trimmed, or renamed timers) says nothing of its block: one add
    header = text[0].split(",")
    keep = [i for i, name in enumerate(header) if "layernorm" not in name]
    trimmed = [",".join(line.split(",")[i] for i in keep) for line in text[:3]]
    (tmp_path / "trimmed-mlp.csv").write_text("\n".join(trimmed) + "\n")
    unknown = read_vidur_compute(tmp_path / "trimmed-mlp.csv").filter(label="add")
    tokens = [int(line.split(",")[header.index("num_tokens")]) for line in text[1:3]]
    assert sorted(unknown["elements"]) == sorted(t * 2560 for t in tokens)  # T h: one add


# --- LLMCompass -------------------------------------------------------------------------------------------------

def test_llmcompass_matmul_flops_over_time_is_the_files_tflops():
    table = read_llmcompass(LLMCOMPASS).filter(label="matmul")
    assert table.schema == pl.Schema(OP_BENCHMARKS)
    rows = raw_rows(LLMCOMPASS / "matmul_A100.csv")
    assert table.height == len(rows) == 20
    for ours, row in zip(table.iter_rows(named=True), rows, strict=True):
        assert (ours["m"], ours["k"], ours["n"]) == tuple(int(v) for v in row[:3])
        assert ours["median_us"] == pytest.approx(float(row[3].removesuffix("ms")) * 1e3)
        tflops = float(row[4].removesuffix("Tflops"))
        assert ours["flops"] / ours["median_us"] / 1e6 == pytest.approx(tflops, rel=2e-3)  # time has 4 decimals


def test_llmcompass_throughput_is_giga_elements_per_second():
    table = read_llmcompass(LLMCOMPASS)
    for name, kind in (("softmax", "softmax"), ("layernorm", "layernorm"), ("gelu", "gelu")):
        ours = table.filter(pl.col("tp").is_null(), label=kind)  # the kernel file, not the GPT-3 layer
        rows = raw_rows(LLMCOMPASS / f"{name}_A100.csv")
        elements = [math.prod(int(v) for v in row[:-1]) for row in rows]
        seconds = [count / (float(row[-1]) * THROUGHPUT_UNIT) for count, row in zip(elements, rows, strict=True)]
        kept = [row for row, time in zip(rows, seconds, strict=True) if time >= HOST_FLOOR_MARGIN * min(seconds)]
        assert (ours["elements"] / ours["median_us"] * 1e6 / THROUGHPUT_UNIT).to_list() == pytest.approx(
            [float(row[-1]) for row in kept])
    # the layer's GELU (16384 x 12288 elements) runs at the rate gelu_A100.csv gives for that size (360 at 2^27,
    # 380 at 2^28 elements): read as G elements/s the two files agree
    gelu = row_where(table, label="GELU")
    assert gelu["elements"] == 16384 * 12288
    assert 360 * 0.95 < gelu["elements"] / gelu["median_us"] / 1e3 < 380 * 1.05


def test_llmcompass_rows_on_the_host_floor_are_left_out():
    """The kernel files were timed per call from the host: their small sizes take the host's time whatever the
    work (GELU: 46.8-48.6 us from 1,024 to 4M elements). Those rows are left out; the rest are the kernel's."""
    table = read_llmcompass(LLMCOMPASS).filter(pl.col("tp").is_null())
    gelu = table.filter(label="gelu").sort("elements")
    assert gelu["elements"].to_list() == [2**25, 2**26, 2**27, 2**28, 2**29]  # 2^24 took 79.8 us: < 2 x 46.8
    for kind, kept in (("layernorm", 6), ("softmax", 12), ("matmul", 20)):
        assert table.filter(label=kind).height == kept
    # each file's host floor (its smallest time per call, read off the files): what is kept is at least twice it
    for kind, floor_us in (("layernorm", 52.09), ("softmax", 13.11), ("gelu", 46.85)):
        assert 2 * floor_us <= table.filter(label=kind)["median_us"].min() < 3 * floor_us


def test_llmcompass_transformer_layer():
    table = read_llmcompass(LLMCOMPASS).filter(pl.col("tp") == 4)
    assert table["label"].to_list() == ["QKV GEMM", "Q×K", "A×V", "output projection", "FFN up", "FFN down",
                                        "softmax", "layernorm", "layernorm", "GELU"]
    shapes = {row["label"]: (row["batch"], row["m"], row["k"], row["n"]) for row in table.iter_rows(named=True)}
    assert shapes["QKV GEMM"] == (1, 16384, 12288, 3 * 12288 // 4)
    assert shapes["Q×K"] == (8 * 24, 2048, 128, 2048)
    assert shapes["A×V"] == (8 * 24, 2048, 2048, 128)
    assert shapes["FFN down"] == (1, 16384, 12288, 12288)
    assert row_where(table, label="QKV GEMM")["median_us"] == pytest.approx(13721.823692321777)
    assert row_where(table, label="softmax")["elements"] == 8 * 24 * 2048 * 2048


def test_llmcompass_all_reduces():
    table = read_llmcompass_network(LLMCOMPASS)
    assert table.schema == pl.Schema(NCCL_LATENCY)
    row = table.row(0, named=True)
    assert (row["collective"], row["group_size"], row["bytes"], row["count"]) == ("all_reduce", 4, 402653184, 2)
    assert row["median_us"] == pytest.approx(2890.9)
    # vTrain's nccl-tests measured the same 384 MiB all-reduce on 4 A100s within 3 %
    vtrain = row_where(read_nccl_tests(NCCL / "allreduce_4gpu.csv"), bytes=402653184)
    assert row["median_us"] == pytest.approx(vtrain["median_us"], rel=0.03)


# --- vTrain's measured iteration times --------------------------------------------------------------------------

def test_ground_truth_single():
    table = read_measurements(GROUND_TRUTH)
    assert table.height == 1440
    optional = {name: None for name in OPTIONAL_COLUMNS}
    assert table.row(0, named=True) == {
        "row": 1, "params_billion": None, "gpus": 2, "global_batch": 16, "micro_batch": 8, "hidden": 1024,
        "heads": 16, "layers": 24, "seq": 1024, "tp": 1, "dp": 1, "pp": 2, "iteration_ms": 372.160408,
        **optional, "problem": None, "measured_as": "ms", "file": None, "line": 2,
    }
    assert table["row"].to_list() == list(range(1, 1441))
    assert measurement_errors(table).is_empty()
    config = measurement_config(table.row(1, named=True))
    assert config.constraint_errors() == []
    assert (config.precision, config.parallelism.recompute, config.parallelism.schedule) == ("fp16", "full", "1f1b")
    model, parallelism = config.model, config.parallelism
    assert (model.vocab, model.hidden, parallelism.tp, parallelism.dp, parallelism.pp) == (50257, 1024, 2, 2, 2)
    assert (config.hardware.device, config.hardware.device_count) == ("A100-80GB", 8)
    assert config.framework == "megatron"  # vTrain's runs: Megatron-DeepSpeed's kernels


def test_measurement_columns_that_say_what_ran(tmp_path):
    """Optional columns override the flags row by row; an empty cell falls back to them."""
    path = tmp_path / "published.csv"
    path.write_text(
        f"{','.join(GROUND_TRUTH_HEADER)},Schedule,virtual_stages,Vocabulary,recomputation,"
        "gradient all-reduce overlap,GPUs per node,inter-node Gbps,framework\n"
        "16,64,2,2048,16,24,2048,2,4,2,812.5,interleaved,2,51200,none,true,4,800,reference\n"
        "16,64,2,2048,16,24,2048,2,4,2,812.5,,,,,,,,\n")
    table = read_measurements(path)
    first = measurement_config(table.row(0, named=True), gpus_per_node=8, inter_node_gbps=100.0)
    p = first.parallelism
    assert (p.schedule, p.virtual_stages, p.recompute, p.dp_overlap) == ("interleaved", 2, "none", True)
    assert (first.model.vocab, first.framework) == (51200, "reference")
    assert (first.hardware.gpus_per_node, first.hardware.inter_node_gbps) == (4, 800.0)
    second = measurement_config(table.row(1, named=True), gpus_per_node=8, inter_node_gbps=100.0)
    assert (second.parallelism.schedule, second.model.vocab, second.framework) == ("1f1b", 50257, "megatron")
    assert (second.hardware.gpus_per_node, second.hardware.inter_node_gbps) == (8, 100.0)


def test_measurement_precision_and_cuda_graphs_columns(tmp_path):
    """A table of runs in bf16 or fp32, or replayed from CUDA graphs, says so row by row (vTrain's fp16, no graphs,
    where a cell is empty); a precision no run has is a row the table's check names."""
    path = tmp_path / "mine.csv"
    path.write_text(f"{','.join(GROUND_TRUTH_HEADER)},precision,CUDA graphs\n"
                    "1,8,4,2048,16,24,2048,1,1,1,494.1,bf16,false\n"
                    "1,4,2,1024,16,2,1024,1,1,1,11.9,BF16,true\n"
                    "1,8,4,2048,16,24,2048,1,1,1,900.0,,\n"
                    "1,8,4,2048,16,24,2048,1,1,1,900.0,fp8,\n")
    table = read_measurements(path)
    configs = [measurement_config(row, device="H200") for row in table.iter_rows(named=True)]
    assert [(c.precision, c.cuda_graphs) for c in configs] == [("bf16", False), ("bf16", True), ("fp16", False),
                                                               ("fp8", False)]
    assert measurement_errors(table)["row"].to_list() == [4]


def test_measurement_columns_of_llama_like_runs(tmp_path):
    """A table of LLaMA-like runs says their MLP width, key/value heads and gated MLP (Hugging Face's and Megatron's
    names): each row's config has them, and an achieved TFLOP/s per GPU is read with the FLOPs of that layer (a
    LLaMA-2-70B-like layer does fewer QKV FLOPs than a GPT layer of its width, and three MLP GEMMs of 28,672)."""
    header = "heads,hidden,layers,tp,pp,gpus,global batch,micro batch,seq,vocab,intermediate_size,num_key_value_heads," \
             "mlp,tflop/s per gpu"
    path = write(tmp_path / "llama.csv", [header, "64,8192,80,8,8,1024,1024,1,4096,32000,28672,8,SwiGLU,400",
                                          "64,8192,80,8,8,1024,1024,1,4096,32000,,,,400"])
    with pytest.warns(InputWarning, match=r"1 row\(s\) have a SwiGLU MLP \(row 1, ...\) but no norm.*as GPT's"):
        table = read_measurements(path, recompute="none")  # LLaMA's MLP, GPT's other parts: said
    llama, gpt = (measurement_config(row, framework="reference") for row in table.iter_rows(named=True))
    assert (llama.model.ffn, llama.model.query_groups, llama.model.mlp) == (28672, 8, "swiglu")
    assert (gpt.model.ffn, gpt.model.query_groups, gpt.model.mlp) == (4 * 8192, 64, "gelu")
    assert not llama.constraint_errors()
    b, s, l, h, v, f = 1024, 4096, 80, 8192, 32000, 28672
    layer = 2 * s * h * h * (2 + 2 * 8 / 64) + 3 * 2 * s * h * f + 4 * s * s * h
    flops = 3 * b * (l * layer + 2 * s * h * v)
    assert table["iteration_ms"][0] == pytest.approx(flops / (400e12 * 1024) * 1e3, rel=1e-12)
    assert table["iteration_ms"][1] == pytest.approx(
        72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h)) / (400e12 * 1024) * 1e3, rel=1e-12)
    # Megatron-LM's names for LLaMA's and Qwen2's layer, Hugging Face's for the untied output projection
    layer = "norm,position embedding,add bias linear,add qkv bias,tie word embeddings"
    path = write(tmp_path / "layers.csv", [f"{header},{layer}",
                                           "64,8192,80,8,8,1024,1024,1,4096,32000,28672,8,SwiGLU,400,RMSNorm,RoPE,"
                                           "false,true,false", "64,8192,80,8,8,1024,1024,1,4096,32000,,,,400,,,,,"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the layer's parts said: nothing to warn of
        qwen, gpt = (measurement_config(row, framework="megatron") for row in
                     read_measurements(path, recompute="none").iter_rows(named=True))
    assert (qwen.model.norm, qwen.model.position, qwen.model.bias, qwen.model.has_qkv_bias) == ("rmsnorm", "rope",
                                                                                                False, True)
    assert gpt.model.is_gpt and gpt.ties_embeddings and not qwen.ties_embeddings


def test_measurement_table_with_an_unknown_column(tmp_path):
    """A column vtrain does not read (a job id, notes, a pandas index) is left out with one warning naming it; a
    value that is not what its column needs is an error naming the line."""
    path = tmp_path / "t.csv"
    path.write_text(f",{','.join(GROUND_TRUTH_HEADER)},colour\n0,16,64,2,2048,16,24,2048,2,4,2,812.5,red\n")
    with pytest.warns(InputWarning, match="column\\(s\\) '', 'colour' not read"):
        table = read_measurements(path)
    assert table.row(0, named=True)["iteration_ms"] == 812.5 and "colour" not in table.columns
    path.write_text(f"{','.join(GROUND_TRUTH_HEADER)},schedule,GPUs per node\n16,64,2,2048,16,24,2048,2,4,2,1,1f1b,x\n")
    with pytest.raises(InputError, match="line 2: 'GPUs per node' is not an integer"):
        read_measurements(path)


def test_measurement_tables_from_elsewhere_are_read_by_their_column_names(tmp_path):
    """A table from another cluster's logs or a paper: columns in any order, short names, no GPU count (t x d x p)
    or no data-parallel size (GPUs / (t x p)), and the time in seconds, samples or tokens per second. Each says the
    same runs as vTrain's layout, to the same milliseconds."""
    vtrain_layout = tmp_path / "vtrain.csv"
    vtrain_layout.write_text(f"{','.join(GROUND_TRUTH_HEADER)}\n16,64,2,2048,16,24,2048,2,4,2,812.5\n"
                             "1024,1536,1,12288,96,96,2048,8,8,16,31500\n")
    expected = read_measurements(vtrain_layout).drop("row", "measured_as")
    layouts = {
        "megatron-log.csv": ("tp,pp,dp,mbs,gbs,seq_len,hidden,num_layers,heads,elapsed time per iteration (ms)",
                             "2,2,4,2,64,2048,2048,24,16,812.5", "8,16,8,1,1536,2048,12288,96,96,31500"),
        "paper.csv": ("Layers,Hidden size,Attention heads,Sequence length,GPUs,TP,PP,Global batch size,"
                      "Micro batch size,Iteration time (s)",
                      "24,2048,16,2048,16,2,2,64,2,0.8125", "96,12288,96,2048,1024,8,16,1536,1,31.5"),
        "throughput.csv": ("gpus,tp,dp,pp,global batch,micro batch,hidden,heads,layers,seq,samples per second",
                           f"16,2,4,2,64,2,2048,16,24,2048,{64 / 0.8125}",
                           f"1024,8,8,16,1536,1,12288,96,96,2048,{1536 / 31.5}"),
        "tokens.csv": ("gpus,tp,dp,pp,global batch,micro batch,hidden,heads,layers,seq,tokens/s",
                       f"16,2,4,2,64,2,2048,16,24,2048,{64 * 2048 / 0.8125}",
                       f"1024,8,8,16,1536,1,12288,96,96,2048,{1536 * 2048 / 31.5}"),
    }
    for name, lines in layouts.items():
        table = read_measurements(write(tmp_path / name, list(lines))).drop("row", "measured_as")
        assert table.drop("iteration_ms").equals(expected.drop("iteration_ms")), name
        assert table["iteration_ms"].to_list() == pytest.approx(expected["iteration_ms"].to_list()), name


def test_measurement_table_with_two_times_reads_the_iteration_time(tmp_path):
    path = write(tmp_path / "both.csv", [f"{','.join(GROUND_TRUTH_HEADER)},tokens per second",
                                         "16,64,2,2048,16,24,2048,2,4,2,812.5,1"])
    with pytest.warns(InputWarning, match="read from 'iteration time \\(ms\\)' for 1 row.*; filled but not read: "
                                          "'tokens per second'"):
        assert read_measurements(path)["iteration_ms"].to_list() == [812.5]


def test_time_columns_that_disagree_are_said_and_those_that_agree_are_not(tmp_path: Path) -> None:
    """A table giving each run's time twice, in ms and in s, the seconds column filled in ms for one row (a unit
    pasted wrong): the row was scored on its first column, the other's 1000x unsaid (an audit). Said, naming the
    row and both readings; times a few per cent apart (rounding, another FLOP count) are not."""
    header = f"{','.join(GROUND_TRUTH_HEADER)},iteration time (s)"
    agree = write(tmp_path / "agree.csv", [header, "16,64,2,2048,16,24,2048,2,4,2,812.5,0.83"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_measurements(agree)
    assert not [w for w in caught if "disagree" in str(w.message)]
    wrong = write(tmp_path / "wrong.csv", [header, "16,64,2,2048,16,24,2048,2,4,2,812.5,0.8125",
                                           "16,64,2,2048,16,24,2048,4,2,2,790,790"])
    with pytest.warns(InputWarning, match=r"1 row\(s\) give iteration times that disagree by more than 1.2x across "
                                          r"their time columns \(row 2: 'iteration time \(ms\)' 790 ms, 'iteration "
                                          r"time \(s\)' 7.9e\+05 ms\): each is scored on its first"):
        assert read_measurements(wrong)["iteration_ms"].to_list() == [812.5, 790]


def test_a_flop_rate_counted_another_way_is_no_disagreement(tmp_path: Path) -> None:
    """Model TFLOP/s per GPU counted as 6N a token, beside the same run's tokens/s per GPU: vtrain's count, with
    attention, is 1.2x that for LLaMA-3-8B at 8,192 tokens, and the two were said to disagree (an audit). Where a
    FLOP rate is one of the two, 1.5x is allowed; a per-GPU throughput given for all GPUs (64x) is said."""
    header = "gpus,tp,pp,global batch,micro batch,hidden,heads,kv heads,ffn hidden size,mlp,layers,seq,vocab," \
             "tokens per second per gpu,model tflop/s per gpu"
    shape = "64,1,1,128,1,4096,32,8,14336,swiglu,32,8192,128256"
    parameters = 8.03e9  # LLaMA-3-8B
    rows = [f"{shape},{tokens},{6 * parameters * tokens / 1e12:.1f}" for tokens in (13000, 13000 * 64)]
    path = write(tmp_path / "nemo.csv", [header, rows[0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_measurements(path)
    assert not [w for w in caught if "disagree" in str(w.message)]
    wrong = write(tmp_path / "total.csv", [header, rows[0].rsplit(",", 2)[0] + f",{13000 * 64},"
                                           + rows[0].rsplit(",", 1)[1]])
    with pytest.warns(InputWarning, match=r"disagree by more than 1.2x \(1.5x where a FLOP rate is one of them\)"):
        read_measurements(wrong)


def test_one_configuration_measured_twice_far_apart_is_said(tmp_path: Path) -> None:
    """The same run logged twice, 1,000 and 1,270 ms (a slow node, a first run compiling): one prediction cannot be
    near both, and both are scored; said, naming the rows. Repeats 3 % apart (run-to-run noise) are not."""
    header = ",".join(GROUND_TRUTH_HEADER)
    near = write(tmp_path / "near.csv", [header, *(f"16,64,2,2048,16,24,2048,2,4,2,{ms}" for ms in (1000, 1030))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        read_measurements(near)
    assert not [w for w in caught if "more than once" in str(w.message)]
    far = write(tmp_path / "far.csv", [header, *(f"16,64,2,2048,16,24,2048,{layout},{ms}" for layout, ms in (
        ("2,4,2", 1000), ("4,2,2", 900), ("2,4,2", 1270)))])
    with pytest.warns(InputWarning, match=r"1 configuration\(s\) measured more than once take times more than 1.2x "
                                          r"apart \(rows 1, 3: 1,000 to 1,270 ms\): each row is scored"):
        assert read_measurements(far).height == 3
    # a rerun's table beside the first in a folder (as one log a run): the folder is one table (an audit)
    folder = tmp_path / "runs"
    folder.mkdir()
    for name, ms in (("first.csv", 1000), ("rerun.csv", 1270)):
        write(folder / name, [header, f"16,64,2,2048,16,24,2048,2,4,2,{ms}"])
    with pytest.warns(InputWarning, match=r"\(rows 1 \(first.csv\), 2 \(rerun.csv\): 1,000 to 1,270 ms\)"):
        read_measurements(folder)


def test_an_excel_csv_naming_its_separator_is_read_as_the_table_it_is(tmp_path: Path) -> None:
    """Excel in a locale whose decimal mark is the comma saves ``sep=;`` as the file's first line: it was read as
    the header ("line 3: 11 fields where the header has 2", exit 2). It names the separator; the rows' lines keep
    their numbers."""
    comma = write(tmp_path / "comma.csv", [",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,812.5"])
    excel = write(tmp_path / "excel.csv", ["sep=;", ";".join(GROUND_TRUTH_HEADER),
                                           "16;64;2;2048;16;24;2048;2;4;2;812,5"])
    assert read_measurements(excel).drop("line").equals(read_measurements(comma).drop("line"))
    assert read_measurements(excel)["line"].to_list() == [3]
    quoted = write(tmp_path / "quoted.csv", ['"sep=;"', ";".join(GROUND_TRUTH_HEADER),
                                             "16;64;2;2048;16;24;2048;2;4;2;812,5"])  # every line quoted (a review)
    assert read_measurements(quoted).drop("line").equals(read_measurements(comma).drop("line"))


def test_a_table_that_expands_past_the_limit_is_refused_before_it_fills_memory(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A 204 KB gzip of a table and 200 MiB of blank lines took 3.7 GB and 3.5 minutes to read (an audit): a
    table's text is read up to MAX_TABLE_TEXT_BYTES (here 1 MiB), then refused in one line; beside tables in a
    folder, such a file is one not read."""
    import gzip

    import vtrain.importers._read as read

    monkeypatch.setattr(read, "MAX_TABLE_TEXT_BYTES", 1 << 20)
    table = "\n".join([",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,812.5"]) + "\n"
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(table.encode() + b"\n" * (2 << 20)))
    with pytest.raises(InputError, match="more than 1 MiB of text once decompressed: no measurement table"):
        read_measurements(bomb)
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "a.csv").write_text(table)
    (folder / "core.1234").write_bytes(b"\0" * (2 << 20))
    with pytest.warns(InputWarning, match=r"1 file\(s\) neither a measurement table nor a Megatron log, not read "
                                          r"\(core.1234\)"):
        assert read_measurements(folder).height == 1


def test_a_table_copied_twice_into_a_folder_is_said(tmp_path: Path) -> None:
    """The same table twice in one folder was scored twice without a word (each file's own repeats are said as it is
    read; the folder's were not: an audit)."""
    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("a.csv", "b.csv"):
        write(folder / name, [",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,812.5"])
    with pytest.warns(InputWarning, match=r"1 row\(s\) repeat an earlier row exactly, measured time included"):
        assert read_measurements(folder).height == 2


def test_a_table_giving_each_row_its_time_in_another_column_reads_every_row(tmp_path):
    """Published runs pasted together: TFLOP/s per GPU for some, tokens/s per GPU for others. The first time column
    was read for the whole table and 6 of 7 rows refused as "no measured time"."""
    header = "gpus,tp,pp,dp,global batch,micro batch,hidden,heads,layers,seq,vocab,recompute"
    path = write(tmp_path / "mixed.csv", [f"{header},tflop/s per gpu,tokens/s/gpu",
                                          "96,2,4,12,1536,4,6144,64,44,2048,50432,full,117,",
                                          "2048,8,4,64,2048,1,8192,64,80,4096,32000,full,,380"])
    with pytest.warns(InputWarning, match="read from 'tflop/s per gpu' for 1 row.*, 'tokens/s/gpu' for 1 row"):
        rows = read_measurements(path)
    assert rows["measured_as"].to_list() == ["tflops/gpu", "tokens/s/gpu"]
    assert rows["problem"].to_list() == [None, None]
    assert rows["iteration_ms"][1] == pytest.approx(2048 * 4096 / (380 * 2048) * 1000)


def test_throughput_that_is_no_measurement_is_refused(tmp_path):
    path = write(tmp_path / "t.csv", ["gpus,tp,dp,pp,global batch,micro batch,hidden,heads,layers,seq,samples/s",
                                      "16,2,4,2,64,2,2048,16,24,2048,0", "16,2,4,2,64,2,2048,16,24,2048,-3",
                                      "12,2,,2,64,2,2048,16,24,2048,1"])
    with pytest.raises(InputError, match="line 4: 'dp' is missing"):
        read_measurements(path)
    path = write(tmp_path / "t.csv", ["gpus,tp,pp,global batch,micro batch,hidden,heads,layers,seq,samples/s",
                                      "16,2,2,64,2,2048,16,24,2048,0", "16,2,2,64,2,2048,16,24,2048,-3",
                                      "12,2,8,64,2,2048,16,24,2048,1"])
    problems = read_measurements(path)["problem"].to_list()
    assert problems[0] == "measured throughput is not a positive number (0.0 samples/s)"
    assert problems[1] == "measured throughput is not a positive number (-3.0 samples/s)"
    assert problems[2] == "dp = 0.75 is not a positive integer"


def test_achieved_teraflops_per_gpu_are_read_as_narayanan_et_al_count_them(tmp_path):
    """Megatron-LM's weak-scaling table and MT-NLG give achieved TFLOP/s per GPU, not times: counted with Narayanan
    et al.'s Eq. 3 (SC21), 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) with full recomputation. The time is those FLOPs over
    the GPUs' rate; a run without recomputation (column or --recompute) ran a quarter fewer layer FLOPs, one with
    selective recomputation only the attention scores again (Korthikanti et al.)."""
    header = "params (B),heads,hidden,layers,tp,pp,gpus,global batch,micro batch,seq,vocab,recompute,tflop/s per gpu"
    path = write(tmp_path / "sc21.csv", [header, "529.6,128,20480,105,8,35,2520,2520,1,2048,51200,full,163",
                                         "529.6,128,20480,105,8,35,2520,2520,1,2048,51200,none,163",
                                         "529.6,128,20480,105,8,35,2520,2520,1,2048,51200,selective,163",
                                         "529.6,128,20480,105,8,35,2520,2520,1,2048,51200,,163"])
    b, s, l, h, v = 2520, 2048, 105, 20480, 51200
    eq3 = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    no_recompute = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    expected_ms = [flops / (163e12 * 2520) * 1e3 for flops in (eq3, no_recompute, no_recompute + 4 * b * l * s * s * h)]
    table = read_measurements(path, recompute="none")
    assert table["iteration_ms"].to_list() == pytest.approx([*expected_ms, expected_ms[1]], rel=1e-12)
    assert expected_ms[0] == pytest.approx(2520 * 2048 * 529.6e9 * 8 / (163e12 * 2520) * 1e3, rel=0.02)  # ~8NT
    assert read_measurements(path)["iteration_ms"][3] == pytest.approx(expected_ms[0])  # vTrain's: full
    assert table["measured_as"].unique().to_list() == ["tflops/gpu"]  # the report says how the times were read
    shapeless = write(tmp_path / "shapeless.csv", [header, "529.6,128,0,105,8,35,2520,2520,1,2048,51200,full,163",
                                                   "529.6,128,20480,-105,8,35,2520,2520,1,2048,51200,full,163"])
    assert read_measurements(shapeless)["problem"].to_list() == [  # no FLOPs counted of a shape no run has
        "hidden = 0 is not a positive integer", "layers = -105 is not a positive integer"]
    refused = write(tmp_path / "zero.csv", [header, "529.6,128,20480,105,8,35,2520,2520,1,2048,51200,full,0"])
    assert read_measurements(refused)["problem"][0] == ("measured throughput is not a positive number (0.0 TFLOP/s "
                                                        "per GPU)")


def test_rows_that_are_no_measurement_are_refused(tmp_path):
    """Negative, zero and NaN times and absurd shapes are kept with the reason, never simulated nor scored."""
    path = tmp_path / "bad.csv"
    good = "8,16,2,1024,16,24,1024,2,2,2,"
    path.write_text(f"{','.join(GROUND_TRUTH_HEADER)}\n{good}-5\n{good}0\n{good}nan\n{good}inf\n"
                    "8,16,2,1024,16,2.4e10,1024,2,2,2,100\n8,16,2,1024,16,24.5,1024,2,2,2,100\n{good}100\n"
                    .replace("{good}", good))
    table = read_measurements(path)
    problems = table["problem"].to_list()
    assert all(problems[:6]) and problems[6] is None
    assert "not a positive number" in problems[0] and "layers = 2.4e+10 is beyond any real run" in problems[4]
    assert "layers = 24.5 is not a positive integer" in problems[5]
    assert table["layers"].to_list()[4:6] == [None, None]
    assert measurement_errors(table).is_empty()


def test_multi_node_measurements(tmp_path):
    path = tmp_path / "ground_truth_multi.csv"
    path.write_text(
        " Parameters (billion) , # GPUs , global batch,micro batch,hidden size,attention heads,# layers,"
        "sequence length,tensor parallelism,data parallelism,pipeline parallelism, iteration time (ms) \n"
        " 1.3 , 16 , 64 , 2 , 2048 , 16 , 24 , 2048 , 2 , 4 , 2 , 812.5 \n"
        "\n"
        "6.7,16,64,2,4096,32,32,2048,4,2,1,1500.25\n")
    table = read_measurements(path)
    assert table["params_billion"].to_list() == [1.3, 6.7]
    assert table["row"].to_list() == [1, 2]
    assert table.row(0, named=True)["iteration_ms"] == 812.5
    errors = measurement_errors(table)
    assert errors["row"].to_list() == [2]
    assert "does not equal the number of devices (16)" in errors["error"][0]
    config = measurement_config(table.row(0, named=True), gpus_per_node=4, inter_node_gbps=200.0,
                                intra_node_gbps=300.0)
    assert config.constraint_errors() == []
    assert (config.hardware.gpus_per_node, config.hardware.inter_node_gbps, config.hardware.intra_node_gbps) == (
        4, 200.0, 300.0)


# --- bad input --------------------------------------------------------------------------------------------------

GROUND_TRUTH_HEADER = ["# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
                       "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
                       "iteration time (ms)"]


def ground_truth_lines() -> list[str]:
    return GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def bad_ground_truth_value(tmp: Path) -> Path:
    lines = ground_truth_lines()[:4]
    lines[2] = lines[2].replace(",1024,", ",abc,", 1)  # hidden size of the second data row (line 3)
    return write(tmp / "gt.csv", lines)


NCCL_CSV_HEADER = "size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)"


def bad_vidur_flag(tmp: Path) -> Path:
    header, first = raw_rows(VIDUR / "compute" / "phi-2-mlp.csv")[:2]
    return write(tmp / "mlp.csv", [",".join(header), ",".join(first).replace("False", "maybe")])


def with_extra_columns(names: list[str], values: list[str]) -> Callable[[Path], Path]:
    """A ground-truth table with ``names`` added to its header and ``values`` to each of its two data rows."""
    def make(tmp: Path) -> Path:
        header, *rows = ground_truth_lines()[:3]
        return write(tmp / "gt.csv", [",".join([header, *names]), *(",".join([row, *values]) for row in rows)])
    return make


def in_folder(tmp: Path, name: str, lines: list[str]) -> Path:
    write(tmp / name, lines)
    return tmp


CASES = {
    "missing file": (lambda tmp: tmp / "nope.csv", read_measurements, "no such file"),
    "nccl missing file": (lambda tmp: tmp / "allreduce_8gpu.csv", read_nccl_tests, "no such file"),
    "vidur network missing file": (lambda tmp: tmp / "all_reduce.csv", read_vidur_network, "no such file"),
    "vidur compute missing file": (lambda tmp: tmp / "mlp.csv", read_vidur_compute, "no such file"),
    "vidur compute no stats": (lambda tmp: write(tmp / "mlp.csv", [
        "n_head,n_kv_head,n_embd,n_expanded_embd,use_gated_mlp,num_tokens,num_tensor_parallel_workers",
        "32,32,4096,11008,True,8,1"]), read_vidur_compute, "no time_stats.<op>.<statistic> columns"),
    "vidur compute tp does not divide": (lambda tmp: write(tmp / "mlp.csv", [
        "n_head,n_kv_head,n_embd,n_expanded_embd,use_gated_mlp,num_tokens,num_tensor_parallel_workers",
        "32,32,4096,11008,True,8,1", "32,32,4096,11008,True,8,3"]), read_vidur_compute, "line 3: n_embd is not"),
    "empty file": (lambda tmp: write(tmp / "gt.csv", [""]), read_measurements, "empty file"),
    "header only": (lambda tmp: write(tmp / "gt.csv", ground_truth_lines()[:1]), read_measurements, "no data rows"),
    "wrong columns": (lambda tmp: write(tmp / "gt.csv", ["a,b", "1,2"]), read_measurements, "expected the columns"),
    "no time column": (lambda tmp: write(tmp / "gt.csv", [",".join(GROUND_TRUTH_HEADER[:-1]), "1," * 9 + "1"]),
                       read_measurements, "no column for an iteration time"),
    "neither GPUs nor dp": (lambda tmp: write(tmp / "gt.csv", ["tp,pp,mbs,gbs,hidden,heads,layers,seq,samples/s",
                                                               "1,1,1,8,1024,16,2,1024,9"]),
                            read_measurements, "no column for # GPUs"),
    "non-numeric value": (bad_ground_truth_value, read_measurements,
                          "line 3: 'hidden size' is not an integer: 'abc'"),
    "ragged row": (lambda tmp: write(tmp / "gt.csv", ground_truth_lines()[:2] + [",".join("123456789012")]),
                   read_measurements, "line 3: 12 fields where the header has 11"),
    "not text": (lambda tmp: write_bytes(tmp / "gt.csv", b"\x00\x8b\x08\x00\xff\xfe"), read_measurements,
                 "not a text file"),
    "broken gzip": (lambda tmp: write_bytes(tmp / "gt.csv", b"\x1f\x8b\x08\x00\xff\xfe"), read_measurements,
                    "a gzip file that does not decompress"),
    # an extra column named as vtrain names a required one internally was a polars DuplicateError traceback
    "extra column named tp": (with_extra_columns(["tp"], ["1"]), read_measurements,
                              "columns 'tensor parallelism' and 'tp' both give 'tp'"),
    "optional column twice, two spellings": (with_extra_columns(["schedule", "Schedule"], ["1f1b", "gpipe"]),
                                             read_measurements, "columns 'schedule' and 'Schedule' both give"),
    "optional column twice, same name": (with_extra_columns(["schedule", "schedule"], ["1f1b", "gpipe"]),
                                         read_measurements, "columns 'schedule' and 'schedule' both give"),
    "nccl csv bad time": (
        lambda tmp: write(tmp / "allreduce_8gpu.csv", [NCCL_CSV_HEADER, "1048576,262144,float,92790,19.78,92150,19.91",
                                                        "2097152,524288,float,fast,39.36,92970,39.47"]),
        read_nccl_tests, "line 3: 'time(ns) out-of-place' is not a number: 'fast'"),
    "nccl csv no group size": (
        lambda tmp: write(tmp / "results.csv", [NCCL_CSV_HEADER, "1048576,262144,float,92790,19.78,92150,19.91"]),
        read_nccl_tests, "group size unknown"),
    "nccl text without table": (lambda tmp: write(tmp / "run.log", ["# nThread 1 nGpus 8", "hello"]),
                                read_nccl_tests, "no nccl-tests results"),
    "nccl text short row": (  # before the last row: a cut-off last row is left out (said)
        lambda tmp: write(tmp / "run.log", (lines := perf_output(NCCL / "allreduce_8gpu.csv", 2,
                                                                 ranks=8).splitlines())[:-4]
                          + ["     4194304       1048576     float     sum      -1     95.8"] + lines[-4:-3]),
        read_nccl_tests, "line 17: 6 fields where the table header has 13"),
    "vidur missing column": (
        lambda tmp: write(tmp / "all_reduce.csv", [",time_stats.all_reduce.min,size,collective",
                                                   "0,0.1,2048,all_reduce"]),
        read_vidur_network, "missing column(s) 'num_workers'"),
    "vidur unknown collective": (
        lambda tmp: write(tmp / "all_reduce.csv", ["num_workers,size,collective,devices_per_node",
                                                   "2,2048,all_reduce,1", "2,2048,broadcast,1"]),
        read_vidur_network, "line 3: unknown collective 'broadcast'"),
    "vidur bad flag": (bad_vidur_flag, read_vidur_compute, "line 2: 'use_gated_mlp' is not True or False: 'maybe'"),
    "llmcompass no folder": (lambda tmp: tmp / "missing", read_llmcompass, "no such folder"),
    "llmcompass empty folder": (lambda tmp: tmp, read_llmcompass, "no LLMCompass files"),
    "llmcompass time without unit": (
        lambda tmp: in_folder(tmp, "matmul_A100.csv", ["64, 12288, 12288, 0.1900ms, 101.7124Tflops",
                                                        "128, 12288, 12288, 0.2003, 193.0114Tflops"]),
        read_llmcompass, "line 2: 'time' has no unit"),
    "llmcompass short transformer": (lambda tmp: in_folder(tmp, "transformer_A100.csv", ["0.01"] * 11),
                                     read_llmcompass_network, "expected 12 lines"),
}


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_naming_the_file(tmp_path, case):
    make, reader, message = CASES[case]
    path = make(tmp_path)
    with pytest.raises(InputError) as caught:
        reader(path)
    text = str(caught.value)
    assert message in text
    assert "\n" not in text
    assert caught.value.path is not None and text.startswith(caught.value.path)
    assert Path(caught.value.path) in (path, tmp_path / "transformer_A100.csv", tmp_path / "matmul_A100.csv")


def test_inter_node_rate_of_zero_or_empty_falls_back_to_the_flag(tmp_path):
    """Tables write 0 (or nothing) for a link rate that was not measured: the command's flag applies. A rate that
    no link has (negative, not finite, beyond any network) refuses the row, as an absurd shape does."""
    path = tmp_path / "rates.csv"
    run = "16,64,2,2048,16,24,2048,2,4,2,812.5"
    path.write_text(f"{','.join(GROUND_TRUTH_HEADER)},inter-node Gbps\n"
                    f"{run},0\n{run},\n{run},0.0\n{run},400\n{run},-100\n{run},nan\n{run},1e9\n")
    table = read_measurements(path)
    rates = [measurement_config(row, inter_node_gbps=100.0).hardware.inter_node_gbps
             for row in table.head(4).iter_rows(named=True)]
    assert rates == [100.0, 100.0, 100.0, 400.0]
    assert measurement_config(table.row(0, named=True)).hardware.inter_node_gbps is None  # no flag: the default
    problems = table["problem"].to_list()
    assert problems[:4] == [None] * 4
    assert all("inter_node_gbps must be a finite number above 0" in p for p in problems[4:]), problems


def test_measurement_shapes_are_bounded_by_the_physical_limits(tmp_path):
    """The one home of the bounds is vtrain/limits.py: a row is refused where a run config would be (2,000
    layers, 300,000 hidden, 8,192 micro-batches per replica), and the largest allowed value is accepted."""
    from vtrain.limits import INTEGER_BOUNDS, MAX_MICRO_BATCHES

    path = tmp_path / "shapes.csv"
    layers, hidden = INTEGER_BOUNDS["layers"][1], INTEGER_BOUNDS["hidden"][1]
    path.write_text(f"{','.join(GROUND_TRUTH_HEADER)}\n"
                    f"8,16,2,1024,16,{layers},1024,2,2,2,100\n8,16,2,1024,16,2000,1024,2,2,2,100\n"
                    f"8,16,2,{hidden},16,24,1024,2,2,2,100\n8,16,2,300000,16,24,1024,2,2,2,100\n"
                    f"8,{2 * MAX_MICRO_BATCHES},1,1024,16,24,1024,2,2,2,100\n"
                    f"8,{4 * MAX_MICRO_BATCHES},1,1024,16,24,1024,2,2,2,100\n")
    problems = read_measurements(path)["problem"].to_list()
    assert problems[0] is None and problems[2] is None and problems[4] is None
    assert problems[1] == f"layers = 2000 is beyond any real run (at most {layers:,})"
    assert problems[3] == f"hidden = 300000 is beyond any real run (at most {hidden:,})"
    assert "8192 micro-batches per replica" in problems[5]


def test_vidur_kernels_carry_the_gpu_their_folder_names(tmp_path: Path) -> None:
    """vidur profiles on several GPUs (``compute/a100/...``, ``compute/h100/...``) in one file layout; the kernel
    model puts each kernel on its own GPU's roofline, so an H100 file must not be read as an A100's. A path that
    names no GPU leaves the device to the fitted profile."""
    source = VIDUR / "compute" / "phi-2-mlp.csv"
    assert set(read_vidur_compute(source)["device"].to_list()) == {"A100-80GB"}  # vidur-a100/: its 80 GB DGX nodes
    h100 = tmp_path / "profiling" / "compute" / "h100" / "microsoft" / "phi-2"
    h100.mkdir(parents=True)
    (h100 / "mlp.csv").write_bytes(source.read_bytes())
    assert set(read_vidur_compute(h100 / "mlp.csv")["device"].to_list()) == {"H100"}
    (tmp_path / "mlp.csv").write_bytes(source.read_bytes())
    assert read_vidur_compute(tmp_path / "mlp.csv")["device"].null_count() == read_vidur_compute(source).height


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_table_saved_with_semicolons_or_tabs_is_read(tmp_path, separator):
    """A spreadsheet saved where the comma is the decimal mark separates fields by ';', a tab-separated export by
    tabs: both were one column named by the whole header ("not a measurement table")."""
    comma = write(tmp_path / "comma.csv", [",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,812.5"])
    other = write(tmp_path / "other.csv", [separator.join(GROUND_TRUTH_HEADER),
                                           separator.join("16,64,2,2048,16,24,2048,2,4,2,812.5".split(","))])
    assert read_measurements(other).equals(read_measurements(comma))
    if separator == ";":  # where the comma is the decimal mark, and a column name may hold one
        write(other, [";".join(GROUND_TRUTH_HEADER) + ';"notes, if any"', "16;64;2;2048;16;24;2048;2;4;2;812,5;x"])
        with pytest.warns(InputWarning, match="'notes, if any' not read"):
            assert read_measurements(other).equals(read_measurements(comma))


def test_a_run_without_a_measured_time_is_a_refused_row(tmp_path):
    """Published tables mark runs that did not run (out of memory) with text or an empty cell: such a row is refused
    with its reason, where the whole table was an error; a shape that is no number is still one."""
    path = write(tmp_path / "paper.csv", ["gpus,tp,dp,pp,gbs,mbs,hidden,heads,layers,seq,iteration time (s)",
                                          "16,2,4,2,64,2,2048,16,24,2048,0.8125", "16,2,4,2,64,8,2048,16,24,2048,OOM",
                                          "16,2,4,2,64,4,2048,16,24,2048,", "16,2,4,2,64,4,2048,16,24,2048,-"])
    table = read_measurements(path)
    assert table["iteration_ms"].to_list() == [812.5, None, None, None]
    assert table["problem"].to_list() == [None, "no measured time ('OOM')", "no measured time (an empty cell)",
                                          "no measured time ('-')"]
    write(path, ["gpus,tp,dp,pp,gbs,mbs,hidden,heads,layers,seq,iteration time (s)",
                 "16,2,4,2,64,2,big,16,24,2048,0.8125"])
    with pytest.raises(InputError, match="line 2: 'hidden' is not an integer: 'big'"):
        read_measurements(path)


def test_a_tab_separated_export_with_a_decimal_comma_is_read(tmp_path):
    """A tab-separated export from a locale whose decimal mark is the comma (812,5) read every time as no number:
    the runs were refused. A comma between digits is the decimal mark of a tab-separated file that writes no number
    with a point; one that does (812.5 beside a "notes, if any" column) keeps its commas as text."""
    comma = write(tmp_path / "comma.csv", [",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,812.5"])
    tabs = write(tmp_path / "tabs.tsv", ["\t".join(GROUND_TRUTH_HEADER), "16\t64\t2\t2048\t16\t24\t2048\t2\t4\t2\t812,5"])
    assert read_measurements(tabs).equals(read_measurements(comma))
    write(tabs, ["\t".join([*GROUND_TRUTH_HEADER, "notes"]), "16\t64\t2\t2048\t16\t24\t2048\t2\t4\t2\t812.5\t1,5 GB"])
    with pytest.warns(InputWarning, match="'notes' not read"):
        assert read_measurements(tabs).equals(read_measurements(comma))


def test_a_tab_separated_number_whose_commas_group_thousands_is_read_so_and_said(tmp_path):
    """A spreadsheet's cells copied as tabs, ``1,812`` ms and ``16,384`` tokens: every comma with three digits
    after it. Read as decimal commas before (1.812 ms: the row scored -99.9 %, the warning blaming the user's
    units); now as thousands, said, since a locale with a decimal comma could mean 1.812."""
    comma = write(tmp_path / "comma.csv", [",".join(GROUND_TRUTH_HEADER), "16,64,2,2048,16,24,2048,2,4,2,1812"])
    tabs = write(tmp_path / "tabs.tsv", ["\t".join(GROUND_TRUTH_HEADER),
                                         "16\t64\t2\t2,048\t16\t24\t2,048\t2\t4\t2\t1,812"])
    with pytest.warns(InputWarning, match="numbers such as '2,048' read with the comma as a thousands separator"):
        assert read_measurements(tabs).equals(read_measurements(comma))


@pytest.mark.parametrize("layout", ["csv", "markdown"])
def test_a_row_short_of_a_field_is_said(layout: str, tmp_path: Path) -> None:
    """A measurement row one cell short (its time left out, its run id then read as the time) was padded with
    nulls and scored without a word (an audit: +264 % on that row). Its padding is said, naming the line."""
    from vtrain.importers.measurements import read_measurements

    header = ["# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
              "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
              "iteration time (ms)", "run id"]
    rows = [["8", "16", "2", "1024", "16", "4", "1024", "1", "8", "1", "250", "7"],
            ["8", "16", "2", "1024", "16", "4", "1024", "1", "8", "1", "100"]]
    if layout == "csv":
        text = "\n".join(",".join(row) for row in [header, *rows]) + "\n"
    else:
        lines = [header, ["---"] * len(header), *rows]
        text = "\n".join("| " + " | ".join(row) + " |" for row in lines) + "\n"
    path = tmp_path / f"runs.{'csv' if layout == 'csv' else 'md'}"
    path.write_text(text)
    line = 3 if layout == "csv" else 4  # the Markdown rule under the header is a line
    with pytest.warns(InputWarning, match=rf"1 row\(s\) with fewer fields than the header's 12 \(line {line}\)"):
        read_measurements(path)


def test_vidur_compute_without_its_gpu_in_the_path_says_what_it_is_taken_as(tmp_path: Path) -> None:
    """A copy of vidur's A100 file outside a folder naming the GPU was read against the profile's --device
    silently (4.5 % off on LLaMA-2-7B)."""
    copy = tmp_path / "mine" / "Llama-2-7b-hf-mlp.csv"
    copy.parent.mkdir()
    copy.write_bytes((VIDUR / "compute" / "Llama-2-7b-hf-mlp.csv").read_bytes())
    with pytest.warns(InputWarning, match="which GPU vidur profiled it on is not in its path"):
        assert set(read_vidur_compute(copy)["device"]) == {None}
    with warnings.catch_warnings():
        warnings.simplefilter("error", InputWarning)
        assert set(read_vidur_compute(VIDUR / "compute" / "Llama-2-7b-hf-mlp.csv")["device"]) == {"A100-80GB"}


def test_a_comment_over_a_table_is_left_out_and_a_header_starting_with_a_hash_is_read(tmp_path: Path) -> None:
    """``# SC21 Table 1, from the paper`` over a pasted table was its header: "line 2: 11 fields where the header
    has 2". NeMo's tables name a column ``#-GPUs``: a header, not a comment."""
    header, first, second = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[:3]
    noted = write(tmp_path / "noted.csv", ["# SC21 Table 1, from the paper", header, first, "#", "  # two", second])
    plain = write(tmp_path / "plain.csv", [header, first, second])
    assert read_measurements(noted).drop("line").equals(read_measurements(plain).drop("line"))
    assert read_measurements(noted)["line"].to_list() == [3, 6]  # the file's own lines
    hashed = write(tmp_path / "nemo.csv", ["model,#-GPUs,GBS,MBS,seq,TP,PP,Tokens / sec / GPU",
                                           "gpt-3-175b,1024,1536,1,2048,8,16,140"])
    assert read_measurements(hashed)["gpus"].to_list() == [1024]
