"""Building a profile from measurements in other shapes (``vtrain fit``): imported tables, optional traces, the
fitted device model, and the measured iteration times it was fitted on, all recorded in ``metadata.json``."""

from __future__ import annotations

import time
from collections.abc import Container
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

import vtrain
from vtrain.errors import warn_input
from vtrain.devices.catalog import device_model
from vtrain.fit.device import device_metadata, fit_device
from vtrain.fit.held_out import held_out_mape
from vtrain.fit.iterations import every_kth_row, fit_host
from vtrain.fit.traced_host import host_overhead, traced_host
from vtrain.importers import (
    file_digest,
    read_llmcompass,
    read_llmcompass_network,
    read_measurements,
    read_nccl_tests,
    read_vidur_compute,
    read_vidur_network,
)
from vtrain.importers.llmcompass import FILES as LLMCOMPASS_FILES
from vtrain.simulate.measured_runs import Hardware
from vtrain.tables.store import Profile, conform, empty_table, load_profile


@dataclass
class FitSources:
    """Where the measurements come from; every field may be empty."""

    nccl_tests: list[Path] = field(default_factory=list)
    llmcompass: Path | None = None
    vidur_compute: list[Path] = field(default_factory=list)
    vidur_network: list[Path] = field(default_factory=list)
    traces: list[Path] = field(default_factory=list)  # profile folders from `vtrain ingest`
    measurements: Path | None = None  # iteration times to fit host overheads on
    fit_every: int = 10  # fit on rows 1, 1+k, 1+2k, ... of ``measurements``


def build_profile(sources: FitSources, device_name: str, hardware: Hardware,
                  parent: Path | None = None) -> Profile:
    """Import every source, fit the device model and return the profile (not yet written)."""
    groups, nccl, files = _imported(sources)
    benchmarks = list(groups.values())
    traced = [load_profile(p) for p in sources.traces]
    # the traces' operator and collective tables join the fit; their timelines (kernels, CPU ops, collective
    # calls) are of other jobs, whose gaps must not stand for the runs this profile predicts: only the rate their
    # host issued operators at does (the host term, below)
    tables = {name: empty_table(name) for name in ("kernels", "cpu_ops", "collectives")}
    tables["op_latency"] = pl.concat([t.op_latency for t in traced], how="diagonal_relaxed") if traced \
        else empty_table("op_latency")
    tables = {name: conform(frame, name) for name, frame in tables.items()}
    tables["op_benchmarks"] = conform(pl.concat(benchmarks, how="diagonal_relaxed"), "op_benchmarks") \
        if benchmarks else empty_table("op_benchmarks")
    collectives = nccl + [t.nccl_latency for t in traced]  # none: the collectives are modelled from the datasheet
    tables["nccl_latency"] = conform(pl.concat(collectives, how="diagonal_relaxed"), "nccl_latency") \
        if collectives else empty_table("nccl_latency")
    profile = Profile(tables=tables)
    device = fit_device(profile, device_name)
    measured_hosts = [found for path, t in zip(sources.traces, traced) if (found := traced_host(t, device, path))]
    if measured_hosts:  # the host of the recordings (measured iteration times, when given, refit it below)
        device = replace(device, host=host_overhead(measured_hosts), provenance={
            **device.provenance, "host": "; ".join(each.describe() for each in measured_hosts)})
    fit_rows: dict[str, Any] | None = None
    if sources.measurements is not None:
        measured = read_measurements(sources.measurements, recompute=hardware.recompute)
        rows = every_kth_row(measured, sources.fit_every)
        fitted = fit_host(measured, profile, device, hardware, rows, source=sources.measurements)
        if fitted.mape_pct > IMPLAUSIBLE_FIT_PCT:
            warn_input(f"the host terms fitted to its {len(fitted.rows)} rows miss them by {fitted.mape_pct:,.0f} % "
                       f"(MAPE): their times do not fit these kernels (seconds in a column of ms? another GPU's "
                       f"runs?)", sources.measurements)
        device = fitted.device
        fit_rows = {"file": sources.measurements.name, "sha256": file_digest(sources.measurements),
                    "rows": fitted.rows, "every": sources.fit_every, "mape_pct": round(fitted.mape_pct, 3),
                    "hardware": hardware.__dict__}
        files.append(sources.measurements)
    profile.metadata = {
        "kind": "profile",
        "vtrain_version": vtrain.__version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "parent": str(parent) if parent else None,
        "device": {"name": device_name, "type": "cuda"},
        "software": {},
        "sources": [{"file": str(f), "sha256": file_digest(f)} for f in files]
        + [{"profile": str(p), "sources": t.metadata.get("sources", [])} for p, t in zip(sources.traces, traced)],
        "fitted": {**device_metadata(device, device_name),
                   "kernel_held_out": held_out_mape(groups, [g for g in groups if g != LLMCOMPASS_KERNELS],
                                                    device_model(device_name)) if len(groups) > 1 else None},
        "fit_rows": fit_rows,
    }
    return profile


#: names of the groups of kernel measurements (the held-out test leaves each out in turn, but for the first)
LLMCOMPASS_KERNELS, LLMCOMPASS_LAYER = "LLMCompass kernels", "LLMCompass GPT-3 layer"


#: a fit of the host terms that misses the rows it was fitted to by more than this (MAPE, %) is said: the terms
#: only add time, so rows measured far below their kernels' time cannot be fitted (iteration times given in
#: seconds read as ms missed by 100,551 %)
IMPLAUSIBLE_FIT_PCT = 50.0


def _vidur_group(path: Path, taken: Container[str]) -> str:
    """The group of a vidur compute file: its model, named by the file (``phi-2-mlp.csv``) or, in vidur's own
    layout (``.../microsoft/phi-2/mlp.csv``), by its folder; files of one name are told apart by their folders
    (keyed by the file name, every model but the last was lost: an audit)."""
    stem = path.name.removesuffix(".csv").removesuffix("mlp").removesuffix("-") or path.parent.name
    folders = path.resolve().parent.parts
    name, depth = stem, 0
    while f"vidur {name}" in taken and depth < len(folders):
        depth += 1
        name = "/".join((*folders[len(folders) - depth:], stem))
    return f"vidur {name}"


def _imported(sources: FitSources) -> tuple[dict[str, pl.DataFrame], list[pl.DataFrame], list[Path]]:
    """Kernel measurements by group (LLMCompass's kernels, its GPT-3 layer, each vidur model), collective
    tables and the files read."""
    benchmarks: dict[str, pl.DataFrame] = {}
    nccl: list[pl.DataFrame] = []
    files: list[Path] = []
    for path in sources.nccl_tests:
        nccl.append(read_nccl_tests(path))
        files.append(path)
    if sources.llmcompass is not None:
        llmcompass = read_llmcompass(sources.llmcompass)
        benchmarks[LLMCOMPASS_KERNELS] = llmcompass.filter(pl.col("tp").is_null())
        benchmarks[LLMCOMPASS_LAYER] = llmcompass.filter(pl.col("tp").is_not_null())
        if (sources.llmcompass / LLMCOMPASS_FILES["transformer"]).is_file():  # its layer's all-reduces, if there
            nccl.append(read_llmcompass_network(sources.llmcompass))
        files.extend(sorted(p for p in sources.llmcompass.iterdir() if p.suffix == ".csv"))
    for path in sources.vidur_compute:
        benchmarks[_vidur_group(path, benchmarks)] = read_vidur_compute(path)
        files.append(path)
    for path in sources.vidur_network:
        nccl.append(read_vidur_network(path))
        files.append(path)
    return benchmarks, nccl, files
