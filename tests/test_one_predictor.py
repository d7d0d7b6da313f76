"""One predictor: `vtrain simulate`, `vtrain validate --measurements` and the Python API predict the same run
identically from the same fitted profile, on one node and across nodes (where the run's network rate replaces
the profile's measured multi-node curves)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from tests.conftest import REPO, vtrain_in_process
from vtrain.cli.main import app
from vtrain.runconfig import load_run_config
from vtrain.simulate.run import simulate
from vtrain.tables.store import load_profile

DATA = REPO / "tests" / "data" / "a100"
HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
          "data parallelism,pipeline parallelism,iteration time (ms)")


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fitted A100 profile (kernels from LLMCompass and one vidur model, collectives from nccl-tests and
    vidur's two-node runs), no host terms."""
    out = tmp_path_factory.mktemp("fit") / "a100"
    result = CliRunner().invoke(app, [
        "fit", "-o", str(out), "--nccl-tests", str(DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"),
        "--llmcompass", str(DATA / "llmcompass-a100"), "--vidur-compute", str(DATA / "vidur-a100" / "compute" /
                                                                              "phi-2-mlp.csv"),
        "--vidur-network", str(DATA / "vidur-a100" / "network" / "all_reduce.csv"), "--json"])
    assert result.exit_code == 0, result.output
    return out


def _run(tmp_path: Path, gpus: int, tp: int, dp: int, pp: int, inter: float | None, gpu: str = "A100-40GB") -> Path:
    config = {"model": {"layers": 8, "hidden": 2048, "heads": 16, "seq": 2048, "vocab": 50257},
              "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 2, "global_batch": 16 * dp,
                              "schedule": "1f1b", "recompute": "full", "dp_overlap": False},
              "precision": "fp16", "framework": "megatron",
              "hardware": {"device": gpu, "device_count": gpus, "gpus_per_node": 8,
                           "inter_node_gbps": inter}}
    path = tmp_path / f"run-{gpus}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(("gpus", "tp", "dp", "pp", "inter"), [(8, 2, 2, 2, None), (32, 4, 4, 2, 800.0)])
def test_same_run_same_prediction_through_every_command(profile: Path, tmp_path: Path, gpus: int, tp: int,
                                                        dp: int, pp: int, inter: float | None) -> None:
    runner = CliRunner()
    run = _run(tmp_path, gpus, tp, dp, pp, inter)
    simulated = runner.invoke(app, ["simulate", str(run), "--profile", str(profile), "--json"])
    assert simulated.exit_code == 0, simulated.output
    cli_ms = json.loads(simulated.stdout)["iteration_time_ms"]

    csv = tmp_path / "one.csv"
    extra = ",inter-node gbps" if inter else ""
    row = f"{gpus},{16 * dp},2,2048,16,8,2048,{tp},{dp},{pp},1000" + (f",{inter:g}" if inter else "")
    csv.write_text(f"{HEADER}{extra}\n{row}\n")
    report = tmp_path / "report"
    validated = runner.invoke(app, ["validate", "--measurements", str(csv), "--profile", str(profile), "-o",
                                    str(report), "--json"])
    assert validated.exit_code == 0, validated.output
    metrics = json.loads((report / "metrics.json").read_text())
    measurements_ms = metrics["worst"][0]["predicted_ms"]

    api_ms = simulate(load_run_config(run), load_profile(profile)).iteration_us / 1e3
    assert cli_ms == pytest.approx(api_ms, rel=1e-9)
    assert measurements_ms == pytest.approx(api_ms, rel=1e-9)


def test_a_run_on_another_variant_of_the_profiles_gpu_same_prediction_through_every_command(
        profile: Path, tmp_path: Path) -> None:
    """Published runs are mostly on A100-80GB parts, the profile an A100-40GB's: a table says so by a device column
    or ``--device``, and the row is predicted as `vtrain simulate` predicts the run on that GPU. A row on another
    GPU (an H100 with this A100 profile) or on none vtrain knows is not simulated, and says why."""
    runner = CliRunner()
    simulated = {}
    for gpu in ("A100-40GB", "A100-80GB"):
        result = runner.invoke(app, ["simulate", str(_run(tmp_path, 8, 2, 2, 2, None, gpu)), "--profile",
                                     str(profile), "--json"])
        assert result.exit_code == 0, result.output
        simulated[gpu] = json.loads(result.stdout)["iteration_time_ms"]
    assert simulated["A100-80GB"] < 0.99 * simulated["A100-40GB"]  # its memory-bound kernels move bytes faster

    row = "8,32,2,2048,16,8,2048,2,2,2,1000"
    column = tmp_path / "column.csv"
    column.write_text(f"{HEADER},GPU\n{row},A100-80GB\n{row},a100\n{row},NVIDIA H100 80GB HBM3\n{row},TPU v4\n")
    flag = tmp_path / "flag.csv"
    flag.write_text(f"{HEADER}\n{row}\n")
    predicted = {}
    for name, table, extra in (("column", column, []), ("flag", flag, ["--device", "a100-sxm4-80gb"])):
        result = runner.invoke(app, ["validate", "--measurements", str(table), "--profile", str(profile), *extra,
                                     "-o", str(tmp_path / name), "--json"])
        assert result.exit_code == 0, result.output
        predicted[name] = pl.read_parquet(tmp_path / name / "rows.parquet")
    rows = predicted["column"]
    assert rows["predicted_ms"].to_list()[:2] == pytest.approx([simulated["A100-80GB"], simulated["A100-40GB"]],
                                                               rel=1e-9)
    assert predicted["flag"]["predicted_ms"].to_list() == pytest.approx([simulated["A100-80GB"]], rel=1e-9)
    assert rows["invalid"].to_list()[2:] == [
        "device H100 is not a variant of the profile's A100-40GB: score runs on it with a profile fitted for it",
        "device 'tpu v4' is no GPU vtrain knows (vtrain/devices/catalog.py lists them)"]

    refused = runner.invoke(app, ["validate", "--measurements", str(flag), "--profile", str(profile), "--device",
                                  "H100", "-o", str(tmp_path / "h100")])
    assert refused.exit_code == 2 and not (tmp_path / "h100").exists()
    assert refused.stderr.strip() == ("error: --device: device H100 is not a variant of the profile's A100-40GB: "
                                      "score runs on it with a profile fitted for it")


def test_the_framework_of_rows_without_the_column_is_a_flag(profile: Path, tmp_path: Path) -> None:
    """``--framework`` says whose kernels the rows without a framework column ran (default megatron: vTrain's
    runs): the row is predicted as `vtrain simulate` predicts the run of that framework; a row's own column wins,
    naming the project as a user's table does (Megatron-LM, Megatron-DeepSpeed; they were refused); Megatron-core,
    whose kernels are not those, and a word that is no framework are refused."""
    runner = CliRunner()
    config = yaml.safe_load(_run(tmp_path, 8, 2, 2, 2, None).read_text())
    simulated = {}
    for framework in ("megatron", "reference"):
        run = tmp_path / f"{framework}.yaml"
        run.write_text(yaml.safe_dump({**config, "framework": framework}))
        result = runner.invoke(app, ["simulate", str(run), "--profile", str(profile), "--json"])
        assert result.exit_code == 0, result.output
        simulated[framework] = json.loads(result.stdout)["iteration_time_ms"]
    assert simulated["reference"] != pytest.approx(simulated["megatron"], rel=0.01)
    row = "8,32,2,2048,16,8,2048,2,2,2,1000"
    table = tmp_path / "table.csv"
    table.write_text(f"{HEADER},framework\n{row},\n{row},megatron\n")
    result = runner.invoke(app, ["validate", "--measurements", str(table), "--profile", str(profile), "--framework",
                                 "reference", "-o", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    predicted = pl.read_parquet(tmp_path / "report" / "rows.parquet")["predicted_ms"].to_list()
    assert predicted == pytest.approx([simulated["reference"], simulated["megatron"]], rel=1e-9)
    named = tmp_path / "named.csv"  # a user's table names the project: Megatron-LM, Megatron-DeepSpeed
    named.write_text(f"{HEADER},framework\n{row},Megatron-LM\n{row},megatron_deepspeed\n{row},Megatron-Core\n")
    result = runner.invoke(app, ["validate", "--measurements", str(named), "--profile", str(profile), "-o",
                                 str(tmp_path / "named")])
    assert result.exit_code == 0, result.output
    rows = pl.read_parquet(tmp_path / "named" / "rows.parquet")
    assert rows["predicted_ms"].to_list()[:2] == pytest.approx([simulated["megatron"]] * 2, rel=1e-9)
    assert rows["invalid"][2] == "framework must be one of reference, megatron (got 'megatron-core')"
    refused = vtrain_in_process("validate", "--measurements", table, "--profile", profile, "--framework",
                                "deepspeed", "-o", tmp_path / "refused")
    assert refused.returncode == 2 and not (tmp_path / "refused").exists()
    assert refused.stderr.strip().endswith("must be one of reference, megatron (got 'deepspeed')")


def test_prediction_uses_the_fitted_device_and_says_so(profile: Path, tmp_path: Path) -> None:
    sim = simulate(load_run_config(_run(tmp_path, 8, 2, 2, 2, None)), load_profile(profile))
    assert "gemm" in sim.device.provenance and sim.device.provenance["gemm"].startswith("fitted")
    ops = [r for r in _resolutions(sim) if "fitted kernel model" in r]
    assert ops and all(("interpolated" in r) or ("extrapolated" in r) for r in ops)


def test_run_network_rate_replaces_measured_multi_node_curves(profile: Path, tmp_path: Path) -> None:
    slow = simulate(load_run_config(_run(tmp_path, 32, 4, 4, 2, 100.0)), load_profile(profile))
    fast = simulate(load_run_config(_run(tmp_path, 32, 4, 4, 2, 3200.0)), load_profile(profile))
    assert slow.breakdown_us["dp"] > fast.breakdown_us["dp"]


def _resolutions(sim) -> list[str]:
    """The details of every op resolution in the simulation's blocks."""
    details = []
    for task in sim.graph.tasks:
        blocks = getattr(task.work, "blocks", None) or (task.work,)
        for block in blocks:
            details += [step.resolution.detail for step in getattr(block, "steps", ())]
    return details


def test_a_llama_like_run_same_prediction_through_every_command(profile: Path, tmp_path: Path) -> None:
    """Grouped-query attention, a gated MLP of its own width and flash attention (a LLaMA-2-70B-like layer): the
    run config's fields and the measurement table's columns give the same prediction, and the plan that runs it
    times it so too."""
    model = {"layers": 8, "hidden": 2048, "heads": 16, "seq": 2048, "vocab": 32000, "ffn_hidden": 5632,
             "kv_heads": 4, "mlp": "swiglu"}
    config = {"model": model, "parallelism": {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32},
              "precision": "bf16", "attention": "flash", "hardware": {"device": "A100-40GB", "device_count": 8}}
    run = tmp_path / "llama.yaml"
    run.write_text(yaml.safe_dump(config))
    simulated = vtrain_in_process("simulate", run, "--profile", profile, "--json")
    assert simulated.returncode == 0, simulated.stderr
    cli_ms = json.loads(simulated.stdout)["iteration_time_ms"]
    api_ms = simulate(load_run_config(run), load_profile(profile)).iteration_us / 1e3
    assert cli_ms == pytest.approx(api_ms, rel=1e-9)

    csv = tmp_path / "llama.csv"
    csv.write_text(f"{HEADER},vocabulary,ffn hidden size,kv heads,mlp,precision,attention,recompute,framework\n"
                   "8,32,2,2048,16,8,2048,2,2,2,1000,32000,5632,4,swiglu,bf16,flash,none,reference\n")
    validated = vtrain_in_process("validate", "--measurements", csv, "--profile", profile, "-o", tmp_path / "report",
                                  "--json")
    assert validated.returncode == 0, validated.stderr
    rows = pl.read_parquet(tmp_path / "report" / "rows.parquet")
    assert rows["predicted_ms"].to_list() == pytest.approx([api_ms], rel=1e-9)

    planned = vtrain_in_process("plan", run, "--gpus", "8", "--profile", profile, "--max-micro-batch", "2",
                                "-o", tmp_path / "plan", "--json")
    assert planned.returncode == 0, planned.stderr
    plans = pl.read_parquet(tmp_path / "plan" / "plans.parquet").filter(
        (pl.col("tp") == 2) & (pl.col("pp") == 2) & (pl.col("micro_batch") == 2) & (pl.col("schedule") == "1f1b")
        & (pl.col("recompute") == "none") & ~pl.col("dp_overlap") & ~pl.col("distributed_optimizer"))
    assert plans["iteration_ms"].to_list() == pytest.approx([api_ms], rel=1e-9)

    gqa_free = dict(config, model=dict(model, kv_heads=None))
    other = tmp_path / "mha.yaml"
    other.write_text(yaml.safe_dump(gqa_free))
    assert simulate(load_run_config(other), load_profile(profile)).iteration_us / 1e3 > api_ms  # more K, V work



@pytest.mark.parametrize(("link", "stride", "rates"), [("intra_node_gbps", 1, (150.0, 1200.0)),
                                                      ("inter_node_gbps", 8, (1600.0, 12800.0))])
def test_a_link_the_run_gives_is_not_timed_by_trace_rows_of_no_link(link: str, stride: int, rates: tuple[float, float],
                                                                   tmp_path: Path) -> None:
    """The shipped A100 profile holds, beside nccl-tests' and vidur's curves, five 2-rank all-reduces of HTA's
    trace (no node count, their waits included: 2.5-12 GB/s). Where the run's config gives a link's rate, the
    measured curves of that link stand down for the device's model; the trace's rows, of no link, had stood in for
    them instead: a 2-GPU group's all-reduce 2.6-2.8 ms at 32 MiB whatever the rate (8-12x the measured curves).
    Now the rate the run gives times it: 8 times the rate, under a third of the time. A group of ranks 8 apart
    spans two nodes (the inter-node link, Gbit/s a node)."""
    from vtrain.fit.device import device_for_run
    from vtrain.simulate.collective_latency import CollectiveResolver
    from vtrain.simulate.latency import MODELLED

    shipped = load_profile(REPO / "profiles" / "a100")
    times = []
    for rate in rates:
        run = _run(tmp_path, 16, 1, 16, 1, None, gpu="A100-80GB")
        config = yaml.safe_load(run.read_text())
        config["hardware"][link] = rate
        run.write_text(yaml.safe_dump(config))
        resolver = CollectiveResolver(shipped, device_for_run(load_run_config(run), shipped), "cuda", 8)
        resolution = resolver.resolve("all_reduce", 2, 32 << 20, stride, 16)
        assert resolution.source == MODELLED, resolution.detail
        times.append(resolution.latency_us)
    assert times[0] / times[1] > 3, times


def test_a_link_rate_that_is_the_devices_own_changes_nothing(tmp_path: Path) -> None:
    """vTrain's config JSON states the A100's 300 GB/s NVLink (`intra_node_bandwidth`): that set aside the profile's
    collective curves measured on that link, so MT-NLG's JSON predicted 36,373.6 ms where a table row of the same
    run (no intra-node column) predicted 36,308.3 (an audit of one predictor). The device's own rate is the rate
    not given; another rate still replaces it."""
    shipped = load_profile(REPO / "profiles" / "a100")
    config = yaml.safe_load((REPO / "examples" / "gpt-1.3b-a100.yaml").read_text())
    times = {}
    for rate in (None, 300, 600):
        config["hardware"]["intra_node_gbps"] = rate
        run = tmp_path / f"run-{rate}.yaml"
        run.write_text(yaml.safe_dump(config))
        times[rate] = simulate(load_run_config(run), shipped).iteration_us
    assert times[300] == times[None] and times[600] != times[None], times


def test_a_profile_traced_on_another_device_is_said_and_not_used(tmp_path: Path) -> None:
    """A profile ingested from an H200's traces timed an A100 run's operators with the H200's measured latencies,
    silently (an audit: 3.5 s where the A100's datasheet gives 6.7), and a CPU profile timed none of a GPU run's,
    silently too. Another GPU's latencies are not the run's: neither is used, and each is said once, in one line;
    a run on the profile's own GPU says nothing."""
    profile = tmp_path / "h200"
    assert vtrain_in_process("ingest", REPO / "traces" / "gpu" / "h200-small-eager", "-o", profile).returncode == 0
    run = REPO / "examples" / "gpt-1.3b-a100.yaml"
    elsewhere = vtrain_in_process("simulate", run, "--profile", profile, "--json")
    assert elsewhere.returncode == 0, elsewhere.stderr
    said = [line for line in elsewhere.stderr.splitlines() if "was traced on" in line]
    assert len(said) == 1 and "was traced on NVIDIA H200 and the run is on A100-80GB: none of its latencies " \
        "applies, the run is modelled" in said[0], elsewhere.stderr
    assert json.loads(elsewhere.stdout)["coverage"]["measured"] == 0
    assert json.loads(elsewhere.stdout)["iteration_time_ms"] == simulate(load_run_config(run)).iteration_us / 1e3
    there = vtrain_in_process("simulate", run, "--device", "H200", "--profile", profile, "--json")
    assert there.returncode == 0 and "was traced on" not in there.stderr, there.stderr
    cpu = tmp_path / "cpu"
    assert vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", cpu).returncode == 0
    on_cpu = vtrain_in_process("simulate", run, "--profile", cpu, "--json")
    assert on_cpu.returncode == 0 and "was traced on the CPU and the run is on A100-80GB: none of its latencies " \
        "applies" in on_cpu.stderr, on_cpu.stderr


def test_a_fitted_profile_times_no_run_on_another_gpu(tmp_path: Path) -> None:
    """The A100 profile's measured rows (kernels and NVLink collectives measured on A100s) timed 1.3 % of an H100
    run and were reported as measured (an audit: `simulate llama-3-8b --profile profiles/a100 --device H100`).
    Another GPU's latencies are not the run's: the run is modelled from its datasheet, as without the profile, and
    the line says so; a variant of the profile's GPU still uses them."""
    shipped = load_profile(REPO / "profiles" / "a100")
    base = load_run_config(REPO / "examples" / "gpt-1.3b-a100.yaml")
    h100 = replace(base, hardware=replace(base.hardware, device="H100"))
    elsewhere = simulate(h100, shipped)
    assert elsewhere.coverage_share["measured"] == 0 and elsewhere.coverage_share["interpolated"] == 0
    assert elsewhere.iteration_us == simulate(h100).iteration_us
    assert simulate(base, shipped).coverage_share["measured"] > 0
    ran = vtrain_in_process("simulate", REPO / "examples" / "gpt-1.3b-a100.yaml", "--device", "H100", "--profile",
                            REPO / "profiles" / "a100")
    assert ran.returncode == 0, ran.stderr
    assert "neither its device model nor its measured latencies (another GPU's) are used" in ran.stderr, ran.stderr
