"""Measured iteration times in vTrain's CSV layout, and the run configs they were measured for.

vTrain's ``ground_truth_single.csv`` (1,440 single-node GPT runs on up to 8 A100s with Megatron-DeepSpeed) has the
columns :data:`SINGLE_NODE_COLUMNS`; its multi-node tables add a leading ``Parameters (billion)`` column. Column
names and values may carry surrounding whitespace and the file a UTF-8 byte-order mark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError
from vtrain.importers._read import csv_rows, numbers
from vtrain.runconfig import HardwareConfig, ModelConfig, ParallelConfig, RunConfig

#: vTrain's column names -> the normalised ones
SINGLE_NODE_COLUMNS = {
    "# GPUs": "gpus", "global batch": "global_batch", "micro batch": "micro_batch", "hidden size": "hidden",
    "attention heads": "heads", "# layers": "layers", "sequence length": "seq", "tensor parallelism": "tp",
    "data parallelism": "dp", "pipeline parallelism": "pp", "iteration time (ms)": "iteration_ms",
}
PARAMETERS_COLUMN = "Parameters (billion)"
#: the columns of :func:`read_measurements`
COLUMNS = {
    "row": pl.Int64, "params_billion": pl.Float64, "gpus": pl.Int64, "global_batch": pl.Int64,
    "micro_batch": pl.Int64, "hidden": pl.Int64, "heads": pl.Int64, "layers": pl.Int64, "seq": pl.Int64,
    "tp": pl.Int64, "dp": pl.Int64, "pp": pl.Int64, "iteration_ms": pl.Float64,
}
#: vTrain's training settings for these runs (Megatron-DeepSpeed, as in its configs)
VOCAB = 50257
PRECISION = "fp16"
RECOMPUTE = "full"
SCHEDULE = "1f1b"


def read_measurements(path: str | Path) -> pl.DataFrame:
    """The measured runs of a vTrain ground-truth CSV, one row each: ``row`` (1-based data row number),
    ``params_billion`` (null when the file has no such column), ``gpus``, ``global_batch``, ``micro_batch``,
    ``hidden``, ``heads``, ``layers``, ``seq``, ``tp``, ``dp``, ``pp`` and ``iteration_ms`` (milliseconds)."""
    path = Path(path)
    names, rows = csv_rows(path)
    single = list(SINGLE_NODE_COLUMNS)
    if names not in (single, [PARAMETERS_COLUMN, *single]):
        raise InputError(f"not a vTrain measurement table: expected the columns [{PARAMETERS_COLUMN},] "
                         f"{','.join(single)}; found {','.join(names)}", path)
    types = {name: COLUMNS[SINGLE_NODE_COLUMNS[name]] for name in single}
    if names[0] == PARAMETERS_COLUMN:
        types[PARAMETERS_COLUMN] = pl.Float64
    rows = numbers(rows, types, path).rename({**SINGLE_NODE_COLUMNS, PARAMETERS_COLUMN: "params_billion"},
                                             strict=False).with_row_index("row", offset=1)
    return rows.select(
        (pl.col(name) if name in rows.columns else pl.lit(None)).cast(dtype).alias(name)
        for name, dtype in COLUMNS.items())


def measurement_config(row: dict[str, Any], gpus_per_node: int = 8, device: str = "A100-80GB",
                       inter_node_gbps: float | None = None, intra_node_gbps: float | None = None) -> RunConfig:
    """The run config of one measured run (a row of :func:`read_measurements`, as a dict) with vTrain's
    Megatron-DeepSpeed settings: fp16, full activation recomputation, 1F1B, vocabulary 50257, no gradient
    bucketing, ``device_count`` = the row's GPUs.

    The config is not validated: ``config.constraint_errors()`` lists what a row breaks (e.g. tp*dp*pp differing
    from its GPU count); :func:`measurement_errors` does so for a whole table.
    """
    return RunConfig(
        model=ModelConfig(layers=int(row["layers"]), hidden=int(row["hidden"]), heads=int(row["heads"]),
                          seq=int(row["seq"]), vocab=VOCAB),
        parallelism=ParallelConfig(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                                   micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]),
                                   schedule=SCHEDULE, recompute=RECOMPUTE, dp_overlap=False),
        precision=PRECISION,
        hardware=HardwareConfig(device=device, device_count=int(row["gpus"]), gpus_per_node=gpus_per_node,
                                intra_node_gbps=intra_node_gbps, inter_node_gbps=inter_node_gbps),
    )


def measurement_errors(measurements: pl.DataFrame, gpus_per_node: int = 8) -> pl.DataFrame:
    """One row (``row``, ``error``) per constraint a measured run's config breaks; empty when all are consistent."""
    errors = [(row["row"], error) for row in measurements.iter_rows(named=True)
              for error in measurement_config(row, gpus_per_node).constraint_errors()]
    return pl.DataFrame(errors, schema={"row": pl.Int64, "error": pl.String}, orient="row")
