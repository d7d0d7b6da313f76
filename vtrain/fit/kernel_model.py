"""A kernel latency model that holds at every shape: interpolation between the nearest measured shapes in
log-shape space (an inverse-distance-weighted local-linear fit of the k nearest, and of every other shape as near
as the k-th) between a physical floor and ceiling.

Many shapes were measured more than once (vidur measured the same residual add once per tensor-parallel degree;
up to 32 rows share one shape in ``profiles/a100``): all of a shape's measurements count, so a prediction does not
depend on which of them a search happens to meet first.

The model does not predict the time itself but how far a kernel is above its roofline floor,

    time = floor_us · exp(nearest(features)),   floor_us = max(flops / peak FLOP/s, bytes / peak bytes/s)

so what it learns is an efficiency (tiling, wave quantisation, launch latency of small kernels) that depends on
the shape. ``nearest`` is a plane through the neighbours' targets, weighted by inverse distance, its slopes shrunk
by a ridge (:data:`SETTINGS`): it follows a trend across the neighbours (efficiency rising with m) where their
mean lags it. It cannot run away: the plane's value is kept within the neighbours' own targets, so a shape beyond
the measured ones gets an efficiency of the nearest measured shapes, never a time below the floor nor above the
largest measured slowdown (the ceiling). Every prediction says whether its shape lay among the measured ones
(``interpolated``: inside their range, one of them within a factor of two) or not (``extrapolated``).

GEMM features: log2 of batch, m, k, n, FLOPs and bytes, and of the wave efficiency (:func:`wave_efficiency`: the
share of the waves of 128 × 128 output tiles over the GPU's SMs that does useful work), so that neighbours are
compared at their quantisation: two shapes a few rows of m apart, one filling its last wave and one spilling into
a new one, lie far apart. Memory-bound features: log2 of elements, bytes and row length, and the kind of kernel
(:data:`MEMORY_KINDS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from vtrain import accuracy
from vtrain.devices.catalog import DATASHEET_DEVICES, canonical_device_name

if TYPE_CHECKING:
    import polars as pl
    from sklearn.neighbors import KDTree

GEMM, MEMORY = "gemm", "memory"
#: the memory-bound kinds the model tells apart (one feature each): a kind of its own where the work per byte
#: differs (row reductions, gathers, rotary's and the gated activation's reads); GELU is element-wise (one read, one
#: write per element, a few dozen FLOPs: far below an A100's FLOP-to-byte balance) and is timed like one — held out,
#: phi-2's GELUs (the only vidur model with one) were missed by 134 % when GELU was a kind apart, whose only other
#: measurements were LLMCompass's host-timed file, and by 23 % as element-wise kernels
MEMORY_KINDS = ("layernorm", "softmax", "elementwise", "embedding", "rotary", "gated activation")
#: vidur kernels that are element-wise by bytes but not by work: told apart by their label
_LABEL_KINDS = {"attn_rope": "rotary", "mlp_act": "gated activation"}
INTERPOLATED, EXTRAPOLATED = "interpolated", "extrapolated"
#: a shape is interpolated when it lies inside the measured ones' range and a measured shape is this close (log2
#: units: within a factor of two in one feature); else extrapolated
NEAR = 1.0
#: model settings: fixed, so a profile's model is rebuilt identically from its op_benchmarks on every load (and a
#: model kept in vtrain's cache is the one a load would build), and
#: chosen by the held-out MAPE on the A100 measurements (each vidur model and LLMCompass's GPT-3 layer left out in
#: turn; `make profile-a100`), checked on the H100 and H200 sweeps (each GPT model left out in turn). GEMM, A100 /
#: H100 / H200: inverse-distance-weighted mean of 16 neighbours 7.3 / 4.9 / 4.8 %; with the wave feature 7.0 /
#: 5.0 / 4.9 %; local-linear (ridge 0.1) without it 7.1 / 4.1 / 3.9 %, with it 6.7 / 4.1 / 3.8 % (ridge 0.03:
#: 6.7 / 4.0 / 3.7 %, 0.3: 6.7 / 4.2 / 3.9 %; 32 neighbours 6.5 / 4.2 / 4.1 %). Memory-bound: mean of 4
#: neighbours 10.0 / 9.0 / 9.9 % (8: 10.7 %, 16: 16.3 % on the A100); local-linear (ridge 0.1) of 4 10.0 / 8.9 /
#: 9.8 %, of 16 9.7 / 6.6 / 7.9 %, of 32 9.8 / 5.0 / 6.3 %
SETTINGS: dict[str, dict[str, float]] = {"neighbours": {GEMM: 16, MEMORY: 16}, "ridge": {GEMM: 0.1, MEMORY: 0.1}}
#: the output tile (rows of m, columns of n) a GEMM's waves are counted in: cuBLAS's usual large tile on A100 and
#: H100; the ratio of the tiles to the SMs sets how full the last wave is
TILE = (128, 128)
#: the SM count of a device whose datasheet has none (every catalog GPU has one): an A100's
UNKNOWN_SM_COUNT = 108


@dataclass(frozen=True)
class KernelShape:
    """What the model needs of one kernel: its work and shape."""

    flops: float
    bytes: float
    batch: float = 1.0
    m: float = 1.0
    k: float = 1.0
    n: float = 1.0
    elements: float = 0.0
    row: float = 1.0  # length of the reduced row (layernorm, softmax); 1 when none
    kind: str = "elementwise"  # memory-bound kind (ignored for GEMMs)


@dataclass
class KernelModel:
    """A fitted model for one class of kernels (GEMM or memory-bound) on one device."""

    kind: str  # GEMM | MEMORY
    peak_flops: float
    peak_bytes_per_s: float
    points: np.ndarray  # the measured shapes' features, one row each
    targets: np.ndarray  # their log(time / floor)
    low: np.ndarray  # per-feature minimum over the training shapes
    high: np.ndarray  # per-feature maximum
    ceiling: float  # largest log(time / floor) seen in training
    samples: int
    sources: tuple[str, ...]
    sm_count: int = UNKNOWN_SM_COUNT  # the device's SMs, over which a GEMM's output tiles run in waves
    _cache: dict[tuple[float, ...], tuple[float, str]] = field(default_factory=dict, repr=False)

    def floor_us(self, shape: KernelShape, peak_flops: float | None = None) -> float:
        """The roofline floor: the time at peak FLOP/s (``peak_flops``, default the half-precision peak the
        model was fitted at) or peak bandwidth, whichever binds."""
        return _floor_us(self.kind, shape, peak_flops or self.peak_flops, self.peak_bytes_per_s)

    def time_us(self, shape: KernelShape, peak_flops: float | None = None) -> tuple[float, str]:
        """Predicted time of one call and whether its shape was inside the measured ones. ``peak_flops``: the
        peak of the call's own precision when it is not the measured kernels' (an fp32 GEMM takes their
        efficiency at the fp32 peak)."""
        features = tuple(_features(self.kind, self.on_measured_bytes_per_element(shape), self.sm_count))
        key = (*features, peak_flops or 0.0)
        cached = self._cache.get(key)
        if cached is None:
            x = np.array(features)
            distances, index = self.nearest(x)
            inside = bool(np.all(x >= self.low - 1e-9) and np.all(x <= self.high + 1e-9)) and distances[0] <= NEAR
            cached = self._cache[key] = (self.floor_us(shape, peak_flops) * math.exp(self._ratio(distances, index, x)),
                                         INTERPOLATED if inside else EXTRAPOLATED)
        return cached

    def on_measured_bytes_per_element(self, shape: KernelShape) -> KernelShape:
        """A memory-bound kernel that moves more (or fewer) bytes per element than any measured one (an Adam step
        streams 28 bytes per parameter, an fp32 element-wise op 8 or 12; the measured kernels 4 to 6) is looked up
        as the measured-like kernel that moves the same bytes: a streaming kernel's efficiency follows the bytes
        it moves, and the measurements say nothing of how it changes with bytes per element. Others unchanged."""
        if self.kind == GEMM or shape.elements <= 0:
            return shape
        low, high = self.bytes_per_element
        per_element = min(max(shape.bytes / shape.elements, low), high)
        return shape if per_element == shape.bytes / shape.elements else replace(shape, elements=shape.bytes / per_element)

    @cached_property
    def bytes_per_element(self) -> tuple[float, float]:
        """The smallest and largest bytes per element of the measured memory-bound kernels."""
        log_ratio = self.points[:, 1] - self.points[:, 0]  # log2 bytes - log2 elements
        return float(2.0 ** log_ratio.min()), float(2.0 ** log_ratio.max())

    @property
    def neighbours(self) -> int:
        """How many measured shapes a prediction weighs at least."""
        return min(SETTINGS["neighbours"][self.kind], len(self.targets))

    def nearest(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The measured shapes a prediction at the feature row ``x`` weighs: the :attr:`neighbours` nearest and
        every other one as near as the last of them, nearest first (ties: lower row first); their distances and
        rows. Found by a scan of every measured shape: a simulation asks for a few hundred shapes, one at a time,
        and the scan spares it importing scikit-learn, which took longer than the simulation. The squared distance
        is summed feature by feature, as the k-d tree of :meth:`ratios` sums it, so the two find the same
        distances to the last bit."""
        squared = np.zeros(len(self.points))
        difference = np.empty(len(self.points))
        for column, value in zip(self.columns, x):
            np.subtract(column, value, out=difference)
            squared += np.square(difference, out=difference)
        index = np.flatnonzero(squared <= np.partition(squared, self.neighbours - 1)[self.neighbours - 1])
        distances = np.sqrt(squared[index])
        order = np.lexsort((index, distances))
        return distances[order], index[order]

    @cached_property
    def columns(self) -> tuple[np.ndarray, ...]:
        """Each feature of the measured shapes as one contiguous array (what :meth:`nearest` scans; a column of
        :attr:`points` is strided)."""
        return tuple(np.ascontiguousarray(self.points[:, j]) for j in range(self.points.shape[1]))

    @cached_property
    def tree(self) -> KDTree:
        """scikit-learn's k-d tree of the measured shapes (built, and scikit-learn imported, on first use)."""
        from sklearn.neighbors import KDTree

        return KDTree(self.points)

    def ratios(self, x: np.ndarray) -> np.ndarray:
        """log(time / floor) at a batch of feature rows ``x``, the neighbours of each (those of :meth:`nearest`)
        found with the k-d tree."""
        kth = self.tree.query(x, k=self.neighbours)[0][:, -1]
        found, distances = self.tree.query_radius(x, kth * (1 + 1e-9), return_distance=True)
        ratios = np.empty(len(x))
        for row, (index, distance) in enumerate(zip(found, distances)):
            keep = distance <= kth[row]
            order = np.lexsort((index[keep], distance[keep]))
            ratios[row] = self._ratio(distance[keep][order], index[keep][order], x[row])
        return ratios

    def _ratio(self, distances: np.ndarray, index: np.ndarray, x: np.ndarray) -> float:
        """log(time / floor) at the feature row ``x`` from its neighbours (nearest first): an exact match, the mean
        of the exact matches (every measurement of that shape); else, with a ridge (``SETTINGS["ridge"]``), the
        inverse-distance-weighted local-linear fit of their targets at ``x`` (a plane through the neighbours, its
        slopes shrunk by the ridge), kept within the neighbours' own targets. Kept between 0 (the floor) and the
        ceiling."""
        targets = self.targets[index]
        if distances[0] < 1e-9:
            exact = (distances < 1e-9).astype(float)
            mean = float(np.sum(exact * targets) / np.sum(exact))
        else:
            ridge = SETTINGS["ridge"][self.kind]
            weights = 1.0 / distances
            weights /= np.sum(weights)
            design = np.column_stack([np.ones(len(index)), self.points[index] - x])
            normal = design.T @ (design * weights[:, None])
            normal[1:, 1:] += ridge * np.eye(design.shape[1] - 1)
            plane = np.linalg.solve(normal, design.T @ (weights * targets))
            mean = min(max(float(plane[0]), float(targets.min())), float(targets.max()))
        return min(max(mean, 0.0), self.ceiling)

    def describe(self) -> str:
        return f"nearest of {self.samples} measured {self.kind} kernels ({', '.join(self.sources)})"


def fit_kernel_model(samples: pl.DataFrame, kind: str, peak_flops: float, peak_bytes_per_s: float,
                     sm_count: int | None = None) -> KernelModel:
    """Fit a :class:`KernelModel` to ``op_benchmarks`` rows of one class for a device of these peaks and SM count
    (None: unknown, taken as :data:`UNKNOWN_SM_COUNT`). Raises ``ValueError`` when fewer than ten rows are
    usable."""
    rows = usable(samples)
    if rows.height < 10:
        raise ValueError(f"{rows.height} usable samples, need at least 10")
    sm_count = sm_count or UNKNOWN_SM_COUNT
    columns = shape_columns(rows, kind)
    x = features_of(kind, columns, measured_sm_counts(rows, sm_count))
    floors = floors_of(kind, columns, *measured_peaks(rows, peak_flops, peak_bytes_per_s))
    y = np.log(np.maximum(rows["median_us"].to_numpy() / floors, 1.0))
    sources = tuple(sorted(set(rows["source"].drop_nulls().to_list()))) if "source" in rows.columns else ()
    return KernelModel(kind, peak_flops, peak_bytes_per_s, x, y, x.min(0), x.max(0), float(y.max()), rows.height,
                       sources, sm_count)


def measured_peaks(rows: pl.DataFrame, peak_flops: float, peak_bytes_per_s: float) -> tuple[np.ndarray, np.ndarray]:
    """The half-precision peak FLOP/s and the memory bandwidth of the GPU each ``op_benchmarks`` row was measured
    on (its ``device``, a datasheet GPU), else ``peak_flops`` and ``peak_bytes_per_s`` (the model's device).

    A kernel's efficiency is learnt against the roofline of the GPU that ran it and applied to the roofline of the
    GPU it is predicted for: LLMCompass and vidur measured on A100-80GB parts (2,039 GB/s), which move a
    memory-bound kernel's bytes 1.3 times faster than an A100-40GB (1,555 GB/s) at the same efficiency; against
    the 40 GB part's floor their large element-wise kernels looked faster than its memory can run."""
    flops, bandwidth = np.full(rows.height, float(peak_flops)), np.full(rows.height, float(peak_bytes_per_s))
    if "device" not in rows.columns:
        return flops, bandwidth
    for name in rows["device"].drop_nulls().unique().to_list():
        gpu = DATASHEET_DEVICES.get(canonical_device_name(str(name)) or "")
        if gpu is not None:
            measured_on = (rows["device"] == name).fill_null(False).to_numpy()
            flops[measured_on], bandwidth[measured_on] = gpu.peak_for("c10::Half"), gpu.memory_bandwidth
    return flops, bandwidth


def measured_sm_counts(rows: pl.DataFrame, sm_count: int) -> np.ndarray:
    """The SM count of the GPU each ``op_benchmarks`` row was measured on (its ``device``, a datasheet GPU), else
    ``sm_count`` (the model's device): a GEMM's waves are those of the GPU that ran it."""
    counts = np.full(rows.height, float(sm_count))
    if "device" not in rows.columns:
        return counts
    for name in rows["device"].drop_nulls().unique().to_list():
        gpu = DATASHEET_DEVICES.get(canonical_device_name(str(name)) or "")
        if gpu is not None and gpu.sm_count:
            counts[(rows["device"] == name).fill_null(False).to_numpy()] = gpu.sm_count
    return counts


def wave_efficiency(batch: Any, m: Any, n: Any, sm_count: Any) -> Any:
    """The share of a GEMM's waves of output tiles that does useful work: ``batch · m · n`` over ``waves · SMs ·
    tile``, with ``batch · ⌈m / 128⌉ · ⌈n / 128⌉`` tiles of 128 × 128 (:data:`TILE`) run ``SMs`` at a time
    (``waves = ⌈tiles / SMs⌉``). 1 when the tiles fill every wave exactly; it drops at every tile or wave
    boundary (an A100's 108 SMs: m 384 → 392 at n 4096 takes a second wave) and is small for small m. Numbers or
    arrays (one shape or a column of them, by the same operations: a row's value is its shape's to the last bit)."""
    tiles = batch * np.ceil(m / TILE[0]) * np.ceil(n / TILE[1])
    return batch * m * n / (np.ceil(tiles / sm_count) * sm_count * TILE[0] * TILE[1])


def _floor_us(kind: str, shape: KernelShape, peak_flops: float, peak_bytes_per_s: float) -> float:
    compute = shape.flops / peak_flops if kind == GEMM else 0.0
    return max(compute, shape.bytes / peak_bytes_per_s) * 1e6


def usable(samples: pl.DataFrame) -> pl.DataFrame:
    """Rows with a positive, finite time and work (polars orders NaN above every number: it is not > 0 here)."""
    import polars as pl

    return samples.filter(pl.col("median_us").is_finite() & (pl.col("median_us") > 0)
                          & pl.col("bytes").is_finite() & (pl.col("bytes") > 0))


def shape_columns(rows: pl.DataFrame, kind: str) -> dict[str, np.ndarray]:
    """The :class:`KernelShape` fields of every ``op_benchmarks`` row, one array per field (a missing or zero
    size is 1; memory-bound rows without an element count have bytes / 4; ``row`` is the reduced row's length
    for layernorm and softmax, else 1)."""
    import polars as pl

    def number(name: str, default: float) -> np.ndarray:
        if name not in rows.columns:
            return np.full(rows.height, default)
        values = rows[name].cast(pl.Float64).fill_null(0.0).to_numpy()
        return np.where(values == 0.0, default, values)

    nbytes = rows["bytes"].cast(pl.Float64).to_numpy()
    if kind == GEMM:
        return {"flops": number("flops", 0.0), "bytes": nbytes, "batch": number("batch", 1.0),
                "m": number("m", 1.0), "k": number("k", 1.0), "n": number("n", 1.0)}
    classes = rows["op_class"].to_list() if "op_class" in rows.columns else [None] * rows.height
    labels = rows["label"].to_list() if "label" in rows.columns else [None] * rows.height
    pairs = list(zip(classes, labels))
    kind_of = {pair: _memory_kind_of(*pair) for pair in set(pairs)}
    kinds = np.array([kind_of[pair] for pair in pairs])
    elements = number("elements", 0.0)
    reduced = np.isin(np.array(classes, dtype=object), ["layernorm", "softmax"])
    return {"flops": np.zeros(rows.height), "bytes": nbytes,
            "elements": np.where(elements == 0.0, nbytes / 4, elements),
            "row": np.where(reduced, number("n", 1.0), 1.0), "kind": kinds}


def shapes_of(rows: pl.DataFrame, kind: str) -> list[KernelShape]:
    """The :class:`KernelShape` of every ``op_benchmarks`` row."""
    columns = shape_columns(rows, kind)
    names = list(columns)
    return [KernelShape(**{name: value if name == "kind" else float(value) for name, value in zip(names, values)})
            for values in zip(*columns.values())]


def _memory_kind_of(op_class: str | None, label: str | None) -> str:
    """The memory-bound kind of an ``op_benchmarks`` row: its class's, or for element-wise rows its label's."""
    kind = memory_kind(str(op_class))
    return _LABEL_KINDS.get(str(label), kind) if op_class == "elementwise" else kind


def memory_kind(name: str) -> str:
    """The memory-bound kind of an ``op_class`` or operator name (an RMSNorm is a norm, a fused rotary embedding
    rotary: vidur measured both for its Llamas)."""
    lowered = name.lower()
    for kind, keys in (("layernorm", ("layernorm", "layer_norm", "rms_norm", "rmsnorm")), ("softmax", ("softmax",)),
                       ("embedding", ("embedding", "index_select")), ("rotary", ("rope", "rotary"))):
        if any(key in lowered for key in keys):
            return kind
    return "elementwise"


def _log2(value: float) -> float:
    return math.log2(max(value, 1.0))


def _features(kind: str, s: KernelShape, sm_count: float) -> list[float]:
    if kind == GEMM:
        return [_log2(s.batch), _log2(s.m), _log2(s.k), _log2(s.n), _log2(s.flops), _log2(s.bytes),
                math.log2(wave_efficiency(s.batch, s.m, s.n, sm_count))]
    return [_log2(s.elements), _log2(s.bytes), _log2(s.row), *(1.0 if s.kind == k else 0.0 for k in MEMORY_KINDS)]


def features_of(kind: str, columns: dict[str, np.ndarray], sm_counts: np.ndarray | float) -> np.ndarray:
    """:func:`_features` of every row of :func:`shape_columns` measured on GPUs of ``sm_counts`` SMs (one per row,
    or one for all), one row each (the logarithms taken once per distinct value, with :func:`math.log2`, so that
    a row's features are those of its shape to the last bit)."""
    def logs(values: np.ndarray, log: Any = _log2) -> np.ndarray:
        distinct, where = np.unique(values, return_inverse=True)
        return np.array([log(float(v)) for v in distinct])[where.ravel()]

    if kind == GEMM:
        waves = wave_efficiency(columns["batch"], columns["m"], columns["n"],
                                np.broadcast_to(np.asarray(sm_counts, dtype=float), columns["m"].shape))
        return np.column_stack([*(logs(columns[name]) for name in ("batch", "m", "k", "n", "flops", "bytes")),
                                logs(waves, math.log2)])
    sizes = [logs(columns[name]) for name in ("elements", "bytes", "row")]
    return np.column_stack([*sizes, *((columns["kind"] == k).astype(float) for k in MEMORY_KINDS)])


def floors_of(kind: str, columns: dict[str, np.ndarray], peak_flops: float | np.ndarray,
              peak_bytes_per_s: float | np.ndarray) -> np.ndarray:
    """:meth:`KernelModel.floor_us` of every row of :func:`shape_columns`."""
    compute = columns["flops"] / peak_flops if kind == GEMM else np.zeros(len(columns["bytes"]))
    return np.maximum(compute, columns["bytes"] / peak_bytes_per_s) * 1e6


def mape_pct(model: KernelModel, rows: pl.DataFrame) -> float | None:
    """Mean absolute % error of ``model`` on ``op_benchmarks`` rows (None without usable rows)."""
    rows = usable(rows)
    if rows.height == 0:
        return None
    columns = shape_columns(rows, model.kind)
    ratios = model.ratios(features_of(model.kind, columns, measured_sm_counts(rows, model.sm_count)))
    peaks = measured_peaks(rows, model.peak_flops, model.peak_bytes_per_s)  # each kernel on the GPU it ran on
    predicted = floors_of(model.kind, columns, *peaks) * np.exp(ratios)
    return accuracy.mape_pct(predicted, rows["median_us"].to_numpy())


def summary(model: KernelModel) -> dict[str, Any]:
    """The model's settings as plain data (the model itself is rebuilt from the profile's op_benchmarks)."""
    return {"model": "inverse-distance-weighted local-linear fit of the nearest measured shapes in log-shape space",
            "settings": {"neighbours": SETTINGS["neighbours"][model.kind], "ridge": SETTINGS["ridge"][model.kind],
                         **({"tile": list(TILE), "sm_count": model.sm_count} if model.kind == GEMM else {})},
            "target": "log(time / roofline floor)", "floor": {"peak_flops": model.peak_flops,
                                                              "peak_bytes_per_s": model.peak_bytes_per_s},
            "samples": model.samples, "sources": list(model.sources)}
