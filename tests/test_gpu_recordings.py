"""Recordings made on real GPUs (``traces/gpu/h200-*``, ``h100-*``: an NVIDIA H200 and an H100, torch 2.11.0+cu130,
made by ``validators/gpu/record_runs.py``; ``traces/gpu/README.md``): the memory model against the peak memory each
recording measured, the ingest of a run whose layers are replayed from CUDA graphs against the raw trace, the
validation of an eager GPU recording, and each GPU's profile (``profiles/h200``, ``profiles/h100``, fitted to layer
kernels timed on that GPU, none of these runs) predicting training-sized runs.
"""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.conftest import REPO
from vtrain.model.memory import peak_stage_memory
from vtrain.runconfig import load_run_config

GPU = REPO / "traces" / "gpu"
#: the folders ``vtrain record`` wrote (a run.yaml beside the trace); h200-compiled-gpt was made outside vtrain
RECORDINGS = sorted(path for path in GPU.iterdir() if (path / "run.yaml").is_file())
#: device activities as Kineto writes them: kernels, copies and memsets
ACTIVITIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def _raw_events(folder: Path) -> list[dict]:
    with gzip.open(folder / "rank-0.json.gz", "rt") as handle:
        return json.load(handle)["traceEvents"]


def _recording(name: str, gpu: str = "h200") -> Path:
    return GPU / f"{gpu}-{name}"


def test_the_recordings_are_there() -> None:
    assert {path.name for path in RECORDINGS} >= {"h200-mem-fp32-none", "h200-mem-fp32-full", "h200-mem-bf16-none",
                                                   "h200-mem-bf16-full", "h200-mem-bf16-wide", "h200-small-eager",
                                                   "h200-small-graphs", "h200-val-gpt1.3b", "h200-val-gpt6.7b-4l",
                                                   "h200-val-gpt13b-2l", "h100-val-gpt1.3b", "h100-val-gpt6.7b-4l",
                                                   "h200-val-gpt2.7b-4l", "h200-val-gpt1.3b-8l-mb8-full",
                                                   "h200-val-gpt350m-mb1", "h100-mem-bf16-none", "h100-small-eager",
                                                   "h100-val-gpt2.7b-4l", "h100-val-gpt1.3b-8l-mb8-full",
                                                   "h100-val-gpt350m-mb1"}


@pytest.mark.parametrize("folder", RECORDINGS, ids=[path.name for path in RECORDINGS])
def test_memory_model_within_10_percent_of_the_measured_peak(folder: Path) -> None:
    """``torch.cuda.max_memory_allocated`` over the recorded iterations against the memory model's peak stage
    (-4.5 to -0.4 %; fp32 with every layer recomputed was -11.2 % before the softmax backward's temporary was
    counted: ``traces/gpu/h200-peak-fp32-full-ops.json``)."""
    config = load_run_config(folder / "run.yaml")
    (measured,) = config.recording["peak_memory_bytes"]
    assert peak_stage_memory(config).total_bytes == pytest.approx(measured, rel=0.10)


def _validate(folder: Path, out: Path, *extra: str, hta: bool = False) -> subprocess.CompletedProcess[str]:
    """`vtrain validate FOLDER -o OUT --json` (HTA's analysis left out unless ``hta``: it is not what is tested)."""
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", "validate", str(folder), "-o", str(out), "--json",
                           *extra, *([] if hta else ["--no-hta"])], capture_output=True, text=True, cwd=REPO)


def _ingest(folder: Path, out: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(folder), "-o", str(out),
                             "--json"], capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(result.stdout)


def test_a_run_replayed_from_cuda_graphs_ingests_every_device_activity_once(tmp_path: Path) -> None:
    """One ``cudaGraphLaunch`` releases a layer pass's kernels (four per iteration and micro-batch pair here):
    every device activity of the raw trace is one kernel row, none multiplied by the launches."""
    folder = _recording("small-graphs")
    events = _raw_events(folder)
    activities = sum(event.get("cat") in ACTIVITIES for event in events)
    launches = sum(event.get("cat") == "cuda_runtime" and event["name"].startswith("cudaGraphLaunch")
                   for event in events)
    summary = _ingest(folder, tmp_path / "profile")
    assert launches == 24  # 2 layers x forward and backward x 2 micro-batches x 3 profiled iterations
    assert summary["tables"]["graph_launches"] == launches
    assert summary["tables"]["kernels"] == activities
    graphed = Counter(event["args"].get("correlation") for event in events if event.get("cat") in ACTIVITIES)
    launch_ids = {event["args"]["correlation"] for event in events
                  if event.get("cat") == "cuda_runtime" and event["name"].startswith("cudaGraphLaunch")}
    assert all(graphed[launch] > 10 for launch in launch_ids)  # each launch released a whole layer pass


def test_graphs_replay_the_eager_run() -> None:
    """Same model, seed and data: the first iteration's loss is the eager run's to the last digit written, and
    the later ones stay within bf16's rounding (the graphs' gradients are summed in another order)."""
    eager = load_run_config(_recording("small-eager") / "run.yaml").recording
    graphs = load_run_config(_recording("small-graphs") / "run.yaml").recording
    assert load_run_config(_recording("small-graphs") / "run.yaml").cuda_graphs
    assert not load_run_config(_recording("small-eager") / "run.yaml").cuda_graphs
    assert graphs["loss"][0] == eager["loss"][0]
    assert graphs["loss"] == pytest.approx(eager["loss"], abs=0.01)


def test_validating_an_eager_gpu_recording(tmp_path: Path) -> None:
    """The replay gives the measured H200 iteration back; the model, from the recording's own held-out
    iterations, is within 10 % (+6.1 % when the traces were added, +2.5 % since the host issues operators at its
    measured rate)."""
    out = tmp_path / "report"
    result = _validate(_recording("small-eager"), out, hta=True)
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert abs(metrics["replay"]["error_pct"]) < 1.0
    assert abs(metrics["model"]["error_pct"]) < 10.0
    assert "does not place" not in result.stderr  # vtrain's own recording: every operator's kernels placed


def test_a_run_replayed_from_cuda_graphs_validated_on_its_own_traces(tmp_path: Path) -> None:
    """The replay follows the graph launches (each releases its kernels in stream order). The run config says
    ``cuda_graphs: true``, so the model issues each layer pass as one replay, whose host time these traces measure
    (194 us forward, 355 us backward: torch's graphed callables' autograd wrapper), and the gradients it adds up
    outside the graph one by one; the graphs' kernels are work, not host time (+139 % when both were wrong, -7.4 %
    with the gaps added as measured, +10.9 % now), and the warning says that the graphed operators have no latency
    of their own in these traces."""
    result = _validate(_recording("small-graphs"), tmp_path / "report")
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert abs(metrics["replay"]["error_pct"]) < 1.0 and abs(metrics["model"]["error_pct"]) < 15.0
    warned = [line for line in result.stderr.splitlines() if "CUDA graph launches" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and "--profile" in warned[0]
    assert "does not place" not in result.stderr  # the graphs' kernels are named by no operator the model places


def test_the_cuda_graph_speed_up_predicted_from_the_eager_recording(tmp_path: Path) -> None:
    """What-if: the eager run's profile, the graphed run's config. The eager run took 16.4-16.7 ms per iteration,
    the graphed one 11.8-12.2 ms; the prediction is within 10 % of the graphed run (11.70 ms with the eager run's
    gaps added as measured; 10.91 ms, -8.9 %, since the host issues at its measured rate: an eager trace cannot say
    that torch's graph replay costs the host four to seven operators' time, so it is charged one), and the eager
    config through the same profile stays the eager run's."""
    profile = tmp_path / "eager-profile"
    _ingest(_recording("small-eager"), profile)
    result = _validate(_recording("small-graphs"), tmp_path / "report", "--profile", str(profile))
    assert result.returncode == 0, result.stderr
    assert abs(json.loads(result.stdout)["model"]["error_pct"]) < 10.0
    assert not [line for line in result.stderr.splitlines() if "CUDA graph" in line]
    eager = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "simulate",
                            str(_recording("small-eager") / "run.yaml"), "--profile", str(profile), "--json"],
                           capture_output=True, text=True, cwd=REPO, check=True)
    graphed = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "simulate",
                              str(_recording("small-eager") / "run.yaml"), "--profile", str(profile), "--cuda-graphs",
                              "--json"], capture_output=True, text=True, cwd=REPO, check=True)
    eager_ms, graphed_ms = (json.loads(run.stdout)["iteration_time_ms"] for run in (eager, graphed))
    assert json.loads(graphed.stdout)["cuda_graphs"] is True
    assert graphed_ms < 0.8 * eager_ms


@pytest.fixture(scope="module")
def six_layer_profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`vtrain ingest` of each GPU's 6-layer bf16 recording (hidden 2048, vocabulary 32,000): a profile of a few
    layers, as vTrain profiles a GPU, to predict other runs on that GPU from."""
    profiles = {}
    for gpu in ("h200", "h100"):
        profiles[gpu] = tmp_path_factory.mktemp("profiles") / f"{gpu}-mem-bf16-none"
        _ingest(_recording("mem-bf16-none", gpu), profiles[gpu])
    return profiles


def test_an_ingested_recording_describes_its_run(six_layer_profiles: dict[str, Path]) -> None:
    """The profile keeps the traced run's config (from its run.yaml): what the simulator tells the operators it
    models in that timeline from the time between them by."""
    run = json.loads((six_layer_profiles["h200"] / "metadata.json").read_text())["run"]
    recorded = load_run_config(_recording("mem-bf16-none") / "run.yaml")
    assert run["model"] == recorded.to_dict()["model"] and run["parallelism"]["micro_batch"] == 4


#: runs bound by their devices' work, none of them the profile's shape: the H200's and the H100's
FEW_LAYER_TARGETS = [("h200", "val-gpt1.3b"), ("h200", "val-gpt6.7b-4l"), ("h200", "val-gpt13b-2l"),
                     ("h200", "val-gpt2.7b-4l"), ("h200", "val-gpt1.3b-8l-mb8-full"), ("h100", "val-gpt1.3b"),
                     ("h100", "val-gpt6.7b-4l"), ("h100", "val-gpt2.7b-4l"), ("h100", "val-gpt1.3b-8l-mb8-full")]


@pytest.mark.parametrize(("gpu", "name"), FEW_LAYER_TARGETS)
def test_a_few_recorded_layers_predict_other_models_on_the_same_gpu(gpu: str, name: str,
                                                                   six_layer_profiles: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """The 6-layer recording's profile predicts GPT-3 1.3B's 24 layers (the same layer, another vocabulary),
    layers 2,560, 4,096 and 5,120 wide and 8 sequences of 1,024 tokens with full recomputation: H200 -0.0, -2.8,
    +0.9, -1.1, +4.5 %; H100 +1.5, +0.9, -0.9, +5.0 %. The host's time is measured between the operators the model
    places in the *recorded* run: measured between the predicted run's instead, every operator of the recording
    with another shape counted as host time (H200 +14.5, +177, -5.6 % for the first three before)."""
    result = _validate(_recording(name, gpu), tmp_path / "report", "--profile", str(six_layer_profiles[gpu]))
    assert result.returncode == 0, result.stderr
    assert abs(json.loads(result.stdout)["model"]["error_pct"]) < 6.0


@pytest.mark.parametrize("gpu", ["h200", "h100"])
def test_a_launch_bound_run_predicted_from_its_own_traces(gpu: str, tmp_path: Path) -> None:
    """GPT-3 350M's 12 layers, one sequence a micro-batch: the GPU idles 80 % of the time, waiting for the host's
    launches. From its own held-out iteration: H200 -8.1 % (its two iterations differ by 6.7 %), H100 +2.6 %."""
    result = _validate(_recording("val-gpt350m-mb1", gpu), tmp_path / "report")
    assert result.returncode == 0, result.stderr
    assert abs(json.loads(result.stdout)["model"]["error_pct"]) < 12.0


@pytest.mark.parametrize("gpu", [
    "h200", pytest.param("h100", marks=pytest.mark.xfail(strict=True, reason=(
        "+49.6 %: in the device-bound recording the host's launches find the queue free only where a pass "
        "begins (the device runs ahead of them afterwards), and its backward pass's first launches are slower "
        "than its average: 71.7 us per operator against the launch-bound run's own 43.6 us")))])
def test_a_launch_bound_run_predicted_from_a_device_bound_recording(gpu: str, six_layer_profiles: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    """The launch-bound run from the 6-layer recording's profile: the host issues operators at the rate measured
    between that recording's launches, the device runs them once issued (the gaps measured in a device-bound
    recording, added as they were, gave -64.8 % on the H200 and -30.0 % on the H100). H200 -6.9 %, from a host
    machine 1.6x faster than the predicted run's (the recordings were made in different calls)."""
    result = _validate(_recording("val-gpt350m-mb1", gpu), tmp_path / "report", "--profile",
                       str(six_layer_profiles[gpu]))
    assert result.returncode == 0, result.stderr
    assert abs(json.loads(result.stdout)["model"]["error_pct"]) < 12.0


@pytest.mark.parametrize(("gpu", "name"), FEW_LAYER_TARGETS)
def test_each_gpus_profile_predicts_training_sized_runs_within_12_percent(gpu: str, name: str,
                                                                          tmp_path: Path) -> None:
    """``profiles/h200`` and ``profiles/h100`` know these runs only through layer kernels timed apart from them on
    the same kind of GPU (and nothing of their attention cores or optimizer; their host through a launch-bound toy,
    device-bound runs hide it): H200 -6.5, -2.5, +1.7, -5.8, -4.7 %, H100 -10.7, -5.5, -10.4, -8.2 % (in the order
    of :data:`FEW_LAYER_TARGETS`; -6.1, -2.2, +1.6, -5.3, -4.4 and -10.5, -5.3, -10.1, -8.4 % without host time)."""
    result = _validate(_recording(name, gpu), tmp_path / "report", "--profile", str(REPO / "profiles" / gpu))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert abs(metrics["model"]["error_pct"]) < 12.0
    (memory,) = metrics["memory"]  # the recording's measured peak beside the memory model's, in the report too
    assert memory["rank"] == 0 and abs(memory["error_pct"]) < 10.0
    assert "## Peak memory" in (tmp_path / "report" / "report.md").read_text()
    # operator by operator: the modelled device activities (named after their operators) meet the measured kernels
    # (named after what cuBLAS picked) at the operator that launched them; before, nearly nothing matched and the
    # report compared stray memsets ("Memset (Device)" as gemm, +5,322 %)
    report = json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]
    matched_ms = sum(row["measured_ms"] for row in report["classes"])
    compute = next(row for row in report["breakdown"] if row["category"] == "compute")
    assert matched_ms > 0.8 * compute["measured_ms"]
    assert all(row["op"].startswith("aten::") for row in report["worst_ops"])


@pytest.mark.parametrize(("gpu", "before", "bound"), [("h200", -80.4, 30.0), ("h100", -63.8, 25.0)])
def test_each_gpus_profile_has_its_hosts_time_and_predicts_a_launch_bound_run(gpu: str, before: float, bound: float,
                                                                             tmp_path: Path) -> None:
    """``profiles/GPU`` holds the host's time per operator measured in the launch-bound toy recorded on that GPU
    (``make profile-GPU``: `vtrain fit --profile` of its ingest), so GPT-3 350M with one sequence a micro-batch
    (another model, recorded from another host machine) is no longer predicted as if the host were free: H200
    -25.6 %, H100 +20.8 % (``before``: without the host's time). The rest of the gap is the host machines': the
    350M's own recordings issue an operator every 72.3 us (H200) and 41.8 us (H100), the toys' hosts every 52.9 and
    51.5 us."""
    metadata = json.loads((REPO / "profiles" / gpu / "metadata.json").read_text())["fitted"]
    assert metadata["provenance"]["host"].startswith("measured: ") and 40.0 < metadata["host"]["op_us"] < 60.0
    result = _validate(_recording("val-gpt350m-mb1", gpu), tmp_path / "report", "--profile",
                       str(REPO / "profiles" / gpu))
    assert result.returncode == 0, result.stderr
    error = json.loads(result.stdout)["model"]["error_pct"]
    assert abs(error) < bound and abs(error) < abs(before) / 2


def test_a_recording_without_its_run_gives_the_fit_the_host_time_of_the_run_read_off_it(tmp_path: Path) -> None:
    """`vtrain fit --profile` of an ingest whose traces say nothing of the run they are of (no run.yaml): the ingest
    reads the run off the traces' shapes (`vtrain/ingest/inferred_run.py`, one warning line), so the host's time per
    operator is measured as with the run.yaml (it was not measured at all: the operators' count per iteration was
    unknown)."""
    def fitted_host(folder: Path, name: str) -> float:
        _ingest(folder, tmp_path / f"ingested-{name}")
        subprocess.run([sys.executable, "-m", "vtrain.cli.main", "fit", "-o", str(tmp_path / f"fitted-{name}"),
                        "--device", "H200", "--vidur-compute", str(REPO / "profiles" / "h200-kernels"), "--profile",
                        str(tmp_path / f"ingested-{name}")], capture_output=True, text=True, cwd=REPO, check=True)
        return json.loads((tmp_path / f"fitted-{name}" / "metadata.json").read_text())["fitted"]["host"]["op_us"]

    folder = tmp_path / "traces"
    shutil.copytree(_recording("small-eager"), folder)
    (folder / "run.yaml").unlink()
    without = fitted_host(folder, "without")
    metadata = json.loads((tmp_path / "ingested-without" / "metadata.json").read_text())
    assert metadata["run_source"] == "read off the traces' shapes"
    assert metadata["run"]["model"] == load_run_config(_recording("small-eager") / "run.yaml").to_dict()["model"]
    assert without > 0 and without == pytest.approx(fitted_host(_recording("small-eager"), "with"), rel=1e-9)


def test_a_recording_with_cuda_graphs_gives_no_host_time(tmp_path: Path) -> None:
    """Its host issues a layer's passes as one replay and only a few operators one by one (87.8 us each measured
    per placed operator, against the eager toy's 52.9): no time per eager operator can be told from it, and one
    warning line says so."""
    _ingest(_recording("small-graphs"), tmp_path / "ingested")
    result = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "fit", "-o", str(tmp_path / "fitted"), "--device",
                             "H200", "--vidur-compute", str(REPO / "profiles" / "h200-kernels"), "--profile",
                             str(tmp_path / "ingested")], capture_output=True, text=True, cwd=REPO, check=True)
    said = [line for line in result.stderr.splitlines() if "CUDA graphs" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: {tmp_path / 'ingested'}: ")
    assert json.loads((tmp_path / "fitted" / "metadata.json").read_text())["fitted"]["host"]["op_us"] == 0.0


def test_a_recording_of_another_gpu_gives_its_host_time_with_a_warning(tmp_path: Path) -> None:
    """The H100's toy given to an H200 profile's fit: its host's time is measured (a host is a host), and one
    warning line says it is another machine's."""
    _ingest(_recording("small-eager", "h100"), tmp_path / "ingested")
    result = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "fit", "-o", str(tmp_path / "fitted"), "--device",
                             "H200", "--vidur-compute", str(REPO / "profiles" / "h200-kernels"), "--profile",
                             str(tmp_path / "ingested")], capture_output=True, text=True, cwd=REPO, check=True)
    said = [line for line in result.stderr.splitlines() if "that machine's" in line]
    assert len(said) == 1 and "H100" in said[0]
    fitted = json.loads((tmp_path / "fitted" / "metadata.json").read_text())["fitted"]
    assert fitted["host"]["op_us"] == pytest.approx(51.5, abs=0.1)


def test_a_trace_of_torch_compile_with_cudagraph_trees(tmp_path: Path) -> None:
    """Made outside vtrain (``validators/gpu/compiled_trace.py``: Inductor's Triton kernels, cuDNN attention, the
    compiled forward and backward replayed by "reduce-overhead" mode's CUDA graphs, no vtrain spans): every device
    activity one row, the three profiled iterations found, and the replay gives the measured time back."""
    folder = _recording("compiled-gpt")
    events = _raw_events(folder)
    launches = sum(event.get("cat") == "cuda_runtime" and event["name"].startswith("cudaGraphLaunch")
                   for event in events)
    assert launches == 6  # the compiled forward and backward, three iterations
    assert any(event.get("cat") == "kernel" and event["name"].startswith("triton_") for event in events)
    summary = _ingest(folder, tmp_path / "profile")
    assert summary["tables"]["kernels"] == sum(event.get("cat") in ACTIVITIES for event in events)
    assert summary["tables"]["graph_launches"] == launches and summary["ranks"]["0"]["iterations"] == 3
    result = _validate(folder, tmp_path / "report")
    assert result.returncode == 0, result.stderr
    assert abs(json.loads(result.stdout)["replay"]["error_pct"]) < 1.0


def test_halving_the_gemms_of_a_compiled_run_finds_cublas_kernels_of_hopper(tmp_path: Path) -> None:
    """Replayed from CUDA graphs, a compiled run's GEMM kernels belong to no operator and are classed by name; cuBLAS
    names its Hopper kernels ``nvjet_sm90_tst_...`` (no "gemm" in them): ``whatif --scale gemm=0.5`` said "no event
    holds time of this kind; nothing changed" of a run whose kernels are 45 % GEMMs. Now -20 %."""
    from vtrain.validate.opclass import ELEMENTWISE, GEMM, kernel_class

    assert kernel_class("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_NNT") == GEMM  # "bias" is no elementwise
    assert kernel_class("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0") == GEMM  # rocBLAS on AMD
    assert kernel_class("void transformer_engine::layer_norm::ln_fwd_tuned_kernel<...>") == ELEMENTWISE
    assert kernel_class("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>") == ELEMENTWISE
    done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "whatif", str(_recording("compiled-gpt")),
                           "--scale", "gemm=0.5", "-o", str(tmp_path / "whatif")], capture_output=True, text=True,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "nothing changed" not in done.stderr
    summary = json.loads((tmp_path / "whatif" / "whatif.json").read_text())
    assert summary["change_pct"] < -10.0


@pytest.mark.parametrize("peaks", ["lots", [1, 2], [-5], [True], [1.5e9]])
def test_a_peak_memory_record_that_is_not_one_whole_number_per_rank_is_said_and_left_out(
        peaks: object, tmp_path: Path) -> None:
    """A run.yaml edited by hand or written by another tool: a warning line naming the file, no memory compared,
    the validation otherwise whole."""
    folder = tmp_path / "run"
    shutil.copytree(_recording("small-eager"), folder)
    described = yaml.safe_load((folder / "run.yaml").read_text())
    described["recording"]["peak_memory_bytes"] = peaks
    (folder / "run.yaml").write_text(yaml.safe_dump(described))
    result = _validate(folder, tmp_path / "report")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["memory"] is None
    said = [line for line in result.stderr.splitlines() if "peak_memory_bytes" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: {folder / 'run.yaml'}: ")


def test_one_prediction_through_a_measurement_table_and_simulate(tmp_path: Path) -> None:
    """The H200 runs written as rows of a measurement table (their precision, framework and graphs in its optional
    columns) are predicted as `vtrain simulate` predicts their run configs, to the microsecond."""
    names = ["val-gpt6.7b-4l", "mem-fp32-none", "small-graphs"]
    header = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor parallelism,"
              "data parallelism,pipeline parallelism,iteration time (ms),vocabulary,recomputation,framework,precision,"
              "CUDA graphs,GPUs per node")
    lines = [header]
    for name in names:
        config = load_run_config(_recording(name) / "run.yaml")
        m, p = config.model, config.parallelism
        lines.append(f"1,{p.global_batch},{p.micro_batch},{m.hidden},{m.heads},{m.layers},{m.seq},1,1,1,100,"
                     f"{m.vocab},{p.recompute},{config.framework},{config.precision},{config.cuda_graphs},1")
    table = tmp_path / "h200.csv"
    table.write_text("\n".join(lines) + "\n")
    profile = str(REPO / "profiles" / "h200")
    subprocess.run([sys.executable, "-m", "vtrain.cli.main", "validate", "--measurements", str(table), "--profile",
                    profile, "-o", str(tmp_path / "scored"), "--json"], capture_output=True, text=True, cwd=REPO,
                   check=True)
    scored = pl.read_parquet(tmp_path / "scored" / "rows.parquet")["predicted_ms"].to_list()
    for name, predicted in zip(names, scored):
        simulated = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "simulate",
                                    str(_recording(name) / "run.yaml"), "--profile", profile, "--json"],
                                   capture_output=True, text=True, cwd=REPO, check=True)
        assert predicted == pytest.approx(json.loads(simulated.stdout)["iteration_time_ms"], abs=1e-3), name


def test_only_half_precision_gemms_of_a_trace_join_a_kernel_fit(tmp_path: Path) -> None:
    """`vtrain fit --profile` adds a trace's GEMMs to the kernel model, which learns half-precision efficiencies.
    An fp32 H200 recording's GEMMs, against the half-precision floor, taught it that those shapes run ~10x slow
    (a bf16 run's prediction went from -2.2 to +8.4 %): they are left out, the bf16 recording's are kept."""
    from vtrain.fit.device import traced_gemms
    from vtrain.tables.store import load_profile

    for name, expected in (("mem-fp32-none", 0), ("mem-bf16-none", 1)):
        _ingest(_recording(name), tmp_path / name)
        gemms = traced_gemms(load_profile(tmp_path / name))
        assert (gemms.height > 0) == bool(expected), name


def test_torch_compiles_triton_templates_of_matrix_products_are_gemms() -> None:
    """``torch.compile(mode="max-autotune")`` runs its chosen GEMMs as Triton templates (``triton_tem_fused_addmm_0``)
    under an operator of that name: they were elementwise (the ``triton_`` of its pointwise kernels), and ``whatif
    --scale gemm=0.5`` halved 36 of a run's 270 GEMMs."""
    from vtrain.validate.opclass import CONVOLUTION, ELEMENTWISE, GEMM, kernel_class, op_class

    assert kernel_class("triton_tem_fused_addmm_0") == GEMM
    assert op_class("triton_tem_fused_bmm_3", "triton_tem_fused_bmm_3") == GEMM
    assert kernel_class("triton_tem_fused_convolution_1") == CONVOLUTION
    assert kernel_class("triton_poi_fused_add_mul_0") == ELEMENTWISE
    # cuDNN's attention backward converts dQ to 16 bits: "convert" is no convolution (a GPT's report had one)
    assert kernel_class("void cudnn::fusion::convert_dq_to_16bits<true>(...)") != CONVOLUTION
    assert kernel_class("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc") == CONVOLUTION
    assert kernel_class("void cudnn::detail::convolve_common_engine_float_NHWC<...>") == CONVOLUTION


def test_durations_from_a_recording_that_replays_cuda_graphs_onto_an_eager_one_is_said(tmp_path: Path) -> None:
    """`whatif h200-small-eager --durations-from h200-small-graphs` predicted +10 % where the graphs' run is 28 %
    faster, with no word but an unmatched-event count (an audit): the operators' durations carry over, the host's
    launches (what the graphs remove) do not. Said, both ways, from run.yaml or, without one, from the launches."""
    from tests.conftest import vtrain_in_process

    eager, graphs = GPU / "h200-small-eager", GPU / "h200-small-graphs"
    ran = vtrain_in_process("whatif", eager, "--durations-from", graphs, "-o", tmp_path / "w")
    assert ran.returncode == 0, ran.stderr
    assert (f"warning: {graphs} replays CUDA graphs and {eager} launches each kernel: operators' durations carry "
            f"over, the host's launches do not") in ran.stderr, ran.stderr
    bare = tmp_path / "bare"
    shutil.copytree(graphs, bare, ignore=shutil.ignore_patterns("run.yaml"))
    back = vtrain_in_process("whatif", bare, "--durations-from", eager, "-o", tmp_path / "x")
    assert back.returncode == 0 and f"warning: {bare} replays CUDA graphs and {eager}" in back.stderr, back.stderr
    same = vtrain_in_process("whatif", eager, "--durations-from", GPU / "h100-small-eager", "-o", tmp_path / "y")
    assert same.returncode == 0 and "replays CUDA graphs" not in same.stderr, same.stderr


def test_kernels_of_the_other_recording_without_a_partner_are_said_to_be_left_out(tmp_path: Path) -> None:
    """`whatif h100-small-eager --durations-from h200-small-eager`: the H200 run has 6 GEMM kernels the H100 run
    has not (0.097 ms, counted from the raw traces by an audit), and the line said their time "counts for the
    matched operator around them", which a kernel has none of: it is left out, and now said so."""
    from tests.conftest import vtrain_in_process

    ran = vtrain_in_process("whatif", GPU / "h100-small-eager", "--durations-from", GPU / "h200-small-eager",
                            "-o", tmp_path / "w")
    assert ran.returncode == 0, ran.stderr
    assert ("6 of them, 0.097 ms in all, have no matched operator around them (device activities among them) and "
            "are left out of the prediction") in ran.stderr, ran.stderr


def _annotations_off_their_kernels(events: list[dict]) -> tuple[int, int]:
    """How many GPU-side user annotations there are, and how many do not span exactly the device activities
    measured (or predicted) inside them on their stream: from the first one's start to the last one's end."""
    activities = defaultdict(list)
    for event in events:
        if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            activities[event["tid"]].append((event["ts"], event["ts"] + event["dur"]))
    annotations = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    off = 0
    for note in annotations:
        begin, end = note["ts"], note["ts"] + note["dur"]
        inside = [(s, e) for s, e in activities[note["tid"]] if s >= begin - 1e-3 and e <= end + 1e-3]
        off += not inside or max(abs(min(s for s, _ in inside) - begin), abs(max(e for _, e in inside) - end)) > 2e-3
    return len(annotations), off


def test_predicted_traces_move_each_annotation_with_its_kernels(tmp_path: Path) -> None:
    """whatif's predicted traces moved every kernel but kept the GPU-side user annotations (Kineto's
    ``gpu_user_annotation``: a span over the kernels a ``record_function`` region ran) at the measured times: with
    every kernel three times as long, all 63 of h100-small-eager's sat where their kernels no longer were (an
    audit). Each now spans its kernels' predicted times, and none is lost (HTA counts them as GPU activity)."""
    from tests.conftest import vtrain_in_process

    source = GPU / "h100-small-eager"
    ran = vtrain_in_process("whatif", source, "--scale-kernel", ".*=3", "-o", tmp_path / "w")
    assert ran.returncode == 0, ran.stderr

    def events(folder: Path) -> list[dict]:
        file = next(folder.glob("*.json*"))
        return json.loads(gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_text())[
            "traceEvents"]

    assert _annotations_off_their_kernels(events(source)) == (63, 0)
    assert _annotations_off_their_kernels(events(tmp_path / "w" / "predicted")) == (63, 0)


def test_a_rocm_traces_annotations_move_with_their_kernels(tmp_path: Path) -> None:
    """A trace made elsewhere: HTA's MI250 ROCm trace puts its GPU annotations (an optimizer step, the profiler
    step) on stream 0 of device 2 beside its kernels; both move with them and none is lost."""
    from tests.conftest import vtrain_in_process

    ran = vtrain_in_process("whatif", REPO / "traces" / "wild" / "mi250-rocm", "--scale-kernel", ".*=3", "-o",
                            tmp_path / "w")
    assert ran.returncode == 0, ran.stderr
    file = tmp_path / "w" / "predicted" / "rank-0.json.gz"
    assert _annotations_off_their_kernels(json.loads(gzip.decompress(file.read_bytes()))["traceEvents"]) == (2, 0)
