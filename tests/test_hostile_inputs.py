"""A corpus of hostile and malformed inputs over every command, generated here (nothing committed), each with its
expected outcome:

- ``rejected``: exit code 2, exactly one line ``error: ...`` naming the file (or the flag) and the problem, no
  traceback;
- ``warning``: exit code 0 and at least one ``warning: ...`` line;
- ``accepted``: exit code 0, no error line.

For every case, nothing of the input changes, nothing is left in the output's parent folder but the output itself
(nothing at all when rejected), and the working folder (where ``reports/`` would go) stays empty unless the
command wrote its report there.

The commands run in this process through :func:`vtrain.cli.main.main` (the console script's entry point, with
its signal handlers and one-line usage errors), so that the whole corpus takes seconds, not minutes of start-up.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, TRACES

SHIPPED_PROFILE = REPO / "profiles" / "a100"  # a fitted A100 device model
SMALL_TRACES = TRACES / "hta-sm80-128rank-sampled"  # 2 of 128 ranks: ingests and replays in about a second
RECORDED = TRACES / "t1p1d2"
A100_DATA = REPO / "tests" / "data" / "a100"
GROUND_TRUTH = A100_DATA / "vtrain-a100" / "ground_truth_single.csv"
NCCL_TESTS = A100_DATA / "vtrain-a100" / "nccl-tests-allreduce-a100"

TINY_RUN = """\
model: {layers: 2, hidden: 64, heads: 4, seq: 32, vocab: 512}
parallelism: {tp: 1, pp: 1, dp: 1, micro_batch: 1, global_batch: 1}
"""
A100_RUN = """\
model: {layers: 2, hidden: 1024, heads: 16, seq: 1024, vocab: 51200}
parallelism: {tp: 2, pp: 1, dp: 1, micro_batch: 1, global_batch: 4}
precision: fp16
framework: reference
attention: eager
hardware: {device: A100, device_count: 2}
"""
VTRAIN_JSON = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "max_length": 32,
               "vocab_size": 512, "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
               "data_parallel_size": 1, "micro_batch_size": 1, "global_batch_size": 1, "num_gpus": 1}
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


# ---------------------------------------------------------------------------------------------------- running


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


def run_cli(args: list[str], cwd: Path) -> Ran:
    """``vtrain ARGS`` in this process, in ``cwd``: exit code, stdout and stderr (an uncaught exception is
    written to stderr as the interpreter would, traceback and all)."""
    from vtrain.cli.main import main

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, os.getcwd()
    sys.argv = ["vtrain", *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - exactly what the corpus looks for
                traceback.print_exc()
                code = 99
    finally:
        sys.argv = argv
        os.chdir(here)
        for each, handler in handlers.items():
            signal.signal(each, handler)
    return Ran(code, out.getvalue(), err.getvalue())


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (and every folder, as empty bytes)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"")
            for p in sorted(folder.rglob("*"))}


# ------------------------------------------------------------------------------------------------------ cases

Setup = Callable[[Path], None]


@dataclass
class Case:
    """One hostile input. ``args`` may hold ``{in}`` (this case's input folder), ``{out}`` (the output target,
    in a folder of its own) and ``{profile}`` / ``{traces}`` (a good profile and trace folder, shared)."""

    id: str
    args: list[str]
    setup: Setup | None
    expect: str
    names: str  # what the error line must contain (a path or a flag), formatted like args
    extra: list[Callable[[Path, Ran], None]] = field(default_factory=list)


def files(content: dict[str, str | bytes]) -> Setup:
    """A setup writing files (relative path -> content) into the case's input folder."""
    def write(folder: Path) -> None:
        for name, data in content.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data.encode() if isinstance(data, str) else data)
    return write


def then(*setups: Setup) -> Setup:
    def run(folder: Path) -> None:
        for setup in setups:
            setup(folder)
    return run


def copy_of(source: Path, name: str) -> Setup:
    return lambda folder: shutil.copytree(source, folder / name)


def with_metadata(change: Callable[[dict], object]) -> Setup:
    """A copy of the shipped fitted profile as ``{in}/profile`` whose metadata.json ``change`` edits."""
    def setup(folder: Path) -> None:
        shutil.copytree(SHIPPED_PROFILE, folder / "profile")
        meta_file = folder / "profile" / "metadata.json"
        metadata = json.loads(meta_file.read_text())
        replaced = change(metadata)
        meta_file.write_text(json.dumps(metadata if replaced is None else replaced))
    return setup


def with_table(name: str, frame: Callable[[pl.DataFrame], pl.DataFrame] | bytes) -> Setup:
    """A copy of the shipped profile as ``{in}/profile`` whose table ``name`` is replaced."""
    def setup(folder: Path) -> None:
        shutil.copytree(SHIPPED_PROFILE, folder / "profile")
        path = folder / "profile" / f"{name}.parquet"
        if isinstance(frame, bytes):
            path.write_bytes(frame)
        else:
            frame(pl.read_parquet(path)).write_parquet(path)
    return setup


def run_config_cases() -> list[Case]:
    """Run configs given to `vtrain simulate` (and, for a few, `validate --config`, `calibrate --reference`)."""
    tiny = TINY_RUN
    yaml_cases = {
        "tp-a-word": (tiny.replace("tp: 1", 'tp: "two"'), "tp must be a whole number"),
        "model-a-list": ("model: [2, 64, 4]\n", "model must be a mapping"),
        "parallelism-a-list": (tiny.replace("parallelism: {", "parallelism: [").replace("global_batch: 1}",
                                                                                         "global_batch: 1]"),
                               "parallelism must be a mapping"),
        "hardware-a-string": (tiny + "hardware: A100\n", "hardware must be a mapping"),
        "software-a-list": (tiny + "software: [1, 2]\n", "software must be a mapping"),
        "bucket-nan": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_bucket_mb: .nan}"), "dp_bucket_mb"),
        "bucket-inf": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_bucket_mb: .inf}"), "dp_bucket_mb"),
        "bucket-negative": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_bucket_mb: -5}"),
                            "dp_bucket_mb"),
        "bucket-zero": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_bucket_mb: 0}"), "dp_bucket_mb"),
        "bucket-a-word": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_bucket_mb: big}"), "dp_bucket_mb"),
        "layers-a-million": (tiny.replace("layers: 2", "layers: 1000000"), "layers must be between"),
        "layers-zero": (tiny.replace("layers: 2", "layers: 0"), "layers must be between"),
        "layers-negative": (tiny.replace("layers: 2", "layers: -4"), "layers must be between"),
        "layers-fraction": (tiny.replace("layers: 2", "layers: 2.5"), "layers must be a whole number"),
        "layers-boolean": (tiny.replace("layers: 2", "layers: true"), "layers must be a whole number"),
        "layers-null": (tiny.replace("layers: 2", "layers: null"), "layers must be a whole number"),
        "layers-a-date": (tiny.replace("layers: 2", "layers: 2024-01-01"), "layers must be a whole number"),
        "hidden-a-string-number": (tiny.replace("hidden: 64", 'hidden: "64"'), "hidden must be a whole number"),
        "hidden-1e300": (tiny.replace("hidden: 64", "hidden: 1.0e+300"), "hidden must be a whole number"),
        "tp-2-to-the-70": (tiny.replace("tp: 1", f"tp: {2 ** 70}"), "tp must be between"),
        "seq-zero": (tiny.replace("seq: 32", "seq: 0"), "seq must be between"),
        "vocab-huge": (tiny.replace("vocab: 512", "vocab: 100000000"), "vocab must be between"),
        "heads-a-list": (tiny.replace("heads: 4", "heads: [4]"), "heads must be a whole number"),
        "schedule-a-number": (tiny.replace("global_batch: 1}", "global_batch: 1, schedule: 5}"), "schedule"),
        "schedule-unknown": (tiny.replace("global_batch: 1}", "global_batch: 1, schedule: zigzag}"),
                             "schedule must be one of"),
        "precision-a-list": (tiny + "precision: [fp32]\n", "precision must be a string"),
        "precision-unknown": (tiny + "precision: fp8\n", "precision must be one of"),
        "precision-a-yaml-boolean": (tiny + "precision: off\n", "YAML reads an unquoted yes, no, on or off"),
        "dp-overlap-a-word": (tiny.replace("global_batch: 1}", "global_batch: 1, dp_overlap: maybe}"),
                              "dp_overlap must be true or false"),
        "intra-gbps-negative": (tiny + "hardware: {intra_node_gbps: -1}\n", "intra_node_gbps"),
        "inter-gbps-zero": (tiny + "hardware: {inter_node_gbps: 0}\n", "inter_node_gbps"),
        "cores-zero": (tiny + "hardware: {cores: 0}\n", "cores must be between"),
        "gpus-per-node-huge": (tiny + "hardware: {gpus_per_node: 100000}\n", "gpus_per_node must be between"),
        "device-count-wrong": (tiny + "hardware: {device_count: 3}\n", "does not equal the number of devices"),
        "too-many-micro-batches": (tiny.replace("global_batch: 1}", "global_batch: 10000000}"),
                                   "micro-batches per replica"),
        "duplicate-key": (tiny.replace("layers: 2,", "layers: 2, layers: 4,"), "given twice"),
        "duplicate-section": (tiny + "model: {layers: 4, hidden: 64, heads: 4, seq: 32}\n", "given twice"),
        "billion-laughs": (LAUGHS, "aliases"),
        "alias-in-config": ("m: &m {layers: 2, hidden: 64, heads: 4, seq: 32}\nmodel: *m\n", "aliases"),
        "python-tag": ("model: !!python/object/apply:os.system ['touch pwned']\n", "not valid YAML"),
        "python-name-tag": ("model: !!python/name:os.system\n", "not valid YAML"),
        "custom-tag": (tiny.replace("layers: 2", "layers: !shell 2"), "not valid YAML"),
        "empty-file": ("", "must be a mapping"),
        "a-scalar": ("42\n", "must be a mapping"),
        "a-list": ("- model\n- parallelism\n", "must be a mapping"),
        "unknown-section": (tiny + "optimizer: adam\n", "unknown section"),
        "unknown-field": (tiny.replace("layers: 2", "layers: 2, depth: 3"), "unknown field"),
        "no-model": ("parallelism: {tp: 1}\n", "no 'model' section"),
        "nested-deep": ("model: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        "tab-indented": ("model:\n\tlayers: 2\n", "not valid YAML"),
        "nul-bytes": ("model: {layers: 2\0}\n", "not valid YAML"),
        "unclosed-flow": ("model: {layers: 2, hidden: 64\n", "not valid YAML"),
        "integer-keys": ("model: {1: 2}\n", "unknown field"),
    }
    cases = [Case(f"simulate/{name}", ["simulate", "{in}/run.yaml"], files({"run.yaml": text}), "rejected",
                  "{in}/run.yaml") for name, (text, _) in yaml_cases.items()]
    words = {f"simulate/{name}": word for name, (_, word) in yaml_cases.items()}
    for case in cases:
        case.extra.append(_error_says(words[case.id]))
    raw = {
        "not-utf8": (b"model: {layers: 2, hidden: \xff\xfe}\n", "not UTF-8"),
        "utf16": (TINY_RUN.encode("utf-16"), "not UTF-8"),
        "gzip-bytes": (gzip.compress(TINY_RUN.encode()), "not UTF-8"),
        "huge-file": (b"# " + b"x" * (2 << 20) + b"\n" + TINY_RUN.encode(), "bytes"),
    }
    cases += [Case(f"simulate/{name}", ["simulate", "{in}/run.yaml"], files({"run.yaml": data}), "rejected",
                   "{in}/run.yaml", extra=[_error_says(word)]) for name, (data, word) in raw.items()]
    vtrain_json = {
        "json-nan": ('{"model": {"layers": NaN}}', "NaN is not a JSON number"),
        "json-duplicate-key": ('{"model": {"layers": 2}, "model": {"layers": 3}}', "given twice"),
        "json-truncated": ('{"model": {"layers": 2', "not valid JSON"),
        "json-nested-deep": ('{"model": ' + "[" * 100000 + "]" * 100000 + "}", "nested more than"),
        "vtrain-json-fraction": (json.dumps({**VTRAIN_JSON, "num_layers": 2.5}), "not a whole number"),
        "vtrain-json-a-word": (json.dumps({**VTRAIN_JSON, "tensor_parallel_size": "x"}), "not a whole number"),
        "vtrain-json-overflow": (json.dumps(VTRAIN_JSON).replace('"num_layers": 2', '"num_layers": 1e400'),
                                 "bad value"),
        "vtrain-json-missing-key": (json.dumps({k: v for k, v in VTRAIN_JSON.items() if k != "hidden_size"}),
                                    "missing 'hidden_size'"),
        "vtrain-json-negative-bucket": (json.dumps({**VTRAIN_JSON, "ddp_bucket_size": -1}), "dp_bucket_mb"),
        "vtrain-json-layers-huge": (json.dumps({**VTRAIN_JSON, "num_layers": 10 ** 9}), "layers must be between"),
        "vtrain-json-seq-1e300": (json.dumps({**VTRAIN_JSON, "max_length": 1e300}), "(got 1.000e+300)"),
        # num_gpus 0 was read as tp x pp x dp, silently (an audit)
        "vtrain-json-no-gpus": (json.dumps({**VTRAIN_JSON, "num_gpus": 0}), "device_count must be between 1"),
    }
    cases += [Case(f"simulate/{name}", ["simulate", "{in}/config.json"], files({"config.json": text}), "rejected",
                   "{in}/config.json", extra=[_error_says(word)]) for name, (text, word) in vtrain_json.items()]
    cases += [
        Case("simulate/config-is-a-folder", ["simulate", "{in}/run.yaml"], files({"run.yaml/x": ""}), "rejected",
             "{in}/run.yaml"),
        Case("simulate/config-a-device", ["simulate", "/dev/zero"], None, "rejected", "/dev/zero",
             extra=[_error_says("not a regular file")]),
        Case("simulate/config-a-pipe", ["simulate", "{in}/run.yaml"], lambda folder: os.mkfifo(folder / "run.yaml"),
             "rejected", "{in}/run.yaml", extra=[_error_says("not a regular file")]),
        Case("simulate/huge-string-value", ["simulate", "{in}/run.yaml"],
             files({"run.yaml": TINY_RUN.replace("global_batch: 1}", f"global_batch: 1, schedule: {'x' * 500_000}}}")}),
             "rejected", "{in}/run.yaml", extra=[_error_says("schedule must be one of")]),
        Case("simulate/vtrain-json-switch-a-string", ["simulate", "{in}/config.json"],
             files({"config.json": json.dumps({**VTRAIN_JSON, "use_gradient_bucket": "false"})}), "rejected",
             "{in}/config.json", extra=[_error_says("not true or false")]),
        Case("simulate/config-missing", ["simulate", "{in}/none.yaml"], None, "rejected", "{in}/none.yaml"),
        Case("simulate/accepted", ["simulate", "{in}/run.yaml", "-o", "{out}"], files({"run.yaml": TINY_RUN}),
             "accepted", ""),
        Case("simulate/empty-parallelism-accepted", ["simulate", "{in}/run.yaml"],
             files({"run.yaml": "model: {layers: 2, hidden: 64, heads: 4, seq: 32}\nparallelism:\n"}), "accepted", ""),
        Case("simulate/vtrain-json-accepted", ["simulate", "{in}/config.json"],
             files({"config.json": json.dumps(VTRAIN_JSON)}), "accepted", ""),
    ]
    return cases


def _assert(condition: bool, message: str) -> None:
    assert condition, message


def _error_says(words: str) -> Callable[[Path, Ran], None]:
    def check(folder: Path, ran: Ran) -> None:
        assert words in ran.error_lines[0], f"{words!r} not in {ran.error_lines[0]!r}"
    return check


def cli_value_cases() -> list[Case]:
    """Values given on the command line: zero, negative, NaN or words where a positive number belongs."""
    run = files({"run.yaml": TINY_RUN})
    simulate = [
        ("tp-zero", ["--tp", "0"], "tp must be between"), ("tp-negative", ["--tp", "-1"], "tp must be between"),
        ("tp-a-word", ["--tp", "abc"], "--tp"), ("micro-batch-zero", ["--micro-batch", "0"], "micro_batch"),
        ("bucket-nan", ["--dp-bucket-mb", "nan"], "dp_bucket_mb"),
        ("bucket-negative", ["--dp-bucket-mb", "-1"], "dp_bucket_mb"),
        ("gpus-zero", ["--gpus", "0"], "device_count must be between"),
        ("schedule-unknown", ["--schedule", "zigzag"], "schedule must be one of"),
        ("unknown-flag", ["--layers", "3"], "--layers"),
        ("profile-missing", ["--profile", "{in}/nothing"], "no such profile folder"),
    ]
    cases = [Case(f"simulate-flags/{name}", ["simulate", "{in}/run.yaml", *flags], run, "rejected", "",
                  extra=[_error_says(words)]) for name, flags, words in simulate]
    cases += [
        Case("simulate-flags/output-is-a-file", ["simulate", "{in}/run.yaml", "-o", "{in}/run.yaml", "--force"],
             run, "rejected", "{in}/run.yaml"),
        Case("tables/top-zero", ["tables", "{profile}", "--top", "0"], None, "rejected", "--top"),
        Case("tables/top-negative", ["tables", "{profile}", "--top", "-3"], None, "rejected", "--top"),
        Case("validate/max-error-negative", ["validate", "{traces}", "--max-error", "-1", "-o", "{out}"], None,
             "rejected", "--max-error"),
        Case("validate/nothing-given", ["validate"], None, "rejected", "TRACE_DIR"),
        Case("validate/trace-dir-and-suite", ["validate", "{traces}", "--suite", "{in}/s.yaml"], None,
             "rejected", "not both"),
        Case("fit/fit-every-zero", ["fit", "-o", "{out}", "--fit-every", "0"], None, "rejected", "--fit-every"),
        Case("fit/gpus-per-node-zero", ["fit", "-o", "{out}", "--gpus-per-node", "0"], None, "rejected",
             "--gpus-per-node"),
        Case("fit/missing-source", ["fit", "-o", "{out}", "--nccl-tests", "{in}/none.csv"], None, "rejected",
             "{in}/none.csv"),
        Case("fit/no-source", ["fit", "-o", "{out}"], None, "rejected", "nothing to fit"),
        Case("fit/nccl-tests-binary", ["fit", "-o", "{out}", "--nccl-tests", "{in}/n.csv"],
             files({"n.csv": bytes(range(256)) * 8}), "rejected", "{in}/n.csv"),
        Case("fit/llmcompass-empty-folder", ["fit", "-o", "{out}", "--llmcompass", "{in}/l"],
             lambda folder: (folder / "l").mkdir(), "rejected", "{in}/l"),
        Case("fit/measurements-wrong-columns", ["fit", "-o", "{out}", "--nccl-tests", str(NCCL_TESTS),
                                                "--measurements", "{in}/m.csv"], files({"m.csv": "a,b\n1,2\n"}),
             "rejected", "{in}/m.csv"),
        Case("fit/profile-damaged", ["fit", "-o", "{out}", "--profile", "{in}/profile"],
             with_metadata(lambda m: m.update(ranks="all")), "rejected", "{in}/profile/metadata.json"),
        Case("fit/output-is-a-source", ["fit", "-o", "{in}/n", "--nccl-tests", "{in}/n", "--force"],
             then(lambda folder: (folder / "n").mkdir(), files({"n/a.csv": "x"})), "rejected", "{in}/n"),
        Case("fit/accepted", ["fit", "-o", "{out}", "--nccl-tests", str(NCCL_TESTS)], None, "accepted", ""),
        Case("plan/gpus-beyond-any-cluster", ["plan", "{in}/run.yaml", "--gpus", "99999999999999999999", "-o", "{out}"],
             run, "rejected", "", extra=[_error_says("1.000e+20 GPUs (at most 1,048,576")]),
        Case("plan/gpus-up-to-beyond-any-cluster", ["plan", "{in}/run.yaml", "--gpus", "..1048577", "-o", "{out}"],
             run, "rejected", "", extra=[_error_says("1,048,577 GPUs (at most 1,048,576")]),
        Case("ingest/no-output-flag", ["ingest", "{traces}"], None, "rejected", "-o/--output"),
        Case("ingest/unknown-flag", ["ingest", "{traces}", "-o", "{out}", "--fast"], None, "rejected", "--fast"),
    ]
    record = [("layers-zero", ["--layers", "0"], "layers must be between"),
              ("layers-huge", ["--layers", "100000"], "layers must be between"),
              ("hidden-negative", ["--hidden", "-64"], "hidden must be between"),
              ("tp-zero", ["--tp", "0"], "tp must be between"),
              ("bucket-nan", ["--dp-bucket-mb", "nan"], "dp_bucket_mb"),
              ("steps-zero", ["--steps", "0"], "--steps"),
              ("heads-a-word", ["--heads", "four"], "--heads")]
    base = {"--layers": "2", "--hidden": "64", "--heads": "4", "--seq": "16", "--vocab": "64",
            "--micro-batch": "1", "--global-batch": "2", "--device": "cpu"}
    for name, flags, words in record:
        given = {**base, flags[0]: flags[1]}
        args = ["record", *[x for pair in given.items() for x in pair], "-o", "{out}"]
        cases.append(Case(f"record/{name}", args, None, "rejected", "", extra=[_error_says(words)]))
    return cases


def profile_cases() -> list[Case]:
    """Profile folders given to `vtrain tables` and `vtrain simulate --profile` (the shipped fitted A100 one,
    damaged)."""
    meta = "{in}/profile/metadata.json"
    damaged = {
        "metadata-a-list": (with_metadata(lambda m: [m]), meta),
        "metadata-device-a-string": (with_metadata(lambda m: m.update(device="A100")), meta),
        "metadata-world-size-a-word": (with_metadata(lambda m: m.update(world_size="two")), meta),
        "metadata-world-size-negative": (with_metadata(lambda m: m.update(world_size=-2)), meta),
        "metadata-ranks-words": (with_metadata(lambda m: m.update(ranks=["a"])), meta),
        "metadata-iterations-a-dict": (with_metadata(lambda m: m.update(iterations={"1": 2})), meta),
        "metadata-fitted-a-list": (with_metadata(lambda m: m.update(fitted=[1])), meta),
        "fitted-host-negative": (with_metadata(lambda m: m["fitted"]["host"].update(op_us=-5.0)), meta),
        "fitted-host-nan": (with_metadata(lambda m: m["fitted"]["host"].update(op_us=float("nan"))), meta),
        "fitted-host-huge": (with_metadata(lambda m: m["fitted"]["host"].update(op_us=1e12)), meta),
        "fitted-gemm-rate-absurd": (with_metadata(lambda m: m["fitted"]["gemm"].update(flops_per_s=1e30)), meta),
        "fitted-gemm-rate-a-word": (with_metadata(lambda m: m["fitted"]["gemm"].update(bytes_per_s="fast")), meta),
        "fitted-scale-a-word": (with_metadata(lambda m: m["fitted"].update(non_gemm_scale="big")), meta),
        "fitted-scale-zero": (with_metadata(lambda m: m["fitted"].update(non_gemm_scale=0)), meta),
        "fitted-collectives-a-string": (with_metadata(lambda m: m["fitted"].update(collectives="x")), meta),
        "fitted-bus-zero": (with_metadata(lambda m: m["fitted"]["collectives"][0].update(bus_gbps=0)), meta),
        "fitted-bus-denormal": (with_metadata(lambda m: m["fitted"]["collectives"][0].update(bus_gbps=1e-300)), meta),
        "fitted-alpha-negative": (with_metadata(lambda m: m["fitted"]["collectives"][0].update(alpha_us=-1e6)),
                                  meta),
        "metadata-not-utf8": (then(copy_of(SHIPPED_PROFILE, "profile"),
                                   files({"profile/metadata.json": b'{"kind": "\xff"}'})), meta),
        "metadata-truncated": (then(copy_of(SHIPPED_PROFILE, "profile"),
                                    files({"profile/metadata.json": '{"kind": "prof'})), meta),
        "metadata-nested-deep": (then(copy_of(SHIPPED_PROFILE, "profile"),
                                      files({"profile/metadata.json": "[" * 100000 + "]" * 100000})), meta),
        "table-wrong-type": (with_table("op_latency", lambda f: f.with_columns(pl.col("median_us").cast(pl.String))),
                             "{in}/profile/op_latency.parquet"),
        "table-fractional-counts": (with_table("op_latency", lambda f: f.with_columns(
            pl.col("count").cast(pl.Float64) + 0.5)), "{in}/profile/op_latency.parquet"),
        "table-unrelated-columns": (with_table("nccl_latency", lambda f: pl.DataFrame({"x": [1, 2], "y": ["a", "b"]})),
                                    "{in}/profile/nccl_latency.parquet"),
        "table-null-medians": (with_table("nccl_latency", lambda f: f.with_columns(pl.lit(None).cast(pl.Float64)
                                                                                  .alias("median_us"))),
                               "{in}/profile/nccl_latency.parquet"),
        "table-negative-latency": (with_table("op_latency", lambda f: f.with_columns(-pl.col("median_us"))),
                                   "{in}/profile/op_latency.parquet"),
        "table-nan-latency": (with_table("nccl_latency", lambda f: f.with_columns(pl.lit(float("nan"))
                                                                                 .alias("p90_us"))),
                              "{in}/profile/nccl_latency.parquet"),
        "benchmarks-nan-time": (with_table("op_benchmarks", lambda f: f.with_columns(pl.col("median_us")
                                                                                     * float("nan"))),
                                "{in}/profile/op_benchmarks.parquet"),  # was a NaN iteration time, rc 0
        "table-not-parquet": (with_table("op_latency", b"PAR1 not really"), "{in}/profile/op_latency.parquet"),
        "table-empty-file": (with_table("nccl_latency", b""), "{in}/profile/nccl_latency.parquet"),
        "table-missing": (then(copy_of(SHIPPED_PROFILE, "profile"),
                               lambda folder: (folder / "profile" / "op_latency.parquet").unlink()), "{in}/profile"),
        "metadata-missing": (then(copy_of(SHIPPED_PROFILE, "profile"),
                                  lambda folder: (folder / "profile" / "metadata.json").unlink()), "{in}/profile"),
        "metadata-a-folder": (then(copy_of(SHIPPED_PROFILE, "profile"),
                                   lambda folder: (folder / "profile" / "metadata.json").unlink(),
                                   lambda folder: (folder / "profile" / "metadata.json").mkdir()), meta),
        "profile-is-a-file": (files({"profile": "not a folder"}), "{in}/profile"),
        "profile-empty-folder": (lambda folder: (folder / "profile").mkdir(), "{in}/profile"),
    }
    cases = []
    for name, (setup, names) in damaged.items():
        cases.append(Case(f"tables/{name}", ["tables", "{in}/profile"], setup, "rejected", names))
    # the kernel measurements cut to five rows: the fitted kernel models metadata.json names cannot be rebuilt (the
    # prediction fell back to datasheet kernels, its provenance still saying "fitted")
    cases.append(Case("simulate-profile/benchmarks-cut", ["simulate", "{in}/run.yaml", "--profile", "{in}/profile"],
                      then(with_table("op_benchmarks", lambda f: f.head(5)), files({"run.yaml": A100_RUN})),
                      "rejected", "{in}/profile/op_benchmarks.parquet"))
    for name in ("fitted-host-negative", "fitted-gemm-rate-absurd", "table-wrong-type", "metadata-a-list",
                 "benchmarks-nan-time"):
        setup, names = damaged[name]
        cases.append(Case(f"simulate-profile/{name}", ["simulate", "{in}/run.yaml", "--profile", "{in}/profile"],
                          then(setup, files({"run.yaml": A100_RUN})), "rejected", names))
    cases += [
        Case("tables/shipped-profile-accepted", ["tables", "{profile}"], None, "accepted", ""),
        Case("simulate-profile/shipped-accepted", ["simulate", "{in}/run.yaml", "--profile", "{profile}"],
             files({"run.yaml": A100_RUN}), "accepted", ""),
    ]
    return cases


def suite_cases() -> list[Case]:
    """Suite files given to `vtrain validate --suite` (and one to `vtrain calibrate --suite`)."""
    good_set = f"  - traces: {SMALL_TRACES}\n"
    suites = {
        "billion-laughs": (LAUGHS, "aliases"),
        "alias-of-a-set": (f"sets:\n  - &s {{traces: {SMALL_TRACES}}}\n  - *s\n", "aliases"),
        "duplicate-key": (f"sets:\n{good_set}sets:\n{good_set}", "given twice"),
        "duplicate-key-in-set": (f"sets:\n  - {{traces: {SMALL_TRACES}, traces: /}}\n", "given twice"),
        "python-tag": ("sets: !!python/object/apply:os.system ['touch pwned']\n", "not valid YAML"),
        "sets-not-a-list": ("sets: {traces: x}\n", "non-empty 'sets' list"),
        "sets-empty": ("sets: []\n", "non-empty 'sets' list"),
        "a-list": (f"- traces: {SMALL_TRACES}\n", "non-empty 'sets' list"),
        "empty-file": ("", "non-empty 'sets' list"),
        "set-a-string": ("sets:\n  - traces\n", "must be a mapping"),
        "set-without-traces": ("sets:\n  - {name: x}\n", "must be a mapping with a 'traces' folder"),
        "set-unknown-key": (f"sets:\n  - {{traces: {SMALL_TRACES}, bound: 2}}\n", "unknown key"),
        "bound-negative": (f"sets:\n  - {{traces: {SMALL_TRACES}, max_replay_error_pct: -1}}\n", "max_replay"),
        "bound-nan": (f"sets:\n  - {{traces: {SMALL_TRACES}, max_replay_error_pct: .nan}}\n", "max_replay"),
        "bound-a-string": (f"sets:\n  - {{traces: {SMALL_TRACES}, max_model_error_pct: '2'}}\n", "max_model"),
        "bound-boolean": (f"sets:\n  - {{traces: {SMALL_TRACES}, max_model_error_pct: true}}\n", "max_model"),
        "traces-a-number": ("sets:\n  - {traces: 5}\n", "non-empty path"),
        "traces-missing-folder": ("sets:\n  - {traces: nowhere}\n", "is not a folder"),
        "traces-a-list": ("sets:\n  - {traces: [a, b]}\n", "non-empty path"),
        "set-name-a-path": (f"sets:\n  - {{traces: {SMALL_TRACES}, name: ../escaped}}\n", "must not be a path"),
        "two-sets-one-name": (f"sets:\n{good_set}{good_set}", "two sets are named"),
        "suite-name-a-path": (f"name: ../../escaped\nsets:\n{good_set}", "must not be a path"),
        "suite-name-a-list": (f"name: [a]\nsets:\n{good_set}", "name must be a string"),
        "unknown-top-key": (f"sets:\n{good_set}setz: 1\n", "unknown key"),
        "nested-deep": ("sets: " + "[" * 3000 + "]" * 3000 + "\n", "nested more than"),
    }
    cases = [Case(f"validate-suite/{name}", ["validate", "--suite", "{in}/suite.yaml", "-o", "{out}"],
                  files({"suite.yaml": text}), "rejected", "{in}/suite.yaml", extra=[_error_says(words)])
             for name, (text, words) in suites.items()]
    cases += [
        Case("validate-suite/not-utf8", ["validate", "--suite", "{in}/suite.yaml"],
             files({"suite.yaml": b"sets:\n  - traces: \xc3\x28\n"}), "rejected", "{in}/suite.yaml"),
        Case("validate-suite/too-many-sets", ["validate", "--suite", "{in}/suite.yaml"],
             files({"suite.yaml": "sets:\n" + good_set * 1001}), "rejected", "{in}/suite.yaml",
             extra=[_error_says("at most 1,000")]),
        Case("validate-suite/missing", ["validate", "--suite", "{in}/none.yaml"], None, "rejected",
             "{in}/none.yaml"),
        Case("validate-suite/set-config-broken", ["validate", "--suite", "{in}/suite.yaml", "-o", "{out}"],
             files({"suite.yaml": f"sets:\n  - {{traces: {SMALL_TRACES}, config: run.yaml}}\n",
                    "run.yaml": TINY_RUN.replace("tp: 1", "tp: two")}), "rejected", "{in}/run.yaml"),
        Case("calibrate/suite-billion-laughs", ["calibrate", "{traces}", "--base", "{profile}", "-o", "{out}",
                                                "--suite", "{in}/suite.yaml", "--report-dir", "{out}-report"],
             files({"suite.yaml": LAUGHS}), "rejected", "{in}/suite.yaml"),
        Case("validate-suite/accepted", ["validate", "--suite", "{in}/suite.yaml", "-o", "{out}", "--no-hta"],
             files({"suite.yaml": f"name: small\nsets:\n{good_set}"}), "warning", ""),
    ]
    return cases


def trace_folder_cases() -> list[Case]:
    """Trace folders given to ingest, validate and calibrate: file-level damage (what is inside a valid trace
    is the ingest helper's corpus)."""
    one = "{in}/traces"
    damaged = {
        "missing": (None, "{in}/none"),
        "a-file": (files({"traces": "x"}), one),
        "empty": (lambda folder: (folder / "traces").mkdir(), one),
        "not-json": (files({"traces/rank-0.json": "this is not json"}), "{in}/traces/rank-0.json"),
        "json-a-list": (files({"traces/rank-0.json": "[1, 2, 3]"}), "{in}/traces/rank-0.json"),
        "json-a-number": (files({"traces/rank-0.json": "42"}), "{in}/traces/rank-0.json"),
        "empty-file": (files({"traces/rank-0.json": ""}), "{in}/traces/rank-0.json"),
        "gzip-truncated": (files({"traces/rank-0.json.gz": gzip.compress(b'{"traceEvents": []}' * 50)[:40]}),
                           "{in}/traces/rank-0.json.gz"),
        "not-gzip": (files({"traces/rank-0.json.gz": b"plain text"}), "{in}/traces/rank-0.json.gz"),
        "nested-deep": (files({"traces/rank-0.json": '{"traceEvents": [' + '{"a": ' * 100000 + "1"
                               + "}" * 100000 + "]}"}), "{in}/traces/rank-0.json"),
        "not-utf8": (files({"traces/rank-0.json": b'{"traceEvents": [{"name": "\xff"}]}'}),
                     "{in}/traces/rank-0.json"),
    }
    cases = []
    for name, (setup, names) in damaged.items():
        folder = "{in}/none" if name == "missing" else one
        cases.append(Case(f"ingest/{name}", ["ingest", folder, "-o", "{out}"], setup, "rejected", names))
        cases.append(Case(f"validate/{name}", ["validate", folder, "-o", "{out}", "--no-hta"], setup, "rejected",
                          names))
    cases += [
        Case("calibrate/trace-dir-empty", ["calibrate", "{in}/traces", "--base", "{profile}", "-o", "{out}",
                                           "--report-dir", "{out}-report"],
             damaged["empty"][0], "rejected", one),
        Case("calibrate/base-damaged", ["calibrate", "{traces}", "--base", "{in}/profile", "-o", "{out}",
                                        "--report-dir", "{out}-report"],
             with_metadata(lambda m: m.update(device="A100")), "rejected", "{in}/profile/metadata.json"),
        Case("calibrate/reference-broken", ["calibrate", "{traces}", "--base", "{profile}", "-o", "{out}",
                                            "--reference", "{in}/run.yaml", "--report-dir", "{out}-report"],
             files({"run.yaml": TINY_RUN.replace("layers: 2", "layers: 1000000")}), "rejected", "{in}/run.yaml"),
        Case("ingest/output-is-the-input", ["ingest", "{in}/traces", "-o", "{in}/traces", "--force"],
             copy_of(SMALL_TRACES, "traces"), "rejected", "{in}/traces"),
        Case("ingest/output-under-a-file", ["ingest", "{traces}", "-o", "{in}/file/profile"], files({"file": "x"}),
             "rejected", "{in}/file"),
        Case("validate/config-tp-a-word", ["validate", "{traces}", "--config", "{in}/run.yaml", "-o", "{out}"],
             files({"run.yaml": TINY_RUN.replace("tp: 1", 'tp: "two"')}), "rejected", "{in}/run.yaml"),
        Case("validate/config-billion-laughs", ["validate", "{traces}", "--config", "{in}/run.yaml", "-o",
                                                "{out}"], files({"run.yaml": LAUGHS}), "rejected", "{in}/run.yaml"),
        Case("validate/output-is-a-file", ["validate", "{traces}", "-o", "{in}/file"], files({"file": "x"}),
             "rejected", "{in}/file"),
        Case("ingest/output-name-with-a-line-break", ["ingest", "{traces}", "-o", "{in}/a\nfile/profile"],
             files({"a\nfile": "x"}), "rejected", "{in}/a\\nfile"),
        Case("ingest/accepted-with-warning", ["ingest", "{traces}", "-o", "{out}"], None, "warning", ""),
        Case("validate/accepted-with-warning", ["validate", "{traces}", "-o", "{out}", "--no-hta"], None,
             "warning", ""),
    ]
    return cases


def measurement_cases() -> list[Case]:
    """`vtrain validate --measurements` (file-level problems and flags; bad rows are the accuracy helper's)."""
    rows = GROUND_TRUTH.read_text(encoding="utf-8-sig").splitlines()
    few = "\n".join(rows[:6]) + "\n"
    base = ["validate", "--measurements", "{in}/m.csv", "--profile"]  # {fitted}: the shipped A100 profile
    return [
        Case("measurements/file-missing", [*base, "{fitted}"], None, "rejected", "{in}/m.csv"),
        Case("measurements/no-profile", ["validate", "--measurements", "{in}/m.csv"], files({"m.csv": few}),
             "rejected", "--profile"),
        Case("measurements/profile-damaged", [*base, "{in}/profile"],
             then(files({"m.csv": few}), with_metadata(lambda m: m["fitted"]["host"].update(op_us=-1))),
             "rejected", "{in}/profile/metadata.json"),
        Case("measurements/inter-node-zero", [*base, "{fitted}", "--inter-node-gbps", "0"], files({"m.csv": few}),
             "rejected", "--inter-node-gbps"),
        Case("measurements/inter-node-nan", [*base, "{fitted}", "--inter-node-gbps", "nan"], files({"m.csv": few}),
             "rejected", "--inter-node-gbps"),
        Case("measurements/intra-node-inf", [*base, "{fitted}", "--intra-node-gbps", "inf"], files({"m.csv": few}),
             "rejected", "--intra-node-gbps"),
        Case("measurements/binary-garbage", [*base, "{fitted}"], files({"m.csv": bytes(range(256)) * 4}),
             "rejected", "{in}/m.csv"),
        Case("measurements/empty-file", [*base, "{fitted}"], files({"m.csv": ""}), "rejected", "{in}/m.csv"),
        Case("measurements/header-only", [*base, "{fitted}"], files({"m.csv": rows[0] + "\n"}), "rejected",
             "{in}/m.csv"),
        Case("measurements/row-with-24e9-layers-accepted", [*base, "{fitted}", "-o", "{out}"],
             files({"m.csv": few + "2,16,8,1024,16,24000000000,1024,1,1,2,372.16\n"}), "accepted", "",
             extra=[lambda _, ran: _assert("1 invalid" in ran.out, "the impossible row is not counted invalid")]),
        Case("measurements/accepted", [*base, "{fitted}", "-o", "{out}"], files({"m.csv": few}), "accepted", ""),
    ]


CASES = run_config_cases() + cli_value_cases() + profile_cases() + suite_cases() + trace_folder_cases() \
    + measurement_cases()

#: cases that fail in code the hostile-input work does not own: case id -> the owner and what happens (expected
#: failures, not strict: once the owner fixes one it shows as XPASS and its entry can go)
KNOWN_ELSEWHERE: dict[str, str] = {}


# ------------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A good profile (ingested here) and a good trace folder, both read-only to the cases."""
    root = tmp_path_factory.mktemp("shared")
    traces = root / "traces"
    shutil.copytree(SMALL_TRACES, traces)
    ran = run_cli(["ingest", str(traces), "-o", str(root / "profile")], root)
    assert ran.code == 0, ran.err
    return {"traces": traces, "profile": root / "profile", "fitted": SHIPPED_PROFILE}


def test_the_corpus_is_large_and_covers_every_command() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 100
    commands = {case.args[0] if case.args[0] != "validate" or "--suite" not in case.args and
                "--measurements" not in case.args else " ".join(case.args[:2]) for case in CASES}
    assert {"ingest", "tables", "simulate", "validate", "validate --suite", "validate --measurements",
            "calibrate", "fit", "record"} <= commands
    for outcome in ("rejected", "warning", "accepted"):
        assert any(case.expect == outcome for case in CASES)


@pytest.mark.parametrize("case", [
    pytest.param(case, id=case.id, marks=[pytest.mark.xfail(reason=KNOWN_ELSEWHERE[case.id])]
                 if case.id in KNOWN_ELSEWHERE else []) for case in CASES])
def test_hostile_input(case: Case, shared: dict[str, Path], tmp_path: Path) -> None:
    inputs, parent, cwd = tmp_path / "in", tmp_path / "out", tmp_path / "cwd"
    for folder in (inputs, parent, cwd):
        folder.mkdir()
    if case.setup is not None:
        case.setup(inputs)
    places = {"in": str(inputs), "out": str(parent / "result"), **{k: str(v) for k, v in shared.items()}}
    args = [arg.format(**places) for arg in case.args]
    before, shared_before = snapshot(inputs), {k: snapshot(v) for k, v in shared.items()}

    ran = run_cli(args, cwd)

    assert "Traceback" not in ran.err, ran.err
    if case.expect == "rejected":
        assert ran.code == 2, (ran.code, ran.err)
        assert len(ran.error_lines) == 1 and ran.err.count("\n") == 1, ran.err
        assert case.names.format(**places) in ran.error_lines[0], ran.err
        assert len(ran.error_lines[0]) < 600, "the error line repeats a huge value"
    else:
        assert ran.code == 0, ran.err
        assert not ran.error_lines, ran.err
        assert case.expect == "accepted" or any(line.startswith("warning:") for line in ran.err.splitlines())
    assert snapshot(inputs) == before, "the input changed"
    assert {k: snapshot(v) for k, v in shared.items()} == shared_before, "a shared input changed"
    left = sorted(p.name for p in parent.iterdir())
    assert left == ([] if case.expect == "rejected" or "-o" not in case.args else ["result"]), left
    # nothing in the working folder: no reports/ of a failed run, no file a !!python tag would have touched
    assert sorted(p.name for p in cwd.iterdir()) == [], "something was written to the working folder"
    for check in case.extra:
        check(inputs, ran)
