"""What `vtrain calibrate` compares: each operator signature, collective and kernel name of two profiles, summarised
per step, on the ranks both profiles hold.

**Steps, not calls.** The calls of one step share its conditions (a busy machine, a slow rank), so thousands of
calls are not thousands of independent samples: a row's samples are its steps. Its value in a step is the median
of its calls in that step on the compared ranks (one call preempted mid-way does not move it); a collective's is
its fastest call there, as waits for a late member or a descheduled thread only ever add to a call. A row also
keeps what one of its calls varies by from step to step (:func:`step_stats`): the k-th call of a signature in a
step is the same call every step, while its calls in one step may differ by layout (an ``aten::mm`` of the forward
and of the backward), and a kernel name's by shape.

**Ranks.** Only the ranks both profiles hold are compared (:class:`Scope`): a folder holding some ranks of the
base's job compares those, and what only the other ranks ran is not "gone". A collective whose members include a
rank one profile holds and the other does not is not compared either: on the side without that rank its time
includes the wait for it (a receive from a stage not in the folder lasts until that stage would have sent), on
the other it does not. Its members are the call's process-group ranks where the trace gives them, else the group
its ``vtrain/comm`` span's purpose names in the run's layout (``tp``, ``dp``, the whole pipeline for ``pp``, the
first and last stage for ``embedding``); a collective with neither is not compared while any rank is held by one
profile only. Collectives whose trace gives no message size (an all-gather sized by its input alone) have no row.

**Operators on CPU ranks.** The operators that do the work (:func:`vtrain.tables.latency.work_op_mask`) are
decided once for both profiles, per operator, by most of its calls in either: decided per call and per profile,
an operator one of whose calls stalled outside its children was one profile's operator and not the other's, and
showed as new or gone with the timing.

A profile without its calls (one `vtrain fit` made) is compared by its latency tables, each row one sample.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from vtrain.errors import number_ranges
from vtrain.kineto import C10D_OP_PREFIX, group_ranks
from vtrain.naming import COMM_SPAN_PREFIX
from vtrain.parallel import Layout
from vtrain.tables.latency import SIGNATURE, gpu_op_calls, in_communication, op_nesting, work_op_mask
from vtrain.tables.matching import match_calls
from vtrain.tables.schema import TRACE_SOURCE
from vtrain.tables.store import Profile

COLLECTIVE_KEYS = ["collective", "group_size", "bytes", "device_type"]
KERNEL_KEYS = ["name"]
#: the column numbering a call's step
STEP = "iteration"
#: the tables holding a profile's calls
CALL_TABLES = ("kernels", "cpu_ops", "collectives")
_KEY_TYPES = {"op": pl.String, "input_dims": pl.String, "input_types": pl.String, "device_type": pl.String,
              "collective": pl.String, "group_size": pl.Int32, "bytes": pl.Int64, "name": pl.String}
#: one side's rows: the keys and these statistics (see :func:`step_stats`)
STATS = {"count": pl.Int64, "median_us": pl.Float64, "p10_us": pl.Float64, "p90_us": pl.Float64,
         "jitter": pl.Float64, "repeats": pl.Float64, "spread": pl.Float64}

#: in a collective call's ``waits_for``: its members are not known
UNKNOWN = -1

Sides = tuple[pl.DataFrame, pl.DataFrame]


@dataclass(frozen=True)
class Scope:
    """The ranks compared, and those only one profile holds (``None`` where a profile holds no calls)."""

    compared: frozenset[int] | None
    not_given: tuple[int, ...] = ()  # the base's ranks the new traces do not hold
    only_new: tuple[int, ...] = ()  # the new traces' ranks the base does not hold

    @classmethod
    def of(cls, old: Profile, new: Profile) -> Scope:
        """The ranks both profiles hold; a profile without calls restricts nothing."""
        before, after = held_ranks(old), held_ranks(new)
        if before is None or after is None:
            return cls(compared=before if after is None else after)
        return cls(compared=before & after, not_given=tuple(sorted(before - after)),
                   only_new=tuple(sorted(after - before)))

    @property
    def one_sided(self) -> frozenset[int]:
        """Ranks one profile holds and the other does not."""
        return frozenset(self.not_given + self.only_new)

    def lines(self, base: object) -> list[str]:
        """What was left out, in words (none when both profiles hold the same ranks)."""
        said = []
        compared = ranks_text(sorted(self.compared or ()))
        if self.not_given:
            said.append(f"the new traces hold ranks {compared} of the base profile {base}'s job: ranks "
                        f"{ranks_text(self.not_given)} are not given, and their operators, kernels and collectives "
                        "are not compared (not gone)")
        if self.only_new:
            said.append(f"ranks {ranks_text(self.only_new)} of the new traces are not in the base profile {base}: "
                        "their operators, kernels and collectives are not compared (not new)")
        return said


def held_ranks(profile: Profile) -> frozenset[int] | None:
    """The ranks whose calls ``profile`` holds, ``None`` when it holds no calls (a fitted profile)."""
    found: set[int] = set()
    for table in CALL_TABLES:
        found.update(profile[table]["rank"].unique().to_list())
    return frozenset(found) or None


def ranks_text(ranks: Iterable[int]) -> str:
    """``0-3, 5, 6`` for 0, 1, 2, 3, 5, 6: runs of three or more as ranges."""
    return number_ranges(ranks, shortest=3)


def step_stats(calls: pl.DataFrame, keys: list[str], in_step: pl.Expr = pl.col("dur").median()) -> pl.DataFrame:
    """Per key of ``calls`` (``rank``, ``keys``, step, ``dur``; each rank's in the order they were made): its calls
    (``count``); over the steps it was called in, the median, p10 and p90 of its value in a step (``in_step`` of
    its calls there), their relative lower spread ``jitter = (median - p10) / median`` (of two steps or more) and
    the number of steps (``repeats``); and ``spread``, what one of its calls varies by: the relative lower spread
    of one call site (the k-th call of the key in a step of a rank) over the steps, the median over its sites."""
    steps = calls.group_by(*keys, STEP).agg(calls=pl.len(), value=in_step)
    stats = steps.group_by(keys).agg(
        count=pl.col("calls").sum(), median_us=pl.col("value").median(),
        p10_us=pl.col("value").quantile(0.1, interpolation="linear"),
        p90_us=pl.col("value").quantile(0.9, interpolation="linear"), repeats=pl.len())
    sites = (calls.with_columns(site=pl.int_range(pl.len()).over("rank", *keys, STEP))
             .group_by(*keys, "rank", "site")
             .agg(n=pl.len(), median=pl.col("dur").median(), p10=pl.col("dur").quantile(0.1, interpolation="linear"))
             .filter((pl.col("n") >= 2) & (pl.col("median") > 0))
             .group_by(keys).agg(spread=((pl.col("median") - pl.col("p10")) / pl.col("median")).median()))
    stats = stats.join(sites, on=keys, how="left", nulls_equal=True)
    return _typed(stats.with_columns(jitter=pl.when((pl.col("repeats") >= 2) & (pl.col("median_us") > 0))
                                     .then((pl.col("median_us") - pl.col("p10_us")) / pl.col("median_us"))), keys)


def latency_stats(table: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """A latency table's rows as one side's rows, for a profile without its calls: each row one sample, with the
    spread of its calls."""
    own = pl.when((pl.col("count") >= 2) & (pl.col("median_us") > 0)).then(
        (pl.col("median_us") - pl.col("p10_us")) / pl.col("median_us"))
    return _typed(table.with_columns(jitter=own, spread=own, repeats=pl.lit(1.0)), keys)


def _typed(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``keys`` and :data:`STATS`, of one type whatever the side (so that the two sides join)."""
    return frame.select(*(pl.col(k).cast(_KEY_TYPES[k]) for k in keys),
                        *(pl.col(c).cast(dtype) for c, dtype in STATS.items()))


# ------------------------------------------------------------------------------------------------ kernels

def kernel_rows(old: Profile, new: Profile, scope: Scope) -> Sides:
    """Per kernel name, each side's steps on the compared ranks."""
    def side(profile: Profile) -> pl.DataFrame:
        return step_stats(_on(profile["kernels"], scope).sort("ts"), KERNEL_KEYS)

    return side(old), side(new)


def _on(table: pl.DataFrame, scope: Scope) -> pl.DataFrame:
    """The rows of ``table`` on the compared ranks."""
    return table if scope.compared is None else table.filter(pl.col("rank").is_in(list(scope.compared)))


# ------------------------------------------------------------------------------------------------ operators

def operator_rows(old: Profile, new: Profile, scope: Scope) -> Sides:
    """Per operator signature, each side's steps: the calls that launched device work on ranks with some, the
    operators doing the work (decided for both sides at once) on the others; a profile without calls gives its
    ``op_latency`` rows."""
    host = [_host_ops(profile, scope) for profile in (old, new)]
    working = work_signatures(*host)
    sides = []
    for profile, ops in zip((old, new), host):
        if held_ranks(profile) is None:
            sides.append(latency_stats(profile["op_latency"], SIGNATURE))
            continue
        calls = pl.concat([_device_op_calls(_on(profile["kernels"], scope)), _host_op_calls(ops, working)],
                          how="vertical_relaxed")
        sides.append(step_stats(calls, SIGNATURE))
    return sides[0], sides[1]


def _host_ops(profile: Profile, scope: Scope) -> pl.DataFrame:
    """The CPU operators of the compared ranks without device activity, in :func:`op_nesting` order."""
    with_device = profile["kernels"]["rank"].unique().to_list()
    ops = _on(profile["cpu_ops"], scope).filter((pl.col("cat") == "cpu_op") & ~pl.col("rank").is_in(with_device))
    return ops.sort("rank", "tid", "ts", pl.col("dur"), descending=[False, False, False, True])


def work_signatures(old: pl.DataFrame, new: pl.DataFrame) -> pl.DataFrame:
    """``name``, ``input_dims``, ``input_types`` of the operators doing the work, decided per operator by most of
    its calls in either side's ``cpu_ops`` (each in :func:`op_nesting` order)."""
    both = pl.concat([old.with_columns(_side=pl.lit(0)), new.with_columns(_side=pl.lit(1))], how="vertical_relaxed")
    names = both["name"].to_list()
    keys: list[object] = list(zip(names, both["input_dims"].to_list(), both["input_types"].to_list()))
    threads = (both["rank"].cast(pl.Int64) * 2 + both["_side"]).to_list()  # one timeline per side and rank
    working = work_op_mask(threads, both["tid"].to_list(), both["ts"].to_list(), both["dur"].to_list(), names, keys)
    return both.filter(pl.Series(working, dtype=pl.Boolean)).select("name", "input_dims", "input_types").unique()


def _host_op_calls(ops: pl.DataFrame, working: pl.DataFrame) -> pl.DataFrame:
    """Every call of a working operator outside the collectives (see
    :func:`vtrain.tables.latency.cpu_op_calls`)."""
    parent, _ = op_nesting(ops["rank"].to_list(), ops["tid"].to_list(), ops["ts"].to_list(), ops["dur"].to_list())
    outside = ~pl.Series(in_communication(ops["name"].to_list(), parent), dtype=pl.Boolean)
    calls = ops.filter(outside).join(working, on=["name", "input_dims", "input_types"], how="semi", nulls_equal=True)
    return calls.sort("ts").select("rank", op="name", input_dims="input_dims", input_types="input_types",
                                   device_type=pl.lit("cpu"), iteration=STEP, dur="dur")


def _device_op_calls(kernels: pl.DataFrame) -> pl.DataFrame:
    """:func:`vtrain.tables.latency.gpu_op_calls` (in the order they were made) with the step of each call, that
    of its first kernel."""
    steps = kernels.sort("ts").group_by("rank", "external_id").agg(pl.col(STEP).first())
    calls = gpu_op_calls(kernels).join(steps, on=["rank", "external_id"], how="left", nulls_equal=True,
                                       maintain_order="left")
    return calls.select("rank", *SIGNATURE, STEP, "dur")


# ------------------------------------------------------------------------------------------------ collectives

@dataclass(frozen=True)
class CollectiveRows:
    """Each side's collective rows, and the calls left out for waiting on ranks only one profile holds
    (``collective``, ``group_size``, ``bytes``, ``device_type``, ``old_calls``, ``new_calls``, ``waits_for``)."""

    old: pl.DataFrame
    new: pl.DataFrame
    left_out: pl.DataFrame


def collective_rows(old: Profile, new: Profile, scope: Scope) -> CollectiveRows:
    """Per collective, group size, bytes and device: each side's steps of the calls whose members both profiles
    hold. A call's time is its transfer where its members were matched; a key none of whose calls were matched
    keeps their own times, waits included (as ``nccl_latency`` does). A collective's value in a step is its fastest
    call there: waits for a late member or a descheduled thread only ever add to a call."""
    sides, left = [], []
    for side, profile in (("old", old), ("new", new)):
        if held_ranks(profile) is None:
            trace_rows = profile["nccl_latency"].filter(
                pl.col("source").is_null() | (pl.col("source") == TRACE_SOURCE))
            sides.append(latency_stats(trace_rows, COLLECTIVE_KEYS))
            continue
        calls = _collective_calls(profile, scope)
        sides.append(step_stats(calls.filter(pl.col("waits_for").is_null()), COLLECTIVE_KEYS,
                                in_step=pl.col("dur").min()))
        left.append(calls.filter(pl.col("waits_for").is_not_null()).with_columns(side=pl.lit(side)))
    return CollectiveRows(old=sides[0], new=sides[1], left_out=_left_out(left))


def _left_out(calls: list[pl.DataFrame]) -> pl.DataFrame:
    """One row per collective key left out on either side: its calls on each and the ranks they wait for."""
    found = pl.concat(calls) if calls else pl.DataFrame()
    if found.is_empty():
        return pl.DataFrame(schema={**{k: _KEY_TYPES[k] for k in COLLECTIVE_KEYS}, "old_calls": pl.Int64,
                                    "new_calls": pl.Int64, "waits_for": pl.String})
    summary = found.group_by(COLLECTIVE_KEYS).agg(
        old_calls=(pl.col("side") == "old").sum().cast(pl.Int64),
        new_calls=(pl.col("side") == "new").sum().cast(pl.Int64),
        waits=pl.col("waits_for").list.explode().unique())
    text = [_waits_text(waits) for waits in summary["waits"].to_list()]
    return (summary.with_columns(waits_for=pl.Series(text, dtype=pl.String)).drop("waits")
            .sort(COLLECTIVE_KEYS, nulls_last=True))


def _waits_text(ranks: list[int]) -> str:
    """The ranks some calls wait for, where :data:`UNKNOWN` stands for calls whose members are not known."""
    said = [ranks_text(rank for rank in set(ranks) if rank != UNKNOWN)]
    if UNKNOWN in ranks:
        said.append("members not known (any rank one profile holds)")
    return "; ".join(text for text in said if text)


def _collective_calls(profile: Profile, scope: Scope) -> pl.DataFrame:
    """The sized collective calls of the compared ranks: keys, step, time, and ``waits_for`` (the ranks only one
    profile holds that the call waits for, :data:`UNKNOWN` where its members are not known; null when none)."""
    sized = profile["collectives"].filter(pl.col("bytes").is_not_null() & pl.col("collective").is_not_null())
    issuing = profile["cpu_ops"].filter(pl.col("name").str.starts_with(C10D_OP_PREFIX)
                                        | pl.col("name").str.starts_with(COMM_SPAN_PREFIX))
    calls = _on(match_calls(sized, issuing if issuing.height else None), scope).with_columns(
        pl.coalesce(pl.col("members").cast(pl.Int32), "group_size").alias("group_size"))
    matched = calls.filter(pl.col("transfer_us").is_not_null())
    raw = (calls.filter(pl.col("transfer_us").is_null()
                        & ~((pl.col("device_type") == "cpu") & (pl.col("collective") == "send")))
           .join(matched.select(COLLECTIVE_KEYS).unique(), on=COLLECTIVE_KEYS, how="anti", nulls_equal=True))
    calls = pl.concat([matched.with_columns(dur=pl.col("transfer_us")), raw]).sort("ts")
    layout = run_layout(profile.metadata)
    waits = [_waits_for(rank, ranks, purpose, layout, scope.one_sided)
             for rank, ranks, purpose in calls.select("rank", "group_ranks", "purpose").iter_rows()]
    return calls.select("rank", *COLLECTIVE_KEYS, STEP, "dur",
                        pl.Series("waits_for", waits, dtype=pl.List(pl.Int64)))


def run_layout(metadata: dict[str, Any]) -> Layout | None:
    """The job's tp x dp x pp layout from the run config a profile recorded, when it spans the job's ranks."""
    parallelism = (metadata.get("run") or {}).get("parallelism") or {}
    try:
        layout = Layout(tp=int(parallelism["tp"]), pp=int(parallelism["pp"]), dp=int(parallelism["dp"]))
    except (KeyError, TypeError, ValueError):
        return None
    world = metadata.get("world_size")
    return layout if world in (None, layout.world_size) else None


def _waits_for(rank: int, ranks: str | None, purpose: str | None, layout: Layout | None,
               one_sided: frozenset[int]) -> list[int] | None:
    """The ranks only one profile holds among a call's members (``[UNKNOWN]`` where its members are not known),
    ``None`` when there are none."""
    if not one_sided:
        return None
    members = _members(rank, ranks, purpose, layout)
    if members is None:
        return [UNKNOWN]
    return sorted(one_sided.intersection(members)) or None


def _members(rank: int, ranks: str | None, purpose: str | None, layout: Layout | None) -> tuple[int, ...] | None:
    """A call's members: its process-group ranks, else its purpose's group in the layout, else ``None``."""
    if ranks:
        try:
            found = group_ranks(json.loads(ranks))
        except json.JSONDecodeError:
            found = None
        if found is not None:
            return found
    if layout is None or purpose is None or not 0 <= rank < layout.world_size:
        return None
    pipeline = layout.pp_group(rank)
    groups = {"tp": layout.tp_group, "dp": layout.dp_group, "pp": lambda _: pipeline,
              "embedding": lambda _: [pipeline[0], pipeline[-1]]}
    return tuple(groups[purpose](rank)) if purpose in groups else None
