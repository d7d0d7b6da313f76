"""Fitting device rates to measured kernels: a roofline per operator kind.

A kernel of ``flops`` floating-point operations that moves ``bytes`` takes

    time = fixed_us + max(flops / flops_per_s, bytes / bytes_per_s)

``fixed_us`` is the part that does not scale (kernel start-up, tail effects, what the benchmark's own timing
adds). The three rates are fitted in log space by minimising the mean absolute log error, so a 10 % miss on a
20 µs kernel weighs as much as one on a 20 ms GEMM. Each source (LLMCompass, vidur, a trace) weighs the same in
total however many rows it has, so thousands of inference-shaped rows from one source do not drown the rest.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import polars as pl

from vtrain.fit.minimize import nelder_mead


@dataclass(frozen=True)
class Roofline:
    """Fitted rates of one kind of kernel and how well they reproduce the samples they came from."""

    flops_per_s: float  # achieved FLOP/s of compute-bound calls (inf for memory-bound kinds)
    bytes_per_s: float  # achieved bytes/s of memory-bound calls
    fixed_us: float  # time that does not scale with the work
    samples: int
    mape_pct: float  # mean absolute % error of the fit on its own samples
    sources: tuple[str, ...]  # the benchmark sources the samples came from

    def time_us(self, flops: float, nbytes: float) -> float:
        """Predicted time of one call."""
        compute = flops / self.flops_per_s if math.isfinite(self.flops_per_s) and flops > 0 else 0.0
        return self.fixed_us + max(compute, nbytes / self.bytes_per_s) * 1e6

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["flops_per_s"] = None if not math.isfinite(self.flops_per_s) else self.flops_per_s
        data["sources"] = list(self.sources)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Roofline:
        flops = data.get("flops_per_s")
        return cls(flops_per_s=math.inf if flops is None else float(flops),
                   bytes_per_s=float(data["bytes_per_s"]), fixed_us=float(data["fixed_us"]),
                   samples=int(data["samples"]), mape_pct=float(data["mape_pct"]),
                   sources=tuple(data.get("sources", ())))


def fit_roofline(samples: pl.DataFrame, *, compute_bound: bool) -> Roofline:
    """Fit a :class:`Roofline` to ``op_benchmarks`` rows (``flops``, ``bytes``, ``median_us``).

    ``compute_bound=False`` fits bandwidth and fixed time only (element-wise, normalisation and softmax
    kernels). Raises ``ValueError`` when there are fewer samples than parameters.
    """
    rows = samples.filter(pl.col("median_us").is_not_null() & (pl.col("median_us") > 0) & (pl.col("bytes") > 0))
    n_params = 3 if compute_bound else 2
    if rows.height < n_params:
        raise ValueError(f"{rows.height} usable samples, need at least {n_params}")
    flops = rows["flops"].fill_null(0.0).to_numpy()
    nbytes = rows["bytes"].to_numpy()
    measured = rows["median_us"].to_numpy()

    def predict(params: np.ndarray) -> np.ndarray:
        fixed = math.exp(params[0])
        memory = nbytes / math.exp(params[1]) * 1e6
        if not compute_bound:
            return fixed + memory
        return fixed + np.maximum(flops / math.exp(params[2]) * 1e6, memory)

    weights = _source_weights(rows)

    def loss(params: np.ndarray) -> float:
        return float(np.sum(weights * np.abs(np.log(predict(params) / measured))))

    start = [math.log(max(float(np.min(measured)) / 2, 0.1)), math.log(1e12)]
    if compute_bound:
        start.append(math.log(1e14))
    best, _ = nelder_mead(loss, np.array(start), step=0.5, iterations=2000)
    mape = float(np.mean(np.abs(predict(best) / measured - 1.0)) * 100)
    sources = tuple(sorted(set(rows["source"].drop_nulls().to_list()))) if "source" in rows.columns else ()
    return Roofline(flops_per_s=math.exp(best[2]) if compute_bound else math.inf,
                    bytes_per_s=math.exp(best[1]), fixed_us=math.exp(best[0]),
                    samples=rows.height, mape_pct=mape, sources=sources)


def _source_weights(rows: pl.DataFrame) -> np.ndarray:
    """Per-row weights that give every source the same total weight (summing to 1)."""
    if "source" not in rows.columns:
        return np.full(rows.height, 1.0 / rows.height)
    sources = rows["source"].fill_null("unknown").to_list()
    counts = {name: sources.count(name) for name in set(sources)}
    return np.array([1.0 / (counts[name] * len(counts)) for name in sources])
