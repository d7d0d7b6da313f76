"""`vtrain calibrate`: a known drift (every NCCL kernel of real A100 traces 30 % slower) is reported on exactly the
collectives and NCCL kernels, an unchanged copy reports none, software changes are named, the reference run and a
validation suite are predicted with both profiles, and bad input gives one line, exit 2 and nothing written."""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, TRACES
from vtrain.calibrate import calibration as calibrate_run
from vtrain.calibrate.drift import SE_PER_LOWER_SPREAD, compare, software_changes
from vtrain.calibrate.profile import derive_profile, metadata_sha256, verify_lineage
from vtrain.cli.main import app
from vtrain.outputs import staged
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.tables.store import load_profile, write_profile

A100 = TRACES / "hta-a100-2rank-nccl"
CPU_RUN = TRACES / "t1p1d2"
CPU_OTHER_RUN = TRACES / "t1p1d2-overlap"
SLOWER = 1.30
GPU_REFERENCE = """\
model: {layers: 4, hidden: 1024, heads: 16, seq: 512, vocab: 32000}
parallelism: {tp: 1, pp: 1, dp: 2, micro_batch: 2, global_batch: 4}
precision: fp32
hardware: {device: A100, device_count: 2, gpus_per_node: 2}
"""


def is_nccl(event: dict[str, Any]) -> bool:
    """An NCCL kernel or its GPU-side annotation (``nccl:all_reduce`` on the GPU timeline)."""
    return event.get("cat") in ("kernel", "gpu_user_annotation") and str(event.get("name", "")).startswith("nccl")


def copy_traces(source: Path, target: Path, edit: Callable[[dict[str, Any]], int] = lambda _: 0) -> int:
    """Copy a trace folder, passing each rank's trace through ``edit``; returns the events ``edit`` changed."""
    target.mkdir()
    changed = 0
    for path in sorted(source.iterdir()):
        if not path.name.endswith(".json.gz"):
            shutil.copy(path, target / path.name)
            continue
        with gzip.open(path, "rt") as handle:
            trace = json.load(handle)
        changed += edit(trace)
        with gzip.open(target / path.name, "wt", compresslevel=1) as handle:  # fast: a test's copy
            handle.write(json.dumps(trace))
    return changed


def slow_down_nccl(trace: dict[str, Any]) -> int:
    """Every NCCL kernel (and its GPU annotation) ``SLOWER`` times longer."""
    slowed = [e for e in trace["traceEvents"] if is_nccl(e)]
    for event in slowed:
        event["dur"] = event["dur"] * SLOWER
    return len(slowed)


def new_nccl_version(trace: dict[str, Any]) -> int:
    trace["distributedInfo"]["nccl_version"] = "2.18.3"
    return 1


def invoke(*args: object) -> Any:
    return CliRunner().invoke(app, ["calibrate", *map(str, args)])


@pytest.fixture(scope="module")
def a100_base(tmp_path_factory: pytest.TempPathFactory, shipped_profile) -> Path:
    # `ingest_traces(A100)`, once per test run (tests/conftest.py)
    return write_profile(shipped_profile(A100), tmp_path_factory.mktemp("profiles") / "a100")


def calibrate_json(trace_dir: Path, base: Path, out: Path, *extra: object) -> dict[str, Any]:
    result = invoke(trace_dir, "--base", base, "-o", out / "profile", "--report-dir", out / "report", "--json",
                    *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_nccl_slowdown_drifts_exactly_the_collectives(a100_base: Path, tmp_path: Path) -> None:
    """The drift test of issue #6: NCCL 30 % slower moves every collective and NCCL kernel by 1.30, nothing else."""
    slow = tmp_path / "slow"
    assert copy_traces(A100, slow, slow_down_nccl) == 42  # 21 NCCL kernels and their 21 GPU annotations
    summary = calibrate_json(slow, a100_base, tmp_path, "--reference", _gpu_reference(tmp_path))
    base = load_profile(a100_base)
    collectives = {tuple(r.values()) for r in base["nccl_latency"].select(
        "collective", "group_size", "bytes", "device_type").to_dicts()}
    nccl_kernels = {n for n in base["kernels"]["name"].unique() if n.startswith("nccl")}
    assert len(collectives) == 7 and len(nccl_kernels) == 2

    moved = summary["drifted"]
    assert {tuple(r["key"].values()) for r in moved if r["kind"] == "collective"} == collectives
    assert {r["key"]["name"] for r in moved if r["kind"] == "kernel"} == nccl_kernels
    assert [r for r in moved if r["kind"] == "op"] == []
    assert len(moved) == len(collectives) + len(nccl_kernels)
    for row in moved:
        assert row["status"] == "slower"
        assert row["ratio"] == pytest.approx(SLOWER, rel=1e-6), row
        assert row["band"] < SLOWER, row  # the band is narrower than the change it let through
    assert summary["unmatched"] == [] and summary["software_changed"] == {}
    assert summary["counts"]["op"]["unchanged"] == base["op_latency"].height
    assert summary["counts"]["kernel"]["unchanged"] == base["kernels"]["name"].n_unique() - len(nccl_kernels)
    assert {r["collective"]: round(r["time_ratio"], 6) for r in summary["collective_types"]} == {
        "all_reduce": SLOWER, "broadcast": SLOWER}

    reference = summary["reference"]  # data-parallel all-reduces interpolated from the slower NCCL table
    assert 0.0 < reference["change_pct"] < 30.0 and reference["new_ms"] > reference["old_ms"]

    report = tmp_path / "report"
    markdown = (report / "report.md").read_text()
    assert "all_reduce group=2 bytes=8196000 (cuda) | slower" in markdown
    page = (report / "report.html").read_text()
    assert "<script" in page and "<script src=" not in page and "with its noise band" in page
    full = json.loads((report / "drift.json").read_text())
    assert len(full["rows"]["op"]) == base["op_latency"].height
    assert pl.read_parquet(report / "tables" / "collective.parquet")["status"].to_list() == ["slower"] * 7


def test_new_profile_records_its_lineage(a100_base: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy_traces(A100, copy)
    summary = calibrate_json(copy, a100_base, tmp_path)
    profile = load_profile(tmp_path / "profile")
    meta = profile.metadata
    assert meta["version"] == "profile" and meta["created_at"]
    assert meta["parent"] == {"path": str(a100_base), "sha256": metadata_sha256(a100_base), "version": "a100"}
    assert summary["parent"] == str(a100_base) and summary["profile"] == str(tmp_path / "profile")
    copied = hashlib.sha256((copy / "rank-0.json.gz").read_bytes()).hexdigest()
    assert [s["sha256"] for s in meta["sources"]] == [copied]
    fitted_now = meta["fitted"]  # calibrate refits the device model to the new tables
    assert fitted_now["device"] == "A100-40GB"
    assert {c["collective"] for c in fitted_now["collectives"]} == {"all_reduce", "broadcast"}
    fitted = {"device": "A100-fitted", "gemm_efficiency": 0.7}
    assert derive_profile(profile, a100_base, version="v3", fitted=fitted).metadata["fitted"] == fitted
    assert verify_lineage(profile) is None
    edited = tmp_path / "edited-base"
    shutil.copytree(a100_base, edited)
    (edited / "metadata.json").write_text((edited / "metadata.json").read_text().replace('"nccl"', '"NCCL"'))
    meta["parent"]["path"] = str(edited)
    assert "has changed since" in (verify_lineage(profile) or "")


@pytest.mark.parametrize("source", [A100, CPU_RUN], ids=["a100", "cpu-t1p1d2"])
def test_unchanged_copy_reports_no_drift(source: Path, tmp_path: Path, shipped_profile) -> None:
    base = write_profile(shipped_profile(source), tmp_path / "base")  # `ingest_traces(source)`, once per run
    copy = tmp_path / "copy"
    copy_traces(source, copy)
    summary = calibrate_json(copy, base, tmp_path)
    assert summary["drifted"] == [] and summary["unmatched"] == [] and summary["software_changed"] == {}
    assert sum(summary["counts"]["op"].values()) == summary["counts"]["op"]["unchanged"] > 0
    if (source / "run.yaml").exists():  # the copy's run.yaml is the default reference
        assert summary["reference"]["config"] == str(copy / "run.yaml")
        assert summary["reference"]["change_pct"] == pytest.approx(0.0, abs=1e-9)  # summation order only
    else:
        assert summary["reference"] is None and "no run.yaml" in summary["reference_reason"]


def test_software_version_change_is_reported(a100_base: Path, tmp_path: Path) -> None:
    upgraded = tmp_path / "upgraded"
    copy_traces(A100, upgraded, new_nccl_version)
    summary = calibrate_json(upgraded, a100_base, tmp_path)
    assert summary["software_changed"] == {"nccl": {"old": "2.17.1", "new": "2.18.3"}}
    assert summary["drifted"] == []
    assert "| nccl | 2.17.1 | 2.18.3 |" in (tmp_path / "report" / "report.md").read_text()


def test_reference_and_suite_use_both_profiles(tmp_path: Path, shipped_profile) -> None:
    """Base from another recorded run of the same model: the reference run and the suite's model predictions
    differ between the profiles, and each equals `simulate` from that profile."""
    base = write_profile(shipped_profile(CPU_OTHER_RUN), tmp_path / "base")  # `ingest_traces`, once per run
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: small\nsets:\n  - traces: {CPU_RUN}\n    name: t1p1d2\n")
    summary = calibrate_json(CPU_RUN, base, tmp_path, "--suite", suite)
    config = load_run_config(CPU_RUN / "run.yaml")
    expected = {side: simulate(config, load_profile(path)).iteration_us / 1e3
                for side, path in (("old", base), ("new", tmp_path / "profile"))}
    reference = summary["reference"]
    assert reference["old_ms"] == pytest.approx(expected["old"]) and reference["new_ms"] == pytest.approx(
        expected["new"])
    assert reference["old_ms"] != reference["new_ms"]
    [row] = summary["suite"]["sets"]
    assert row["model_old"]["predicted_ms"] == pytest.approx(expected["old"], abs=1e-3)
    assert row["model_new"]["predicted_ms"] == pytest.approx(expected["new"], abs=1e-3)
    assert "## Validation suite `small` with the old and the new profile" in (
        tmp_path / "report" / "report.md").read_text()


def _gpu_reference(folder: Path) -> Path:
    path = folder / "gpu-run.yaml"
    path.write_text(GPU_REFERENCE)
    return path


def test_noise_band_rule() -> None:
    """The rule of vtrain.calibrate.drift on hand-made rows."""
    def side(rows: list[tuple[str, int, float, float]]) -> pl.DataFrame:
        return pl.DataFrame(rows, schema=["key", "count", "median_us", "p10_us"], orient="row").with_columns(
            p90_us=pl.col("median_us") * 2)

    old = side([("wide", 3, 100.0, 70.0), ("small", 50, 100.0, 98.0), ("up", 50, 100.0, 98.0),
                ("down", 50, 100.0, 98.0), ("once", 1, 100.0, 100.0), ("gone", 5, 10.0, 9.0)])
    new = side([("wide", 3, 125.0, 90.0), ("small", 50, 103.0, 101.0), ("up", 50, 110.0, 108.0),
                ("down", 50, 90.0, 88.0), ("once", 1, 112.0, 112.0), ("new", 5, 10.0, 9.0)])
    table = compare(old, new, ["key"], pl.col("key"))
    status = dict(zip(table["key"], table["status"]))
    assert status == {"wide": "unchanged", "small": "unchanged", "up": "slower", "down": "faster", "once": "slower",
                      "gone": "gone", "new": "new"}
    band = dict(zip(table["key"], table["band"]))
    e_old, e_new = (SE_PER_LOWER_SPREAD * s / math.sqrt(3) for s in (0.30, 35 / 125))
    assert band["wide"] == pytest.approx(math.exp(2 * max(e_old, e_new)))  # 1.40: a 25 % change is noise here
    # seen once: each side borrows its table's median spread (old 2/100 of "small"/"up"/"down", new 2/90 of "down")
    assert band["once"] == pytest.approx(math.exp(2 * SE_PER_LOWER_SPREAD * max(0.02, 2 / 90)))
    assert dict(zip(table["key"], table["pooled_spread"]))["once"] is True


@pytest.mark.parametrize("case", ["missing base", "base not a profile", "empty trace dir", "output exists",
                                  "output is the base", "report folder exists"])
def test_bad_input(case: str, a100_base: Path, tmp_path: Path) -> None:
    out, report, traces, base = tmp_path / "new", tmp_path / "report", A100, a100_base
    if case == "missing base":
        base = tmp_path / "nope"
    elif case == "base not a profile":
        base = A100
    elif case == "empty trace dir":
        traces = tmp_path / "empty"
        traces.mkdir()
    elif case in ("output exists", "report folder exists"):
        (out if case == "output exists" else report).mkdir()
        (out if case == "output exists" else report).joinpath("keep.txt").write_text("mine")
    else:
        out = base
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke(traces, "--base", base, "-o", out, "--report-dir", report)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    named = {"missing base": base, "base not a profile": base, "empty trace dir": traces, "output exists": out,
             "output is the base": out, "report folder exists": report}[case]
    assert str(named) in lines[0]
    if case == "report folder exists":  # the flag that gave it is the one to change
        assert lines[0].endswith("give another --report-dir"), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no profile, no report, no staging folder
    if case in ("output exists", "report folder exists"):
        assert (out if case == "output exists" else report).joinpath("keep.txt").read_text() == "mine"


@contextmanager
def report_rename_fails(target: Path, kind: str, command: str) -> Iterator[Path]:
    """``staged`` whose final rename fails (the report is written before the profile)."""
    with staged(target, kind, command) as staging:
        yield staging
        raise OSError("rename failed")


def report_write_fails(*_: object, **__: object) -> None:
    raise OSError("disk full")


@pytest.mark.parametrize("name, broken", [("write_drift_report", report_write_fails),
                                          ("staged", report_rename_fails),
                                          ("write_profile", report_write_fails)])  # the report written first
def test_failed_report_leaves_no_profile(name: str, broken: object, a100_base: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate_run, name, broken)
    result = invoke(A100, "--base", a100_base, "-o", tmp_path / "new", "--report-dir", tmp_path / "report")
    assert result.exit_code != 0 and isinstance(result.exception, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_recorded_runs_pytorch_upgrade_is_reported(tmp_path: Path, shipped_profile) -> None:
    """Kineto writes no PyTorch version into a trace's header; `vtrain record` writes it into run.yaml, which ingest
    did not read for it: a recorded run's PyTorch upgrade was reported as no change (an audit). The profile takes
    it from run.yaml, and calibrate says it."""
    base = write_profile(shipped_profile(CPU_RUN), tmp_path / "base")
    recorded = str(load_profile(base).metadata["software"]["pytorch"])
    assert recorded and recorded != "None"
    upgraded = tmp_path / "upgraded"
    copy_traces(CPU_RUN, upgraded)
    (upgraded / "run.yaml").write_text((CPU_RUN / "run.yaml").read_text().replace(f"torch: {recorded}",
                                                                                  "torch: 9.9.9+cpu"))
    summary = calibrate_json(upgraded, base, tmp_path)
    assert summary["software_changed"] == {"pytorch": {"old": recorded, "new": "9.9.9+cpu"}}


def test_two_names_of_one_gpu_are_no_device_change() -> None:
    """A fitted profile names its GPU by the catalog (``H100``), a trace by the driver (``NVIDIA H100 80GB HBM3``):
    calibrating `traces/gpu/h100-user-ckpt-accum` against `profiles/h100` reported ``device: H100 -> NVIDIA H100
    80GB HBM3`` as a change. Another part of a GPU still is one."""
    def meta(name: str) -> dict[str, Any]:
        return {"device": {"name": name}, "software": {"cuda_runtime": 13000}}

    assert software_changes(meta("H100"), meta("NVIDIA H100 80GB HBM3")) == {}
    assert software_changes(meta("A100"), meta("NVIDIA A100-SXM4-80GB")) == {
        "device": {"old": "A100", "new": "NVIDIA A100-SXM4-80GB"}}
    assert software_changes(meta("cpu"), meta("H100"))["device"] == {"old": "cpu", "new": "H100"}


def test_traces_of_another_job_than_the_bases_are_said(tmp_path: Path, shipped_profile) -> None:
    """calibrate is for the same job after a software change: traces of another layout (t1 p1 d2 against the
    base's t1 p2 d1) drift by their work, not by the software, and were reported as drift without a word."""
    base = write_profile(shipped_profile(TRACES / "t1p2d1"), tmp_path / "base")
    result = invoke(CPU_RUN, "--base", base, "-o", tmp_path / "profile", "--report-dir", tmp_path / "report")
    assert result.exit_code == 0, result.stderr
    assert (f"warning: the traces are of another job than the base profile {base}'s (t x p x d 1 x 1 x 2 against "
            "1 x 2 x 1): operators of other shapes show as gone and new") in result.stderr, result.stderr
    same = write_profile(shipped_profile(CPU_OTHER_RUN), tmp_path / "same")  # the same job, overlapped
    result = invoke(CPU_RUN, "--base", same, "-o", tmp_path / "profile2", "--report-dir", tmp_path / "report2")
    assert result.exit_code == 0 and "another job" not in result.stderr, result.stderr


def test_a_fitted_base_keeps_the_benchmarks_its_device_model_was_fitted_to(tmp_path: Path) -> None:
    """The shipped A100 profile is fitted to 33,722 LLMCompass and vidur kernels and 7,168 nccl-tests rows besides
    its traces. Calibrated on the same A100 traces, the new profile dropped them all, silently: its kernel model
    was 'not fitted', 12 of its 14 collective curves were gone, and MT-NLG was predicted 36 % slower. Now they are
    carried over, said, and the device model refitted to them is the base's."""
    base = REPO / "profiles" / "a100"
    result = invoke(A100, "--base", base, "-o", tmp_path / "profile", "--report-dir", tmp_path / "report")
    assert result.exit_code == 0, result.stderr
    assert (f"warning: carried over from the base profile {base}: 33,722 kernel benchmarks and 16,115 collective "
            "measurements (llmcompass, nccl-tests, vidur)") in result.stderr, result.stderr
    old, new = (json.loads((folder / "metadata.json").read_text())["fitted"] for folder in (base, tmp_path / "profile"))
    for part in ("gemm", "memory_bound", "collectives"):
        assert new[part] == old[part], part
    assert new["provenance"]["gemm"] == "fitted: llmcompass, vidur"


def test_a_copy_of_the_traces_a_fitted_profile_was_made_from_says_what_cannot_be_compared(tmp_path: Path) -> None:
    """An identical copy of the H100 recording `profiles/h100` was fitted to, calibrated against it (an audit):
    "another job (device NVIDIA H100 80GB HBM3 against H100)", every software version "None -> 13000" as a change,
    all 63 kernels "new" and the reference run 1.0 % faster, none of it said for what it is: the base holds no
    kernels and no timeline (its host is timed by the device model's host terms, the copy's by its timeline)."""
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "traces" / "gpu" / "h100-small-eager", copy)
    base = REPO / "profiles" / "h100"
    result = invoke(copy, "--base", base, "-o", tmp_path / "profile", "--report-dir", tmp_path / "report")
    assert result.exit_code == 0, result.stderr
    assert "another job" not in result.stderr, result.stderr
    assert (f"warning: the base profile {base} holds no kernels (a profile fitted to measurements): every kernel of "
            "the new traces shows as new") in result.stderr, result.stderr
    assert (f"warning: the new traces time the host's issue of operators from their own timeline, the base profile "
            f"{base} from the device model's host terms") in result.stderr, result.stderr
    assert "| nccl | not recorded | 2.28.9 |" in (tmp_path / "report" / "report.md").read_text()
