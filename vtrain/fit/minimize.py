"""A small Nelder-Mead minimiser (numpy only): the fits here have two to six parameters and cheap objectives."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(objective: Callable[[np.ndarray], float], start: np.ndarray, *, step: float = 0.25,
                iterations: int = 300, tolerance: float = 1e-7) -> tuple[np.ndarray, float]:
    """Minimise ``objective`` from ``start``; returns the best point and its value.

    The initial simplex moves each coordinate by ``step`` (absolute: fits work in log space, so 0.25 is a 28 %
    change of the parameter). Stops after ``iterations`` or when the simplex's values agree within ``tolerance``.
    """
    n = len(start)
    points = [np.asarray(start, dtype=float)] + [start + step * np.eye(n)[i] for i in range(n)]
    values = [objective(p) for p in points]
    for _ in range(iterations):
        order = np.argsort(values)
        points, values = [points[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tolerance * (abs(values[0]) + tolerance):
            break
        centroid = np.mean(points[:-1], axis=0)
        reflected = centroid + (centroid - points[-1])
        f_reflected = objective(reflected)
        if f_reflected < values[0]:
            expanded = centroid + 2.0 * (centroid - points[-1])
            f_expanded = objective(expanded)
            points[-1], values[-1] = (expanded, f_expanded) if f_expanded < f_reflected else (reflected, f_reflected)
        elif f_reflected < values[-2]:
            points[-1], values[-1] = reflected, f_reflected
        else:
            contracted = centroid + 0.5 * (points[-1] - centroid)
            f_contracted = objective(contracted)
            if f_contracted < values[-1]:
                points[-1], values[-1] = contracted, f_contracted
            else:  # shrink towards the best point
                points = [points[0]] + [points[0] + 0.5 * (p - points[0]) for p in points[1:]]
                values = [values[0]] + [objective(p) for p in points[1:]]
    best = int(np.argmin(values))
    return points[best], float(values[best])
