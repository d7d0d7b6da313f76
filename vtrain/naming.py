"""The one naming scheme for the spans that `vtrain record` writes and `vtrain simulate` predicts.

Every span the validators align is a ``torch.profiler.record_function`` whose name is::

    vtrain/<kind> key=value key=value ...

``kind`` is one of :data:`SPAN_KINDS`; keys appear in the fixed order of :data:`FIELD_ORDER` and values
contain no spaces. Examples::

    vtrain/forward stage=0 mb=3                     # one micro-batch's forward pass on a pipeline stage
    vtrain/layer phase=backward stage=1 mb=0 layer=5
    vtrain/comm purpose=tp op=all_reduce phase=forward stage=0 mb=2 layer=1
    vtrain/comm purpose=pp op=send phase=forward stage=0 mb=2 peer=1
    vtrain/comm purpose=dp op=all_reduce stage=0 bucket=0
    vtrain/optimizer stage=0

Iterations are the profiler's own ``ProfilerStep#N`` spans.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    import polars as pl

SPAN_PREFIX = "vtrain/"

#: kinds of span: phases (forward, backward, recompute, optimizer), model blocks (embedding, layer, head =
#: final norm + logits + loss) and communication (comm).
SPAN_KINDS = ("forward", "backward", "recompute", "optimizer", "embedding", "layer", "head", "comm")

#: the order in which fields are written; ``purpose`` is tp, pp or dp; ``op`` is the collective
#: (all_reduce, all_gather, reduce_scatter, broadcast, send, recv).
FIELD_ORDER = ("purpose", "op", "phase", "stage", "chunk", "mb", "layer", "peer", "bucket")

PHASES = ("forward", "backward", "recompute", "optimizer")
#: the phase of a timeline's calls that no phase span holds, and the name of every phase together (latency
#: tables, host gaps and interference factors measured over all phases: :mod:`vtrain.tables.gaps`)
ALL, OTHER = "all", "other"

ITERATION_PREFIX = "ProfilerStep#"


def rank_trace_file(rank: int) -> str:
    """The file name of one rank's trace that vtrain writes (recorded, predicted or replayed)."""
    return f"rank-{rank}.json.gz"


#: the whole name of an iteration's span: the prefix and the iteration number in ASCII digits (at most 18: an
#: int64), nothing else (a ``record_function("ProfilerStep#warmup")`` of the user's is no iteration)
ITERATION_NAME = rf"^{ITERATION_PREFIX}([0-9]{{1,18}})$"

#: the prefix of every communication span (``vtrain/comm purpose=...``)
COMM_SPAN_PREFIX = f"{SPAN_PREFIX}comm"


def span_name(kind: str, **fields: object) -> str:
    """Build a span name, e.g. ``span_name("layer", phase="forward", stage=0, mb=1, layer=3)``."""
    if kind not in SPAN_KINDS:
        raise ValueError(f"unknown span kind {kind!r}; expected one of {', '.join(SPAN_KINDS)}")
    unknown = set(fields) - set(FIELD_ORDER)
    if unknown:
        raise ValueError(f"unknown span fields {sorted(unknown)}")
    parts = [f"{SPAN_PREFIX}{kind}"]
    parts += [f"{key}={fields[key]}" for key in FIELD_ORDER if fields.get(key) is not None]
    return " ".join(parts)


def parse_span_name(name: str) -> tuple[str, dict[str, str]] | None:
    """Split a span name into its kind and fields; ``None`` if the name is not a vtrain span."""
    if not name.startswith(SPAN_PREFIX):
        return None
    head, *pairs = name.split(" ")
    kind = head[len(SPAN_PREFIX):]
    if kind not in SPAN_KINDS:
        return None
    fields: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            return None
        fields[key] = value
    return kind, fields


def iteration_id(name: str) -> int | None:
    """The iteration number of a ``ProfilerStep#N`` span (:data:`ITERATION_NAME`), else ``None``."""
    match = re.fullmatch(ITERATION_NAME, name)
    return int(match.group(1)) if match else None


def iteration_numbers(names: pl.Expr) -> pl.Expr:
    """:func:`iteration_id` of each name of a string column: the iteration number of a ``ProfilerStep#N`` span,
    else null."""
    import polars as pl

    return names.str.extract(ITERATION_NAME).cast(pl.Int64)


def step_windows(spans: pl.DataFrame, by: Sequence[str] = (), thread: str | None = None) -> pl.DataFrame:
    """The iterations' windows (``*by, iteration, step_ts, step_end``, sorted by start) of ``ProfilerStep#N`` spans
    given as those columns. ``thread``: the column naming each span's thread, where the steps are those of the thread
    that calls the profiler's ``step()``, whose spans cover the most time (then: the most spans, the lowest thread): a
    span of a number marked on another thread too, empty, had cut the iteration short at its end, the events after
    it in no iteration (an audit). ``None`` for spans made from optimizer steps, each on its step's thread. The
    spans of one number that overlap are one window, from the first start to the last end; spans of one number one
    after another (a trace stitched from others) stay apart."""
    import polars as pl

    if thread is not None and spans.height:
        per_thread = spans.group_by(*by, thread).agg(spans=pl.len(),
                                                     held=(pl.col("step_end") - pl.col("step_ts")).sum())
        ranked = per_thread.sort("held", "spans", thread, descending=[True, True, False], nulls_last=True)
        main = ranked.unique(subset=list(by), keep="first", maintain_order=True) if by else ranked.head(1)
        spans = spans.join(main.select(*by, thread), on=[*by, thread], nulls_equal=True).drop(thread)
    keys = [*by, "iteration"]
    ordered = spans.sort(*keys, "step_ts").with_columns(_reach=pl.col("step_end").cum_max().shift(1).over(keys))
    opens = (pl.col("step_ts") >= pl.col("_reach")).fill_null(True)  # the first span of a number opens its window
    numbered = ordered.with_columns(_window=opens.cast(pl.Int64).cum_sum().over(keys))
    return (numbered.group_by(*keys, "_window").agg(pl.col("step_ts").min(), pl.col("step_end").max())
            .drop("_window").sort(*by, "step_ts"))


def stitched_numbers(spans: pl.DataFrame, by: Sequence[str] = (), thread: str = "thread") -> pl.DataFrame:
    """The ``ProfilerStep#N`` numbers that name steps one after another on one thread (a trace stitched from
    others, or its spans renamed), of spans given as ``*by, thread, iteration, step_ts, step_end``: one row per
    ``*by, iteration`` with ``spans``, how many that thread has, sorted. A step marked on another thread too is
    none (spans on two threads), nor is one span of no length (not "apart" from itself)."""
    import polars as pl

    apart = pl.col("step_ts").max() >= pl.col("step_end").min()
    return (spans.group_by(*by, thread, "iteration").agg(spans=pl.len(), apart=apart)
            .filter(pl.col("apart") & (pl.col("spans") > 1))
            .unique([*by, "iteration"], keep="first").select(*by, "iteration", "spans").sort(*by, "iteration"))
