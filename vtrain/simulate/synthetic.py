"""Profiles made from the workload model itself rather than from a trace: every signature a run resolves, with
latencies from a given function. Used for closed-form tests, benchmarks and what-if studies."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from vtrain.model import gpt
from vtrain.model.gpt import GptShape
from vtrain.model.memory import stage_parameters
from vtrain.model.ops import Op
from vtrain.partition import partition
from vtrain.runconfig import RunConfig
from vtrain.tables.store import Profile, conform, empty_table


def workload_ops(config: RunConfig) -> list[Op]:
    """Every distinct operator a simulation of ``config`` resolves, in first-use order."""
    shape = GptShape.from_config(config)
    steps = [*gpt.embedding_forward(shape), *gpt.layer_forward(shape), *gpt.head_forward(shape)]
    for accumulate in (False, True):
        steps += [*gpt.head_backward(shape, accumulate), *gpt.layer_backward(shape, accumulate),
                  *gpt.embedding_backward(shape, accumulate)]
    for chunks in partition(config):
        steps += gpt.optimizer_step(shape, stage_parameters(shape, chunks))
    distinct: dict[tuple[str, str, str], Op] = {}
    for step in steps:
        if isinstance(step, Op):
            distinct.setdefault(step.signature, step)
    return list(distinct.values())


def synthetic_profile(config: RunConfig, op_latency_us: Callable[[Op], float],
                      collectives: list[dict[str, object]] | None = None,
                      kernels_per_op: Callable[[Op], int] | None = None) -> Profile:
    """A profile with one ``op_latency`` row per workload signature (latency from ``op_latency_us``, kernel names
    ``<op>_kernel<k>``) and the given ``nccl_latency`` rows (dicts of that table's columns)."""
    device_type = GptShape.from_config(config).device_type
    rows = []
    for op in workload_ops(config):
        count = kernels_per_op(op) if kernels_per_op is not None else 1
        rows.append({"op": op.name, "input_dims": op.input_dims, "input_types": op.input_types,
                     "device_type": device_type, "median_us": float(op_latency_us(op)), "count": 1,
                     "n_kernels": count, "kernels": " ; ".join(f"{op.name}_kernel{k}" for k in range(count))})
    tables = {name: empty_table(name) for name in ("kernels", "cpu_ops", "collectives")}
    tables["op_latency"] = conform(pl.DataFrame(rows), "op_latency")
    nccl = [{"device_type": device_type, "count": 1, **row} for row in collectives or []]
    tables["nccl_latency"] = conform(pl.DataFrame(nccl), "nccl_latency") if nccl else empty_table("nccl_latency")
    return Profile(tables=tables, metadata={"kind": "synthetic"})
