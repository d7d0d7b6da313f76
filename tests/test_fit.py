"""The fitted device model: kernel models, collective α-β curves, host overheads, `vtrain fit` and
`vtrain validate --measurements`, on the real A100 measurements copied into tests/data/a100 (the kernel model
itself: tests/test_kernel_model.py)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import REPO
from vtrain.cli.main import app
from vtrain.devices.fitted import HostOverhead
from vtrain.errors import InputError, InputWarning
from vtrain.fit.alpha_beta import fit_collectives
from vtrain.fit.device import device_from_profile, device_metadata, fit_device
from vtrain.importers import read_llmcompass, read_nccl_tests
from vtrain.model.ops import make_op
from vtrain.report.measurements import render_markdown
from vtrain.tables.store import Profile, conform, empty_table
from vtrain.validate.measurements import validate_measurements

DATA = REPO / "tests" / "data" / "a100"
NCCL = DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"
GROUND_TRUTH = DATA / "vtrain-a100" / "ground_truth_single.csv"
SHIPPED = REPO / "profiles" / "a100"


def test_alpha_beta_reproduces_nccl_tests() -> None:
    table = pl.concat([read_nccl_tests(NCCL / f"allreduce_{n}gpu.csv") for n in (2, 8)])
    fits = {f.group_size: f for f in fit_collectives(table)}
    assert set(fits) == {2, 8}
    for n, fit in fits.items():
        rows = table.filter(pl.col("group_size") == n)
        errors = [abs(fit.time_us(b) / t - 1) for b, t in rows.select("bytes", "median_us").iter_rows()]
        assert max(errors) < 0.3 and sum(errors) / len(errors) < 0.05  # α-β is a line; NCCL ramps at 1-4 MiB
        assert 150 < fit.bus_gbps < 260  # NVLink A100: nccl-tests busbw ~190-230 GB/s


def test_fitted_device_round_trips_through_metadata() -> None:
    tables = {name: empty_table(name) for name in ("kernels", "cpu_ops", "collectives", "op_latency")}
    tables["op_benchmarks"] = conform(read_llmcompass(DATA / "llmcompass-a100"), "op_benchmarks")
    tables["nccl_latency"] = conform(read_nccl_tests(NCCL / "allreduce_4gpu.csv"), "nccl_latency")
    device = fit_device(Profile(tables), "A100-40GB")
    metadata = {"fitted": json.loads(json.dumps(device_metadata(device, "A100-40GB")))}
    again = device_from_profile(Profile(tables, metadata=metadata))
    op = make_op("aten::mm", [[4096, 4096], [4096, 4096]], ["c10::Half", "c10::Half"])
    assert again.op_latency_us(op) == pytest.approx(device.op_latency_us(op))
    assert again.collective_us("all_reduce", 4, 2**24, 1) == device.collective_us("all_reduce", 4, 2**24, 1)
    latency, detail = device.collective_us("all_reduce", 4, 2**24, 1)
    assert "fitted" in detail and "nccl-tests" in detail and math.isfinite(latency)
    assert device.provenance["gemm"].startswith("fitted")


def test_old_profile_metadata_is_one_line_error() -> None:
    """A profile fitted by an older vtrain (a roofline, ``sync_us_per_rank``) must be refitted, not misread."""
    tables = {name: empty_table(name) for name in ("kernels", "cpu_ops", "collectives", "op_latency",
                                                   "op_benchmarks", "nccl_latency")}
    old = {"fitted": {"device": "A100-40GB", "host": {"op_us": 39.4, "collective_us": 35.3,
                                                      "sync_us_per_rank": 2.0}, "non_gemm_scale": 0.45}}
    with pytest.raises(InputError, match="refit it with `vtrain fit`"):
        device_from_profile(Profile(tables, metadata=old), "metadata.json")


def test_sync_term_grows_slowly_with_the_group() -> None:
    """σ·√(2 ln n): 0 for one rank, and at t = 16 a few σ, not the 488 µs of the old 2 µs·(n−1)²."""
    host = HostOverhead(op_us=0.0, collective_us=0.0, jitter_us=10.0)
    assert host.sync_us(1) == 0.0
    assert host.sync_us(2) == pytest.approx(10.0 * math.sqrt(2 * math.log(2)))
    assert host.sync_us(16) < 25.0 and host.sync_us(4096) < 42.0
    assert host.sync_us(8) < host.sync_us(16) < host.sync_us(64)


def test_fit_command_records_rows_and_validate_excludes_them(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "prof"
    result = runner.invoke(app, ["fit", "-o", str(out), "--nccl-tests", str(NCCL), "--llmcompass",
                                 str(DATA / "llmcompass-a100"), "--vidur-compute",
                                 str(DATA / "vidur-a100" / "compute" / "phi-2-mlp.csv"), "--measurements",
                                 str(GROUND_TRUTH),
                                 "--fit-every", "144", "--json"])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["fit_rows"]["rows"] == list(range(1, 1441, 144))
    assert meta["fitted"]["host"]["op_us"] > 0
    subset = tmp_path / "subset.csv"  # another file: its rows are not the fitted ones, nothing is excluded
    subset.write_text("\n".join(GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[:41]) + "\n")
    report = tmp_path / "report"
    result = runner.invoke(app, ["validate", "--measurements", str(subset), "--profile", str(out), "-o",
                                 str(report), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 40 and summary["excluded"] == 0 and summary["mape_pct"] < 30
    assert (report / "report.html").read_text().count("<script") >= 1
    assert "Ten worst-predicted rows" in (report / "report.md").read_text()
    assert meta["fitted"]["kernel_held_out"]["rotations"][0]["held_out"] == "LLMCompass GPT-3 layer"


def test_measurements_refuse_rows_that_are_no_measurement(tmp_path: Path) -> None:
    """A negative, zero or NaN time and an absurd shape: a warning, no simulation (2.4e10 layers would never
    finish), and the MAPE over the good rows only."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    good = lines[1].split(",")
    absurd = [*good[:5], "2.4e10", *good[6:]]
    bad = [",".join([*good[:-1], time]) for time in ("-3", "0", "nan")] + [",".join(absurd)]
    table = tmp_path / "bad.csv"
    table.write_text("\n".join([lines[0], lines[1], *bad]) + "\n")
    result = CliRunner().invoke(app, ["validate", "--measurements", str(table), "--profile", str(SHIPPED), "-o",
                                      str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 1 and summary["invalid"] == 4
    assert "warning:" in result.stderr and "4 row(s) not simulated and not scored" in result.stderr
    assert math.isfinite(summary["mape_pct"])


def test_measurements_say_rows_that_cannot_run_and_rows_far_off(tmp_path: Path) -> None:
    """A row whose GPUs are not t·d·p (it cannot be simulated) was left out without a word; a row measured in
    seconds where ms belong (1,000x off) or in µs was scored silently. Each is now a warning line."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    good = lines[1].split(",")
    wrong_gpus = ",".join([str(2 * int(good[0])), *good[1:]])
    in_seconds = ",".join([*good[:-1], str(float(good[-1]) / 1000)])
    in_microseconds = ",".join([*good[:-1], str(float(good[-1]) * 1000)])
    table = tmp_path / "odd.csv"
    table.write_text("\n".join([lines[0], lines[1], wrong_gpus, in_seconds, in_microseconds]) + "\n")
    result = CliRunner().invoke(app, ["validate", "--measurements", str(table), "--profile", str(SHIPPED), "-o",
                                      str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 3 and summary["invalid"] == 1
    said = [line for line in result.stderr.splitlines()
            if line.startswith("warning:") and "rows that do not say it" not in line]
    assert len(said) == 2, result.stderr
    assert "1 row(s) not simulated and not scored (row 2: tp*dp*pp" in said[0]
    assert "2 row(s) measured more than 5x from the prediction, scored all the same (row 3: measured" in said[1]


def test_measurements_say_rows_that_could_not_have_fitted(tmp_path: Path) -> None:
    """A measured run whose largest stage the memory model puts over its device's memory could not have run as the
    table says (vTrain's row 342: hidden 2048, 24 layers, micro-batch 8 on one A100-40GB, 49.7 GiB without
    recomputation, Megatron's dropout masks and dropped-out probabilities counted, and its 16-bit logits beside
    their fp32 copy at the head's peak; 51.3 GiB before its output projection was counted as the tied word
    embedding): a warning line, the row scored
    all the same; with recomputation it fits and nothing is said."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    assert lines[342] == "2,32,8,2048,16,24,1024,1,2,1,962.740116"
    table = tmp_path / "one.csv"
    table.write_text("\n".join([lines[0], lines[342]]) + "\n")
    said = {}
    for name, flags in (("none", ["--recompute", "none"]), ("full", ["--recompute", "full"]),
                        ("80GB", ["--recompute", "none", "--device", "A100-80GB"])):
        result = CliRunner().invoke(app, ["validate", "--measurements", str(table), "--profile", str(SHIPPED),
                                          *flags, "-o", str(tmp_path / name), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["rows"] == 1
        said[name] = [line for line in result.stderr.splitlines()
                      if line.startswith("warning:") and "rows that do not say it" not in line]
    assert len(said["none"]) == 1 and said["full"] == [] and said["80GB"] == [], said
    assert ("1 row(s) measured although the memory model puts their largest stage over the GPU's memory, scored "
            "all the same (row 1: 49.7 GiB of A100-40GB's 40 GiB with recomputation none)") in said["none"][0]
    # a table measured on 80 GB A100s and scored with this 40 GB profile is told how to say so
    assert "give theirs: --device or a device column, e.g. A100-80GB" in said["none"][0]
    named = tmp_path / "named.csv"  # a row that names its GPU is not asked for it (an audit: OPT-175B's A100-80GB)
    named.write_text("\n".join([lines[0] + ",device", lines[342] + ",A100-40GB"]) + "\n")
    result = CliRunner().invoke(app, ["validate", "--measurements", str(named), "--profile", str(SHIPPED),
                                      "--recompute", "none", "-o", str(tmp_path / "named"), "--json"])
    [line] = [line for line in result.stderr.splitlines() if "memory model puts their largest stage" in line]
    assert "give theirs" not in line and "shard their optimizer states" in line, line
    flag = CliRunner().invoke(app, ["validate", "--measurements", str(table), "--profile", str(SHIPPED), "--recompute",
                                    "none", "--device", "A100-40GB", "-o", str(tmp_path / "flag"), "--json"])
    [line] = [line for line in flag.stderr.splitlines() if "memory model puts their largest stage" in line]
    assert "give theirs" not in line, line  # nor one whose GPU --device gives
    rows = pl.read_parquet(tmp_path / "none" / "rows.parquet")
    assert rows["fits"].to_list() == [False] and rows["memory_gib"][0] == pytest.approx(49.74, abs=0.01)


@pytest.mark.skipif(not SHIPPED.exists(), reason="profiles/a100 is built by `make profile-a100`")
def test_shipped_a100_profile_on_ground_truth(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", "--measurements", str(GROUND_TRUTH), "--profile", str(SHIPPED),
                                      "--recompute", "none", "-o", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    meta = json.loads((SHIPPED / "metadata.json").read_text())
    assert summary["excluded"] == len(meta["fit_rows"]["rows"]) > 0
    assert summary["rows"] + summary["excluded"] == 1440
    assert summary["mape_pct"] < 10


def test_measurements_need_a_fitted_profile(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["validate", "--measurements", str(GROUND_TRUTH), "--profile",
                                 str(REPO / "traces" / "t2p1d1"), "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "error:" in result.stderr
    result = runner.invoke(app, ["validate", "--measurements", str(tmp_path / "none.csv"), "--profile",
                                 str(SHIPPED), "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no such file" in result.stderr
    assert not (tmp_path / "r").exists()
    (tmp_path / "tables").mkdir()  # a folder was called "no such file"; a folder of none is one line
    result = runner.invoke(app, ["validate", "--measurements", str(tmp_path / "tables"), "--profile",
                                 str(SHIPPED), "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and "no measurement table or Megatron log among its 0 file(s)" in result.stderr
    assert not (tmp_path / "r").exists()
    # the measurements' hardware flags on a trace folder were ignored in silence
    result = runner.invoke(app, ["validate", str(REPO / "traces" / "t1p1d2"), "--device", "A100-80GB",
                                 "--inter-node-gbps", "800", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and not (tmp_path / "r").exists()
    assert result.stderr.strip() == ("error: --device, --inter-node-gbps go with --measurements (a trace folder's run "
                                     "is described by its run.yaml or --config)")
    # and so were the rows' recomputation and framework
    result = runner.invoke(app, ["validate", str(REPO / "traces" / "t1p1d2"), "--recompute", "none", "--framework",
                                 "reference", "-o", str(tmp_path / "r")])
    assert result.exit_code == 2 and not (tmp_path / "r").exists()
    assert result.stderr.strip().startswith("error: --recompute, --framework go with --measurements")


@pytest.mark.skipif(not SHIPPED.exists(), reason="profiles/a100 is built by `make profile-a100`")
def test_a_run_on_another_variant_of_the_profiles_gpu_gets_its_roofline_and_memory() -> None:
    """An A100-80GB run with the A100-40GB profile: the kernel models keep their learnt efficiencies on the 80 GB
    part's roofline (a memory-bound kernel moves its bytes at 2,039 GB/s, not 1,555; a large GEMM, compute-bound,
    is as fast), with its 80 GB of memory; host and collective terms stay the profile's."""
    from vtrain.fit.device import device_for_run
    from vtrain.runconfig import run_config_from_dict
    from vtrain.tables.store import load_profile

    profile = load_profile(SHIPPED)

    def device(gpu: str):
        config = run_config_from_dict({"model": {"layers": 2, "hidden": 4096, "heads": 32, "seq": 2048,
                                                 "vocab": 50257},
                                       "parallelism": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1,
                                                       "global_batch": 1},
                                       "precision": "fp16", "hardware": {"device": gpu, "device_count": 1}})
        return device_for_run(config, profile)

    forty, eighty = device("A100-40GB"), device("A100-80GB")
    assert (forty.name, eighty.name) == ("A100-40GB", "A100-80GB")
    assert eighty.memory_bytes == 2 * forty.memory_bytes
    big_add = make_op("aten::add", [[8192, 16384], [8192, 16384], []], ["c10::Half", "c10::Half", "Scalar"])
    assert forty.op_latency_us(big_add) / eighty.op_latency_us(big_add) == pytest.approx(2039 / 1555, rel=1e-9)
    gemm = make_op("aten::mm", [[8192, 8192], [8192, 8192]], ["c10::Half", "c10::Half"])
    assert forty.op_latency_us(gemm) == pytest.approx(eighty.op_latency_us(gemm), rel=1e-9)
    assert forty.host == eighty.host and forty.collectives == eighty.collectives


def test_a_fit_without_a_host_source_says_so(tmp_path: Path) -> None:
    """Kernel and collective tables alone fit no host term: the summary said ``host: 0.0 µs/op``, as if one had
    been measured at zero; now it says none was fitted and why."""
    result = CliRunner().invoke(app, ["fit", "-o", str(tmp_path / "prof"), "--nccl-tests", str(NCCL),
                                      "--llmcompass", str(DATA / "llmcompass-a100")])
    assert result.exit_code == 0, result.output
    assert "host: not fitted: no measured iteration times" in result.stdout
    assert "0.0 µs/op" not in result.stdout


def test_measurements_split_each_layouts_time_per_micro_batch_and_per_iteration(tmp_path: Path) -> None:
    """Runs of one layout at several global batches tell the work every micro-batch repeats from the iteration's
    own: measured 10 ms + 5 ms per micro-batch is read back exactly, and the prediction is split the same way; a
    layout measured at one global batch only is no layout of the split."""
    header = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[0]
    runs = [(gbs, 10.0 + 5.0 * gbs / (2 * 2)) for gbs in (8, 16, 32)]  # micro-batch 2, dp 2: gbs / 4 micro-batches
    lines = [header, *(f"4,{gbs},2,1024,16,12,1024,1,2,2,{ms}" for gbs, ms in runs), "2,16,2,1024,16,12,1024,2,1,1,99"]
    table = tmp_path / "layouts.csv"
    table.write_text("\n".join(lines) + "\n")
    v = validate_measurements(table, SHIPPED, recompute="none")
    layouts = v.per_micro_batch
    assert layouts.height == 1 and layouts["runs"].to_list() == [3]
    row = layouts.row(0, named=True)
    assert row["per_micro_batch_ms_measured"] == pytest.approx(5.0) and row["fixed_ms_measured"] == pytest.approx(10.0)
    scored = v.scored.filter(pl.col("tp") == 1).sort("global_batch")
    slope, fixed = np.polyfit([2.0, 4.0, 8.0], scored["predicted_ms"].to_numpy(), 1)
    assert row["per_micro_batch_ms_predicted"] == pytest.approx(slope)
    assert row["fixed_ms_predicted"] == pytest.approx(fixed)
    assert row["per_micro_batch_ratio"] == pytest.approx(slope / 5.0)
    by_pp = v.per_micro_batch_by("pp").to_dicts()
    assert by_pp == [{"pp": 2, "layouts": 1, "per_micro_batch_ratio": pytest.approx(slope / 5.0),
                      "fixed_ms_measured": pytest.approx(10.0), "fixed_ms_predicted": pytest.approx(fixed)}]
    assert v.to_dict()["per_micro_batch"]["pp"] == by_pp
    assert "## Per micro-batch and per iteration" in render_markdown(v)


def test_measurements_split_the_time_per_micro_batch_into_layers_and_what_surrounds_them(tmp_path: Path) -> None:
    """Layouts that differ only in their layers, each at two global batches, measured at 4 ms per micro-batch
    outside the layers + 3 ms per layer a stage holds (+ 10 ms per iteration): both parts read back exactly, the
    prediction split the same way; one family, so one row by pp."""
    header = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()[0]
    lines = [header]
    for layers in (12, 16, 24):
        for micro_batches in (2, 4):
            ms = 10.0 + micro_batches * (4.0 + 3.0 * layers / 2)  # pp 2: layers / 2 a stage
            lines.append(f"4,{micro_batches * 2 * 2},2,1024,16,{layers},1024,1,2,2,{ms}")
    table = tmp_path / "families.csv"
    table.write_text("\n".join(lines) + "\n")
    v = validate_measurements(table, SHIPPED, recompute="none")
    assert v.per_micro_batch.height == 3 and v.per_layer.height == 1
    row = v.per_layer.row(0, named=True)
    assert row["per_layer_ms_measured"] == pytest.approx(3.0) and row["outside_ms_measured"] == pytest.approx(4.0)
    per_micro_batch = v.per_micro_batch.sort("layers")["per_micro_batch_ms_predicted"].to_numpy()
    slope, outside = np.polyfit([6.0, 8.0, 12.0], per_micro_batch, 1)  # layers a stage holds: 12, 16, 24 over pp 2
    assert row["per_layer_ms_predicted"] == pytest.approx(slope)
    assert row["outside_ms_predicted"] == pytest.approx(outside)
    assert v.to_dict()["per_layer"]["pp"] == [{"pp": 2, "families": 1, "per_layer_ratio": pytest.approx(slope / 3.0),
                                                "outside_ms_measured": pytest.approx(4.0),
                                                "outside_ms_predicted": pytest.approx(outside)}]
    assert "predicted / measured per layer" in render_markdown(v)


def test_a_folder_of_no_measurements_is_refused_not_fitted_to_nothing(tmp_path: Path) -> None:
    """A folder holding a Slurm job's error file fitted nothing, exit 0, no word ("collectives: not fitted")."""
    folder = tmp_path / "nccl"
    folder.mkdir()
    (folder / "slurm-48213.err").write_text("srun: error: node00: task 0: Exited with exit code 1\n")
    result = CliRunner().invoke(app, ["fit", "-o", str(tmp_path / "profile"), "--nccl-tests", str(folder)])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        f"error: {folder}: no .csv, .txt, .log, .out file in the folder: nothing to read"], result.stderr
    assert not (tmp_path / "profile").exists()


def test_a_profile_every_command_would_refuse_is_not_written(tmp_path: Path) -> None:
    """`vtrain fit` wrote a profile of a 0-GPU group's collectives that `vtrain tables` then refused; whatever
    the checks of a profile's reader refuse, its writer now refuses first."""
    from vtrain.tables.store import write_profile

    rows = read_nccl_tests(NCCL / "allreduce_2gpu.csv").head(3).with_columns(group_size=pl.lit(0, dtype=pl.Int32))
    profile = Profile(tables={"op_latency": empty_table("op_latency"), "nccl_latency": rows})
    with pytest.raises(InputError, match="not written: every command would refuse it .* group_size below 1"):
        write_profile(profile, tmp_path / "profile")
    assert not (tmp_path / "profile").exists()


def test_vidur_files_in_vidur_s_own_layout_are_each_a_model(tmp_path: Path) -> None:
    """vidur writes each model's profile as ``.../<org>/<model>/mlp.csv``: keyed by the file name, every model but
    the last was thrown away (one group of 2,349 rows where three hold 23,229; GPT-1.3B predicted 9 % faster: an
    audit). Each file is its model, named by its folder."""
    compute = DATA / "vidur-a100" / "compute"
    files = []
    for model in ("Llama-2-7b-hf", "Llama-2-70b-hf", "phi-2"):
        folder = tmp_path / "vidur" / "compute" / "a100" / model
        folder.mkdir(parents=True)
        (folder / "mlp.csv").write_bytes((compute / f"{model}-mlp.csv").read_bytes())
        files += ["--vidur-compute", str(folder / "mlp.csv")]
    result = CliRunner().invoke(app, ["fit", "-o", str(tmp_path / "prof"), *files])
    assert result.exit_code == 0, result.output
    flat = CliRunner().invoke(app, ["fit", "-o", str(tmp_path / "flat"), *(
        arg if arg.startswith("--") else str(compute / f"{Path(arg).parent.name}-mlp.csv") for arg in files)])
    assert flat.exit_code == 0, flat.output
    rows = pl.read_parquet(tmp_path / "prof" / "op_benchmarks.parquet").height
    assert rows == pl.read_parquet(tmp_path / "flat" / "op_benchmarks.parquet").height > 10_000


def test_a_host_fit_that_misses_its_rows_is_said_and_every_fit_says_its_error(tmp_path: Path) -> None:
    """Iteration times in seconds under a column of ms fitted host terms 4x too small with a MAPE of 100,551 % on
    the rows fitted, kept in the metadata and printed nowhere (an audit). `fit` prints the MAPE on its rows, and
    says a fit that misses them by more than IMPLAUSIBLE_FIT_PCT."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    seconds = tmp_path / "seconds.csv"
    seconds.write_text("\n".join([lines[0], *(",".join([*row.split(",")[:-1], str(float(row.split(",")[-1]) / 1e3)])
                                              for row in lines[1:11])]) + "\n")
    args = ["fit", "--nccl-tests", str(NCCL), "--vidur-compute",
            str(DATA / "vidur-a100" / "compute" / "phi-2-mlp.csv"), "--fit-every", "1"]
    with pytest.warns(InputWarning, match=r"rows miss them by [0-9,]+ % \(MAPE\).*seconds in a column of ms\?"):
        wrong = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "wrong"), "--measurements", str(seconds)])
    assert wrong.exit_code == 0, wrong.output
    right = tmp_path / "right.csv"
    right.write_text("\n".join(lines[:11]) + "\n")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        fine = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "right"), "--measurements", str(right)])
    assert fine.exit_code == 0 and not any("rows miss them by" in str(w.message) for w in said), fine.output
    assert "fitted on 10 rows of right.csv (every 1): MAPE " in fine.stdout, fine.stdout


def test_an_llmcompass_folder_without_its_layer_file_is_read(tmp_path: Path) -> None:
    """Any one of LLMCompass's files is enough (its reader's rule), but a folder without transformer_A100.csv was
    refused ("no such file"): the layer's all-reduces were always read (an audit). They are read where there."""
    folder = tmp_path / "llmcompass"
    folder.mkdir()
    (folder / "matmul_A100.csv").write_bytes((DATA / "llmcompass-a100" / "matmul_A100.csv").read_bytes())
    result = CliRunner().invoke(app, ["fit", "-o", str(tmp_path / "prof"), "--llmcompass", str(folder)])
    assert result.exit_code == 0, result.output
    assert pl.read_parquet(tmp_path / "prof" / "op_benchmarks.parquet").height > 0
