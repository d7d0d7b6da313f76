"""`vtrain cluster JOBS.yaml --gpus N --profile P [--policy baseline|vtrain|all] [-o OUT] [--json]`: simulate
jobs sharing a GPU cluster, their speed on every allocation from vtrain's best plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from vtrain.cli.errors import user_errors
from vtrain.cli.options import (
    attention_option,
    device_memory_option,
    device_option,
    force_option,
    framework_option,
    gpus_per_node_option,
    inter_node_gbps_option,
    max_micro_batch_option,
    profile_option,
    real_option,
)
from vtrain.errors import InputError
from vtrain.outputs import REPORT, check_output, staged

if TYPE_CHECKING:
    from vtrain.studies.cluster import Job, Speeds

REPORTS = Path("reports")


@user_errors
def cluster_command(
    jobs_file: Path = typer.Argument(..., help="JOBS.yaml: jobs: [{name, layers, hidden, heads, seq, tokens, "
                                               "arrival_h, vocab?, deadline_h?, gpus?, global_batch?}]."),
    gpus: int = typer.Option(..., "--gpus", min=1, max=1 << 20, help="GPUs in the cluster."),
    profile: Path | None = profile_option(),
    policy: str = typer.Option("all", "--policy", help="baseline, vtrain or all."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Report folder (default "
                                                                     "reports/cluster-<jobs file name>)."),
    force: bool = force_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the summary per policy as JSON."),
    resize_overhead_min: float = real_option(5.0, "--resize-overhead-min", 0.0, 1e4,
                                             "Minutes a running job loses when resized (checkpoint-restart)."),
    device: str = device_option(),
    gpus_per_node: int = gpus_per_node_option(),
    inter_node_gbps: float | None = inter_node_gbps_option(),
    device_memory: float | None = device_memory_option(),
    max_micro_batch: int = max_micro_batch_option(),
    framework: str = framework_option(),
    attention: str | None = attention_option("How the jobs run attention: "),
) -> None:
    """Simulate the jobs on a shared cluster under a FIFO baseline and a throughput-aware (vtrain) policy."""
    from vtrain.studies.cluster import POLICIES, Speeds, allocation_sizes, simulate_cluster
    from vtrain.studies.cluster_report import ClusterStudy, study_summary, write_cluster_files
    from vtrain.studies.jobs import read_jobs
    from vtrain.studies.predict import Cluster, describe, plan_throughput

    policies = list(POLICIES) if policy == "all" else [policy]
    if policy != "all" and policy not in POLICIES:
        raise InputError(f"--policy must be one of {', '.join(POLICIES)} or all (got {policy!r})")
    jobs = read_jobs(jobs_file, framework)
    target = output if output is not None else REPORTS / f"cluster-{jobs_file.stem}"
    check_output(target, inputs=[jobs_file, profile], force=force)
    hardware = Cluster(device=device, gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps,
                       device_memory_gib=device_memory, framework=framework, attention=attention or "eager")
    throughput = plan_throughput(profile, hardware, max_micro_batch)
    speeds = Speeds(throughput, allocation_sizes(gpus, [job.gpus for job in jobs if job.gpus]))
    _check_runnable(jobs, gpus, speeds, policies, jobs_file)
    schedules = [simulate_cluster(jobs, gpus, speeds, name, resize_overhead_min / 60) for name in policies]
    study = ClusterStudy(jobs, schedules, speeds, str(profile) if profile else None, resize_overhead_min / 60,
                         describe(hardware))
    with staged(target, REPORT, "cluster") as staging:
        write_cluster_files(study, staging)
    if as_json:
        print(json.dumps({**study_summary(study), "output": str(target)}, indent=2))
        return
    for schedule in schedules:
        print(f"{schedule.policy:>8}: makespan {schedule.makespan_h:.2f} h, mean JCT {schedule.mean_jct_h:.2f} h, "
              f"utilisation {schedule.utilization:.1%}")
    print(f"wrote {target} ({throughput.sweeps} (job, GPUs) plans searched)")


def _check_runnable(jobs: list[Job], gpus: int, speeds: Speeds, policies: list[str], path: Path) -> None:
    """Every job must run under every policy asked for: one line naming the first that cannot."""
    for job in jobs:
        if "baseline" in policies:
            if job.gpus is None:
                raise InputError(f"job {job.name!r}: the baseline policy needs gpus (what the job asks for)", path)
            if job.gpus > gpus:
                raise InputError(f"job {job.name!r} asks for {job.gpus} GPUs, the cluster has {gpus}", path)
            if speeds.at(job, job.gpus) is None:
                raise InputError(f"job {job.name!r}: no plan runs it on the {job.gpus} GPUs it asks for "
                                 "(divisibility or device memory)", path)
        if "vtrain" in policies and not speeds.options(job, gpus):
            raise InputError(f"job {job.name!r}: no plan runs it on any allocation of up to {gpus} GPUs", path)
