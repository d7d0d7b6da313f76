"""Fitting the host side of a device model to measured iteration times.

Kernel latencies and collective curves come from kernel and collective measurements; what they cannot tell is
what the training framework adds around them: the CPU time to issue each operator and collective (Python,
autograd, dispatcher, launch) and the spread of the times at which a collective's ranks arrive. Those three
numbers (:class:`~vtrain.devices.fitted.HostOverhead`) are fitted here, by minimising the mean absolute log error
of the predicted iteration time over a chosen subset of measured runs, each predicted as every other command
predicts it (:func:`~vtrain.simulate.measured_runs.predict_runs` with the profile). The subset's row numbers are
recorded, so validation can leave them out. Nothing scales the kernels: their time is the kernel model's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from vtrain.devices.fitted import FittedDevice, HostOverhead
from vtrain.errors import InputError
from vtrain.fit.minimize import nelder_mead
from vtrain.simulate.measured_runs import Hardware, predict_runs
from vtrain.tables.store import Profile

#: starting point of the fit: 20 µs per operator and collective, 5 µs of arrival jitter
_START = HostOverhead(op_us=20.0, collective_us=20.0, jitter_us=5.0)


@dataclass(frozen=True)
class IterationFit:
    """The device with fitted host terms and how well they reproduce the rows they were fitted on."""

    device: FittedDevice
    rows: list[int]
    mape_pct: float


def every_kth_row(measurements: pl.DataFrame, k: int) -> list[int]:
    """Row numbers 1, 1+k, 1+2k, ...: a deterministic subset that spans the table's configurations."""
    return measurements.filter((pl.col("row") - 1) % k == 0)["row"].to_list()


def fit_host(measurements: pl.DataFrame, profile: Profile, device: FittedDevice, hardware: Hardware,
             rows: list[int], iterations: int = 40, source: Path | None = None) -> IterationFit:
    """Fit the host overheads of ``device`` (the fitted device of ``profile``) to the measured runs numbered
    ``rows``; an :class:`InputError` naming ``source`` (the table) when none of them can be simulated."""
    subset = measurements.filter(pl.col("row").is_in(rows))
    _check_usable(predict_runs(subset, profile, device, hardware), source)
    measured = subset["iteration_ms"].to_numpy()

    def with_params(params: np.ndarray) -> FittedDevice:
        op, collective, jitter = (math.exp(p) for p in params)
        return replace(device, host=HostOverhead(op, collective, jitter))

    def loss(params: np.ndarray) -> float:
        predicted = predict_runs(subset, profile, with_params(params), hardware)["predicted_ms"].to_numpy()
        valid = ~np.isnan(predicted)
        return float(np.mean(np.abs(np.log(predicted[valid] / measured[valid]))))

    start = np.log([_START.op_us, _START.collective_us, _START.jitter_us])
    best, _ = nelder_mead(loss, start, step=0.5, iterations=iterations)
    fitted = with_params(best)
    result = predict_runs(subset, profile, fitted, hardware)
    mape = float(result["error_pct"].abs().mean())
    provenance = {**fitted.provenance, "host": f"fitted: {len(rows)} measured iteration times"}
    return IterationFit(replace(fitted, provenance=provenance), sorted(rows), mape)


def _check_usable(predicted: pl.DataFrame, source: Path | None) -> None:
    """An :class:`InputError` when no row of ``predicted`` (:func:`predict_runs`) was simulated: nothing to fit on
    (the mean error of no rows was a TypeError)."""
    if predicted["predicted_ms"].is_not_null().any():
        return
    first = predicted.row(0, named=True) if predicted.height else None
    reason = f" (row {first['row']}: {first['invalid']})" if first else ""
    raise InputError(f"none of the {predicted.height} rows to fit the host overheads on can be simulated{reason}",
                     source)
