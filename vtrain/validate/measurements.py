"""``vtrain validate --measurements FILE.csv --profile PROFILE``: predict every measured run of a table of
iteration times with the profile's fitted device model and report how far off the predictions are.

Rows the profile's host overheads were fitted on (``metadata.json`` → ``fit_rows``, recognised by the table's
sha256) are predicted and shown but left out of the MAPE, and the result says how many.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from vtrain.devices.catalog import DATASHEET_DEVICES, canonical_device_name
from vtrain.errors import InputError
from vtrain.fit.device import device_from_profile, device_problem
from vtrain.importers import file_digest
from vtrain.importers.measurements import FRAMEWORK, PRECISION, RECOMPUTE, TIME_READINGS, read_measurements
from vtrain.simulate.measured_runs import Hardware, Progress, predict_runs
from vtrain.tables.store import load_profile

#: the dimensions errors are broken down by
DIMENSIONS = ("gpus", "nodes", "tp", "dp", "pp", "micro_batch", "hidden", "layers")
#: what makes rows one layout, measured at several numbers of micro-batches (every column of a run but the
#: global batch)
LAYOUT = ("gpus", "tp", "dp", "pp", "micro_batch", "hidden", "heads", "layers", "seq", "vocab", "schedule",
          "virtual_stages", "recompute", "dp_overlap", "sequence_parallel", "distributed_optimizer", "gpus_per_node",
          "inter_node_gbps", "framework", "precision", "attention", "cuda_graphs", "fused_kernels", "device")


@dataclass
class MeasurementValidation:
    """Every row predicted, which were fitted on, and the error statistics over the others."""

    measurements: Path
    profile: Path
    hardware: Hardware
    table: pl.DataFrame  # the measurements + predicted_ms, error_pct, invalid, fitted, nodes
    device_provenance: dict[str, str]

    @property
    def scored(self) -> pl.DataFrame:
        """Rows that count: predicted and not fitted on."""
        return self.table.filter(~pl.col("fitted") & pl.col("predicted_ms").is_not_null())

    @property
    def measured_as(self) -> str:
        """How the table's measured times were read (:data:`~vtrain.importers.measurements.TIME_READINGS`)."""
        forms = self.table["measured_as"].drop_nulls().unique(maintain_order=True).to_list()
        return "; ".join(TIME_READINGS[form] for form in forms) if forms else TIME_READINGS["ms"]

    @property
    def mape_pct(self) -> float | None:
        scored = self.scored
        return float(scored["error_pct"].abs().mean()) if scored.height else None

    def worst(self, n: int = 10) -> pl.DataFrame:
        """The ``n`` scored rows with the largest absolute error."""
        return self.scored.sort(pl.col("error_pct").abs(), descending=True).head(n)

    def by_dimension(self) -> dict[str, pl.DataFrame]:
        """Per dimension value: rows, MAPE and mean signed error."""
        return {
            dim: self.scored.group_by(dim, maintain_order=True).agg(
                rows=pl.len(), mape_pct=pl.col("error_pct").abs().mean(),
                mean_error_pct=pl.col("error_pct").mean()).sort(dim)
            for dim in DIMENSIONS
        }

    @cached_property
    def per_micro_batch(self) -> pl.DataFrame:
        """Each layout measured at two or more numbers of micro-batches (scored rows that differ only in their
        global batch), its measured and its predicted times fitted by least squares as a fixed part plus a part
        per micro-batch: one row per layout (``runs``: its rows), with the predicted part per micro-batch over the
        measured one (``per_micro_batch_ratio``). It tells an error in the work every micro-batch repeats (its
        passes, their communication, a pipeline's hand-offs) from one in the work of an iteration (the optimizer
        step, the gradient all-reduce, filling and draining the pipeline)."""
        rows = self.scored.with_columns(micro_batches=pl.col("global_batch") // (pl.col("micro_batch") * pl.col("dp")))
        return _two_parts(rows, [column for column in LAYOUT if column in rows.columns], pl.col("micro_batches"),
                          {"measured": "iteration_ms", "predicted": "predicted_ms"},
                          ("per_micro_batch_ms", "fixed_ms", "runs"))

    def per_micro_batch_by(self, dim: str) -> pl.DataFrame:
        """:attr:`per_micro_batch` per value of ``dim``: layouts, the median ratio of predicted to measured time
        per micro-batch, and the medians of the fixed parts (ms)."""
        return _medians_by(self.per_micro_batch, dim, "layouts", "per_micro_batch_ratio", "fixed_ms")

    @cached_property
    def per_layer(self) -> pl.DataFrame:
        """Each family of :attr:`per_micro_batch` layouts that differ only in their layers (two or more layers per
        stage): the time per micro-batch, measured and predicted, fitted by least squares as a part outside the
        layers plus a part per layer a stage holds (``layouts``: the family's). A pipeline goes at the pace of its
        slowest stage, the last one (its layers and the head) in these models, so the part outside the layers is
        the embedding, the head and the loss; it tells an error in the layers from one in what surrounds them."""
        layouts = self.per_micro_batch
        keys = [column for column in LAYOUT if column in layouts.columns and column not in ("layers", "virtual_stages")]
        return _two_parts(layouts, keys, pl.col("layers") / pl.col("pp"),
                          {side: f"per_micro_batch_ms_{side}" for side in ("measured", "predicted")},
                          ("per_layer_ms", "outside_ms", "layouts"))

    def per_layer_by(self, dim: str) -> pl.DataFrame:
        """:attr:`per_layer` per value of ``dim``: families, the median ratio of predicted to measured time per
        layer, and the medians of the parts outside the layers (ms per micro-batch)."""
        return _medians_by(self.per_layer, dim, "families", "per_layer_ratio", "outside_ms")

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` summary and ``metrics.json``."""
        invalid = self.table.filter(pl.col("invalid").is_not_null())
        return {
            "measurements": str(self.measurements), "profile": str(self.profile),
            "measured_as": self.measured_as, "mape_pct": self.mape_pct, "rows": self.scored.height,
            "excluded": int(self.table["fitted"].sum()), "invalid": invalid.height,
            "median_abs_error_pct": float(self.scored["error_pct"].abs().median()) if self.scored.height else None,
            "max_abs_error_pct": float(self.scored["error_pct"].abs().max()) if self.scored.height else None,
            "hardware": self.hardware.__dict__, "device_provenance": self.device_provenance,
            "worst": self.worst().select("row", "gpus", "tp", "dp", "pp", "micro_batch", "global_batch", "hidden",
                                         "layers", "iteration_ms", "predicted_ms", "error_pct").to_dicts(),
            "by_dimension": {dim: frame.to_dicts() for dim, frame in self.by_dimension().items()},
            "per_micro_batch": {dim: self.per_micro_batch_by(dim).to_dicts() for dim in ("tp", "pp")},
            "per_layer": {dim: self.per_layer_by(dim).to_dicts() for dim in ("tp", "pp")},
            "invalid_rows": invalid.select("row", "invalid").to_dicts(),
        }


def validate_measurements(measurements: Path, profile_dir: Path, gpus_per_node: int = 8,
                          inter_node_gbps: float | None = None, intra_node_gbps: float | None = None,
                          warn: Callable[[str], None] | None = None,
                          recompute: str = RECOMPUTE, progress: Progress | None = None,
                          gpu: str | None = None, framework: str = FRAMEWORK,
                          attention: str = "eager") -> MeasurementValidation:
    """Predict every row of ``measurements`` as ``vtrain simulate`` would with ``profile_dir`` (its tables, then
    its fitted device on the row's hardware: ``gpu``, a variant of the profile's GPU, for rows without a device
    column; default the profile's). Rows that are no measurement (a time that is not positive, an absurd shape)
    are refused without being simulated, and ``warn`` gets one line about them. ``framework`` and ``attention``:
    whose kernels rows without a framework column ran, and how rows without an attention column ran it.
    ``progress`` gets (runs simulated so far, distinct runs to simulate), as
    :func:`~vtrain.simulate.measured_runs.predict_runs` gives them."""
    profile = load_profile(profile_dir)
    fitted = profile.metadata.get("fitted")
    if not fitted:
        raise InputError("the profile has no fitted device model (build one with `vtrain fit`)", profile_dir)
    device = device_from_profile(profile, str(profile_dir / "metadata.json"))
    problem = device_problem(gpu, device) if gpu is not None else None
    if problem:
        raise InputError(f"--device: {problem}")
    table = read_measurements(measurements, recompute=recompute)
    hardware = Hardware(device=canonical_device_name(gpu or "") or fitted["device"], gpus_per_node=gpus_per_node,
                        inter_node_gbps=inter_node_gbps, intra_node_gbps=intra_node_gbps, recompute=recompute,
                        framework=framework, attention=attention)
    predicted = predict_runs(table, profile, device, hardware, progress=progress).with_columns(
        fitted=pl.col("row").is_in(fitted_rows(profile.metadata, measurements)),
        nodes=(pl.col("gpus") + gpus_per_node - 1) // gpus_per_node,
    )
    for line in (_left_to_the_command(predicted, hardware), _not_scored(predicted), _far_off(predicted),
                 _beyond_peak(predicted),
                 _over_memory(predicted, hardware.device, recompute, gpu_given=gpu is not None)):
        if line and warn is not None:
            warn(f"{measurements}: {line}")
    return MeasurementValidation(measurements, profile_dir, hardware, predicted, device.provenance)


def _two_parts(frame: pl.DataFrame, keys: list[str], x: pl.Expr, sides: dict[str, str],
               names: tuple[str, str, str]) -> pl.DataFrame:
    """Per group of ``frame``'s rows by ``keys`` with two or more values of ``x``: each of ``sides`` (name -> its
    column) fitted by least squares as an intercept plus a slope times ``x``. ``names``: the slope's and the
    intercept's column prefixes (suffixed with the side) and the rows' count column; the slope's predicted over
    measured is ``<slope without _ms>_ratio``."""
    slope, intercept, count = names
    if frame.is_empty():
        return pl.DataFrame(schema={"tp": pl.Int64, "pp": pl.Int64})
    parts = []
    for key, group in frame.with_columns(_x=x).group_by(keys, maintain_order=True):
        at = group["_x"].to_numpy().astype(float)
        if len(set(at)) < 2:
            continue
        fits = {side: np.polyfit(at, group[column].to_numpy(), 1) for side, column in sides.items()}
        parts.append({**dict(zip(keys, key)), count: group.height,
                      **{f"{slope}_{side}": float(fit[0]) for side, fit in fits.items()},
                      **{f"{intercept}_{side}": float(fit[1]) for side, fit in fits.items()}})
    if not parts:
        return pl.DataFrame(schema={"tp": pl.Int64, "pp": pl.Int64})
    ratio = slope.removesuffix("_ms") + "_ratio"
    return pl.DataFrame(parts).with_columns((pl.col(f"{slope}_predicted") / pl.col(f"{slope}_measured")).alias(ratio))


def _medians_by(frame: pl.DataFrame, dim: str, count: str, ratio: str, intercept: str) -> pl.DataFrame:
    """Rows of :func:`_two_parts` per value of ``dim``: how many, the median ``ratio`` and the medians of the
    measured and predicted ``intercept``."""
    columns = (f"{intercept}_measured", f"{intercept}_predicted")
    if frame.is_empty():
        return pl.DataFrame(schema={dim: pl.Int64, count: pl.UInt32, ratio: pl.Float64,
                                    **{column: pl.Float64 for column in columns}})
    return frame.group_by(dim, maintain_order=True).agg(pl.len().alias(count), pl.col(ratio).median(),
                                                        *(pl.col(column).median() for column in columns)).sort(dim)


#: a row measured this many times faster or slower than its prediction is said: the model's errors are tens of
#: percent, a unit mistake (seconds written as ms) is a thousand times
FAR_OFF = 5.0
#: a row's measured time over its prediction
_MEASURED_OVER_PREDICTED = pl.col("iteration_ms") / pl.col("predicted_ms")


def _left_to_the_command(predicted: pl.DataFrame, hardware: Hardware) -> str | None:
    """One warning line for the settings that change a prediction most and that rows leave unsaid (no column, or
    an empty cell): what those rows were predicted with (the flag, or its default), None when every row says
    them all."""
    settings = {"recompute": ("recomputation", hardware.recompute, "--recompute"),
                "precision": ("precision", PRECISION, None), "device": ("GPU", hardware.device, "--device"),
                "framework": ("framework", hardware.framework, "--framework"),
                "attention": ("attention", hardware.attention, "--attention"),
                "dp_overlap": ("gradient all-reduce overlap", "off", None),
                "distributed_optimizer": ("distributed optimizer", "off", None),
                "sequence_parallel": ("sequence parallelism", "off", None)}
    unsaid = [f"{what} {value}{f' ({flag})' if flag else ''} for {count} of {predicted.height}"
              for column, (what, value, flag) in settings.items()
              if (count := predicted.height if column not in predicted.columns else predicted[column].null_count())]
    return f"rows that do not say it are predicted with: {'; '.join(unsaid)}" if unsaid else None


def flags_no_row_takes(table: pl.DataFrame, given: dict[str, str]) -> str | None:
    """One warning line for the flags the command line gave (``given``: a table column -> the flag as written,
    ``{"attention": "--attention eager"}``) that set no row because every row states that column itself (a
    Megatron-LM log always does): each row is predicted as it says, not as the flag does. None when every flag
    set some row."""
    unused = [flag for column, flag in given.items()
              if column in table.columns and table.height and table[column].null_count() == 0]
    if not unused:
        return None
    sets = "this flag sets" if len(unused) == 1 else "these flags set"
    return (f"{', '.join(unused)}: every row gives its own, so {sets} no row (a flag stands in only for rows that "
            "leave the setting out): each row is predicted as it says")


def _not_scored(predicted: pl.DataFrame) -> str | None:
    """One warning line for the rows that were not simulated (refused when read, or a run that cannot be: GPUs
    that are not t·d·p), None when there are none."""
    unscored = predicted.filter(pl.col("invalid").is_not_null())
    if unscored.is_empty():
        return None
    first = unscored.row(0, named=True)
    return (f"{unscored.height} row(s) not simulated and not scored ({_where(first)}: {first['invalid']}"
            f"{'; each with why in the report' if unscored.height > 1 else ''})")


def _where(row: dict[str, Any]) -> str:
    """A row as a warning names it: its number in the table, and its file and line where a folder was read."""
    return f"row {row['row']}" + (f", {row['file']} line {row['line']}" if row.get("file") else "")


def _far_off(predicted: pl.DataFrame) -> str | None:
    """One warning line for the rows measured more than :data:`FAR_OFF` times faster or slower than predicted
    (scored all the same), None when there are none."""
    far = predicted.filter(_MEASURED_OVER_PREDICTED.is_between(1 / FAR_OFF, FAR_OFF).not_())
    if far.is_empty():
        return None
    first = far.row(0, named=True)
    return (f"{far.height} row(s) measured more than {FAR_OFF:g}x from the prediction, scored all the same ("
            f"{_where(first)}: measured {first['iteration_ms']:,.6g} ms, predicted {first['predicted_ms']:,.6g} ms"
            f"{', ...' if far.height > 1 else ''}): a unit mistake, or not the run the row describes?")


#: a measured time whose model FLOPs run above this share of the GPUs' datasheet peak in the run's precision is
#: said: dense training reaches 40-65 % of it; above 90 % the row's precision, GPU or shape is not what ran
BEYOND_PEAK = 0.9


def _beyond_peak(predicted: pl.DataFrame) -> str | None:
    """One warning line for the half-precision rows whose measured time implies a model FLOPs utilisation above
    :data:`BEYOND_PEAK` of their GPUs' peak (scored all the same), None when there are none: an FP8 run in a table
    without a precision column is one (fp32 rows are not checked: their GEMMs may have run in TF32; rows
    :func:`_far_off` says are not either: a unit mistake is said once)."""
    precision = pl.col("precision").fill_null(PRECISION) if "precision" in predicted.columns else pl.lit(PRECISION)
    beyond = predicted.filter(pl.col("measured_mfu") > BEYOND_PEAK, pl.col("invalid").is_null(),
                              precision.is_in(["fp16", "bf16"]), _MEASURED_OVER_PREDICTED.is_between(1 / FAR_OFF,
                                                                                                     FAR_OFF))
    if beyond.is_empty():
        return None
    first = beyond.row(0, named=True)
    return (f"{beyond.height} row(s) measured faster than their GPUs can run the model in half precision, scored "
            f"all the same ({_where(first)}: {first['measured_mfu']:.0%} of the datasheet peak"
            f"{', ...' if beyond.height > 1 else ''}): did they run in FP8 (vtrain does not model it), on other "
            f"GPUs, or with another shape?")


def _over_memory(predicted: pl.DataFrame, device: str, recompute: str, gpu_given: bool = False) -> str | None:
    """One warning line for the rows that ran although the memory model says their largest stage does not fit the
    GPU (the row's, else ``device``: given by --device where ``gpu_given``), scored all the same, None when there
    are none: a run that did not fit could not have been measured, so what the row says ran (recomputation above
    all; ``recompute`` where the row does not say), its GPU or the memory model is wrong."""
    over = predicted.filter(pl.col("fits").not_())
    if over.is_empty():
        return None
    first = over.row(0, named=True)
    recompute = first.get("recompute") or recompute
    gpu = DATASHEET_DEVICES.get(canonical_device_name(first.get("device") or device) or "")
    capacity = f" of {gpu.name}'s {gpu.memory_bytes / 2**30:,.0f} GiB" if gpu and gpu.memory_bytes else ""
    # a row that names its GPU is not asked for it (OPT-175B's row of A100-80GB was: an audit)
    elsewhere = ("" if first.get("device") or gpu_given else "run on GPUs with more memory (give theirs: --device "
                 "or a device column, e.g. A100-80GB), ")
    return (f"{over.height} row(s) measured although the memory model puts their largest stage over the GPU's "
            f"memory, scored all the same ({_where(first)}: {first['memory_gib']:,.1f} GiB{capacity} with "
            f"recomputation {recompute}{', ...' if over.height > 1 else ''}): did the runs recompute activations, "
            f"{elsewhere}shard their optimizer states (a distributed optimizer or zero stage column), or does the "
            f"memory model over-count?")


def fitted_rows(metadata: dict[str, Any], measurements: Path) -> list[int]:
    """Row numbers of ``measurements`` the profile was fitted on (none unless the file's sha256 matches)."""
    fit = metadata.get("fit_rows") or {}
    if not fit.get("sha256"):
        return []
    try:
        digest = file_digest(measurements)
    except OSError:  # a file of the folder that is not read (a device, a pipe): no fitted file either
        return []
    if fit.get("sha256") != digest:
        return []
    return list(fit.get("rows", []))
