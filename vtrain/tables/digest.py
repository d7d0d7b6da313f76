"""What a prediction reads from a profile's tables, as plain Python rows: the operator and collective latencies,
the signatures of the operator calls in its timeline and its ranks' forward spans.

A simulation resolves its few hundred distinct latencies from these rows alone; the tables themselves (polars
frames) are read only where a profile's timeline is measured (its host gaps and interference,
:mod:`vtrain.tables.gaps`). Being plain data, a digest is kept between runs (:mod:`vtrain.cache`), so that
predicting from a profile read before needs neither its Parquet files nor polars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vtrain.naming import SPAN_PREFIX

if TYPE_CHECKING:
    import polars as pl

#: the tables a digest is made of
DIGEST_TABLES = ("op_latency", "nccl_latency", "cpu_ops", "kernels")
#: (device type, op, input dims, input types, median µs, kernels joined by " ; ")
OpRow = tuple[str, str, str, str, float | None, str | None]
#: (device type, collective, group size, nodes, bytes, mean µs, median µs, wait µs, source)
NcclRow = tuple[str, str, int | None, int | None, int | None, float | None, float | None, float | None, str | None]
Signature = tuple[str, str, str]


@dataclass(frozen=True)
class ProfileDigest:
    """The rows of a profile that predictions read."""

    op_latency: tuple[OpRow, ...]
    nccl_latency: tuple[NcclRow, ...]  # ordered by bytes
    timeline: frozenset[Signature]  # the signatures of the operator calls in the timeline (CPU ops, kernels' ops)
    has_timeline: bool  # whether the profile holds a timeline at all (rows of CPU ops or kernels)
    forward_spans: frozenset[tuple[int, str]]  # (rank, name) of its `vtrain/forward ...` spans
    #: the point-to-point ``nccl_latency`` rows left out of :attr:`nccl_latency` because their times include the
    #: wait for a peer its traces do not hold (:data:`~vtrain.tables.latency.RAW_DURATION`: one rank of a pipeline)
    waits_included: int = 0

    @property
    def shapeless(self) -> bool:
        """Whether the timeline has calls and none with its input shapes (traced without ``record_shapes=True``):
        no operator can be looked up by its shape."""
        return self.has_timeline and all(dims is None for _, dims, _ in self.timeline)

    def op_rows(self, device_type: str) -> list[OpRow]:
        """The ``op_latency`` rows of one device type (``cuda`` or ``cpu``)."""
        return [row for row in self.op_latency if row[0] == device_type]

    def nccl_rows(self, device_type: str) -> list[NcclRow]:
        """The ``nccl_latency`` rows of one device type, ordered by bytes."""
        return [row for row in self.nccl_latency if row[0] == device_type]


def digest_of(tables: Mapping[str, pl.DataFrame]) -> ProfileDigest:
    """The digest of a profile's tables (a table it lacks counts as empty)."""
    op_latency = _rows(tables, "op_latency", ("device_type", "op", "input_dims", "input_types", "median_us",
                                              "kernels"))
    nccl, waits_included = _without_waits(tables.get("nccl_latency"))
    nccl_rows = [] if nccl is None or nccl.is_empty() else nccl.sort("bytes", maintain_order=True).select(
        "device_type", "collective", "group_size", "nodes", "bytes", "mean_us", "median_us", "wait_us",
        "source").rows()
    timeline: set[Signature] = set()
    has_timeline = False
    for name, op in (("cpu_ops", "name"), ("kernels", "cpu_op")):
        table = tables.get(name)
        if table is not None and not table.is_empty():
            has_timeline = True
            timeline.update(table.select(op, "input_dims", "input_types").unique().iter_rows())
    return ProfileDigest(tuple(op_latency), tuple(nccl_rows), frozenset(timeline), has_timeline,
                         _forward_spans(tables.get("cpu_ops")), waits_included)


def _without_waits(nccl: pl.DataFrame | None) -> tuple[pl.DataFrame | None, int]:
    """The ``nccl_latency`` rows a prediction may read, and how many it may not: a point-to-point row timed raw, its
    wait for the peer included (no other rank's call matched it: the traces of one stage of a pipeline), times the
    other stage's work, not the transfer (one rank of a 2x2x2 gloo job read its receives at 109 ms where they take
    1.7, and a simulation from it put 35 times the pipeline's transfer time: an audit). A collective among
    replicas timed raw stays: replicas doing the same work wait for each other a little, as a straggler's wait
    (one rank of four's gloo all-reduces priced its gradient reduction at +7.8 %, the datasheet at -64 %)."""
    if nccl is None or "duration_source" not in nccl.columns:
        return nccl, 0
    import polars as pl

    from vtrain.tables.latency import RAW_DURATION
    from vtrain.tables.matching import P2P

    waited = ((pl.col("duration_source") == RAW_DURATION) & pl.col("collective").is_in(list(P2P))).fill_null(False)
    return nccl.filter(~waited), int(nccl.select(waited.sum()).item())


def _rows(tables: Mapping[str, pl.DataFrame], name: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    table = tables.get(name)
    return [] if table is None or table.is_empty() else table.select(columns).rows()


def _forward_spans(cpu_ops: pl.DataFrame | None) -> frozenset[tuple[int, str]]:
    """(rank, name) of every ``vtrain/forward ...`` span (what tells a recorded run's pipeline stages apart)."""
    if cpu_ops is None or cpu_ops.is_empty():
        return frozenset()
    import polars as pl

    spans = cpu_ops.filter(pl.col("name").str.starts_with(f"{SPAN_PREFIX}forward ")).select("rank", "name")
    return frozenset(spans.unique().iter_rows())
