"""`vtrain validate TRACE_DIR [--config RUN] [--profile PROFILE_DIR] [-o REPORT_DIR] [--max-error PCT] [--json]`
and `vtrain validate --suite validators/NAME.yaml`."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import typer

from vtrain.cli.errors import user_errors, warn
from vtrain.cli.options import attention_option, framework_option, recompute_option
from vtrain.distributed import workers_within_cores
from vtrain.errors import InputError, InputWarning
from vtrain.importers.measurements import FRAMEWORK, RECOMPUTE
from vtrain.ingest.discover import find_trace_files
from vtrain.ingest.pipeline import default_workers
from vtrain.limits import real_problem
from vtrain.outputs import REPORT, check_output, resolved, staged, write_json, write_text
from vtrain.report.suite import SetResult, print_suite, render_suite_markdown
from vtrain.report.terminal import print_summary
from vtrain.report.validation import write_report_files
from vtrain.validate.suite import SUITE_METRICS, SUITE_REPORT, SuiteEntry, check, load_suite
from vtrain.validate.traces import Prepared, finish_validation, prepare_validation, traced_run_config

EXIT_TOO_FAR = 1
REPORTS = Path("reports")


@user_errors
def validate_command(
    trace_dir: Path | None = typer.Argument(None, help="Folder with one Kineto trace per rank (and run.yaml when "
                                                       "recorded by `vtrain record`)."),
    config: Path | None = typer.Option(None, "--config", help="Run config to simulate (run.yaml, vtrain YAML/JSON, "
                                                              "vTrain's config JSON, or the run's Megatron-LM log); "
                                                              "default: TRACE_DIR/run.yaml."),
    profile: Path | None = typer.Option(None, "--profile", help="Latency tables for the model (a profile folder); "
                                                                "default: built from the same traces without the "
                                                                "iterations under test."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Report folder (default reports/<trace dir "
                                                                    "name>/, or reports/suite-<name>/)."),
    max_error: float | None = typer.Option(None, "--max-error", min=0.0, help="Exit 1 when a prediction's "
                                                                               "iteration-time error is above "
                                                                               "this many percent."),
    suite: Path | None = typer.Option(None, "--suite", help="Run a validation suite (validators/NAME.yaml) "
                                                            "instead of one folder."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    no_hta: bool = typer.Option(False, "--no-hta", help="Skip HTA's analysis of the measured and predicted traces "
                                                        "(it parses every trace folder again)."),
    measurements: Path | None = typer.Option(None, "--measurements", help="Measured runs to predict with "
                                                                          "--profile's fitted device model: a table "
                                                                          "(CSV or Markdown; vTrain's columns or short "
                                                                          "names, any order), a Megatron-LM training "
                                                                          "log, or a folder of them."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="With --measurements: GPUs per node."),
    inter_node_gbps: float | None = typer.Option(None, "--inter-node-gbps", min=0.0,
                                                 help="With --measurements: network Gbit/s per node (default: "
                                                      "the profile's multi-node collective fits)."),
    intra_node_gbps: float | None = typer.Option(None, "--intra-node-gbps", min=0.0,
                                                 help="With --measurements: GPU-to-GPU GB/s within a node "
                                                      "(default: the profile's single-node fits)."),
    recompute: str | None = recompute_option("With --measurements: activation recomputation (none, selective or "
                                             "full) of rows without that column (default full).", default=None),
    framework: str | None = framework_option("With --measurements: whose kernels, mixed precision and optimizer "
                                             "states the rows without a framework column ran with (default "
                                             "megatron): ", default=None),
    attention: str | None = attention_option("With --measurements: how the rows without an attention column ran "
                                             "it: "),
    device: str | None = typer.Option(None, "--device", help="With --measurements: the GPU of rows without a device "
                                                             "column, a variant of the profile's (A100-80GB with an "
                                                             "A100-40GB profile; default: the profile's)."),
    workers: int | None = typer.Option(None, "--workers", min=1, help="Processes reading the rank files in "
                                                                      "parallel (default: one per core for a large "
                                                                      "folder, one for a small one)."),
    ray: bool = typer.Option(False, "--ray", help="Read the rank files as Ray tasks (pip install 'vtrain[ray]'; "
                                                  "the folder on a shared file system): on the cluster at "
                                                  "--ray-address, else RAY_ADDRESS, else a local one."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address (ray://HOST:10001, "
                                                                       "auto); implies --ray."),
) -> None:
    """Compare the replay and the model-driven prediction with measured traces; write the report. With
    --measurements, predict a table of measured iteration times instead."""
    if measurements is not None:
        if trace_dir is not None or suite is not None:
            raise InputError("give --measurements without a TRACE_DIR or --suite")
        if profile is None:
            raise InputError("--measurements needs --profile (a profile with a fitted device model)")
        given = {column: f"--{column} {value}" for column, value in (("recompute", recompute), ("device", device),
                                                                     ("framework", framework),
                                                                     ("attention", attention)) if value is not None}
        _measurements(measurements, profile, output, max_error, as_json, gpus_per_node, inter_node_gbps,
                      intra_node_gbps, recompute or RECOMPUTE, device, framework or FRAMEWORK, attention or "eager",
                      given)
        return
    given = [flag for flag, value in (("--device", device), ("--inter-node-gbps", inter_node_gbps),
                                      ("--intra-node-gbps", intra_node_gbps), ("--recompute", recompute),
                                      ("--framework", framework), ("--attention", attention)) if value is not None]
    if given:
        raise InputError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --measurements (a trace "
                         f"folder's run is described by its run.yaml or --config)")
    if suite is not None:
        if trace_dir is not None:
            raise InputError("give either a TRACE_DIR or --suite, not both")
        _suite(suite, output, max_error, as_json, not no_hta)
        return
    if trace_dir is None:
        raise InputError("give a TRACE_DIR (a folder of traces) or --suite validators/NAME.yaml")
    target = output or REPORTS / resolved(trace_dir).name
    check_output(target, inputs=[trace_dir, config, profile], replaces=REPORT, command="validate",
                 what="report folder")
    _check_inputs(trace_dir, config)
    files = find_trace_files(trace_dir)
    prepared = prepare_validation(trace_dir, config_path=config, profile_dir=profile, warn=warn,
                                  workers=workers_within_cores(workers, warn) if workers else default_workers(files),
                                  ray_address=ray_address or ("local" if ray else None))
    with staged(target, REPORT, "validate") as staging:  # created only now, when there are results to write
        result = finish_validation(prepared, staging, with_hta=not no_hta)
        write_report_files(result, staging)
    errors = [result.replay.error_pct] + ([result.model.error_pct] if result.model else [])
    passed = all(check(e, max_error) for e in errors)
    said = passed if max_error is not None else None  # no --max-error: nothing to pass (not "passed")
    if as_json:
        print(json.dumps({**result.summary(), "report": str(target), "max_error": max_error, "passed": said}))
    else:
        print_summary(result, str(target))
    if not passed:
        if not as_json:
            print(f"iteration-time error above --max-error {max_error:g} %", file=sys.stderr)
        raise typer.Exit(EXIT_TOO_FAR)


def _check_inputs(trace_dir: Path, config: Path | None) -> None:
    """The checks that need no trace parsed (a folder with traces, a readable and consistent run config), made
    before any work: bad input is refused at once."""
    find_trace_files(trace_dir)
    if config is not None:
        with warnings.catch_warnings():  # said once, when the validation reads it
            warnings.simplefilter("ignore", InputWarning)
            traced_run_config(trace_dir, config)


def _suite(path: Path, output: Path | None, max_error: float | None, as_json: bool, with_hta: bool) -> None:
    loaded = load_suite(path)
    target = output or REPORTS / f"suite-{loaded.name}"
    check_output(target, inputs=[path, *(i for e in loaded.entries for i in (e.traces, e.config, e.profile))],
                 replaces=REPORT, command="validate", what="report folder")
    for entry in loaded.entries:
        _check_inputs(entry.traces, entry.config)
    results: list[SetResult] = []

    def prepare(entry: SuiteEntry) -> Prepared:
        return prepare_validation(entry.traces, config_path=entry.config, profile_dir=entry.profile, warn=warn)

    first = prepare(loaded.entries[0])
    with staged(target, REPORT, "validate") as staging:  # created only once the first set has results to write
        for index, entry in enumerate(loaded.entries):
            prepared = first if index == 0 else prepare(entry)
            folder = staging / entry.name
            folder.mkdir()
            result = finish_validation(prepared, folder, with_hta=with_hta)
            write_report_files(result, folder)
            results.append(SetResult(entry=entry, summary=result.summary()))
        write_text(staging / SUITE_REPORT, render_suite_markdown(loaded, results))
        write_json(staging / SUITE_METRICS, {"suite": loaded.name, "sets": [r.to_dict() for r in results],
                                             "passed": all(r.passed for r in results)})
    passed = all(r.passed for r in results) and all(
        check(r.error(p), max_error) for r in results for p in ("replay", "model"))
    if as_json:
        print(json.dumps({"suite": loaded.name, "report": str(target), "passed": passed,
                          "sets": [r.to_dict() for r in results]}))
    else:
        print_suite(loaded, results, str(target))
    if not passed:
        raise typer.Exit(EXIT_TOO_FAR)


def _measurements(path: Path, profile: Path, output: Path | None, max_error: float | None, as_json: bool,
                  gpus_per_node: int, inter_node_gbps: float | None, intra_node_gbps: float | None,
                  recompute: str, device: str | None, framework: str, attention: str, given: dict[str, str]) -> None:
    from vtrain.cli.progress import counting
    from vtrain.report.measurements import terminal_lines, write_measurement_report
    from vtrain.validate.measurements import flags_no_row_takes, validate_measurements

    if not path.is_file() and not path.is_dir():  # a folder: its tables and Megatron logs
        raise InputError("is not a regular file (a pipe or a device), not a table of measurements"
                         if path.exists() else "no such file", path)
    for flag, value in (("inter_node_gbps", inter_node_gbps), ("intra_node_gbps", intra_node_gbps)):
        problem = None if value is None else real_problem(flag, value)
        if problem:
            raise InputError(f"--{flag.replace('_', '-')}: {problem}")
    target = output or REPORTS / f"measurements-{path.stem}"
    check_output(target, inputs=[path, profile], replaces=REPORT, command="validate", what="report folder")
    with counting("predicting runs") as progress:  # on stderr, where it is a terminal
        result = validate_measurements(path, profile, gpus_per_node, inter_node_gbps, intra_node_gbps, warn,
                                       recompute, progress, device, framework, attention)
    unused = flags_no_row_takes(result.table, given)
    if unused:
        warn(unused)
    summary = result.to_dict()
    if not summary["rows"] and summary["invalid"] and not summary["excluded"]:
        raise InputError(f"no row could be predicted ({summary['invalid']} refused; first: row "
                         f"{summary['invalid_rows'][0]['row']}, {summary['invalid_rows'][0]['invalid']})", path)
    with staged(target, REPORT, "validate") as staging:
        write_measurement_report(result, staging)
    passed = check(summary["mape_pct"], max_error) if summary["mape_pct"] is not None else True
    if as_json:
        print(json.dumps({key: summary[key] for key in ("mape_pct", "rows", "excluded", "invalid",
                                                         "median_abs_error_pct", "max_abs_error_pct", "measured_as")}
                         | {"report": str(target), "max_error": max_error,
                            "passed": passed if max_error is not None else None}))
    else:
        print("\n".join(terminal_lines(result)))
        print(f"report: {target}")
    if not passed:
        if not as_json:
            print(f"MAPE above --max-error {max_error:g} %", file=sys.stderr)
        raise typer.Exit(EXIT_TOO_FAR)
