"""`vtrain simulate CONFIG [--profile DIR] [-o OUT_DIR] [--json]`: predict one training iteration."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import typer

from vtrain.cli.errors import user_errors
from vtrain.outputs import check_output
from vtrain.runconfig import load_run_config
from vtrain.simulate import Simulation, simulate
from vtrain.simulate.chrome_trace import write_chrome_traces
from vtrain.simulate.summary import CATEGORIES, describe_task
from vtrain.tables.store import load_profile

_SHOWN_STAGES = 8
_SHOWN_PATH = 4


@user_errors
def simulate_command(
    config: Path = typer.Argument(..., help="Run config: run.yaml (or its folder), a YAML/JSON in the run-config "
                                            "schema, or vTrain's config JSON."),
    profile: Path | None = typer.Option(None, "--profile", help="Profile folder from `vtrain ingest` (op and "
                                                                  "NCCL latencies); without it every latency is "
                                                                  "modelled."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Write the predicted timeline here: one "
                                                                     "Chrome trace per simulated rank."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    force: bool = typer.Option(False, "--force", help="Replace the output folder if it exists."),
    tp: int | None = typer.Option(None, "--tp", help="Override tensor-parallel size."),
    pp: int | None = typer.Option(None, "--pp", help="Override pipeline-parallel size."),
    dp: int | None = typer.Option(None, "--dp", help="Override data-parallel size."),
    micro_batch: int | None = typer.Option(None, "--micro-batch", help="Override sequences per micro-batch."),
    global_batch: int | None = typer.Option(None, "--global-batch", help="Override sequences per iteration."),
    schedule: str | None = typer.Option(None, "--schedule", help="Override schedule: 1f1b, gpipe, interleaved."),
    virtual_stages: int | None = typer.Option(None, "--virtual-stages", help="Override model chunks per stage."),
    recompute: str | None = typer.Option(None, "--recompute", help="Override recomputation: none or full."),
    dp_overlap: bool | None = typer.Option(None, "--dp-overlap/--no-dp-overlap",
                                           help="Override overlapping of the gradient all-reduce."),
    dp_bucket_mb: float | None = typer.Option(None, "--dp-bucket-mb", help="Override gradient bucket size (MiB)."),
    gpus: int | None = typer.Option(None, "--gpus", help="Override the number of devices."),
    device: str | None = typer.Option(None, "--device", help="Override the device (A100, H100, cpu, ...)."),
) -> None:
    """Predict the iteration time, breakdown and timeline of a run config."""
    run = load_run_config(config).with_overrides(
        tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=global_batch, schedule=schedule,
        virtual_stages=virtual_stages, recompute=recompute, dp_overlap=dp_overlap, dp_bucket_mb=dp_bucket_mb)
    if gpus is not None or device is not None:
        hardware = run.hardware
        run = replace(run, hardware=replace(hardware,
                                            device_count=hardware.device_count if gpus is None else gpus,
                                            device=hardware.device if device is None else device))
    if output is not None:
        check_output(output, inputs=[config, profile], force=force)
    table = load_profile(profile) if profile is not None else None
    sim = simulate(run, table, source=config)
    written = write_chrome_traces(sim, output, overwrite=force) if output is not None else []
    if as_json:
        summary = sim.to_dict()
        summary["traces"] = [str(path) for path in written]
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(sim))
        if written:
            print(f"wrote {len(written)} trace(s) to {output}")


def format_summary(sim: Simulation) -> str:
    """The human-readable summary."""
    ms = 1e-3
    par = sim.config.parallelism
    total = sim.iteration_us
    lines = [
        f"iteration time   {total * ms:,.3f} ms",
        f"parallelism      t={par.tp} d={par.dp} p={par.pp}, {par.micro_batches} micro-batches of "
        f"{par.micro_batch}, {par.schedule}"
        + (f" (v={par.virtual_stages})" if par.virtual_stages > 1 else "")
        + f", recompute {par.recompute}, dp overlap {'on' if par.dp_overlap else 'off'}",
        f"device           {sim.device.describe()}",
        f"profile          {sim.profile_path or 'none (every latency modelled)'}",
        "breakdown (mean per GPU)",
    ]
    for key in CATEGORIES:
        value = sim.breakdown_us[key]
        share = value / total if total > 0 else 0.0
        lines.append(f"  {key:<10} {value * ms:>12,.3f} ms  {share:6.1%}")
    shares = sim.coverage_share
    lines.append("coverage         " + "  ".join(f"{key} {shares[key]:.1%}" for key in shares)
                 + "  (distinct signatures: "
                 + ", ".join(f"{key} {count}" for key, count in sim.distinct_sources.items()) + ")")
    lines.append("stages           stage  rank   busy ms   idle ms   bubble ms   memory GiB")
    for summary, memory in list(zip(sim.stages, sim.memory))[:_SHOWN_STAGES]:
        lines.append(f"                 {summary.stage:>5} {summary.rank:>5} {summary.busy_us * ms:>9,.1f} "
                     f"{summary.idle_us * ms:>9,.1f} {summary.breakdown_us['bubble'] * ms:>11,.1f} "
                     f"{memory.total_bytes / 2**30:>12,.2f}")
    if len(sim.stages) > _SHOWN_STAGES:
        lines.append(f"                 ... {len(sim.stages) - _SHOWN_STAGES} more (--json for all)")
    path = [describe_task(sim.graph.tasks[i]) for i in sim.critical_path]
    shown = path if len(path) <= 2 * _SHOWN_PATH else path[:_SHOWN_PATH] + ["..."] + path[-_SHOWN_PATH:]
    lines.append(f"critical path    {len(path)} tasks: " + " -> ".join(shown))
    return "\n".join(lines)
