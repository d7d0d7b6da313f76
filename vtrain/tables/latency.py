"""The latency tables the simulator reads: ``op_latency`` (per operator signature) and ``nccl_latency``
(per collective x group size x message size).

A message size is nccl-tests': an all-gather's is its output buffer, its input times its group size
(:func:`all_gather_output`, the one rule, read by ingest too). An all-gather whose trace says neither its output nor
its group size has, in ``collectives``, its input's element count, no ``bytes`` and no ``group_size``
(:func:`input_sized_all_gather`): ``nccl_latency`` sizes it by its input times the members found by matching it
across ranks, and leaves out, with one warning, those it cannot match.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import polars as pl

from vtrain.collective_cost import with_bandwidths
from vtrain.errors import warn_input
from vtrain.kineto import COMMUNICATION_OP_PREFIXES, dtype_bytes
from vtrain.naming import ITERATION_PREFIX
from vtrain.tables.matching import METADATA, P2P, POINT_TO_POINT, match_calls
from vtrain.tables.schema import COMMUNICATION, TRACE_SOURCE
from vtrain.tables.store import conform

SIGNATURE = ["op", "input_dims", "input_types", "device_type"]
KERNEL_SEPARATOR = " ; "
#: ``nccl_latency.duration_source``: what a row's times measure
MATCHED_DURATION = "transfer: end - last arrival"
RAW_DURATION = "raw: waits included"


def all_gather_output(in_n: int | None, out_n: int | None,
                      group_size: int | None) -> tuple[int | None, int | None]:
    """(output elements, group size) of an all-gather of ``in_n`` elements per rank: nccl-tests sizes an all-gather
    by its output buffer. The output is ``out_n`` where the trace gives it, else ``in_n`` x ``group_size``; the group
    size is ``group_size`` where given, else ``out_n / in_n`` (an all-gather's output is its group's inputs). None
    where the trace does not say: an output known from neither is unknown, not the input."""
    if out_n is None and in_n is not None and (group_size or not in_n):  # gathering nothing gives nothing
        out_n = in_n * (group_size or 1)
    if group_size is None and in_n and out_n is not None and out_n >= in_n and out_n % in_n == 0:
        group_size = out_n // in_n
    return out_n, group_size


def input_sized_all_gather() -> pl.Expr:
    """The ``collectives`` rows of all-gathers whose trace says neither their output nor their group size: their
    ``elements`` are their input's, ``bytes`` and ``group_size`` are null (:func:`all_gather_output`)."""
    return ((pl.col("collective") == "all_gather") & pl.col("elements").is_not_null() & pl.col("bytes").is_null()
            & pl.col("group_size").is_null())


def _duration_stats(column: str) -> list[pl.Expr]:
    return [
        pl.len().alias("count"),
        pl.col(column).median().alias("median_us"),
        pl.col(column).quantile(0.1, interpolation="linear").alias("p10_us"),
        pl.col(column).quantile(0.9, interpolation="linear").alias("p90_us"),
        pl.col(column).mean().alias("mean_us"),
    ]


def gpu_op_calls(kernels: pl.DataFrame) -> pl.DataFrame:
    """One row per operator call that launched device work: its signature, kernel sequence and total time.

    Communication kernels are left out (they belong to ``nccl_latency``), as are kernels whose launching CPU
    op is unknown, and those launched under no operator but the iteration's ``ProfilerStep#N`` span: no operator's
    call (keyed by the step's number, they read as an operator gone and a new one in every drift report whose
    traces number their steps otherwise: an audit).
    """
    return (
        kernels.filter(pl.col("cpu_op").is_not_null() & (pl.col("kernel_class") != COMMUNICATION)
                       & ~pl.col("cpu_op").str.starts_with(ITERATION_PREFIX))
        .sort("ts")
        .group_by("rank", "external_id", maintain_order=True)
        .agg(
            op=pl.col("cpu_op").first(), input_dims=pl.col("input_dims").first(),
            input_types=pl.col("input_types").first(),
            kernels=pl.col("name").str.join(KERNEL_SEPARATOR), n_kernels=pl.len().cast(pl.Int32),
            dur=pl.col("dur").sum(),
        )
        .with_columns(device_type=pl.lit("cuda"))
    )


def cpu_op_calls(cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """The CPU operators that do the work, for ranks without device activity.

    On a CPU run an operator's latency is its own CPU duration. The operator that does the work is the outermost
    op whose self time (duration minus the ops nested in it) is at least half its duration, so ``aten::addmm``
    counts rather than its caller ``aten::linear`` or its helpers (``aten::expand``, ``aten::resolve_conj``).
    Every call of such an operator's signature counts, nested in another operator or not: whether a call is the
    outermost one with most of its time to itself depends on its own duration (a call slowed down, e.g.
    preempted, leaves its caller little self time), so those calls alone would be the slow ones.
    Communication ops (``c10d::*``, ``record_param_comms``) and everything inside them are left out.
    """
    ops = cpu_ops.filter(pl.col("cat") == "cpu_op").sort("rank", "tid", "ts", pl.col("dur"), descending=[
        False, False, False, True])
    names = ops["name"].to_list()
    parent, child_time = op_nesting(ops["rank"].to_list(), ops["tid"].to_list(), ops["ts"].to_list(),
                                    ops["dur"].to_list())
    work = pl.Series(_work_ops(names, ops["dur"].to_list(), parent, child_time), dtype=pl.Boolean)
    calls = ops.filter(~pl.Series(in_communication(names, parent), dtype=pl.Boolean))
    signatures = ops.filter(work).select("name", "input_dims", "input_types").unique()
    return calls.join(signatures, on=["name", "input_dims", "input_types"], how="semi", nulls_equal=True).select(
        op="name", input_dims="input_dims", input_types="input_types", dur="dur",
        kernels="name", n_kernels=pl.lit(1, dtype=pl.Int32), device_type=pl.lit("cpu"))


def op_nesting(ranks: list[int], tids: list[int], starts: list[float],
               durations: list[float]) -> tuple[list[int], list[float]]:
    """For CPU ops sorted by (rank, thread, start, longest first): each op's parent (``-1`` at the top) and the
    time of the ops directly nested in it."""
    n = len(starts)
    parent = [-1] * n
    child_time = [0.0] * n
    stack: list[int] = []
    for i in range(n):
        if i and (ranks[i] != ranks[i - 1] or tids[i] != tids[i - 1]):
            stack = []
        while stack and starts[stack[-1]] + durations[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            child_time[stack[-1]] += durations[i]
        stack.append(i)
    return parent, child_time


def in_communication(names: list[str], parent: list[int]) -> list[bool]:
    """True for collectives (``c10d::*``, ``gloo:*``, ``record_param_comms``, ...) and every op nested in one
    (ops in :func:`op_nesting` order)."""
    inside = [False] * len(names)
    for i, name in enumerate(names):
        inside[i] = name.startswith(COMMUNICATION_OP_PREFIXES) or (parent[i] >= 0 and inside[parent[i]])
    return inside


def work_op_mask(ranks: list[int], tids: list[int], starts: list[float], durations: list[float],
                 names: list[str], keys: list[object] | None = None) -> list[bool]:
    """For CPU ops sorted by (rank, thread, start, longest first): True for the ops doing the work.

    The outermost op whose self time is at least half its duration, except that an op holding a collective
    (``c10d::*``, ``gloo:*``, ...) is never one: its self time is mostly the wait for that collective (e.g. a
    tensor-parallel ``autograd.Function``), so the search goes on inside it. Collectives and what they hold are
    never work ops. With ``keys`` (each op's operator, e.g. its rank, name and dims) it is decided per operator, by
    most of the calls in which it is the outermost candidate: one call stalled outside its children (an
    ``aten::scaled_dot_product_attention`` preempted around the operator it calls) does not make its operator
    one, nor leave its children none; without, call by call (the profile's tables: every signature one of
    whose calls does the work has its latency there, for the simulator to find the operators it places).
    """
    parent, child_time = op_nesting(ranks, tids, starts, durations)
    return _work_ops(names, durations, parent, child_time, keys)


def _work_ops(names: list[str], durations: list[float], parent: list[int], child_time: list[float],
              keys: list[object] | None = None) -> list[bool]:
    holds_comm = [name.startswith(COMMUNICATION_OP_PREFIXES) for name in names]
    for i in range(len(names) - 1, -1, -1):
        if holds_comm[i] and parent[i] >= 0:
            holds_comm[parent[i]] = True

    def mostly_its_own(i: int) -> bool:  # this call's self time is at least half its duration
        return durations[i] > 0 and durations[i] - child_time[i] >= 0.5 * durations[i]

    if keys is None:
        return [works for _, works in _covered(names, parent, holds_comm, mostly_its_own)]
    tally: dict[object, list[int]] = {}  # per operator: calls that did the work, calls that were candidates
    for key, (candidate, works) in zip(keys, _covered(names, parent, holds_comm, mostly_its_own)):
        if candidate:
            counts = tally.setdefault(key, [0, 0])
            counts[0] += works
            counts[1] += 1
    working = {key for key, (works, candidates) in tally.items() if 2 * works > candidates}
    return [works for _, works in _covered(names, parent, holds_comm,
                                           lambda i: durations[i] > 0 and keys[i] in working)]


def _covered(names: list[str], parent: list[int], holds_comm: list[bool],
             works: Callable[[int], bool]) -> Iterator[tuple[bool, bool]]:
    """For each op in :func:`op_nesting` order: (whether it is a candidate: no work op or collective at or above
    it, and it holds no collective; whether ``works(i)`` says it does the work); a candidate that works covers the
    ops nested in it."""
    covered = [False] * len(names)  # a work op or a collective is at or above this op
    for i, name in enumerate(names):
        above = parent[i] >= 0 and covered[parent[i]]
        if name.startswith(COMMUNICATION_OP_PREFIXES):
            covered[i] = True
            yield False, False
            continue
        candidate = not above and not holds_comm[i]
        works_here = candidate and works(i)
        covered[i] = above or works_here
        yield candidate, works_here


def op_latency(calls: pl.DataFrame) -> pl.DataFrame:
    """Aggregate operator calls by signature; ``kernels`` is the most common kernel sequence of the signature."""
    if calls.is_empty():
        return conform(pl.DataFrame(), "op_latency")
    stats = calls.group_by(SIGNATURE).agg(*_duration_stats("dur"))
    sequence = (
        calls.group_by(*SIGNATURE, "kernels", "n_kernels").agg(pl.len().alias("seen"))
        .sort("seen", "kernels", descending=[True, False])
        .unique(SIGNATURE, keep="first")
        .drop("seen")
    )
    table = stats.join(sequence, on=SIGNATURE, how="left", nulls_equal=True)
    # the slowest first; ties in signature order, so that the same calls write the same table (the profile's key)
    return conform(table.sort("median_us", *SIGNATURE, descending=[True] + [False] * len(SIGNATURE)), "op_latency")


def nccl_latency(collectives: pl.DataFrame, cpu_ops: pl.DataFrame | None = None,
                 iterations: list[int] | None = None) -> pl.DataFrame:
    """Time and nccl-tests bandwidths per collective, group size and message size.

    Calls matched across ranks (:func:`vtrain.tables.matching.match_calls`; ``cpu_ops`` gives gloo calls their
    issuing operator and span labels) count with their transfer time, from the last member's arrival to their
    end, so a rank that arrived early does not make the collective look slow; the group size is the number of
    members found and ``wait_us`` the mean time members waited for the last one. ``mean_us`` and ``wait_us`` are
    those of a typical iteration: each iteration's mean, the median over iterations (a burst of slow iterations
    does not move them). A (collective, group size,
    size) with no matched call keeps the raw per-rank durations, waits included (``duration_source`` says
    which), except gloo sends on CPU ranks, whose span lasts until the sender waits for the send and says nothing
    about the transfer. The ``collectives`` table itself keeps every raw duration. ``iterations``: only the calls
    of these count, matched among all of them (a member of a collective that one rank's iteration boundary put in the
    next iteration is still a member: held-out profiles, :func:`vtrain.validate.model.held_out_profile`).
    An all-gather sized by its input alone (:func:`input_sized_all_gather`) is matched by its input's bytes and
    sized by its input times its members (:func:`_sized_by_members`).
    """
    sized = _with_input_bytes(collectives).filter(pl.col("bytes").is_not_null() & pl.col("collective").is_not_null())
    if sized.is_empty():
        return conform(pl.DataFrame(), "nccl_latency")
    keys = ["collective", "group_size", "bytes", "device_type"]
    calls = _sized_by_members(match_calls(sized, cpu_ops))
    if calls.is_empty():
        return conform(pl.DataFrame(), "nccl_latency")
    if iterations is not None:
        calls = calls.filter(pl.col("iteration").is_in(iterations))
    matched = calls.filter(pl.col("transfer_us").is_not_null()).with_columns(
        group_size=pl.col("members"), duration=pl.col("transfer_us"), duration_source=pl.lit(MATCHED_DURATION))
    raw = (
        calls.filter(pl.col("transfer_us").is_null()
                     & ~((pl.col("device_type") == "cpu") & (pl.col("collective") == "send")))
        .join(matched.select(keys).unique(), on=keys, how="anti", nulls_equal=True)
        .with_columns(duration=pl.col("dur"), wait_us=pl.lit(None, dtype=pl.Float64),
                      duration_source=pl.lit(RAW_DURATION),
                      group_size_source=pl.when(pl.col("collective").is_in(P2P)).then(pl.lit(POINT_TO_POINT))
                      .when(pl.col("group_size").is_not_null()).then(pl.lit(METADATA)))
    )
    columns = [*keys, "iteration", "duration", "wait_us", "algorithm", "group_size_source", "duration_source"]
    rows = pl.concat([matched.select(columns), raw.select(columns)], how="vertical_relaxed")
    typical = (rows.group_by([*keys, "iteration"]).agg(pl.col("duration", "wait_us").mean())
               .group_by(keys).agg(mean_us=pl.col("duration").median(), wait_us=pl.col("wait_us").median()))
    table = (
        rows.group_by(keys)
        .agg(*_duration_stats("duration"),
             algorithm=pl.col("algorithm").drop_nulls().mode().first(),
             group_size_source=pl.col("group_size_source").drop_nulls().mode().first(),
             duration_source=pl.col("duration_source").first())
        .drop("mean_us")
        .join(typical, on=keys, nulls_equal=True)
        .with_columns(source=pl.lit(TRACE_SOURCE))
    )
    return conform(with_bandwidths(table).sort(keys, nulls_last=True), "nccl_latency")


#: the column marking, during :func:`nccl_latency`, the all-gathers whose ``bytes`` are their input's
_INPUT_SIZED = "_input_sized"


def _with_input_bytes(collectives: pl.DataFrame) -> pl.DataFrame:
    """``collectives`` with the input-sized all-gathers' (:func:`input_sized_all_gather`) ``bytes`` their input's,
    which every member of one call has, to match them across ranks; :data:`_INPUT_SIZED` marks them."""
    marked = collectives.with_columns(input_sized_all_gather().fill_null(False).alias(_INPUT_SIZED))
    if not marked[_INPUT_SIZED].any():
        return marked
    sizes = {dtype: dtype_bytes(dtype) for dtype in marked.filter(_INPUT_SIZED)["dtype"].unique().to_list()}
    item = pl.col("dtype").replace_strict(sizes, default=None, return_dtype=pl.Int64)
    return marked.with_columns(bytes=pl.when(_INPUT_SIZED).then(pl.col("elements") * item)
                               .otherwise(pl.col("bytes")))


def _sized_by_members(calls: pl.DataFrame) -> pl.DataFrame:
    """Matched ``calls`` (:func:`vtrain.tables.matching.match_calls`) with the input-sized all-gathers sized as
    :func:`all_gather_output` sizes one: input bytes x members, the group size the members found. Those matched with
    no other rank's call have no size: left out, with one warning line."""
    marked = pl.col(_INPUT_SIZED)
    unsized = calls.filter(marked & pl.col("members").is_null())
    if not unsized.is_empty():
        ranks = sorted(unsized["rank"].unique().to_list())
        warn_input(f"{unsized.height} all-gather call(s) on {len(ranks)} rank(s) ({', '.join(map(str, ranks[:5]))}"
                   f"{' ...' if len(ranks) > 5 else ''}) say neither their output size nor their group size, and were "
                   f"matched with no other rank's call (its trace missing, or the calls not found together): their "
                   f"message size is unknown, they are left out of nccl_latency")
    return (calls.filter(~marked | pl.col("members").is_not_null())
            .with_columns(bytes=pl.when(marked).then(pl.col("bytes") * pl.col("members")).otherwise(pl.col("bytes")),
                          group_size=pl.when(marked).then(pl.col("members").cast(pl.Int32))
                          .otherwise(pl.col("group_size")))
            .drop(_INPUT_SIZED))
