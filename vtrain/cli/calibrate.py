"""`vtrain calibrate NEW_TRACE_DIR --base profiles/OLD -o profiles/NEW [--suite S] [--reference RUN] [--report-dir DIR]
[--force] [--json]`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from vtrain.calibrate.calibration import calibrate, write_calibration
from vtrain.cli.errors import user_errors, warn
from vtrain.report.drift import print_drift

REPORTS = Path("reports")


@user_errors
def calibrate_command(
    trace_dir: Path = typer.Argument(..., help="Folder with the new traces, one Kineto trace per rank."),
    base: Path = typer.Option(..., "--base", help="The profile to compare against (profiles/OLD)."),
    output: Path = typer.Option(..., "-o", "--output", help="Profile folder to write (profiles/NEW); its name is "
                                                            "the new version."),
    suite: Path | None = typer.Option(None, "--suite", help="Re-run this validation suite (validators/NAME.yaml) "
                                                            "with the old and the new profile."),
    reference: Path | None = typer.Option(None, "--reference", help="Run config whose predicted iteration time is "
                                                                    "compared (default: NEW_TRACE_DIR/run.yaml)."),
    report_dir: Path | None = typer.Option(None, "--report-dir", help="Drift report folder (default "
                                                                      "reports/calibrate-<NEW name>/)."),
    force: bool = typer.Option(False, "--force", help="Replace the profile folder if it exists."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable summary."),
) -> None:
    """Ingest new traces as a version of a base profile; report what drifted (operators, collectives, kernels,
    software versions, a reference run's predicted time) and write the new profile with its lineage."""
    result = calibrate(trace_dir, base, output, report_dir=report_dir or REPORTS / f"calibrate-{output.name}",
                       reference=reference, suite=suite, force=force, warn=warn)
    write_calibration(result, force=force)
    if as_json:
        sys.stdout.write(json.dumps(result.summary()) + "\n")
    else:
        print_drift(result)
