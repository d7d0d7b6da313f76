"""Collective calls matched across ranks: which calls on different ranks are one collective, how long each member
waited for the last one to arrive, and how long the transfer took once everyone had arrived.

A collective cannot progress before its last member has arrived, so the time one rank spends in it splits into
``wait_us`` (last arrival - own arrival: the rank was early) and ``transfer_us`` (own end - last arrival).
A point-to-point transfer is complete when the receiver has the data, so both of its members get
``receiver's end - later arrival`` (a gloo ``isend`` span lasts until the sender waits for it, which says nothing
about the transfer).

A rank *arrives* when it issues the call (and is *ready* once its previous call in the group has ended, for calls
issued asynchronously while that one still ran: the times above are taken from the ready times): on CPU ranks the start of the issuing ``c10d::*`` operator when
``cpu_ops`` is given (gloo's ``gloo:send`` annotation only starts once ``c10d::send`` has returned, and that call
can block for milliseconds), else the start of the collective's own event (the NCCL kernel, the annotation).

The members of each call are found per iteration, in issue order, within a group that comes from (the
``group_size_source`` of each matched call says which):

``metadata``
    the call's process-group ranks or name (NCCL kernels and ``record_param_comms`` carry them);
``point-to-point``
    a send and a receive, between the only two ranks with transfers of that size or, on recorded runs, between
    the stages their ``vtrain/comm`` spans name; when a stage has several ranks (replicas), the pairing of the
    two stages' ranks under which no receive completed before its send was posted
    (:mod:`vtrain.tables.pairing`);
``matched across ranks``
    gloo collectives carry no group. On ranks that share a clock (CPU ranks of one host) the members of one
    collective overlap in time (none ends before the last one arrives) and mostly end together: a rank's group
    is the ranks whose calls of the same collective and size overlap each of its calls, narrowed to those whose
    calls also end within a quarter of the shorter call's duration of its own in most calls when that narrowing
    is consistent across the members.

Calls that cannot be matched (peers without a trace, groups that issued different sequences, members that do not
overlap on a shared clock) keep ``transfer_us`` null and ``group_size_source`` says nothing about them.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import polars as pl

from vtrain.kineto import C10D_OP_PREFIX, group_ranks
from vtrain.naming import COMM_SPAN_PREFIX, parse_span_name
from vtrain.tables.calls import Call, align, classes, ordered, pair_in_order, start_when_ready
from vtrain.tables.pairing import match_point_to_point

METADATA, POINT_TO_POINT, MATCHED = "metadata", "point-to-point", "matched across ranks"
P2P = ("send", "recv")
#: members of one collective end within this share of the shorter member's duration of each other
CO_COMPLETION = 0.25
#: a nearest partner ends at most this share of the gap to any other candidate from a rank's calls
NEAREST_MARGIN = 1 / 3
_ISSUE_TOLERANCE_US = 1.0
_RESULTS = ("match_id", "members", "transfer_us", "wait_us", "group_size_source")
_SPAN_FIELDS = ("span_stage", "span_peer", "span_phase", "span_mb", "purpose")

MATCH_COLUMNS = {"arrival_ts": pl.Float64, "issue_end_ts": pl.Float64, "purpose": pl.String, "match_id": pl.Int64,
                 "members": pl.Int32, "transfer_us": pl.Float64, "wait_us": pl.Float64,
                 "group_size_source": pl.String}


def match_calls(collectives: pl.DataFrame, cpu_ops: pl.DataFrame | None = None) -> pl.DataFrame:
    """``collectives`` with :data:`MATCH_COLUMNS` added: arrival and end of the issuing operator, the purpose of
    the ``vtrain/comm`` span around the call, the collective it was matched into (``match_id``, the input row of
    its first member), members found, transfer and wait times and where the group came from (null where the
    call was not matched)."""
    if collectives.is_empty():
        return collectives.with_columns(pl.lit(None, dtype=dtype).alias(name) for name, dtype in MATCH_COLUMNS.items())
    frame = _with_issue_context(collectives.with_row_index("_row"), cpu_ops)
    calls = [
        Call(row=row, rank=rank, kind=kind, nbytes=nbytes, iteration=iteration, on_cpu=device == "cpu",
              arrival=arrival, end=ts + dur, group=_metadata_group(ranks, pg), stage=stage, peer=peer,
              label=(phase, mb))
        for row, rank, kind, nbytes, iteration, device, arrival, ts, dur, ranks, pg, stage, peer, phase, mb
        in frame.select("_row", "rank", "collective", "bytes", "iteration", "device_type", "arrival_ts", "ts", "dur",
                        "group_ranks", "process_group", *_SPAN_FIELDS[:4]).iter_rows()
        if kind is not None and ts is not None and dur is not None
    ]
    present = {c.rank for c in calls}
    _match_metadata([c for c in calls if c.group is not None], present)
    match_point_to_point([c for c in calls if c.kind in P2P and not _names_pair(c.group)], POINT_TO_POINT)
    _match_by_completion([c for c in calls if c.group is None and c.kind not in P2P and c.on_cpu])
    start_when_ready(calls, P2P)
    results = pl.DataFrame(
        {"_row": [c.row for c in calls], "match_id": [c.match for c in calls], "members": [c.members for c in calls],
         "transfer_us": [c.transfer for c in calls], "wait_us": [c.wait for c in calls],
         "group_size_source": [c.source for c in calls]},
        schema={"_row": pl.UInt32, **{k: v for k, v in MATCH_COLUMNS.items() if k in _RESULTS}})
    return (frame.join(results, on="_row", how="left").sort("_row")
            .drop("_row", *_SPAN_FIELDS[:4]))


# ------------------------------------------------------------------------------------------ context of each call

def _with_issue_context(frame: pl.DataFrame, cpu_ops: pl.DataFrame | None) -> pl.DataFrame:
    """Add ``arrival_ts`` and ``issue_end_ts`` (the issuing c10d op's start and end on CPU ranks; else the call's
    start and null) and the stage and peer of the ``vtrain/comm`` span around the call (null without one)."""
    frame = frame.with_columns(pl.col("ts").alias("arrival_ts"), pl.lit(None, dtype=pl.Float64).alias("issue_end_ts"),
                               *(pl.lit(None, dtype=pl.String).alias(c) for c in _SPAN_FIELDS))
    if cpu_ops is None or cpu_ops.is_empty():
        return frame
    issuing = (cpu_ops.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with(C10D_OP_PREFIX))
               .select("rank", issue_ts=pl.col("ts"), issue_end=pl.col("ts") + pl.col("dur")).sort("issue_ts"))
    spans = _comm_spans(cpu_ops)
    joined = frame.sort("ts")
    if not issuing.is_empty():
        joined = (
            joined.join_asof(issuing, left_on="ts", right_on="issue_ts", by="rank", strategy="backward",
                              check_sortedness=False)
            .with_columns(issued=(pl.col("device_type") == "cpu")
                          & (pl.col("ts") <= pl.col("issue_end") + _ISSUE_TOLERANCE_US))
            .with_columns(arrival_ts=pl.when("issued").then(pl.col("issue_ts")).otherwise(pl.col("ts")),
                          issue_end_ts=pl.when("issued").then(pl.col("issue_end")))
            .drop("issue_ts", "issue_end", "issued")
        )
    if not spans.is_empty():
        joined = (
            joined.drop(*_SPAN_FIELDS)
            .join_asof(spans, left_on="arrival_ts", right_on="span_ts", by="rank", strategy="backward",
                       check_sortedness=False)
            .with_columns([pl.when(pl.col("arrival_ts") <= pl.col("span_end")).then(pl.col(c)).alias(c)
                           for c in _SPAN_FIELDS])
            .drop("span_ts", "span_end")
        )
    return joined


def _comm_spans(cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """The ``vtrain/comm`` spans: rank, start, end and the fields that identify a transfer."""
    rows = cpu_ops.filter(pl.col("name").str.starts_with(COMM_SPAN_PREFIX)).select("rank", "name", "ts", "dur")
    fields = [(parse_span_name(name) or ("", {}))[1] for name in rows["name"].to_list()]
    return rows.select("rank", span_ts=pl.col("ts"), span_end=pl.col("ts") + pl.col("dur")).with_columns(
        pl.Series(column, [f.get(key) for f in fields], dtype=pl.String)
        for column, key in zip(_SPAN_FIELDS, ("stage", "peer", "phase", "mb", "purpose"))
    ).sort("span_ts")


def _metadata_group(ranks: str | None, pg_name: str | None) -> tuple | None:
    if ranks:
        try:
            parsed = json.loads(ranks)
        except json.JSONDecodeError:
            parsed = None
        if (ranks := group_ranks(parsed)) is not None:
            return ("ranks", ranks)
    return ("name", pg_name) if pg_name else None


# ------------------------------------------------------------------------------------------ the three group sources

def _match_metadata(calls: list[Call], present: set[int]) -> None:
    """Groups named by the trace: match per group, collective and iteration in issue order."""
    by_group: dict[tuple, dict[int, list[Call]]] = defaultdict(lambda: defaultdict(list))
    for call in calls:
        by_group[(call.group, call.kind, call.iteration)][call.rank].append(call)
    for (group, kind, _), per_rank in by_group.items():
        members = list(group[1]) if group[0] == "ranks" else sorted(per_rank)
        if kind in P2P or len(members) < 2 or not set(members) <= present:
            continue
        align(ordered(per_rank.get(rank, []) for rank in members), METADATA)
    _match_metadata_p2p([c for c in calls if c.kind in P2P and _names_pair(c.group)], present)


def _names_pair(group: tuple | None) -> bool:
    return group is not None and group[0] == "ranks" and len(group[1]) == 2


def _match_metadata_p2p(calls: list[Call], present: set[int]) -> None:
    """Point-to-point calls whose group names both ranks: each direction is one channel."""
    by_channel: dict[tuple[int, int], tuple[list[Call], list[Call]]] = defaultdict(lambda: ([], []))
    for call in calls:
        first, second = call.group[1]
        peer = second if call.rank == first else first
        if peer not in present:
            continue
        if call.kind == "send":
            by_channel[(call.rank, peer)][0].append(call)
        else:
            by_channel[(peer, call.rank)][1].append(call)
    for sends, recvs in by_channel.values():
        pair_in_order(sends, recvs, METADATA)



def _match_by_completion(calls: list[Call]) -> None:
    """Collectives without a group on ranks sharing a clock: infer each rank's group, then match the group's
    calls per iteration in issue order.

    Members of one collective overlap in time (none ends before the last arrives), so a rank's candidates are the
    ranks with a call overlapping each of its calls of that collective and size; among them, its group is, in this
    order of preference, when every member names the same group:

    * its nearest partner: the one candidate whose calls end closest to its own, by a clear margin (the median
      end gap to it at most :data:`NEAREST_MARGIN` of the median gap to each other candidate): two groups of two
      reducing at the same moment on a loaded machine can all end within a quarter of their duration, but each
      pair still ends closer together than with the other pair;
    * the ranks whose calls end with its own in most calls (co-completion);
    * all the candidates.
    """
    for same_size in classes(calls, lambda c: (c.kind, c.nbytes)).values():
        per_rank: dict[int, dict[int | None, list[Call]]] = defaultdict(lambda: defaultdict(list))
        for call in same_size:
            per_rank[call.rank][call.iteration].append(call)
        ranks = sorted(per_rank)
        overlapping = {(a, b): _share(per_rank[a], per_rank[b], _overlaps) for a in ranks for b in ranks if a != b}
        candidates = {a: {b for b in ranks if b != a and overlapping[(a, b)] == 1.0 == overlapping[(b, a)]}
                      for a in ranks}
        ending = {a: {b for b in candidates[a] if min(_share(per_rank[a], per_rank[b], _co_completes),
                                                     _share(per_rank[b], per_rank[a], _co_completes)) >= 0.5}
                  for a in ranks}
        nearest = {a: _nearest_partner(per_rank, a, candidates[a]) for a in ranks}
        done: set[int] = set()
        for rank in ranks:
            groups = (_consistent_group(rank, partners) for partners in (nearest, ending, candidates))
            group = next((g for g in groups if g is not None and not done & set(g)), None)
            if group is None:
                continue
            done.update(group)
            for iteration in per_rank[rank]:
                align(ordered(per_rank[member].get(iteration, []) for member in group), MATCHED)


def _nearest_partner(per_rank: dict[int, dict[int | None, list[Call]]], rank: int, candidates: set[int]) -> set[int]:
    """The candidate whose calls end closest to ``rank``'s by a clear margin (a set of one), else an empty set."""
    if len(candidates) < 2:
        return set()
    gaps = {other: _median_end_gap(per_rank[rank], per_rank[other]) for other in candidates}
    closest = min(gaps, key=gaps.get)
    if all(gaps[closest] <= NEAREST_MARGIN * gap for other, gap in gaps.items() if other != closest):
        return {closest}
    return set()


def _median_end_gap(mine: dict[int | None, list[Call]], theirs: dict[int | None, list[Call]]) -> float:
    """Median over my calls of the smallest end gap to an overlapping call of theirs in the same iteration."""
    gaps = sorted(min((abs(other.end - call.end) for other in theirs.get(iteration, []) if _overlaps(call, [other])),
                      default=math.inf)
                  for iteration, calls in mine.items() for call in calls)
    return gaps[len(gaps) // 2] if gaps else math.inf


def _consistent_group(rank: int, partners: dict[int, set[int]]) -> tuple[int, ...] | None:
    """``rank`` and its partners, when every member names the same group."""
    group = {rank} | partners[rank]
    if len(group) < 2 or any({member} | partners[member] != group for member in group):
        return None
    return tuple(sorted(group))


def _share(mine: dict[int | None, list[Call]], theirs: dict[int | None, list[Call]], test) -> float:
    """Share of my calls for which ``test(call, their calls in that iteration)`` holds."""
    calls = [call for per_iteration in mine.values() for call in per_iteration]
    hits = sum(1 for call in calls if test(call, theirs.get(call.iteration, [])))
    return hits / len(calls) if calls else 0.0


def _overlaps(call: Call, others: list[Call]) -> bool:
    """Whether one of ``others`` shares a moment with ``call``."""
    return any(max(call.arrival, other.arrival) <= min(call.end, other.end) for other in others)


def _co_completes(call: Call, others: list[Call]) -> bool:
    """Whether one of ``others`` overlaps ``call`` and ends with it."""
    return any(max(call.arrival, other.arrival) <= min(call.end, other.end)
               and abs(other.end - call.end) <= CO_COMPLETION * min(call.duration, other.duration)
               for other in others)


