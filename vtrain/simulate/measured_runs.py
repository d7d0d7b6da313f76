"""Simulating every run of a table of measured iteration times (any layout read by vtrain.importers.measurements).

Each row becomes a run config with the settings the runs were measured with (see
:func:`vtrain.importers.measurements.measurement_config`) and is simulated exactly as ``vtrain simulate`` would
simulate it with the same profile: the profile's tables first, then its fitted device on the row's hardware
(:func:`vtrain.fit.device.device_for_run`). Rows whose config is inconsistent, or whose measured time is
unusable, are kept with their reason and no prediction, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from vtrain.devices.fitted import FittedDevice
from vtrain.fit.device import for_config
from vtrain.importers.measurements import FRAMEWORK, RECOMPUTE, measurement_config, row_problem
from vtrain.runconfig import RunConfig
from vtrain.simulate.run import simulate
from vtrain.tables.store import Profile


@dataclass(frozen=True)
class Hardware:
    """What a table without the optional columns does not say: node size, link rates, the device name, and the
    activation recomputation and framework of its runs."""

    device: str = "A100-40GB"
    gpus_per_node: int = 8
    inter_node_gbps: float | None = None  # Gbit/s per node
    intra_node_gbps: float | None = None  # GB/s per GPU
    recompute: str = RECOMPUTE
    framework: str = FRAMEWORK


def predict_runs(measurements: pl.DataFrame, profile: Profile | None, device: FittedDevice, hardware: Hardware,
                 rows: list[int] | None = None) -> pl.DataFrame:
    """``measurements`` (from :func:`~vtrain.importers.measurements.read_measurements`) with ``predicted_ms``,
    ``error_pct`` (predicted vs measured, signed), ``memory_gib`` and ``fits`` (the largest stage's memory per GPU
    by the memory model, and whether it fits the device's) and ``invalid`` (why a row was not simulated, else null) added.
    ``device`` is the profile's fitted device (:func:`~vtrain.fit.device.device_from_profile`), put on each row's
    hardware; ``rows`` restricts the prediction to those row numbers."""
    table = measurements if rows is None else measurements.filter(pl.col("row").is_in(rows))
    predicted: list[float | None] = []
    memory: list[float | None] = []
    fits: list[bool | None] = []
    invalid: list[str | None] = []
    done: dict[str, tuple[float, float, bool | None]] = {}  # config -> its prediction: a repeated run is simulated once
    for row in table.iter_rows(named=True):
        problem = row_problem(row)
        config = None if problem else measurement_config(
            row, hardware.gpus_per_node, hardware.device, hardware.inter_node_gbps, hardware.intra_node_gbps,
            hardware.recompute, hardware.framework)
        problem = problem or next(iter(config.constraint_errors()), None)
        if problem or config is None:
            predicted.append(None)
            memory.append(None)
            fits.append(None)
            invalid.append(problem)
            continue
        key = repr(config)
        if key not in done:
            done[key] = _predicted(config, profile, device)
        predicted_ms, memory_gib, fit = done[key]
        predicted.append(predicted_ms)
        memory.append(memory_gib)
        fits.append(fit)
        invalid.append(None)
    return table.with_columns(
        predicted_ms=pl.Series(predicted, dtype=pl.Float64),
        memory_gib=pl.Series(memory, dtype=pl.Float64),
        fits=pl.Series(fits, dtype=pl.Boolean),
        invalid=pl.Series(invalid, dtype=pl.String),
    ).with_columns(error_pct=(pl.col("predicted_ms") / pl.col("iteration_ms") - 1.0) * 100)


def _predicted(config: RunConfig, profile: Profile | None, device: FittedDevice) -> tuple[float, float, bool | None]:
    """One run's predicted iteration time (ms), its largest stage's memory per GPU (GiB) and whether that fits."""
    sim = simulate(config, profile, for_config(device, config))
    return sim.iteration_us / 1e3, sim.largest_stage_bytes / 2**30, sim.fits_device
