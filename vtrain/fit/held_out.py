"""How well the kernel models predict kernels they were not fitted on: each group of measurements (one model of
vidur's, LLMCompass's GPT-3 layer) is left out in turn, the models are fitted to all the others and scored on it.
Groups whose shapes the simulator must predict without having measured them are the honest test of a model that
claims to hold at every shape; the score is the mean absolute % error per group and kernel class."""

from __future__ import annotations

from typing import Any

import polars as pl

from vtrain.devices.model import DeviceModel
from vtrain.fit.device import kernel_samples
from vtrain.fit.kernel_model import GEMM, MEMORY, fit_kernel_model, mape_pct, usable


def held_out_mape(groups: dict[str, pl.DataFrame], held_out: list[str], base: DeviceModel) -> dict[str, Any]:
    """For every name in ``held_out``: fit to every other group of ``groups`` (``op_benchmarks`` rows), score on
    that one. Returns ``{"rotations": [{"held_out", "gemm_mape_pct", "gemm_rows", "memory_mape_pct",
    "memory_rows"}, ...], "gemm_mape_pct", "memory_mape_pct"}`` (the last two: mean over rotations); a class
    with no kernels in the group, or too few in the others, scores None."""
    rotations = []
    for name in held_out:
        train = pl.concat([frame for other, frame in groups.items() if other != name], how="diagonal_relaxed")
        row: dict[str, Any] = {"held_out": name}
        for kind, key in ((GEMM, "gemm"), (MEMORY, "memory")):
            test = usable(kernel_samples(groups[name], kind))
            row[f"{key}_mape_pct"], row[f"{key}_rows"] = None, test.height
            try:
                model = fit_kernel_model(kernel_samples(train, kind), kind, base.peak_for("c10::Half"),
                                         base.memory_bandwidth, base.sm_count)
            except ValueError:  # too few kernels of this class left to fit on
                continue
            row[f"{key}_mape_pct"] = mape_pct(model, test)
        rotations.append(row)
    return {"rotations": rotations, **{f"{key}_mape_pct": _mean([r[f"{key}_mape_pct"] for r in rotations])
                                       for key in ("gemm", "memory")}}


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
