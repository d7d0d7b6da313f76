"""Tables read off a timeline of events, the same way for the measured and the replayed times.

The event frame comes from :func:`vtrain.replay.replayer.replay` and holds both: the measured ``ts``/``dur`` and
the replayed ``sim_ts``/``sim_dur`` of every event. :func:`annotate` adds what does not depend on the times
(iteration, launching operator, operator class); the other functions take a :data:`Side` and read the
matching columns, so that every definition is literally the same on both sides.

Definitions:

* **iteration**: a ``ProfilerStep#N`` span; CPU events belong to the step that holds their start, device
  activities to the step that launched them. It ends at the later of the step's end and the end of the last
  device activity it launched; it starts at the step's start or, when the previous iteration's device work was
  still running then (steps that overlap on the device), when the previous iteration ended. Consecutive
  iterations therefore never overlap and their times add up to the time they cover. A trace without
  ``ProfilerStep#N`` marks is one iteration (number 0) from its first event to its last.
* **operators**: device activities on GPU ranks; on CPU-only ranks the CPU operators that do the work
  (:func:`vtrain.tables.latency.work_op_mask`) and the collectives.
* **breakdown** of an iteration: ``compute`` (time covered by non-communication operators), ``bubble``
  (pipeline transfers not hidden by compute: waiting for the neighbouring stage), ``exposed_comm`` (other
  collectives not hidden by compute or bubble) and ``idle`` (the rest: framework overhead, launches, gaps).
  On CPU-only ranks sends are left out: a gloo ``isend`` span lasts until the sender waits for it, and the
  transfer shows up as the receiver's wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from vtrain.errors import InputError, some_of
from vtrain.kineto import ATTENTION_OPS, OPTIMIZER_ITERATION, empty_steps_text, fused_attention_dims
from vtrain.naming import ITERATION_PREFIX, SPAN_PREFIX, iteration_numbers, step_windows, stitched_numbers
from vtrain.tables.latency import work_op_mask
from vtrain.validate.opclass import COMM_PREFIX, comm_class, op_class

if TYPE_CHECKING:
    from vtrain.replay.trace import KeptRank, RankTrace


@dataclass(frozen=True)
class Side:
    """Which columns hold the start and duration of events."""

    name: str
    start: str
    dur: str


MEASURED = Side("measured", "ts", "dur")
REPLAYED = Side("replay", "sim_ts", "sim_dur")


def annotate(events: pl.DataFrame) -> pl.DataFrame:
    """Add ``iteration``, ``gpu_rank``, ``op`` and ``call`` (the launching operator of device activities: its name
    and its event), ``is_op`` and ``op_class`` to a replay event frame (text columns are categories, as the frame's
    names are)."""
    gpu_ranks = events.filter(pl.col("kind") == "device")["rank"].unique().to_list()
    frame = events.with_columns(gpu_rank=pl.col("rank").is_in(gpu_ranks))
    frame = _with_iteration(frame)
    launching = (
        frame.filter((pl.col("kind") == "cpu") & (pl.col("cat") == "cpu_op") & pl.col("external_id").is_not_null())
        .unique(["rank", "external_id"], keep="first")
        .select("rank", "external_id", op=pl.col("name"), call=pl.col("event").cast(pl.Int32))  # a rank's event number
    )
    frame = frame.join(launching, on=["rank", "external_id"], how="left")
    device = pl.col("kind") == "device"
    frame = frame.with_columns(op=pl.when(device).then(pl.col("op")).otherwise(pl.col("name")),
                               call=pl.when(device).then(pl.col("call")))
    frame = _with_work_op(frame)
    is_op = (
        pl.when(pl.col("gpu_rank")).then(pl.col("kind") == "device")
        .otherwise(pl.col("collective").is_not_null() | pl.col("work_op"))
    )
    return _with_op_class(frame.with_columns(is_op=is_op.fill_null(False)))


def _with_op_class(frame: pl.DataFrame) -> pl.DataFrame:
    """``op_class``, worked out once for each distinct (kind, name, op, collective)."""
    keys = ["kind", "name", "op", "collective"]
    distinct = frame.select(keys).unique()
    classes = [
        comm_class(collective) if collective is not None or (kind == "device" and name.startswith("nccl"))
        else op_class(op, name if kind == "device" else None)
        for kind, name, op, collective in distinct.iter_rows()
    ]
    table = distinct.with_columns(op_class=pl.Series(classes, dtype=pl.Categorical))
    return frame.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")


def step_spans(frame: pl.DataFrame) -> pl.DataFrame:
    """The ``ProfilerStep#N`` spans of a timeline frame: its CPU events of such a name
    (:data:`vtrain.naming.ITERATION_NAME`; a user's ``ProfilerStep#warmup`` annotation is none)."""
    named = frame.filter((pl.col("kind") == "cpu") & pl.col("name").cat.starts_with(ITERATION_PREFIX))
    return named.filter(iteration_numbers(pl.col("name").cast(pl.String)).is_not_null())


#: how far (µs) a step may seem to run into the next and be the two meeting: a start and a duration added in floating
#: point land a few ulps off the next step's start (steps made from optimizer steps end where the next begins)
STEP_OVERLAP_US = 1.0


def overlapping_steps(trace_dir: object, frame: pl.DataFrame) -> str | None:
    """The warning for ``ProfilerStep#N`` spans that overlap a step of another number on their thread (one step
    stretched over the next, or spans written by hand): each iteration is measured from its step's start or the
    previous iteration's end, whichever is later (:func:`iterations`), so the later step is cut short (a step held
    by the one before measured 0 ms, silently: an audit). ``None`` when the steps follow one another."""
    start = pl.col(MEASURED.start)
    steps = step_spans(frame).select("rank", "lane", number=iteration_numbers(pl.col("name").cast(pl.String)),
                                     start=start, end=start + pl.col(MEASURED.dur)).sort("rank", "lane", "start")
    following = steps.with_columns(next_start=pl.col("start").shift(-1).over("rank", "lane"),
                                   next_number=pl.col("number").shift(-1).over("rank", "lane"))
    overlapping = following.filter((pl.col("next_start") < pl.col("end") - STEP_OVERLAP_US)
                                   & (pl.col("next_number") != pl.col("number")))
    if overlapping.is_empty():
        return None
    first = overlapping.row(0, named=True)
    return (f"{trace_dir}: {overlapping.height} ProfilerStep span(s) run into the next step on their thread (rank "
            f"{first['rank']}: #{first['number']} ends after #{first['next_number']} starts): each iteration is "
            f"measured from its step's start or the previous one's end, whichever is later, so the later step is "
            f"cut short (steps stretched, or written by hand?)")


def stitched_steps(trace_dir: object, frame: pl.DataFrame) -> str | None:
    """The warning for ``ProfilerStep#N`` numbers that name steps one after another on one thread (a trace stitched
    from others, or its spans renamed): each number is one iteration from its first step's start to its last's end,
    the steps between them cut to nothing (a median halved, silently: an audit; ingest says the same of its tables).
    ``None`` when each number names one step on its thread."""
    start = pl.col(MEASURED.start)
    steps = step_spans(frame).select("rank", "lane", iteration=iteration_numbers(pl.col("name").cast(pl.String)),
                                     step_ts=start, step_end=start + pl.col(MEASURED.dur))
    repeated = stitched_numbers(steps, by=["rank"], thread="lane").rename({"iteration": "number"})
    if repeated.is_empty():
        return None
    rank = repeated["rank"][0]
    shown = some_of([f"#{number} x{spans}" for number, spans in
                     repeated.filter(pl.col("rank") == rank).select("number", "spans").rows()])
    return (f"{trace_dir}: {repeated['number'].n_unique()} ProfilerStep number(s) name steps one after another on "
            f"their thread, on {repeated['rank'].n_unique()} rank(s) (rank {rank}: {shown}): each number is measured "
            f"as one iteration from its first step's start to its last's end, the steps between cut short (a trace "
            f"stitched from others, or its spans renamed?)")


def step_layout_warnings(trace_dir: object, frame: pl.DataFrame) -> list[str]:
    """The warnings on how a timeline's ``ProfilerStep#N`` spans lie (:func:`overlapping_steps`,
    :func:`stitched_steps`), for `validate` and `whatif` alike."""
    return [line for line in (overlapping_steps(trace_dir, frame), stitched_steps(trace_dir, frame)) if line]


def without_made_iterations(frame: pl.DataFrame, traces: Sequence[RankTrace | KeptRank]) -> pl.DataFrame:
    """An annotated event frame with no iteration on the ranks whose ``ProfilerStep#N`` spans were made from their
    optimizer steps (:data:`~vtrain.kineto.OPTIMIZER_ITERATION`) where other ``traces`` of the set have the
    profiler's own: their numbers are not the profiler's."""
    made = {trace.rank for trace in traces if trace.optimizer_iterations}
    if not made or len(made) == len(traces):
        return frame
    return frame.with_columns(iteration=pl.when(pl.col("rank").is_in(sorted(made))).then(None)
                              .otherwise(pl.col("iteration")))


def _with_iteration(frame: pl.DataFrame) -> pl.DataFrame:
    spans = step_spans(frame)
    made = spans.select((pl.col("cat").cast(pl.String) == OPTIMIZER_ITERATION).any()).item()
    steps = step_windows(spans.select("rank", "lane", iteration=iteration_numbers(pl.col("name").cast(pl.String)),
                                      step_ts="ts", step_end=pl.col("ts") + pl.col("dur")),
                         by=["rank"], thread=None if made else "lane").rename({"iteration": "step"})
    if steps.is_empty():  # no iteration marks: the whole trace is one iteration
        return frame.with_columns(iteration=pl.lit(0, dtype=pl.Int64))
    # placed on the few columns it needs (sorting the whole frame would copy every name), then put back in order
    order = frame.select("rank", "event", "kind", "ts", "launch").with_row_index("_row").sort("ts")
    placed = (
        order.join_asof(steps.sort("step_ts"), left_on="ts", right_on="step_ts", by="rank", strategy="backward",
                        check_sortedness=False)
        .with_columns(iteration=pl.when(pl.col("ts") < pl.col("step_end")).then(pl.col("step")))
        .drop("step_ts", "step_end", "step")
    )
    launch_iteration = placed.select("rank", launch="event", launch_iteration="iteration")
    placed = (
        placed.join(launch_iteration, on=["rank", "launch"], how="left")
        .with_columns(iteration=pl.when(pl.col("kind") == "device")
                      .then(pl.coalesce("launch_iteration", "iteration")).otherwise(pl.col("iteration")))
        .drop("launch_iteration")
    )
    return frame.with_columns(iteration=placed.sort("_row")["iteration"])


def _with_work_op(frame: pl.DataFrame) -> pl.DataFrame:
    """``work_op``: the CPU operators that do the work (:func:`vtrain.tables.latency.work_op_mask`), decided per
    rank and operator by most of its calls."""
    cpu = (frame.filter((pl.col("kind") == "cpu") & (pl.col("cat") == "cpu_op"))  # ops of one start and length
           .sort("rank", "lane", "ts", "dur", "event", descending=[False, False, False, True, False]))  # in file order
    ranks = cpu["rank"].to_list()
    mask = work_op_mask(ranks, cpu["lane"].to_list(), cpu["ts"].to_list(), cpu["dur"].to_list(), cpu["name"].to_list(),
                        keys=list(zip(ranks, cpu["name"].to_list(), cpu["input_dims"].to_list())))
    work = cpu.select("rank", "event", work_op=pl.Series(mask, dtype=pl.Boolean))
    return frame.join(work, on=["rank", "event"], how="left").with_columns(pl.col("work_op").fill_null(False))


def measured_iterations(frame: pl.DataFrame, trace_dir: object) -> list[int]:
    """The iterations the measured timeline holds events of, in order; none is one line naming the folder: its
    ``ProfilerStep#N`` spans hold no event (a writer that gave them no length), or it has no usable event."""
    found = sorted(iterations(frame, MEASURED)["iteration"].unique().to_list())
    if found:
        return found
    steps = step_spans(frame)
    if steps.height:
        raise InputError(f"{empty_steps_text(steps.height, steps['dur'].max())}: no iteration to measure", trace_dir)
    raise InputError("no events the replay can use (CPU operators, runtime calls, kernels)", trace_dir)


def whole_trace_note(trace_dir: object) -> str:
    """The warning for a trace set without ``ProfilerStep#N`` spans (a profiler used without ``step()``), whose
    iteration :func:`iterations` takes to be everything on each rank."""
    return f"{trace_dir}: no ProfilerStep#N spans; the whole trace is taken as one iteration"


def iterations(frame: pl.DataFrame, side: Side) -> pl.DataFrame:
    """One row per rank and iteration: ``start``, ``end`` and ``time_us`` (``start`` is the step's start, or the
    previous iteration's end when that is later: see the module's definition)."""
    start, dur = pl.col(side.start), pl.col(side.dur)
    # queries, so that only the columns the windows need are read, not every column of the events chosen
    def windows(events: pl.LazyFrame) -> pl.DataFrame:
        return events.filter(pl.col("iteration").is_not_null()).group_by("rank", "iteration").agg(
            start=start.min(), step_end=(start + dur).max()).collect()

    steps = windows(step_spans(frame).lazy())
    if steps.is_empty():  # no iteration marks: the iteration is everything on the rank
        steps = windows(frame.lazy())
    device_end = (
        frame.lazy().filter((pl.col("kind") == "device") & pl.col("iteration").is_not_null())
        .group_by("rank", "iteration").agg(device_end=(start + dur).max()).collect()
    )
    return (
        steps.join(device_end, on=["rank", "iteration"], how="left")
        .with_columns(end=pl.max_horizontal("step_end", "device_end"))
        .sort("rank", "start", "iteration")
        .with_columns(previous_end=pl.col("end").shift(1).over("rank"))
        .with_columns(start=pl.when(pl.col("previous_end").is_null()).then(pl.col("start"))
                      .otherwise(pl.max_horizontal("start", pl.min_horizontal("previous_end", "end"))))
        .with_columns(time_us=pl.col("end") - pl.col("start"))
        .select("rank", "iteration", "start", "end", "time_us")
        .sort("rank", "iteration")
    )


def spans(frame: pl.DataFrame, side: Side) -> pl.DataFrame:
    """The ``vtrain/*`` spans with their fields, and which occurrence of that name on the rank and iteration
    each is (the key that aligns two timelines)."""
    rows = frame.filter((pl.col("kind") == "cpu") & pl.col("name").cat.starts_with(SPAN_PREFIX)
                        & pl.col("iteration").is_not_null())
    table = (
        rows.sort("rank", "ts")
        .select("rank", "iteration", pl.col("name").cast(pl.String), start=pl.col(side.start), dur=pl.col(side.dur))
        .with_columns(occurrence=pl.int_range(pl.len()).over("rank", "iteration", "name"))
    )
    fields = table["name"].str.split(" ")
    kinds = fields.list.first().str.strip_prefix(SPAN_PREFIX)
    table = table.with_columns(span_kind=kinds)
    for key in ("phase", "stage", "mb", "purpose", "op"):
        table = table.with_columns(
            pl.col("name").str.extract(rf"(?:^| ){key}=(\S+)").alias(key)
        )
    return table.with_columns(phase=pl.coalesce(
        pl.when(pl.col("span_kind").is_in(["forward", "backward", "recompute", "optimizer"]))
        .then(pl.col("span_kind")), pl.col("phase")))


def ops(frame: pl.DataFrame, side: Side) -> pl.DataFrame:
    """Every operator with its class, signature (name and input dims for CPU operators, kernel name for device
    activities) and duration, in order per rank. Sends on CPU ranks are left out, as in :func:`breakdown`: a
    gloo send's span lasts until the sender waits for it, which says nothing about the transfer (the receive
    says when the data arrived)."""
    chosen = _tested_ops(frame).select(  # only these columns are copied (a trace has millions of operators)
        *_OP_COLUMNS, start=pl.col(side.start), dur=pl.col(side.dur)).collect()
    return _signed(chosen, "rank", "ts")


def launched_ops(frame: pl.DataFrame, side: Side) -> pl.DataFrame:
    """:func:`ops`, with a GPU rank's device activities gathered per operator call that launched them: one row per
    call, under the operator's signature (name and input dims), its time the sum of its activities', its class that
    of the longest of them. A model prediction names its device activities after operators (``aten::mm
    (modelled)``) where a measurement names the kernels a library picked (``nvjet_sm90_...``): the two meet at the
    operator. Activities whose launching operator is not in the trace stay as they are."""
    chosen = _tested_ops(frame).select(*_OP_COLUMNS, "call", start=pl.col(side.start),
                                       dur=pl.col(side.dur)).collect()
    launched = pl.col("call").is_not_null()
    dims = (frame.lazy().filter(pl.col("kind") == "cpu")
            .select("rank", call=pl.col("event").cast(pl.Int32), call_dims="input_dims"))
    calls = (
        chosen.lazy().filter(launched).join(dims, on=["rank", "call"], how="left")
        .sort("dur", "event", descending=[True, False])
        .group_by("rank", "iteration", "call")
        .agg(event=pl.col("call").first().cast(pl.Int64), name=pl.col("op").first(),
             input_dims=pl.col("call_dims").first(),
             op=pl.col("op").first(), op_class=pl.col("op_class").first(), collective=pl.col("collective").first(),
             matched=pl.col("matched").first(), ts=pl.col("ts").min(), start=pl.col("start").min(),
             dur=pl.col("dur").sum())
        .with_columns(kind=pl.lit("cpu").cast(chosen["kind"].dtype))
        .collect()
    )
    rows = chosen.filter(~launched).drop("call")
    gathered = pl.concat([rows, calls.select(rows.columns)], how="vertical_relaxed")
    return _signed(gathered, "rank", "ts", "event")  # the event: one order however the groups came out


#: the columns :func:`ops` reads of each operator (besides its start and duration on the chosen side)
_OP_COLUMNS = ("rank", "iteration", "event", "kind", "name", "input_dims", "op", "op_class", "collective", "matched",
               "ts")


def _signed(chosen: pl.DataFrame, *order: str) -> pl.DataFrame:
    """Operators with their ``signature``, sorted by ``order``, in the columns :func:`ops` gives."""
    return (_with_signature(chosen).sort(*order)
            .select("rank", "iteration", "event", "name", "op", "op_class", "collective", "matched", "signature",
                    "start", "dur"))


def _tested_ops(frame: pl.DataFrame) -> pl.LazyFrame:
    """The operators of the iterations, sends on CPU ranks left out, as a query: what selects from it copies
    only the columns it names."""
    return frame.lazy().filter(pl.col("is_op") & pl.col("iteration").is_not_null() & ~_send_on_cpu())


def _with_signature(frame: pl.DataFrame) -> pl.DataFrame:
    """``signature`` (a category), made once for each distinct (kind, name, input_dims); a fused attention call's
    dims as the model places it (its [b, heads, s, d] tensors: :func:`~vtrain.kineto.fused_attention_signature`),
    so that a measured call and its prediction are one operator."""
    keys = ["kind", "name", "input_dims"]
    name = pl.col("name").cast(pl.String)
    dims = pl.when(name.is_in(list(ATTENTION_OPS))).then(
        pl.col("input_dims").cast(pl.String).map_elements(fused_attention_dims, return_dtype=pl.String)
    ).otherwise(pl.col("input_dims").cast(pl.String))
    signature = pl.when(pl.col("input_dims").is_not_null() & (pl.col("kind") == "cpu")).then(
        pl.concat_str(name, pl.lit(" "), dims)).otherwise(name)
    table = frame.select(keys).unique().with_columns(signature=signature.cast(pl.Categorical))
    return frame.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")


def breakdown(frame: pl.DataFrame, side: Side) -> pl.DataFrame:
    """Per rank and iteration: ``compute_us``, ``bubble_us``, ``exposed_comm_us``, ``idle_us`` (they add up to
    ``time_us``)."""
    windows = iterations(frame, side)
    selected = _tested_ops(frame).select(
        "rank", "iteration", start=pl.col(side.start), end=pl.col(side.start) + pl.col(side.dur),
        part=pl.when(pl.col("op_class").cat.starts_with(COMM_PREFIX))
        .then(pl.when(pl.col("purpose") == "pp").then(pl.lit("bubble")).otherwise(pl.lit("comm")))
        .otherwise(pl.lit("compute")),
    ).collect()
    groups = {key: group for key, group in selected.group_by("rank", "iteration")}
    rows = []
    for rank, iteration, start, end, time_us in windows.iter_rows():
        group = groups.get((rank, iteration))
        parts = {"compute": [], "bubble": [], "comm": []}
        if group is not None:
            for s, e, part in group.select("start", "end", "part").iter_rows():
                parts[part].append((max(s, start), min(e, end)))
        compute = _covered(parts["compute"])
        with_bubble = _covered(parts["compute"] + parts["bubble"])
        everything = _covered(parts["compute"] + parts["bubble"] + parts["comm"])
        rows.append({"rank": rank, "iteration": iteration, "time_us": time_us, "compute_us": compute,
                     "bubble_us": with_bubble - compute, "exposed_comm_us": everything - with_bubble,
                     "idle_us": max(0.0, time_us - everything)})
    schema = {"rank": pl.Int32, "iteration": pl.Int64, "time_us": pl.Float64, "compute_us": pl.Float64,
              "bubble_us": pl.Float64, "exposed_comm_us": pl.Float64, "idle_us": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def _send_on_cpu() -> pl.Expr:
    return (~pl.col("gpu_rank") & (pl.col("collective") == "send")).fill_null(False)


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals."""
    if not intervals:
        return 0.0
    array = np.asarray([(s, e) for s, e in intervals if e > s], dtype=np.float64)
    if array.size == 0:
        return 0.0
    array = array[np.argsort(array[:, 0])]
    total, current_start, current_end = 0.0, array[0, 0], array[0, 1]
    for s, e in array[1:]:
        if s > current_end:
            total += current_end - current_start
            current_start, current_end = s, e
        elif e > current_end:
            current_end = e
    return total + current_end - current_start
