"""`vtrain simulate` from the command line: the summary, JSON, overrides, traces and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process

MTNLG = REPO / "examples" / "mtnlg-530b.json"
TINY = REPO / "examples" / "tiny-cpu.yaml"


def vtrain(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", "simulate", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


def test_vtrain_config_json_summary() -> None:
    result = vtrain(MTNLG, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["iteration_time_ms"] > 0
    assert set(summary["breakdown_ms"]) == {"compute", "host", "tp", "pp", "dp", "bubble", "optimizer"}
    assert sum(summary["breakdown_ms"].values()) == pytest.approx(summary["iteration_time_ms"], rel=1e-9)
    assert summary["coverage"] == {"measured": 0.0, "interpolated": 0.0, "modelled": 1.0}  # no profile given
    assert (summary["parallelism"]["tp"], summary["parallelism"]["dp"], summary["parallelism"]["pp"]) == (8, 12, 35)
    assert summary["parallelism"]["micro_batches"] == 160
    assert len(summary["stages"]) == 35 and summary["stages"][1]["rank"] == 96
    assert summary["device"]["provenance"]["peak_flops"] == "datasheet"
    assert summary["critical_path"][0]["task"] == "forward stage=0 mb=0"


def test_vtrain_config_keys_it_does_not_read_are_said(tmp_path: Path) -> None:
    """A misspelt key of vTrain's config fell back to its default without a word; every key vtrain does not read
    is now one warning line (as a real process, and in the same words in process), and the run is predicted."""
    config = json.loads(MTNLG.read_text())
    config["ddp_bucket_mb"] = config.pop("ddp_bucket_size")  # misspelt: the 25 MB default applies
    config["comment"] = "from vTrain's repository"
    config["gpu_name"] = "A100-80GB"  # MT-NLG's parts: by the memory model it needs 40.1 GiB a GPU
    path = tmp_path / "mtnlg.json"
    path.write_text(json.dumps(config))
    line = f"warning: {path}: vTrain config keys vtrain does not read, ignored: comment, ddp_bucket_mb\n"
    for ran in (vtrain(path), vtrain_in_process("simulate", path)):
        assert ran.returncode == 0, ran.stderr
        assert ran.stderr == line
    assert vtrain_in_process("simulate", MTNLG, "--device", "A100-80GB").stderr == ""


def test_a_run_that_does_not_fit_its_device_is_said() -> None:
    """MT-NLG without tensor parallelism: 248 GiB per GPU by the memory model on a 40 GiB A100 was predicted
    without a word; now a warning line says it would not fit (the prediction is still given)."""
    ran = vtrain_in_process("simulate", MTNLG, "--tp", "1", "--dp", "96")
    assert ran.returncode == 0 and "iteration time" in ran.stdout
    assert ran.stderr.startswith(f"warning: {MTNLG}: its largest pipeline stage needs ")
    assert "more than the 40 GiB of A100-40GB: the run would not fit" in ran.stderr
    assert vtrain_in_process("simulate", MTNLG, "--device", "A100-80GB").stderr == ""  # t8 d12 p35 fits 80 GB


def test_a_need_within_the_models_error_of_the_device_may_not_fit() -> None:
    """The memory model is -8.4 to -0.9 % of Megatron-core's measured peaks: a run it fits in 37.22 of 40 GiB peaks
    at 37.6-40.6 GiB as measured, which was said nothing of; it may not fit, and the line says so, and why. MT-NLG's
    own plan (40.02 GiB by the model) would not fit a 40 GiB part, as said before."""
    ran = vtrain_in_process("simulate", REPO / "examples" / "gpt-1.3b-a100.yaml", "--tp", "1", "--pp", "1", "--dp",
                            "16", "--micro-batch", "4", "--recompute", "selective", "--schedule", "1f1b",
                            "--virtual-stages", "1", "--device", "A100-40GB")
    assert ran.returncode == 0, ran.stderr
    assert ("needs 37.22 GiB per GPU (memory model: parameters, gradients, optimizer state, activations): 37.6-40.6 "
            "GiB as measured (the model is -8.4 to -0.9 % of measured peaks), around the 40 GiB of A100-40GB: the run "
            "may not fit") in ran.stderr, ran.stderr
    assert "40.02 GiB per GPU" in vtrain_in_process("simulate", MTNLG).stderr


def test_flags_override_the_config_and_text_summary() -> None:
    result = vtrain(MTNLG, "--pp", 15, "--dp", 16, "--gpus", 1920, "--schedule", "interleaved",
                    "--virtual-stages", 7, "--no-dp-overlap")
    assert result.returncode == 0, result.stderr
    assert "t=8 d=16 p=15" in result.stdout and "interleaved (v=7)" in result.stdout
    assert "dp overlap off" in result.stdout
    assert "modelled 100.0%" in result.stdout


def test_the_precision_and_framework_of_the_run_are_flags_too() -> None:
    """A YAML run config that leaves the precision out runs in fp32 (ten times fp16's time on an A100's GEMMs), and
    there was no flag to say otherwise: ``--precision`` and ``--framework`` override the run's as its own keys would
    (MT-NLG's config is fp16: in fp32 it takes more than three times as long)."""
    times = {}
    for flags in ((), ("--precision", "fp32"), ("--framework", "megatron", "--precision", "bf16"),
                  ("--framework", "Megatron-LM", "--precision", "bf16")):
        result = vtrain(MTNLG, "--json", *flags)
        assert result.returncode == 0, result.stderr
        times[flags] = json.loads(result.stdout)["iteration_time_ms"]
    assert times[("--precision", "fp32")] > 3 * times[()]
    assert times[("--framework", "megatron", "--precision", "bf16")] != times[()]
    assert times[("--framework", "Megatron-LM", "--precision", "bf16")] == times[("--framework", "megatron",
                                                                                  "--precision", "bf16")]


def test_the_links_of_the_run_are_flags_too() -> None:
    """A node's network and size and the GPUs' links override the run config's hardware, as `validate
    --measurements`, `cluster` and `size` take them: MT-NLG's t = 8 gradient all-reduces and pipeline transfers
    (one GPU of each node) take a GPU's share of the node's network."""
    times = {}
    for gbps in (800, 3200):
        result = vtrain_in_process("simulate", MTNLG, "--profile", REPO / "profiles" / "a100", "--json",
                                   "--inter-node-gbps", gbps, "--gpus-per-node", 8, "--intra-node-gbps", 300)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)
        times[gbps] = summary["breakdown_ms"]["pp"] + summary["breakdown_ms"]["dp"]
    assert times[800] > 1.5 * times[3200] > 0


def test_a_run_over_several_nodes_says_its_network_and_where_each_rate_came_from() -> None:
    """A run over 16 nodes predicted with an assumed network (GPT-3 175B on 128 GPUs: 100 to 1,600 Gbit/s a node
    moves it 21 %) said "assumed" among the device's sources, without the rate it assumed; one node says nothing."""
    profile = REPO / "profiles" / "a100"
    gpt3 = ["gpt-3-175b", "--tp", 8, "--pp", 8, "--dp", 16, "--micro-batch", 1, "--global-batch", 1536]
    ran = {gbps: vtrain_in_process("simulate", *gpt3, "--profile", profile,
                                   *(["--inter-node-gbps", gbps] if gbps else [])) for gbps in (None, 400)}
    lines = {gbps: [line for line in done.stdout.splitlines() if line.startswith("network")]
             for gbps, done in ran.items()}
    # the profile's collectives over nodes are vidur's 2-node curves: they time the run, not the assumed 1,600
    # Gbit/s the line had said alone (an audit: OPT-175B's gradient all-reduce over 124 nodes 4.2x the time at it)
    assert lines[None] == ["network          inter-node collectives timed by the profile's curves fitted on 2 nodes "
                           "(vidur; bus bandwidth 5.87 to 20.2 GB/s), a group over more nodes as on the most "
                           "measured: --inter-node-gbps gives your network; where no curve fits, inter-node 1,600 "
                           "Gbit/s per node of 8 GPUs (assumed), step latency 6 us (assumed); intra-node 300 GB/s "
                           "per GPU (datasheet)"]
    assert "warning: gpt-3-175b: its collectives over nodes (up to 128) are timed by the profile's curves fitted on " \
           "2 nodes (vidur), as on 2: their rate is that cluster's network (--inter-node-gbps gives yours)" \
           in ran[None].stderr, ran[None].stderr
    assert lines[400][0].startswith("network          inter-node 400 Gbit/s per node of 8 GPUs (config)")
    assert "its collectives over nodes" not in ran[400].stderr
    one_node = vtrain_in_process("simulate", "gpt-3-2.7b", "--tp", 8, "--pp", 1, "--dp", 1, "--micro-batch", 1,
                                 "--global-batch", 8, "--profile", profile)
    assert one_node.returncode == 0 and "network" not in one_node.stdout, one_node.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--tp", 16], "tp*dp*pp = 16*12*35 = 6720 does not equal the number of devices (3360)"),
    (["--pp", 10, "--dp", 42], "layers (105) is not divisible by pp*virtual_stages (10*1)"),
    (["--micro-batch", 7], "global batch (1920) is not divisible by dp*micro_batch (12*7)"),
    (["--device", "TPUv9"], "unknown device 'TPUv9'"),
    # with a fitted profile, a warning that its device model was not used came first
    (["--device", "TPUv9", "--profile", REPO / "profiles" / "a100"], "unknown device 'TPUv9'"),
    (["--gpus-per-node", 0], "gpus_per_node must be between 1 and 1,024 (got 0)"),
    # one stage has nothing to interleave with: it was simulated as three chunks of one stage, with no warning
    (["--pp", 1, "--dp", 420, "--global-batch", 1680, "--schedule", "interleaved", "--virtual-stages", 3],
     "virtual_stages=3 needs pp >= 2"),
    (["--framework", "deepspeed"], "framework must be one of reference, megatron (got 'deepspeed')"),
    (["--precision", "fp8"], "precision must be one of fp32, fp16, bf16 (got 'fp8')"),
])
def test_inconsistent_config_is_one_line_exit_2(args: list[object], message: str) -> None:
    result = vtrain_in_process("simulate", MTNLG, *args)  # in this process (tests/conftest.py)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(MTNLG) in lines[0] and message in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(("args", "message"), [
    (["--inter-node-gbps", -5], "argument --inter-node-gbps: must be above 0.001 and at most 1e+06 (got '-5')"),
    (["--inter-node-gbps", 1e-300], "argument --inter-node-gbps: must be above 0.001"),  # overflowed the schedule
    (["--intra-node-gbps", 1e-300], "argument --intra-node-gbps: must be above 0.001 and at most 100000"),
])
def test_a_link_rate_out_of_bounds_names_its_flag(args: list[object], message: str) -> None:
    """A link rate the run config refuses is the flag's error, one line, before the run config is read (it had
    been blamed on the run config's file)."""
    result = vtrain_in_process("simulate", MTNLG, *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_bad_profile_and_missing_config(tmp_path: Path) -> None:
    result = vtrain_in_process("simulate", TINY, "--profile", tmp_path / "nope")
    assert result.returncode == 2 and "no such profile folder" in result.stderr
    result = vtrain(tmp_path / "missing.yaml")  # a real process
    assert result.returncode == 2 and "no such run config" in result.stderr


def test_writes_traces_and_refuses_to_clobber(tmp_path: Path) -> None:
    out = tmp_path / "pred"
    result = vtrain(TINY, "-o", out)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".vtrain-output", "rank-0.json.gz", "rank-2.json.gz", "run.yaml"]
    again = vtrain(TINY, "-o", out)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_the_prediction_path_imports_no_typer_scikit_learn_or_networkx() -> None:
    """`vtrain simulate` parses its own arguments, evaluates the profile's kernel models from their arrays and
    schedules plain lists: typer, pydantic, scikit-learn and networkx (over a second of start-up between them on a
    busy machine) are not imported, while the prediction is the fitted device's."""
    code = ("import runpy, sys\n"
            f"sys.argv = ['vtrain', 'simulate', {str(MTNLG)!r}, '--profile', {str(REPO / 'profiles' / 'a100')!r}, "
            "'--json']\n"
            "try:\n    runpy.run_module('vtrain.cli.main', run_name='__main__')\n"
            "except SystemExit as stop:\n    assert not stop.code, stop.code\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'typer', 'pydantic', 'sklearn', 'networkx'}), "
            "file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "[]"
    summary = json.loads(result.stdout)
    # every kernel modelled (the profile measured none of MT-NLG's shapes); the collectives on NVLink are on the
    # measured nccl-tests curves (the JSON's 300 GB/s is the A100's own), so are the tied embedding's all-reduces
    assert 0.9 < summary["coverage"]["modelled"] < 0.99 and "fitted" in summary["device"]["provenance"]["gemm"]


def test_a_reader_that_goes_away_stops_it_quietly() -> None:
    """`vtrain simulate ... --json | head -1`: the pipe closes under the output; no traceback, exit 141 (as shells
    report SIGPIPE)."""
    command = [sys.executable, "-m", "vtrain.cli.main", "simulate", str(REPO / "examples" / "mtnlg-530b.json"),
               "--profile", str(REPO / "profiles" / "a100"), "--device", "A100-80GB", "--json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before it writes a byte: every write fails, whatever the output's size
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=300) == 141
    assert "Traceback" not in stderr and stderr == ""


@pytest.mark.parametrize("value", ['"yes"', "1", "null"])
def test_cuda_graphs_must_be_true_or_false(value: str, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: {layers: 2, hidden: 64, heads: 4, seq: 32, vocab: 128}\n"
                      f"cuda_graphs: {value}\n")
    result = vtrain_in_process("simulate", config)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "cuda_graphs must be true or false" in lines[0]


def test_cuda_graphs_need_a_gpu(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("model: {layers: 2, hidden: 64, heads: 4, seq: 32, vocab: 128}\n"
                      "hardware: {device: cpu}\ncuda_graphs: true\n")
    result = vtrain_in_process("simulate", config)
    assert result.returncode == 2 and "cuda_graphs needs a GPU" in result.stderr
    assert vtrain_in_process("simulate", config, "--no-cuda-graphs").returncode == 0


def test_a_profile_fitted_for_another_gpu_is_said_unused() -> None:
    """profiles/h100 holds an H100's kernels: for MT-NLG's A100 config it is not used, and that is said (it was
    silent: the prediction was the A100 datasheet's); with --device H100 it is used and nothing is said."""
    other = vtrain_in_process("simulate", MTNLG, "--profile", REPO / "profiles" / "h100")
    said = [line for line in other.stderr.splitlines() if "was fitted for H100" in line]
    assert other.returncode == 0 and len(said) == 1 and "--device H100" in said[0]
    same = vtrain_in_process("simulate", MTNLG, "--profile", REPO / "profiles" / "h100", "--device", "H100")
    assert same.returncode == 0 and "was fitted for" not in same.stderr


def test_the_padded_vocabulary_is_said() -> None:
    """Megatron pads the vocabulary to a multiple of 128·t, and the prediction and parameter count use the padded
    rows (MT-NLG's 50,257 words are 51,200 rows at t = 8), but nothing said so: a user comparing parameter counts
    found 75,200 more than the config gave for GPT-2 XL (an audit). The summary and --json say the rows."""
    ran = vtrain_in_process("simulate", MTNLG)
    assert ran.returncode == 0, ran.stderr
    assert "vocab 50257; fp16, Megatron's kernels; the vocabulary padded to 51200 rows (a multiple of 128·t = " \
        "1024, as Megatron pads it)" in ran.stdout, ran.stdout
    summary = json.loads(vtrain_in_process("simulate", MTNLG, "--json").stdout)
    assert summary["model"]["vocab"] == 50257 and summary["model"]["vocab_rows"] == 51200


def test_a_layout_the_flags_break_names_the_flags() -> None:
    """`simulate run.yaml --dp 4` on a 2-GPU run blamed the file ("run.yaml: inconsistent run config: ... does not
    equal the number of devices (2)"): the flags that changed it are named with it."""
    from tests.conftest import vtrain_in_process

    run = REPO / "traces" / "t1p1d2" / "run.yaml"
    ran = vtrain_in_process("simulate", run, "--dp", "4", "--no-dp-overlap")
    assert ran.returncode == 2
    assert ran.stderr.startswith(f"error: {run} with --dp 4 --no-dp-overlap: inconsistent run config: tp*dp*pp"), \
        ran.stderr
    assert vtrain_in_process("simulate", run, "--dp", "4", "--gpus", "4").returncode == 0
    model = vtrain_in_process("simulate", "llama-2-7b", "--gpus", "12", "--tp", "8")  # a model without a run: its
    assert "error: llama-2-7b with --tp 8 --gpus 12: inconsistent run config" in model.stderr, model.stderr  # --gpus
