"""`vtrain whatif TRACE_DIR [--scale CLASS=FACTOR ...] [--scale-kernel REGEX=FACTOR ...]
[--durations-from OTHER_TRACE_DIR] [-o OUT_DIR] [--json]`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from vtrain.cli.errors import user_errors, warn
from vtrain.errors import InputError
from vtrain.outputs import REPORT, check_output, resolved

if TYPE_CHECKING:
    from vtrain.whatif.changes import Scale

REPORTS = Path("reports")


@user_errors
def whatif_command(
    trace_dir: Path = typer.Argument(..., help="Folder with one Kineto trace per rank (a measured run)."),
    scale: list[str] = typer.Option([], "--scale", help="CLASS=FACTOR: multiply the duration of every operator "
                                                        "of a class (gemm, attention, elementwise/norm, memory, "
                                                        "convolution, other, all_reduce, all_gather, "
                                                        "reduce_scatter, all_to_all, send/recv, broadcast, comm, "
                                                        "host). "
                                                        "Repeatable."),
    scale_kernel: list[str] = typer.Option([], "--scale-kernel", help="REGEX=FACTOR: multiply the duration of "
                                                                      "every kernel/operator whose name matches. "
                                                                      "Repeatable."),
    durations_from: Path | None = typer.Option(None, "--durations-from", help="Another recording of the same job: "
                                                                              "take every op's and kernel's "
                                                                              "duration from it."),
    ops_only: bool = typer.Option(False, "--ops-only", help="With --durations-from: take only operators', kernels' "
                                                            "and transfers' durations; keep this trace set's host "
                                                            "time between operators."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Report folder (default reports/whatif-<trace "
                                                                    "dir name>/)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Re-time a measured run's own dependency graph with changed durations; report the predicted iteration
    time, the new critical path and predicted Chrome traces."""
    from vtrain.whatif.changes import half_a_class, parse_scale, parse_scale_kernel

    scales = [parse_scale(s) for s in scale] + [parse_scale_kernel(s) for s in scale_kernel]
    _each_once(scales, [*scale, *scale_kernel])
    for line in filter(None, map(half_a_class, scales)):
        warn(line)
    if ops_only and durations_from is None:
        raise InputError("--ops-only needs --durations-from", trace_dir)
    if not scales and durations_from is None:
        raise InputError("nothing to change: give --scale, --scale-kernel or --durations-from", trace_dir)
    for folder in (trace_dir, durations_from):
        if folder is not None and not folder.is_dir():
            raise InputError("not a folder", folder)
    target = output or REPORTS / f"whatif-{resolved(trace_dir).name}"
    check_output(target, inputs=[trace_dir, durations_from], replaces=REPORT, command="whatif",
                 what="report folder")

    from vtrain.outputs import staged
    from vtrain.whatif.report import write_whatif_report
    from vtrain.whatif.retime import what_if

    result = what_if(trace_dir, scales, durations_from, ops_only=ops_only, warn=warn)
    with staged(target, REPORT, "whatif") as staging:
        write_whatif_report(result, staging)
    summary = result.summary()
    if as_json:
        print(json.dumps({**summary, "report": str(target)}))
        return
    line = (f"{trace_dir}: measured {summary['measured_ms']:.1f} ms, predicted {summary['predicted_ms']:.1f} ms "
            f"({summary['change_pct']:+.2f} %)")
    if summary.get("other_measured_ms") is not None:
        line += (f"; {durations_from} measured {summary['other_measured_ms']:.1f} ms, "
                 f"error {summary['error_pct']:+.2f} %")
    elif "other_measured_ms" in summary:
        line += f"; {durations_from} has no iteration paired with this one's steady iterations"
    print(line)
    print(f"report: {target}")


def _each_once(scales: list[Scale], texts: list[str]) -> None:
    """An error for a class or pattern given twice (``--scale gemm=2 --scale gemm=3`` multiplied gemm by 6), also
    under two of its names (``--scale norm=0.5 --scale elementwise=0.5`` multiplied that class by 0.25)."""
    seen: dict[object, str] = {}
    for rule, text in zip(scales, texts):
        key = rule.classes if rule.pattern is None and rule.classes else rule.label
        if key in seen:
            flag = "--scale-kernel" if rule.pattern is not None else "--scale"
            also = "" if seen[key].split("=")[0] == text.split("=")[0] else " (two names of one class)"
            raise InputError(f"{flag}: {rule.label} is given twice{also} ({seen[key]}, {text}): give each "
                             "class or pattern once, with the factor it should have")
        seen[key] = text
