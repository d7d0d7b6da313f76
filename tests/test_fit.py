"""The fitted device model: kernel rooflines, collective α-β curves, host overheads, `vtrain fit` and
`vtrain validate --measurements`, on the real A100 measurements copied into tests/data/a100."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from vtrain.cli.main import app
from vtrain.fit.collectives import fit_collectives
from vtrain.fit.device import device_from_metadata, device_metadata, fit_device
from vtrain.fit.kernels import fit_roofline
from vtrain.importers import read_llmcompass, read_nccl_tests
from vtrain.model.ops import make_op
from vtrain.tables.store import Profile, conform, empty_table

from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "a100"
NCCL = DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"
GROUND_TRUTH = DATA / "vtrain-a100" / "ground_truth_single.csv"
SHIPPED = REPO / "profiles" / "a100"


def test_gemm_roofline_reproduces_llmcompass_matmuls() -> None:
    gemms = read_llmcompass(DATA / "llmcompass-a100").filter(pl.col("op_class") == "gemm")
    fit = fit_roofline(gemms, compute_bound=True)
    assert fit.mape_pct < 10
    assert 200e12 < fit.flops_per_s < 312e12  # below the A100's dense fp16 peak
    big = gemms.filter(pl.col("flops") == pl.col("flops").max()).row(0, named=True)
    assert fit.time_us(big["flops"], big["bytes"]) == pytest.approx(big["median_us"], rel=0.1)


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
    again = device_from_metadata(json.loads(json.dumps(device_metadata(device, "A100-40GB"))))
    op = make_op("aten::mm", [[4096, 4096], [4096, 4096]], ["c10::Half", "c10::Half"])
    assert again.op_latency_us(op) == pytest.approx(device.op_latency_us(op))
    assert again.collective_us("all_reduce", 4, 2**24, 1) == device.collective_us("all_reduce", 4, 2**24, 1)
    latency, detail = device.collective_us("all_reduce", 4, 2**24, 1)
    assert "fitted" in detail and "nccl-tests" in detail and math.isfinite(latency)
    assert device.provenance["gemm"].startswith("fitted")


def test_fit_command_records_rows_and_validate_excludes_them(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "prof"
    result = runner.invoke(app, ["fit", "-o", str(out), "--nccl-tests", str(NCCL), "--llmcompass",
                                 str(DATA / "llmcompass-a100"), "--measurements", str(GROUND_TRUTH),
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
    assert summary["rows"] == 40 and summary["excluded"] == 0 and summary["mape_pct"] < 25
    assert (report / "report.html").read_text().count("<script") >= 1
    assert "Ten worst-predicted rows" in (report / "report.md").read_text()


@pytest.mark.skipif(not SHIPPED.exists(), reason="profiles/a100 is built by `make profile-a100`")
def test_shipped_a100_profile_on_ground_truth(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", "--measurements", str(GROUND_TRUTH), "--profile", str(SHIPPED),
                                      "-o", str(tmp_path / "r"), "--json"])
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
