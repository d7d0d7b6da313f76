"""Which profiled iterations are steady: the ones `vtrain validate` and `vtrain whatif` measure and predict.

Every ``ProfilerStep#N`` but the first (which warms up), and but a last step the profiler's stop cut short: the
profiler stopping inside a step closes it there (``ProfilerStep#2`` of ``traces/wild/mi250-rocm`` lasts 49 µs and
holds nothing but itself), so its time is no iteration's. A rank's last step is cut short when the rank has device
work and the step launched none, when every other step of the rank runs an optimizer step and it runs none (the
profiler stopped before it: a step cut at 60 % of its time read 19 % fast), or when it lasts less than
:data:`CUT_SHARE` of the median of the rank's other steps *and* holds fewer events than any of them (a step faster
than the others does the same work). Each step cut short is said in one warning line; steady steps whose times
spread over more than :data:`SPREAD` times the shortest are said too. A step that holds nothing is no iteration at
all (its timeline numbers it none: :func:`vtrain.validate.rank_checks.renumbered`), and is read here by its own
number: the last one is said as cut short.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from vtrain.kineto import OPTIMIZER_STEP
from vtrain.naming import ITERATION_PREFIX, iteration_numbers
from vtrain.validate.timeline import step_spans, whole_trace_note

#: a last step lasting less than this share of the median of the rank's other steps (and holding fewer events than
#: any) was cut short. The shipped traces' last steps last 0.63 (traces/whatif/t1p2d1-threads1) to 1.6 times that
#: median; a pruned step (traces/wild/compare-test) 1.2
CUT_SHARE = 0.5
#: steady steps lasting more than this many times the shortest of them are said: warm-up steps kept, or a load that
#: changed while the profiler ran (the shipped traces' steady steps lie within 1.3 times their shortest)
SPREAD = 1.5


@dataclass(frozen=True)
class Steady:
    """The steady iterations, why they are those (in words), and the warning lines choosing them gave."""

    iterations: list[int]
    basis: str
    notes: list[str]


def steady_iterations(all_iterations: list[int], *, marked: bool) -> tuple[list[int], str]:
    """The iterations a validation compares (every profiled one but the first, which warms up) and why, in words:
    ``marked`` is whether the traces have ``ProfilerStep#N`` spans (without them the whole trace is iteration 0)."""
    if not marked:
        return all_iterations, "no ProfilerStep#N spans: the whole trace is one iteration"
    if len(all_iterations) == 1:
        return all_iterations, "the only profiled one, used although it is the first"
    return all_iterations[1:], "the first profiled one excluded"


def steady_set(trace_dir: Path, frame: pl.DataFrame, all_iterations: list[int],
               files: Mapping[int, Path]) -> Steady:
    """The steady iterations of an annotated event frame (:func:`vtrain.validate.timeline.annotate`) whose profiled
    iterations are ``all_iterations``: :func:`steady_iterations` of those not cut short by the profiler's stop
    (:func:`cut_short`); ``files`` names each rank's trace file for the warnings."""
    marked = not step_spans(frame).is_empty()
    if not marked:
        steady, basis = steady_iterations(all_iterations, marked=False)
        return Steady(steady, basis, [whole_trace_note(trace_dir)])
    cut, notes = cut_short(frame, files)
    kept = [i for i in all_iterations if i not in cut] or all_iterations
    steady, basis = steady_iterations(kept, marked=True)
    if cut:
        basis += "; " + ", ".join(f"{ITERATION_PREFIX}{i}" for i in sorted(cut)) + " cut short by the profiler's stop"
    if len(kept) == 1:
        notes.append(f"{trace_dir}: only one profiled iteration ({kept[0]})"
                     + (" besides the one cut short" if cut else "") + "; it is used although it is the first")
    elif len(steady) == 1:
        notes.append(f"{trace_dir}: one steady iteration ({ITERATION_PREFIX}{steady[0]}, the first excluded): every "
                     "measured figure is one sample (profile more steps for a spread)")
    notes += _spread(frame, steady, trace_dir) + _warm_ups_counted(frame, steady, files)
    return Steady(steady, basis, notes)


def _warm_ups_counted(frame: pl.DataFrame, steady: list[int], files: Mapping[int, Path]) -> list[str]:
    """One warning line when a rank's first profiled step is among the steady ones: its steps are numbered from
    another step than the set's first (a profiler whose ``step()`` was called once more on it), so its warm-up
    is measured as an iteration of the job."""
    firsts = step_spans(frame).group_by("rank").agg(pl.col("iteration").min()).sort("rank")
    counted = firsts.filter(pl.col("iteration").is_in(steady))
    if len(steady) < 2 or counted.is_empty():
        return []
    rank, first = counted.row(0)
    also = f" (and {counted.height - 1} other rank(s))" if counted.height > 1 else ""
    return [f"{files.get(rank, f'rank {rank}')}: the rank's first profiled step, {ITERATION_PREFIX}{first}, is one "
            f"the set counts as steady{also}: its steps are numbered from {first}, the set's from "
            f"{firsts['iteration'].min()}, so its warm-up is measured as an iteration"]


def _spread(frame: pl.DataFrame, steady: list[int], trace_dir: Path) -> list[str]:
    """One warning line when the steady steps' times (the longest rank's) spread over more than :data:`SPREAD`
    times the shortest: their median mixes unlike iterations."""
    spans = (step_spans(frame).filter(pl.col("iteration").is_in(steady)).group_by("iteration")
             .agg(pl.col("dur").max()).sort("iteration"))
    if spans.height < 2 or spans["dur"].min() <= 0 or spans["dur"].max() <= SPREAD * spans["dur"].min():
        return []
    shown = ", ".join(f"#{i} {d / 1e3:,.4g} ms" for i, d in spans.iter_rows())
    return [f"{trace_dir}: the steady steps last {spans['dur'].min() / 1e3:,.4g} to {spans['dur'].max() / 1e3:,.4g} ms "
            f"(x{spans['dur'].max() / spans['dur'].min():.2g}: {shown}): warm-up steps, or a load that changed while "
            "the profiler ran? their median mixes them"]


def cut_short(frame: pl.DataFrame, files: Mapping[int, Path]) -> tuple[set[int], list[str]]:
    """The iterations whose step was the last of a rank and cut short by the profiler's stop (see the module), and
    one warning line for each (naming the first rank's file it was cut on, and how many others)."""
    table = _steps(frame)
    cut: dict[int, list[tuple[int, str]]] = {}
    for (rank,), steps in table.group_by("rank"):
        if steps.height < 2:
            continue
        *others, last = steps.sort("start").iter_rows(named=True)
        why = _why_cut(last, others, bool(steps["rank_has_device"][0]))
        if why:
            cut.setdefault(last["iteration"], []).append((rank, why))
    notes = []
    for iteration, ranks in sorted(cut.items()):
        rank, why = min(ranks)
        also = f" (and on {len(ranks) - 1} other rank files)" if len(ranks) > 1 else ""
        notes.append(f"{files.get(rank, f'rank {rank}')}: {ITERATION_PREFIX}{iteration}, the last step, {why}{also}: "
                     f"the profiler stopped in it; it is not counted as an iteration")
    return set(cut), notes


def _steps(frame: pl.DataFrame) -> pl.DataFrame:
    """Per rank and step: its start, span, events (host and device) and device activities, and whether the rank has
    device activity at all."""
    spans = _step_marks(frame).group_by("rank", "iteration").agg(start=pl.col("ts").min(), span=pl.col("dur").max())
    counts = (frame.lazy().filter(pl.col("iteration").is_not_null()).group_by("rank", "iteration")
              .agg(events=pl.len(), device=(pl.col("kind") == "device").sum(),
                   optimizer=pl.col("name").cast(pl.String).str.contains(OPTIMIZER_STEP.pattern).sum()).collect())
    with_device = frame.lazy().group_by("rank").agg(rank_has_device=(pl.col("kind") == "device").any()).collect()
    return (spans.join(counts, on=["rank", "iteration"], how="left").join(with_device, on="rank", how="left")
            .with_columns(pl.col("events", "device", "optimizer").fill_null(0)))


def _step_marks(frame: pl.DataFrame) -> pl.DataFrame:
    """The ``ProfilerStep#N`` spans of each rank's steps, with their step's number as ``iteration``: the iteration
    they lie in, or for a step that holds nothing (numbered none) their own. A span numbered none whose number is
    one of the rank's iterations is none of its steps: a mark on another thread, past the rank's last step."""
    spans = step_spans(frame).select("rank", "iteration", "ts", "dur",
                                     number=iteration_numbers(pl.col("name").cast(pl.String)))
    numbered = spans.filter(pl.col("iteration").is_not_null())
    nothing = (spans.filter(pl.col("iteration").is_null())
               .join(numbered.select("rank", number="iteration").unique(), on=["rank", "number"], how="anti"))
    own = pl.col("number").cast(numbered.schema["iteration"])
    return pl.concat([numbered, nothing.with_columns(iteration=own)]).drop("number")


def _why_cut(last: dict, others: list[dict], has_device: bool) -> str | None:
    """Why a rank's last step was cut short, in words (``None``: it was not)."""
    if has_device and last["device"] == 0:
        return f"holds no device work (the rank's other steps launch {min(o['device'] for o in others):,} or more)"
    typical = statistics.median(o["span"] for o in others)
    if last["span"] < CUT_SHARE * typical and last["events"] < min(o["events"] for o in others):
        return (f"lasts {last['span'] / 1e3:.3g} ms against a median of {typical / 1e3:.3g} ms for the others, with "
                f"fewer events than any of them")
    if last["optimizer"] == 0 and all(o["optimizer"] for o in others):
        return "runs no optimizer step (each of the rank's other steps runs one)"
    return None
