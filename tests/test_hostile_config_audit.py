"""An audit of the config, table and profile side with hostile input: each case here failed before its fix (a
traceback, a silently wrong answer, a search that never ended, or an output left half-replaced).

Every refused case ends with exit code 2 and exactly one ``error:`` line naming the file or flag, no traceback, and
leaves its input unchanged. Inputs are built in ``tmp_path`` from the shipped examples and profiles.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process

TINY_CPU = REPO / "examples" / "tiny-cpu.yaml"
VTRAIN_JSON = REPO / "examples" / "mtnlg-530b.json"
A100_PROFILE = REPO / "profiles" / "a100"
GROUND_TRUTH = REPO / "tests" / "data" / "a100" / "vtrain-a100" / "ground_truth_single.csv"
A100_RUN = """\
model: {layers: 2, hidden: 1024, heads: 16, seq: 1024, vocab: 51200}
parallelism: {tp: 2, pp: 1, dp: 1, micro_batch: 1, global_batch: 4}
precision: fp16
hardware: {device: A100-40GB, device_count: 2}
"""
MODEL = "model: {layers: %s, hidden: 64, heads: 4, seq: 32}\n"


def refused(ran: subprocess.CompletedProcess[str], names: str, words: str = "") -> None:
    """``ran`` ended as bad input: exit 2, one ``error:`` line naming ``names`` and saying ``words``."""
    assert "Traceback" not in ran.stderr, ran.stderr
    assert ran.returncode == 2, ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, ran.stderr
    assert names in lines[0] and words in lines[0], lines[0]


def unchanged(folder: Path, ran: Callable[[], subprocess.CompletedProcess[str]]) -> subprocess.CompletedProcess[str]:
    """Run ``ran`` and check that no file under ``folder`` changed, appeared or went."""
    def snapshot() -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    before = snapshot()
    result = ran()
    assert snapshot() == before
    return result


# ---------------------------------------------------------------------------------------------------- run configs


UNREADABLE_VALUES = {
    "layers-10-to-the-400.yaml": MODEL % (10 ** 400),  # shown_count formatted it as a float: OverflowError
    "layers-5000-digits.yaml": MODEL % ("9" * 5000),  # beyond Python's int digit limit: ValueError
    "num-layers-10-to-the-400.json": json.dumps({**json.loads(VTRAIN_JSON.read_text()), "num_layers": 10 ** 400}),
    "num-layers-5000-digits.json": '{"num_layers": ' + "9" * 5000 + "}",
    "impossible-date.yaml": MODEL % 2 + "software: {built: 2024-13-45}\n",  # datetime: ValueError
}


@pytest.mark.parametrize("name", list(UNREADABLE_VALUES))
def test_a_value_no_number_type_holds_is_one_error_line(name: str, tmp_path: Path) -> None:
    """Integers too large for a float or for Python's digit limit, and impossible YAML dates, are refused."""
    config = tmp_path / name
    config.write_text(UNREADABLE_VALUES[name])
    refused(unchanged(tmp_path, lambda: vtrain_in_process("simulate", config)), str(config))


def test_an_override_too_large_for_a_float_is_one_error_line(tmp_path: Path) -> None:
    """``--tp`` with 400 digits is said to be out of bounds, not a traceback."""
    config = tmp_path / "run.yaml"
    shutil.copy(TINY_CPU, config)
    refused(unchanged(tmp_path, lambda: vtrain_in_process("simulate", config, "--tp", "9" * 400)), str(config),
            "tp must be between 1 and 1,024 (got 1.000e+400)")


def test_a_json_config_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A JSON config saved with a byte-order mark (as Windows editors do) is read, as a YAML one is."""
    config = tmp_path / "config.json"
    config.write_text("\ufeff" + VTRAIN_JSON.read_text(), encoding="utf-8")
    ran = vtrain_in_process("simulate", config, "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["iteration_time_ms"] > 0


@pytest.mark.parametrize("key, value", [("ddp_bucket_size", "25"), ("ddp_bucket_size", True),
                                        ("intra_node_bandwidth", True), ("inter_node_bandwidth", "200")])
def test_a_vtrain_json_rate_must_be_a_number(key: str, value: object, tmp_path: Path) -> None:
    """vTrain's real-valued keys were converted with float(): ``true`` became a 1 GB/s link, ``"25"`` a number."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**json.loads(VTRAIN_JSON.read_text()), key: value}))
    refused(unchanged(tmp_path, lambda: vtrain_in_process("simulate", config)), str(config), "is not a number")


# ------------------------------------------------------------------------------------------------------ profiles


def damaged_profile(folder: Path, metadata: Callable[[dict], None] | None = None,
                    table: tuple[str, Callable[[pl.DataFrame], pl.DataFrame]] | None = None) -> Path:
    """A copy of the shipped A100 profile in ``folder`` with its metadata or one table changed."""
    profile = folder / "profile"
    shutil.copytree(A100_PROFILE, profile)
    if metadata is not None:
        data = json.loads((profile / "metadata.json").read_text())
        metadata(data)
        (profile / "metadata.json").write_text(json.dumps(data))
    if table is not None:
        path = profile / f"{table[0]}.parquet"
        table[1](pl.read_parquet(path)).write_parquet(path)
    return profile


def _curve(key: str, value: object) -> Callable[[dict], None]:
    return lambda data: data["fitted"]["collectives"][0].update({key: value})


FITTED_CHANGES = {
    "collectives[0].nodes must be a whole number": _curve("nodes", "x"),  # was a TypeError
    "collectives[0].group_size must be between": _curve("group_size", 0),
    "host.jitter_us": lambda data: data["fitted"]["host"].update(jitter_us=float("nan")),
}


@pytest.mark.parametrize("words", list(FITTED_CHANGES))
def test_a_fitted_curve_or_host_term_out_of_bounds_is_refused(words: str, tmp_path: Path) -> None:
    """A fitted collective's group and the host's arrival jitter are bounded like the other fitted numbers (a NaN
    jitter made every multi-rank prediction NaN, exit 0)."""
    profile = damaged_profile(tmp_path, metadata=FITTED_CHANGES[words])
    config = tmp_path / "run.yaml"
    config.write_text(A100_RUN)
    ran = unchanged(tmp_path, lambda: vtrain_in_process("simulate", config, "--profile", profile))
    refused(ran, str(profile / "metadata.json"), words)


def test_a_metadata_integer_beyond_the_digit_limit_is_refused(tmp_path: Path) -> None:
    """``metadata.json`` holding a 5,000-digit integer is corrupt, not a traceback."""
    profile = damaged_profile(tmp_path)
    (profile / "metadata.json").write_text('{"kind": "profile", "world_size": ' + "9" * 5000 + "}")
    ran = unchanged(tmp_path, lambda: vtrain_in_process("tables", profile))
    refused(ran, str(profile / "metadata.json"), "not valid JSON")


@pytest.mark.parametrize("name, column, value", [("nccl_latency", "group_size", 0), ("op_benchmarks", "m", -5)])
def test_a_table_with_groups_or_shapes_below_one_is_refused(name: str, column: str, value: int,
                                                            tmp_path: Path) -> None:
    """Group sizes of 0 and GEMMs of -5 rows changed predictions silently (by 43% and 0.3%)."""
    profile = damaged_profile(tmp_path, table=(name, lambda frame: frame.with_columns(
        pl.lit(value).cast(frame.schema[column]).alias(column))))
    config = tmp_path / "run.yaml"
    config.write_text(A100_RUN)
    ran = unchanged(tmp_path, lambda: vtrain_in_process("simulate", config, "--profile", profile))
    refused(ran, str(profile / f"{name}.parquet"), f"with a {column} below 1")


# ------------------------------------------------------------------------------------------------- measurements


@pytest.mark.parametrize("column, value", [("vocab", "1e30"), ("virtual stages", "9" * 5000)])
def test_a_measurement_column_beyond_int64_names_its_line(column: str, value: str, tmp_path: Path) -> None:
    """An optional integer column beyond 64 bits was a polars overflow traceback."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    table = tmp_path / "m.csv"
    table.write_text(f"{lines[0]},{column}\n" + "".join(f"{row},{value}\n" for row in lines[1:3]))
    ran = unchanged(tmp_path, lambda: vtrain_in_process("validate", "--measurements", table, "--profile",
                                                        A100_PROFILE, "-o", tmp_path / "report"))
    refused(ran, str(table), "line 2: ")
    assert len(ran.stderr) < 1000  # the value is cut, not printed whole
    assert not (tmp_path / "report").exists()


def test_a_repeated_measured_run_is_simulated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows describing the same run are simulated once: a million-row table of 1,440 runs took hours (about 20 ms a
    row), and takes about a minute."""
    from vtrain.fit.device import device_from_profile
    from vtrain.importers.measurements import read_measurements
    from vtrain.simulate import measured_runs
    from vtrain.tables.store import load_profile

    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    table = tmp_path / "m.csv"
    table.write_text("\n".join([lines[0], lines[1], lines[1], lines[2], lines[1]]) + "\n")
    calls: list[object] = []
    simulate = measured_runs.simulate
    monkeypatch.setattr(measured_runs, "simulate",
                        lambda config, *args, **kwargs: calls.append(config) or simulate(config, *args, **kwargs))
    profile = load_profile(A100_PROFILE)
    predicted = measured_runs.predict_runs(read_measurements(table), profile, device_from_profile(profile),
                                           measured_runs.Hardware())
    assert len(calls) == 2
    times = predicted["predicted_ms"].to_list()
    assert times[0] == times[1] == times[3] != times[2]


# ------------------------------------------------------------------------------------------------------ plans


def test_a_plan_on_a_device_without_a_memory_size_is_one_error_line(tmp_path: Path) -> None:
    """`vtrain plan` of a CPU run config (no memory size) ended in a ValueError traceback; it asks for
    --device-memory."""
    config = tmp_path / "run.yaml"
    shutil.copy(TINY_CPU, config)
    ran = unchanged(tmp_path, lambda: vtrain_in_process("plan", config, "--gpus", "4", "-o", tmp_path / "plans"))
    refused(ran, "", "no memory size: give --device-memory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


@pytest.mark.parametrize("flag, value", [("--price-per-gpu-hour", "inf"), ("--tokens", "inf"),
                                         ("--max-micro-batch", "100000000"), ("--device-memory", "inf")])
def test_a_plan_value_beyond_any_run_is_refused(flag: str, value: str, tmp_path: Path) -> None:
    """An infinite price or token count made the cost chart fail (traceback); 10^8 micro-batch sizes enumerated
    for hours; infinite memory let every plan fit."""
    config = tmp_path / "run.yaml"
    shutil.copy(TINY_CPU, config)
    ran = vtrain_in_process("plan", config, "--gpus", "4", "--device", "A100", flag, value, "-o", tmp_path / "plans")
    refused(ran, flag)
    assert not (tmp_path / "plans").exists()


# ------------------------------------------------------------------------------------------------------ outputs


def test_force_through_a_link_writes_where_it_points_and_keeps_the_link(tmp_path: Path) -> None:
    """`-o LINK --force` (LINK a link to vtrain's own output) renamed the link aside, left it there as a stale
    backup, and put a new folder in its place while the old output stayed where the link pointed."""
    config = tmp_path / "run.yaml"
    shutil.copy(TINY_CPU, config)
    target, link = tmp_path / "scratch" / "traces", tmp_path / "traces"
    assert vtrain_in_process("simulate", config, "-o", target).returncode == 0
    earlier = (target / "rank-0.json.gz").stat().st_ino  # the earlier output, replaced below
    link.symlink_to(target, target_is_directory=True)
    ran = vtrain_in_process("simulate", config, "-o", link, "--force")
    assert ran.returncode == 0, ran.stderr
    assert link.is_symlink() and link.resolve() == target.resolve()
    assert (target / "rank-0.json.gz").stat().st_ino != earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml", "scratch", "traces"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["traces"]


# --------------------------------------------------------------------------------------------------------- fit


NCCL_TESTS = REPO / "tests" / "data" / "a100" / "vtrain-a100" / "nccl-tests-allreduce-a100"


def measurement_rows(folder: Path, count: int, time: str | None = None) -> Path:
    """The first ``count`` rows of vTrain's A100 table in ``folder`` (with every time replaced by ``time``)."""
    lines = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    rows = [line if time is None else line.rsplit(",", 1)[0] + f",{time}" for line in lines[1:count + 1]]
    table = folder / "m.csv"
    table.write_text("\n".join([lines[0], *rows]) + "\n")
    return table


@pytest.mark.parametrize("command", ["fit", "validate"])
def test_an_unknown_recomputation_flag_is_refused(command: str, tmp_path: Path) -> None:
    """``--recompute bogus`` made every row unusable: `fit` ended in a TypeError, `validate` scored nothing, exit
    0."""
    table = measurement_rows(tmp_path, 3)
    args = ["fit", "--nccl-tests", NCCL_TESTS] if command == "fit" else ["validate", "--profile", A100_PROFILE]
    ran = unchanged(tmp_path, lambda: vtrain_in_process(*args, "--measurements", table, "--recompute", "bogus",
                                                        "-o", tmp_path / "out"))
    refused(ran, "--recompute", "must be one of none, selective, full")
    assert not (tmp_path / "out").exists()


def test_fitting_on_rows_none_of_which_can_be_simulated_is_refused(tmp_path: Path) -> None:
    """A table whose rows to fit on all have unusable times (NaN) ended `fit` in a TypeError (mean of no errors)."""
    table = measurement_rows(tmp_path, 3, time="nan")
    ran = unchanged(tmp_path, lambda: vtrain_in_process("fit", "--nccl-tests", NCCL_TESTS, "--measurements", table,
                                                        "-o", tmp_path / "profile"))
    refused(ran, str(table), "none of the 1 rows to fit the host overheads on can be simulated")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]


def test_a_gpu_run_config_that_leaves_out_its_framework_precision_or_attention_says_what_it_got(
        tmp_path: Path) -> None:
    """Their defaults are `vtrain record`'s CPU runs' (whose run.yaml leaves them out): a Megatron run on A100s
    written without them was planned as vtrain's reference GPT in fp32 with eager attention, silently (an audit:
    `plan examples/gpt-1.3b-a100.yaml` recommended a plan that needs 112 GiB on the 80 GiB part as Megatron)."""
    from vtrain.errors import InputWarning
    from vtrain.runconfig import load_run_config

    shape = "model: {layers: 2, hidden: 256, heads: 4, seq: 128, vocab: 512}\n"
    left_out = tmp_path / "left-out.yaml"
    left_out.write_text(shape + "hardware: {device: A100-80GB}\n")
    with pytest.warns(InputWarning, match=r"framework, precision, attention not given, so framework reference "
                                          r"\(vtrain record's GPT.*\); precision fp32; attention eager \(a "
                                          r"Megatron-LM run says framework: megatron, precision: bf16, attention: "
                                          r"flash\)"):
        assert load_run_config(left_out).framework == "reference"
    for text in (shape + "hardware: {device: A100-80GB}\nframework: megatron\nprecision: bf16\nattention: flash\n",
                 shape + "hardware: {device: cpu}\n", shape):
        said = tmp_path / "said.yaml"
        said.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error", InputWarning)
            load_run_config(said)


def test_an_inconsistent_gpu_run_config_is_one_line(tmp_path: Path) -> None:
    """A GPU run config leaving out its framework, precision and attention, and refused (global batch 7 over
    2 x 2): the warning on its defaults came first, then the error: two lines for bad input (an audit). One."""
    config = tmp_path / "gb7.yaml"
    config.write_text("model: {layers: 4, hidden: 512, heads: 8, seq: 512, vocab: 512}\n"
                      "parallelism: {tp: 1, pp: 1, dp: 2, micro_batch: 2, global_batch: 7}\n"
                      "hardware: {device: A100, device_count: 2, gpus_per_node: 8}\n")
    ran = vtrain_in_process("simulate", config)
    assert ran.returncode == 2 and ran.stderr.splitlines() == [
        f"error: {config}: inconsistent run config: global batch (7) is not divisible by dp*micro_batch (2*2)"], \
        ran.stderr


def test_a_tab_in_yaml_names_its_line_and_the_rule(tmp_path: Path) -> None:
    """A jobs file indented with a tab was refused with PyYAML's first line, "while scanning for the next token",
    no line named (an audit); now the problem, its line and column, and that YAML indents with spaces."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n\t- {name: a, layers: 2, hidden: 64, heads: 2, seq: 64, tokens: 1.0e+6, gpus: 8}\n")
    ran = vtrain_in_process("cluster", jobs, "--gpus", 8, "-o", tmp_path / "out")
    refused(ran, str(jobs), "jobs file is not valid YAML: found character '\\t' that cannot start any token (line 2, "
                            "column 1); YAML indents with spaces, not tabs")


def test_a_jobs_file_names_the_top_level_key_it_does_not_know(tmp_path: Path) -> None:
    """A jobs file with a key beside ``jobs`` (the cluster's GPU written into it) was told only what a jobs file is
    (an audit); the key is named, and where the cluster is given."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("gpu_type: H100\njobs:\n  - {name: a, layers: 2, hidden: 64, heads: 2, seq: 64, tokens: 1.0e+6, "
                    "gpus: 8}\n")
    ran = vtrain_in_process("cluster", jobs, "--gpus", 8, "-o", tmp_path / "out")
    refused(ran, str(jobs), "unknown top-level key(s) 'gpu_type': a jobs file is a mapping with one key, jobs")
