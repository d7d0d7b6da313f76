"""How far a prediction is from a measurement: the signed error of one, and the mean absolute error of many.

Both are ``(predicted - measured) / measured`` in percent, the way vTrain's paper and every vtrain report state
accuracy: simulate against measured runs, validate's phases and operators, whatif's change, and the fitted device
model against the kernels it was fitted to.
"""

from __future__ import annotations

import numpy as np


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    """``(predicted - measured) / measured`` in percent; ``None`` when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def mape_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    """The mean absolute percentage error of ``predicted`` against ``measured`` (arrays of equal length, measured
    values positive)."""
    return float(np.mean(np.abs(np.asarray(predicted) / np.asarray(measured) - 1.0)) * 100)
