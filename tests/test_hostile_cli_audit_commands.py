"""Findings of a hostile audit of the planning and study commands (`plan`, `cluster`, `size`, `tables`, `record`,
`whatif`) and of the strict config reader: each bad input is one line and exit code 2 (no traceback, no hang),
each suspicious one a warning line. Commands run in-process (:func:`tests.conftest.vtrain_in_process`)."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.configfile import read_config_file
from vtrain.errors import InputError
from vtrain.runconfig import ModelConfig
from vtrain.studies.cluster import Job, Speeds, simulate_cluster
from vtrain.studies.throughput import Prediction, Workload

PROFILE = REPO / "profiles" / "a100"
CONFIG = REPO / "examples" / "gpt-1.3b-a100.yaml"
TRACES = REPO / "traces" / "t2p2d2"
#: a small model whose sweep on 8 GPUs takes about a second
SMALL_PLAN = ["plan", "--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "256", "--vocab", "1024",
              "--global-batch", "16", "--gpus", "8", "--max-micro-batch", "1"]
TINY_RECORD = ["record", "--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--vocab", "128",
               "--micro-batch", "2", "--global-batch", "4"]


def one_error(result, *parts: str) -> str:
    """The one ``error:`` line of a refused command, holding every one of ``parts``."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(part in lines[0] for part in parts), lines[0]
    return lines[0]


def job_line(**fields: object) -> str:
    job = {"name": "a", "layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "tokens": "1.0e+9", "arrival_h": 0,
           "gpus": 8, **fields}
    return "jobs:\n  - {" + ", ".join(f"{key}: {value}" for key, value in job.items()) + "}\n"


# ------------------------------------------------------------------------------------------- cluster (3, 4)

@pytest.fixture
def ten_seconds() -> Iterator[None]:
    """A test that must end in ten seconds: a simulation that spins forever fails (a TimeoutError) instead."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("did not end in 10 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 10)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("fields, parts", [
    ({"arrival_h": 1732665600}, ["job 'a': arrival_h must be at most 87,660", "Unix timestamp"]),
    ({"arrival_h": "1.0e+12"}, ["arrival_h must be at most"]),
    ({"deadline_h": "1.0e+12"}, ["deadline_h must be at most"]),
    ({"tokens": "1.0e+300"}, ["tokens must be at most 1e+16"]),
])
def test_cluster_refuses_times_and_tokens_beyond_physical_bounds(tmp_path: Path, fields: dict[str, object],
                                                                parts: list[str], ten_seconds: None) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(job_line(**fields))
    result = vtrain_in_process("cluster", jobs, "--gpus", 8, "--profile", PROFILE, "-o", tmp_path / "out")
    one_error(result, str(jobs), *parts)
    assert not (tmp_path / "out").exists()


WORKLOAD = Workload(ModelConfig(layers=2, hidden=64, heads=2, seq=16), global_batch=4)


@pytest.mark.parametrize("policy", ["baseline", "vtrain"])
def test_a_simulation_at_a_late_clock_ends(policy: str, ten_seconds: None) -> None:
    """At a clock of 10^9 hours an hour-long job's remaining tokens lost their last digits to rounding and never
    reached zero: the simulation ran forever. Every event now ends a job or admits one."""
    jobs = [Job("a", WORKLOAD, 1e9 + 7, 1732665600.0, gpus=8), Job("b", WORKLOAD, 3e9 + 1, 1732665600.5, gpus=8),
            Job("c", WORKLOAD, 1e-300, 1732665601.0, gpus=8)]  # c: its run is lost in the clock's rounding
    speeds = Speeds(lambda workload, gpus: Prediction(1e9 / 3600, label=f"{gpus} GPUs"), [8])
    schedule = simulate_cluster(jobs, 8, speeds, policy)
    ends = {job.name: job.end_h for job in schedule.jobs}
    assert ends["a"] == pytest.approx(1732665601.0) and ends["b"] == pytest.approx(1732665604.0)
    assert all(job.segments for job in schedule.jobs) and math.isfinite(schedule.makespan_h)


# ------------------------------------------------------------------------------------------------ tables (11)

def test_tables_top_beyond_any_table_is_one_line() -> None:
    one_error(vtrain_in_process("tables", PROFILE, "--top", "99999999999999999999"), "--top")


# -------------------------------------------------------------------------------------------------- plan (12)

def test_plan_unknown_device_is_the_only_line(tmp_path: Path) -> None:
    result = vtrain_in_process("plan", CONFIG, "--gpus", 16, "--device", "BOGUS", "--profile", PROFILE,
                               "-o", tmp_path / "x")
    one_error(result, "--device: unknown device 'BOGUS'")
    assert not (tmp_path / "x").exists()


# -------------------------------------------------------------------------------------------------- plan (13)

@pytest.mark.filterwarnings("error::UserWarning")  # a library's raw warning (matplotlib's log axis of $0) fails
def test_plan_at_no_price_says_so_and_draws_its_chart(tmp_path: Path) -> None:
    result = vtrain_in_process(*SMALL_PLAN, "--price-per-gpu-hour", 0, "-o", tmp_path / "p", "--json")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: --price-per-gpu-hour 0: every plan costs $0"), lines
    assert (tmp_path / "p" / "frontier.svg").stat().st_size > 0
    assert json.loads(result.stdout)["best"]["usd"] == 0


def test_plan_for_fewer_tokens_than_one_iteration_says_so(tmp_path: Path) -> None:
    """`--tokens 1` priced every plan at a 4,096th of an iteration: "0.0 days, $0", silently (an audit)."""
    result = vtrain_in_process(*SMALL_PLAN, "--price-per-gpu-hour", 2, "--tokens", 1, "-o", tmp_path / "p")
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("warning:")] == [
        "warning: --tokens 1 is less than one iteration's 4,096 (global batch 16 x sequence 256): each plan is "
        "priced for 0.000244 of an iteration"], result.stderr


# -------------------------------------------------------------------------------------------------- plan (21)

def test_plan_with_no_plan_within_its_limits_says_why(tmp_path: Path) -> None:
    result = vtrain_in_process(*SMALL_PLAN, "--max-iteration-s", "1e-9", "-o", tmp_path / "p", "--json")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "warning: no simulated plan is within the limits (iteration <= 1e-09 s): none takes 1e-09 s or less (the "
        "fastest"), lines
    summary = json.loads(result.stdout)
    assert summary["best"] is None and summary["best_reason"].startswith("no simulated plan is within the limits")
    # both limits, each met by some plan but no plan meeting both: what each leaves (an audit: "the fastest takes
    # 25.3 s, the cheapest costs $5.4M", each of which met one limit, read as if a plan should qualify)
    one_or_eight = [*SMALL_PLAN[:-3], "1,8", *SMALL_PLAN[-2:]]  # eight GPUs are quicker, one GPU is cheaper
    ran = vtrain_in_process(*one_or_eight, "-o", tmp_path / "q", "--json")
    plans = pl.read_csv(tmp_path / "q" / "plans.csv").filter(pl.col("status") == "simulated")
    quick = plans.filter(pl.col("gpus") == 8)["iteration_ms"].min() / 1e3
    cheap = plans.filter(pl.col("gpus") == 1)["usd"].min()
    cheapest_quick = plans.filter(pl.col("iteration_ms") <= quick * 1e3)["usd"].min()
    fastest_cheap = plans.filter(pl.col("usd") <= cheap)["iteration_ms"].min() / 1e3
    assert ran.returncode == 0 and cheapest_quick > cheap and fastest_cheap > quick, (cheapest_quick, cheap)
    both = vtrain_in_process(*one_or_eight, "--max-iteration-s", repr(quick), "--budget-usd", repr(cheap),
                             "-o", tmp_path / "r", "--json")
    reason = json.loads(both.stdout)["best_reason"]
    assert f"the cheapest within {quick:g} s costs ${cheapest_quick:,.0f}" in reason, reason
    assert f"the fastest within ${cheap:,.0f} takes {fastest_cheap:.3g} s" in reason, reason


# ------------------------------------------------------------------------------------------ number flags (19)

@pytest.mark.parametrize("args, flag", [
    (["plan", CONFIG, "--gpus", "16", "--price-per-gpu-hour", "nan"], "--price-per-gpu-hour"),
    (["plan", CONFIG, "--gpus", "16", "--tokens", "nan"], "--tokens"),
    (["plan", CONFIG, "--gpus", "16", "--device-memory", "nan"], "--device-memory"),
    (["plan", CONFIG, "--gpus", "16", "--max-iteration-s", "NaN"], "--max-iteration-s"),
    (["size", "--gpus", "8", "--days", "nan"], "--days"),
    (["size", "--gpus", "8", "--days", "1", "--mfu", "nan"], "--mfu"),
    (["cluster", CONFIG, "--gpus", "8", "--resize-overhead-min", "nan"], "--resize-overhead-min"),
])
def test_nan_flags_are_not_a_number(tmp_path: Path, args: list[object], flag: str) -> None:
    one_error(vtrain_in_process(*args, "-o", tmp_path / "out"), flag, "is not a number")
    assert not (tmp_path / "out").exists()


def test_number_flags_out_of_range_say_the_range(tmp_path: Path) -> None:
    result = vtrain_in_process("plan", CONFIG, "--gpus", "16", "--tokens", "1e20", "-o", tmp_path / "out")
    one_error(result, "--tokens", "must be between 1 and 1e+16 (got '1e20')")


# ------------------------------------------------------------------------------------------------ record (14)

@pytest.mark.parametrize("flags, message", [
    (["--threads", "100000"], "--threads must be at most 1,024"),
    (["--steps", "100000000"], "--steps must be at most 100"),
    (["--warmup", "100000000"], "--warmup must be at most 100"),
])
def test_record_counts_beyond_a_recording_are_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    one_error(vtrain_in_process(*TINY_RECORD, *flags, "-o", tmp_path / "t"), message)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ whatif (15)

@pytest.mark.parametrize("flags, message", [
    (["--scale", "gemm=2", "--scale", "gemm=3"], "--scale: gemm is given twice (gemm=2, gemm=3)"),
    (["--scale-kernel", "addmm=2", "--scale-kernel", "addmm=0.5"], "--scale-kernel: /addmm/ is given twice"),
    # one class under two names: it was scaled by 0.25, silently (an audit, traces/gpu/h100-val-gpt6.7b-4l)
    (["--scale", "norm=0.5", "--scale", "elementwise=0.5"],
     "--scale: elementwise is given twice (two names of one class) (norm=0.5, elementwise=0.5)"),
])
def test_whatif_change_given_twice_is_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    one_error(vtrain_in_process("whatif", TRACES, *flags, "-o", tmp_path / "w"), message)
    assert not (tmp_path / "w").exists()


def test_whatif_says_that_norm_is_half_of_its_class(tmp_path: Path) -> None:
    """`--scale norm=0.5` halved every element-wise kernel with the norms (-16 % where the norms could give
    -0.5 %: an audit); the class is one, so it is said."""
    ran = vtrain_in_process("whatif", TRACES, "--scale", "norm=0.5", "-o", tmp_path / "w")
    assert ran.returncode == 0, ran.stderr
    assert ("warning: --scale norm: the class elementwise/norm, every element-wise and normalisation kernel alike "
            "(--scale-kernel REGEX=F scales normalisation kernels alone)") in ran.stderr.splitlines()


# ------------------------------------------------------------------------------------------- config file (17)

@pytest.mark.parametrize("value, message", [
    ("1:0", "line 2: layers: 1:0 is a base-60 number in YAML 1.1 (60)"),
    ("1:30.5", "layers: 1:30.5 is a base-60 number"),
    ("1_000", "layers: 1_000 is a number in YAML 1.1 only"),
    ("017", "layers: 017 is octal (15) in YAML 1.1 and 17 in YAML 1.2"),
    ("0b101", "layers: 0b101 is a binary number in YAML 1.1 only"),
])
def test_yaml_numbers_read_differently_by_yaml_versions_are_refused(tmp_path: Path, value: str,
                                                                   message: str) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(f"model:\n  layers: {value}\n")
    with pytest.raises(InputError, match="run config refused") as refused:
        read_config_file(path, "run config")
    assert message in str(refused.value) and str(path) in str(refused.value)
    path.write_text(f"gpus: [8, {value}]\n")  # a list's item: the line and value
    with pytest.raises(InputError, match=f"line 1: {value} is"):
        read_config_file(path, "run config")


def test_yaml_1_2_numbers_are_read_as_yaml_1_2_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("a: 0x1F\nb: 0o17\nc: 07\nd: 24\ne: 1.0e+9\n")
    assert read_config_file(path, "run config") == {"a": 31, "b": 15, "c": 7, "d": 24, "e": 1e9}


def test_base_60_layers_in_a_run_config_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(CONFIG.read_text().replace("layers: 24", "layers: 1:0"))
    one_error(vtrain_in_process("simulate", config), str(config), "layers: 1:0 is a base-60 number")


LONG = "a" * 500  # longer than a file name may be (255 bytes on Linux)


@pytest.mark.parametrize("args", [
    ["simulate", f"{LONG}.json"], ["plan", f"{LONG}.json", "--gpus", "8", "--global-batch", "8"],
    ["ingest", LONG, "-o", "{tmp}/out"], ["validate", LONG], ["tables", LONG],
    ["validate", "--measurements", f"{LONG}.csv", "--profile", str(PROFILE)],
    ["simulate", str(REPO / "examples" / "mtnlg-530b.json"), "-o", f"{{tmp}}/{LONG}"],
], ids=lambda args: " ".join(a if len(a) < 20 else "LONG" for a in args))
def test_a_file_name_too_long_for_the_system_is_one_line(tmp_path: Path, args: list[str]) -> None:
    """Python 3.11's pathlib raises ENAMETOOLONG from ``exists()`` and ``is_dir()``: wherever such a path is first
    touched, the command says so in one line (the name cut to 60 characters), writes nothing and exits 2."""
    result = vtrain_in_process(*(arg.replace("{tmp}", str(tmp_path)) for arg in args))
    line = one_error(result, "file name too long for this system")
    assert len(line) < 200 and "characters)" in line
    assert list(tmp_path.iterdir()) == []


def test_a_name_too_long_for_a_file_is_no_architecture() -> None:
    one_error(vtrain_in_process("simulate", LONG), "no such file, nor a model vtrain knows by name")


@pytest.mark.parametrize("args", [
    ["plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "128", "--global-batch", "8", "--gpus",
     "\u0668"],
    ["plan", "examples/gpt-1.3b-a100.yaml", "--gpus", "..\u0663\u0663\u0666\u0660"],
    ["size", "--gpus", "8", "--days", "\u0661.\u0665"],
    ["simulate", "examples/tiny-cpu.yaml", "--tp=\u0662"],
])
def test_numbers_in_other_digits_are_refused_as_run_configs_refuse_them(args: list[str], tmp_path: Path) -> None:
    """`plan --gpus ٨` planned 8 GPUs and `--tokens ١٠٠` priced 100 tokens (Python's int and float read any
    script's digits), where a run config's `tp: ٨` is refused and `size --gpus ٨` was too: one rule now."""
    result = vtrain_in_process(*args, "-o", tmp_path / "out")
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.count("\n") == 1 and "a number written in digits other than 0-9" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_a_link_rate_at_the_run_configs_bound_names_the_flag(command: str, tmp_path: Path) -> None:
    """``--inter-node-gbps 0.001`` passed the flag's check (at least 0.001) and was then refused as the run config's
    ("examples/gpt-1.3b-a100.yaml: no plan can train this model: inter_node_gbps must be ... above 0.001": an
    audit): the flag has the run config's bounds, and is named."""
    args = ["--gpus", "16", "-o", tmp_path / "out"] if command == "plan" else []
    ran = vtrain_in_process(command, REPO / "examples" / "gpt-1.3b-a100.yaml", "--inter-node-gbps", "0.001", *args)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    [line] = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert "--inter-node-gbps" in line and "must be above 0.001" in line and "yaml" not in line, line
