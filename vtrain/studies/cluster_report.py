"""The cluster study's output: ``report.md`` / ``report.html`` (summary, a Gantt chart and a job table per
policy, the predicted speed of every job on every allocation), ``schedule.json`` and ``jobs.csv``."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtrain.outputs import write_json, write_text
from vtrain.report.document import Bullets, Document, Figure, Section, TableBlock, Text, render_html, render_markdown
from vtrain.studies.cluster import Job, JobResult, Schedule, Speeds
from vtrain.studies.predict import STUDIED_SPACE


@dataclass(frozen=True)
class ClusterStudy:
    """What was simulated and how."""

    jobs: list[Job]
    schedules: list[Schedule]
    speeds: Speeds
    profile: str | None
    resize_overhead_h: float
    hardware: str


def study_summary(study: ClusterStudy) -> dict[str, Any]:
    """The JSON summary (``--json``, ``schedule.json``): one entry per policy."""
    return {"cluster_gpus": study.schedules[0].cluster_gpus, "profile": study.profile,
            "hardware": study.hardware, "resize_overhead_h": study.resize_overhead_h,
            "speed_source": "modelled: each job's best plan per allocation, timed by vtrain from the profile",
            "plans_searched": STUDIED_SPACE,
            "policies": {s.policy: s.to_dict() for s in study.schedules}}


def write_cluster_files(study: ClusterStudy, folder: Path) -> None:
    """Every file of the study into ``folder`` (a staging folder)."""
    document = cluster_document(study)
    write_text(folder / "report.md", render_markdown(document))
    write_text(folder / "report.html", render_html(document))
    write_json(folder / "schedule.json", study_summary(study))
    with (folder / "jobs.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["policy", "job", "arrival_h", "start_h", "end_h", "jct_h", "gpu_hours", "deadline_h",
                         "met_deadline", "allocations"])
        for schedule in study.schedules:
            for job in schedule.jobs:
                writer.writerow([schedule.policy, job.name, f"{job.arrival_h:g}", f"{job.start_h:.4f}",
                                 f"{job.end_h:.4f}", f"{job.jct_h:.4f}", f"{job.gpu_hours:.2f}",
                                 "" if job.deadline_h is None else f"{job.deadline_h:g}",
                                 "" if job.met_deadline is None else job.met_deadline, _allocations(job)])


def cluster_document(study: ClusterStudy) -> Document:
    """The report's sections."""
    gpus = study.schedules[0].cluster_gpus
    heading = [
        Text(f"{len(study.jobs)} jobs on {gpus} GPUs ({study.hardware}); profile {study.profile}."),
        Text("Speeds are modelled: each job's speed on an allocation is the best plan's for that many GPUs, timed "
             f"from the profile as `vtrain simulate` times it. {STUDIED_SPACE} Resizing a running job costs "
             f"{study.resize_overhead_h * 60:g} min at its new speed (checkpoint-restart).", note=True),
        TableBlock(_summary_table(study.schedules)),
    ]
    sections = [Section("Schedules", [Figure(gantt_figure(study.schedules))])]
    for schedule in study.schedules:
        sections.append(Section(f"Policy: {schedule.policy}", [TableBlock(_job_table(schedule))], level=3))
    sections.append(Section("Predicted speeds (tokens/s, best plan) per job and allocation",
                            [TableBlock(_speed_table(study))]))
    sections.append(Section("Policies", [Bullets([
        ("baseline: first come, first served; each job gets exactly the GPUs it asked for once that many are "
         "free and every earlier job has started, and keeps them to the end."),
        ("vtrain: at every arrival and completion the cluster is handed out again, step by step, to the job "
         "whose predicted speed gains the most per added GPU, measured as the share of its remaining work done "
         "per hour; allocations are the sizes in the speed table."),
    ])]))
    return Document(title="Multi-tenant cluster: baseline versus vtrain-aware scheduling", heading=heading,
                    sections=sections)


def gantt_figure(schedules: list[Schedule]):  # -> plotly Figure
    """One Gantt chart per policy (rows: jobs; bars: allocations, labelled with their GPUs)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=len(schedules), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                           subplot_titles=[f"{s.policy}: makespan {s.makespan_h:.1f} h, mean JCT "
                                           f"{s.mean_jct_h:.1f} h, utilisation {s.utilization:.0%}"
                                           for s in schedules])
    for row, schedule in enumerate(schedules, start=1):
        for job in schedule.jobs:
            figure.add_trace(go.Bar(
                y=[job.name] * len(job.segments), base=[s.start_h for s in job.segments],
                x=[s.end_h - s.start_h for s in job.segments], orientation="h", name=job.name,
                text=[f"{s.gpus}" for s in job.segments], textposition="inside", showlegend=row == 1,
                legendgroup=job.name,
                hovertext=[f"{job.name}: {s.gpus} GPUs, {s.plan}, {s.start_h:.2f}-{s.end_h:.2f} h"
                           for s in job.segments], hoverinfo="text"), row=row, col=1)
            figure.add_trace(go.Scatter(x=[job.arrival_h], y=[job.name], mode="markers", showlegend=False,
                                        marker={"symbol": "triangle-right", "color": "black"},
                                        hovertext=[f"{job.name} arrives"], hoverinfo="text"), row=row, col=1)
    figure.update_layout(barmode="overlay", height=260 * len(schedules) + 80, title="GPUs per job over time")
    figure.update_xaxes(title_text="hours", row=len(schedules), col=1)
    return figure


def _summary_table(schedules: list[Schedule]) -> tuple[list[str], list[list[str]]]:
    rows = []
    for s in schedules:
        deadlines = sum(1 for j in s.jobs if j.deadline_h is not None)
        met = sum(1 for j in s.jobs if j.met_deadline)
        rows.append([s.policy, f"{s.makespan_h:.2f}", f"{s.mean_jct_h:.2f}", f"{s.utilization:.1%}",
                     f"{met} of {deadlines}" if deadlines else "–"])
    return ["policy", "makespan h", "mean JCT h", "utilisation", "deadlines met"], rows


def _job_table(schedule: Schedule) -> tuple[list[str], list[list[str]]]:
    rows = [[j.name, f"{j.arrival_h:g}", f"{j.start_h:.2f}", f"{j.end_h:.2f}", f"{j.jct_h:.2f}",
             f"{j.gpu_hours:,.0f}", "–" if j.met_deadline is None else ("yes" if j.met_deadline else "no"),
             _allocations(j)] for j in schedule.jobs]
    return ["job", "arrival h", "start h", "end h", "JCT h", "GPU-hours", "deadline met", "allocations"], rows


def _allocations(job: JobResult) -> str:
    return "; ".join(f"{s.gpus} GPUs {s.plan} {s.start_h:.2f}-{s.end_h:.2f} h" for s in job.segments)


def _speed_table(study: ClusterStudy) -> tuple[list[str], list[list[str]]]:
    sizes = study.speeds.sizes
    rows = []
    for job in study.jobs:
        cells = []
        for gpus in sizes:
            if gpus > study.schedules[0].cluster_gpus:
                continue
            prediction = study.speeds.at(job, gpus)
            cells.append("–" if prediction is None else
                         f"{prediction.tokens_per_s:,.0f} ({prediction.label}, MFU "
                         f"{prediction.plan.get('mfu', float('nan')):.0%})")
        rows.append([job.name, *cells])
    return ["job", *[f"{g} GPUs" for g in sizes if g <= study.schedules[0].cluster_gpus]], rows
