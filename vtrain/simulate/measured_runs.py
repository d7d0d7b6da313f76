"""Simulating every run of a table of measured iteration times (any layout read by vtrain.importers.measurements).

Each row becomes a run config with the settings the runs were measured with (see
:func:`vtrain.importers.measurements.measurement_config`) and is simulated exactly as ``vtrain simulate`` would
simulate it with the same profile: the profile's tables first, then its fitted device on the row's hardware
(:func:`vtrain.fit.device.device_for_run`). Rows whose config is inconsistent, or whose measured time is
unusable, are kept with their reason and no prediction, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from vtrain.devices.catalog import DATASHEET_DEVICES, canonical_device_name
from vtrain.devices.fitted import FittedDevice
from vtrain.fit.device import device_problem, on_run_hardware
from vtrain.flops import mfu
from vtrain.importers.measurements import FRAMEWORK, RECOMPUTE, measurement_config, row_problem
from vtrain.model.ops import PRECISION_DTYPE
from vtrain.runconfig import RunConfig
from vtrain.simulate.run import SharedResolvers, simulate
from vtrain.tables.store import Profile


@dataclass(frozen=True)
class Hardware:
    """What a table without the optional columns does not say: node size, link rates, the device name, and the
    activation recomputation, framework and attention of its runs."""

    device: str = "A100-40GB"
    gpus_per_node: int = 8
    inter_node_gbps: float | None = None  # Gbit/s per node
    intra_node_gbps: float | None = None  # GB/s per GPU
    recompute: str = RECOMPUTE
    framework: str = FRAMEWORK
    attention: str = "eager"


#: a progress callback: (distinct runs simulated so far, distinct runs to simulate)
Progress = Callable[[int, int], None]

#: how much the resolvers shared by a table's runs may hold (:meth:`SharedResolvers.held`) before fresh ones
#: replace them: a table of many shapes (a million rows) would otherwise keep every shape's latencies (about
#: 0.2 MiB a shape); 10,000 is some 100 MiB, and a fresh set costs a run about 5 ms more
MAX_HELD = 10_000
#: resolvers kept for this many GPUs and link rates (each row may give its own) before all are replaced
MAX_HARDWARE = 4


def predict_runs(measurements: pl.DataFrame, profile: Profile | None, device: FittedDevice, hardware: Hardware,
                 rows: list[int] | None = None, progress: Progress | None = None) -> pl.DataFrame:
    """``measurements`` (from :func:`~vtrain.importers.measurements.read_measurements`) with ``predicted_ms``,
    ``error_pct`` (predicted vs measured, signed), ``memory_gib`` and ``fits`` (the largest stage's memory per GPU
    by the memory model, and whether it fits the device's) and ``invalid`` (why a row was not simulated, else null) added.
    ``device`` is the profile's fitted device (:func:`~vtrain.fit.device.device_from_profile`), put on each row's
    hardware; ``rows`` restricts the prediction to those row numbers. Each distinct run is simulated once;
    ``progress`` is called with (0, distinct runs) before the first and (runs simulated, distinct runs) after
    each."""
    table = measurements if rows is None else measurements.filter(pl.col("row").is_in(rows))
    keys: list[str | None] = []  # each row's run (its config's repr), None for a row not simulated
    invalid: list[str | None] = []
    runs: dict[str, RunConfig] = {}  # the distinct runs, in the order of their first row
    for row in table.iter_rows(named=True):
        problem = row_problem(row)
        config = None if problem else measurement_config(
            row, hardware.gpus_per_node, hardware.device, hardware.inter_node_gbps, hardware.intra_node_gbps,
            hardware.recompute, hardware.framework, hardware.attention)
        problem = (problem or device_problem(config.hardware.device, device)
                   or next(iter(config.constraint_errors()), None))
        if problem or config is None:
            keys.append(None)
            invalid.append(problem)
            continue
        key = repr(config)
        runs.setdefault(key, config)
        keys.append(key)
        invalid.append(None)
    done = _predicted(runs, profile, device, progress)
    none = (None, None, None)
    predicted, memory, fits = zip(*(done[key] if key is not None else none for key in keys)) if keys else ((), (), ())
    measured_mfu = [measured_mfu_of(runs[key], ms) if key is not None else None
                    for key, ms in zip(keys, table["iteration_ms"])]
    return table.with_columns(
        predicted_ms=pl.Series(predicted, dtype=pl.Float64),
        memory_gib=pl.Series(memory, dtype=pl.Float64),
        fits=pl.Series(fits, dtype=pl.Boolean),
        invalid=pl.Series(invalid, dtype=pl.String),
        measured_mfu=pl.Series(measured_mfu, dtype=pl.Float64),
    ).with_columns(error_pct=(pl.col("predicted_ms") / pl.col("iteration_ms") - 1.0) * 100)


def measured_mfu_of(config: RunConfig, iteration_ms: float) -> float | None:
    """The model FLOPs utilisation a measured iteration time implies: the model's FLOPs without recomputation
    (:func:`vtrain.flops.model_flops_per_iteration`) over the time and the datasheet peak of all the run's GPUs
    in its precision (None for a device without a datasheet: the host CPU)."""
    gpu = DATASHEET_DEVICES.get(canonical_device_name(config.hardware.device) or "")
    if gpu is None or not iteration_ms > 0:
        return None
    return mfu(config.model, config.parallelism.global_batch, iteration_ms / 1e3, config.hardware.device_count,
               gpu.peak_for(PRECISION_DTYPE[config.precision]))


def _predicted(runs: dict[str, RunConfig], profile: Profile | None, device: FittedDevice,
               progress: Progress | None) -> dict[str, tuple[float, float, bool | None]]:
    """Each run's predicted iteration time (ms), its largest stage's memory per GPU (GiB) and whether that fits.

    Runs on the same links are resolved through one set of shared resolvers (:class:`SharedResolvers`, as a
    plan's are): what they share (calibration, blocks of the same shape) is resolved once, and each run gets
    what it would get alone."""
    if progress is not None:
        progress(0, len(runs))
    shared: dict[tuple[str, float | None, float | None], SharedResolvers] = {}
    done: dict[str, tuple[float, float, bool | None]] = {}
    for key, config in runs.items():
        hardware = (config.hardware.device, config.hardware.inter_node_gbps, config.hardware.intra_node_gbps)
        resolvers = shared.get(hardware)
        if resolvers is None or resolvers.held() > MAX_HELD:
            if resolvers is None and len(shared) >= MAX_HARDWARE:
                shared.clear()
            resolvers = shared[hardware] = SharedResolvers(profile, on_run_hardware(device, config))
        sim = simulate(config, profile, resolvers.device, shared=resolvers)
        done[key] = (sim.iteration_us / 1e3, sim.largest_stage_bytes / 2**30, sim.fits_device)
        if progress is not None:
            progress(len(done), len(runs))
    return done

