"""``what_if``: re-time a measured run's own dependency graph under changed durations.

The flow: build the replay graph of the trace set once (:func:`vtrain.replay.build.build_graph`), find which
edges hold each event's own time (:mod:`vtrain.whatif.owners`), give every event a new own time (from another
recording of the same job, matched op by op, and/or multiplied per class or name pattern; a collective call not
matched to its peers' keeps its wait for them, :mod:`vtrain.whatif.unmatched`), evaluate the graph
with the edited delays (:func:`vtrain.replay.engine.evaluate`: waits, including each collective's wait for its
last member, follow from the new arrival times), and read iteration times and critical paths off the result.
Unchanged durations reproduce the replay exactly.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from vtrain.errors import InputError
from vtrain.ingest.clocks import clocks_disagree
from vtrain.replay.build import build_graph
from vtrain.replay.engine import evaluate
from vtrain.replay.replayer import Replay, timeline
from vtrain.replay.trace import check_replayable, read_trace_set, trace_set_warnings
from vtrain.runconfig import RunConfig, described_run
from vtrain.accuracy import error_pct
from vtrain.validate.rank_checks import renumbered
from vtrain.validate.steady import steady_set
from vtrain.validate.timeline import (
    MEASURED,
    REPLAYED,
    Side,
    annotate,
    iterations,
    measured_iterations,
    step_layout_warnings,
    without_made_iterations,
)
from vtrain.whatif.changes import HOST, Scale, scale_factors
from vtrain.whatif.critical import HOST_OPS_LABEL, CriticalPath, PathFinder, mean_by
from vtrain.whatif.match import Matching, match_events
from vtrain.whatif.owners import NO_OWNER, OwnedGraph, own_edges
from vtrain.whatif.unmatched import UnmatchedWaits, unmatched_waits


@dataclass
class TraceSet:
    """One recording: its graph with the holder of every edge, its annotated event frame (measured times), the
    time every holder holds (events' own times, then host stretches; :mod:`vtrain.whatif.owners`), the part of it
    that is a wait for peers, which a scale keeps (:mod:`vtrain.whatif.unmatched`), and its steady iterations
    (:func:`vtrain.validate.steady.steady_set`, as `vtrain validate` chooses them)."""

    path: Path
    config: RunConfig | None
    owned: OwnedGraph
    frame: pl.DataFrame
    held: np.ndarray
    wait: np.ndarray
    steady: list[int]

    @property
    def own(self) -> np.ndarray:
        """Every event's own time (µs)."""
        return self.held[:self.owned.events]


@dataclass
class WhatIf:
    """The prediction: iteration times (µs, job time = mean over ranks) per profiled iteration."""

    trace_dir: Path
    other_dir: Path | None
    changes: list[str]
    scale_hits: dict[str, int]
    ops_only: bool
    iterations: list[int]
    steady: list[int]
    measured_us: dict[int, float]
    replayed_us: dict[int, float]
    predicted_us: dict[int, float]
    other_measured_us: dict[int, float] | None
    baseline_paths: list[CriticalPath]
    predicted_paths: list[CriticalPath]
    matching: Matching | None
    replay: Replay  # the predicted timeline, for the Chrome traces
    notes: list[str] = field(default_factory=list)

    def median_ms(self, series: dict[int, float] | None) -> float | None:
        """The median over the steady iterations, in ms."""
        if not series:
            return None
        values = [series[i] for i in self.steady if i in series]
        return statistics.median(values) / 1e3 if values else None

    def summary(self) -> dict[str, Any]:
        """The headline numbers (``--json``)."""
        measured, predicted = self.median_ms(self.measured_us), self.median_ms(self.predicted_us)
        out: dict[str, Any] = {"measured_ms": measured, "predicted_ms": predicted,
                               "change_pct": error_pct(predicted, measured),
                               "replay_ms": self.median_ms(self.replayed_us)}
        if self.other_measured_us is not None:
            other = self.median_ms(self.other_measured_us)
            out.update(other_measured_ms=other, error_pct=error_pct(predicted, other))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Everything the report shows, as plain data (``whatif.json``)."""
        per_iteration = [{"iteration": i, "steady": i in self.steady,
                          "measured_ms": to_ms(self.measured_us.get(i)), "replay_ms": to_ms(self.replayed_us.get(i)),
                          "predicted_ms": to_ms(self.predicted_us.get(i)),
                          **({"other_measured_ms": to_ms(self.other_measured_us.get(i))}
                             if self.other_measured_us is not None else {})}
                         for i in self.iterations]
        out = {**self.summary(), "trace_dir": str(self.trace_dir),
               "other_dir": str(self.other_dir) if self.other_dir else None, "ops_only": self.ops_only,
               "changes": self.changes,
               "scale_hits": self.scale_hits, "steady_iterations": self.steady, "iterations": per_iteration,
               "critical_path": {"baseline_ms": _ms_dict(mean_by(self.baseline_paths, "by_class")),
                                 "predicted_ms": _ms_dict(mean_by(self.predicted_paths, "by_class"))},
               "notes": self.notes}
        if self.matching is not None:
            out["unmatched"] = {**self.matching.counts,
                                "base_names": self.matching.unmatched_base.head(20).to_dicts(),
                                "other_names": self.matching.unmatched_other.head(20).to_dicts()}
        return out


def load_trace_set(trace_dir: str | Path, warn: Callable[[str], None] = lambda _: None) -> TraceSet:
    """Read a trace folder (and its ``run.yaml`` when there is one) and build its graph; ``warn`` gets a line for
    each thing the reading did not read, left out or found suspicious (:func:`vtrain.replay.trace.trace_set_warnings`,
    as `vtrain validate` says them)."""
    trace_dir = Path(trace_dir)
    traces = read_trace_set(trace_dir)
    check_replayable(trace_dir, traces)
    config, _, problem = described_run(trace_dir)
    if problem:
        warn(f"{problem}: the traces are re-timed without the run it describes")
    world_size = config.parallelism.world_size if config else next((t.world_size for t in traces if t.world_size), None)
    for line in trace_set_warnings(trace_dir, traces, world_size):
        warn(line)
    graph = build_graph(traces, config)
    owned = own_edges(graph)
    waits = unmatched_waits(owned)
    if line := _unmatched_collectives(trace_dir, graph.stats.collective_calls_unmatched, waits):
        warn(line)
    frame, line = renumbered(trace_dir, without_made_iterations(annotate(timeline(graph, graph.measured)), traces),
                             traces, graph.step_shifts)
    if line:
        warn(line)
    if line := clocks_disagree(trace_dir, iterations(frame, MEASURED)):
        warn(f"{line}; the re-timed graph links the ranks' events across those clocks, and its prediction does not "
             "stand either")
    for line in step_layout_warnings(trace_dir, frame):
        warn(line)
    all_iterations = measured_iterations(frame, trace_dir)
    chosen = steady_set(trace_dir, frame, all_iterations, {trace.rank: trace.path for trace in traces})
    for line in chosen.notes:
        warn(line)
    return TraceSet(path=trace_dir, config=config, owned=owned, frame=frame, held=owned.held_time, wait=waits.wait,
                    steady=chosen.iterations)


def _unmatched_collectives(trace_dir: Path, unmatched: Counter[str], waits: UnmatchedWaits) -> str | None:
    """The warning for collective calls the replay could not match to their peers' (their process group unknown,
    their peers' traces not in the folder): each keeps its measured duration, its wait for the peers included, so
    a change before it does not move its end (halving a run's GEMMs read -28 % instead of -43 %); a scale of its
    class multiplies only its transfer (:mod:`vtrain.whatif.unmatched`)."""
    count = sum(unmatched.values())
    if not count:
        return None
    reasons = "; ".join(f"{reason}: {n:,}" for reason, n in unmatched.most_common())
    at_wait = (f"; {waits.at_thread_wait:,} of them, which ended where their thread waited for them, are all wait "
               "(their transfer assumed done by then)" if waits.at_thread_wait else "")
    return (f"{trace_dir}: {count:,} collective call(s) not matched to their peers' keep their measured duration, "
            f"their wait for the peers included ({reasons}): what is re-timed before them does not move their end, "
            f"and a --scale of their class multiplies only their transfer, assumed to be the fastest call of the "
            f"same kind and size on their rank ({waits.transfer_us / 1e3:,.1f} of their "
            f"{waits.total_us / 1e3:,.1f} ms), the rest, their wait, staying as measured{at_wait}")


def what_if(trace_dir: str | Path, scales: list[Scale] | None = None, other_dir: str | Path | None = None,
            ops_only: bool = False, warn: Callable[[str], None] = lambda _: None) -> WhatIf:
    """Predict ``trace_dir``'s iterations with durations from ``other_dir`` (when given), then ``scales``.

    From ``other_dir`` come every operator's, kernel's and collective transfer's own time and, unless
    ``ops_only``, every host stretch (a thread's time between operators), each matched op by op.
    """
    base = load_trace_set(trace_dir, warn)
    other = load_trace_set(other_dir, warn) if other_dir is not None else None
    return predict(base, scales or [], other, ops_only, warn)


def predict(base: TraceSet, scales: list[Scale], other: TraceSet | None = None, ops_only: bool = False,
            warn: Callable[[str], None] = lambda _: None) -> WhatIf:
    """The what-if of already loaded trace sets (see :func:`what_if`)."""
    notes: list[str] = []
    new_held, new_wait, matching = base.held, base.wait, None
    if other is not None:
        other = _paired_iterations(base, other, notes)
        new_held, new_wait, matching = _durations_from(base, other, ops_only, notes)
    factors, hits = scale_factors(scales, *_scalable(base), counted=base.held > 0)
    for label, n in hits.items():
        if n == 0:
            notes.append(f"{label}: no event of {base.path} holds time of this kind; nothing changed")
    unit = [scale.label for scale in scales if scale.factor == 1]
    if unit:
        notes.append(f"{', '.join(unit)}: a factor of 1 changes nothing")
    delay = edited_delays(base.owned, base.held, _scaled_held(new_held, new_wait, factors))
    owned = base.owned
    times, released = evaluate(owned.graph.measured, owned.src, owned.dst, delay)
    replayed, _ = evaluate(owned.graph.measured, owned.src, owned.dst, owned.delay)
    if released:
        notes.append(f"{released} event points were released from dependency cycles")
    predicted = _with_times(base.frame, times)
    baseline = _with_times(base.frame, replayed)
    predicted_us, replayed_us = _job_times(predicted, REPLAYED), _job_times(baseline, REPLAYED)
    moving = {scale.label for scale in scales if scale.factor != 1}
    if other is None and any(hits[label] for label in moving) and _unmoved(predicted_us, replayed_us):
        scaled = ", ".join(f"{label} ({n} events)" for label, n in hits.items() if n and label in moving)
        notes.append(f"{scaled}: scaled, and no iteration moved: none of these events is on a critical path of "
                     f"{base.path}'s recorded dependencies (the iterations wait on other work)")
    steady = [i for i in base.steady if other is None or i in other.steady] or base.steady
    shifted = _shifted_steps(predicted_us, replayed_us, steady)
    if shifted:
        notes.append(shifted)
    for line in notes:
        warn(line)
    all_iterations = sorted(iterations(base.frame, MEASURED)["iteration"].unique().to_list())
    return WhatIf(
        trace_dir=base.path, other_dir=other.path if other else None,
        changes=[f"{s.label}={s.factor:g}" for s in scales], scale_hits=hits, ops_only=ops_only,
        iterations=all_iterations, steady=steady,
        measured_us=_job_times(base.frame, MEASURED), replayed_us=replayed_us, predicted_us=predicted_us,
        other_measured_us=_job_times(other.frame, MEASURED) if other else None,
        baseline_paths=_paths(base, owned.delay, replayed, baseline, steady),
        predicted_paths=_paths(base, delay, times, predicted, steady),
        matching=matching,
        replay=Replay(traces=owned.graph.traces, events=predicted, origin=owned.graph.origin,
                      stats=owned.graph.stats, edge_counts={}, notes=notes),
        notes=notes)


def _paired_iterations(base: TraceSet, other: TraceSet, notes: list[str]) -> TraceSet:
    """``other`` with its iterations numbered as ``base``'s, paired in order, when their ``ProfilerStep#N`` numbers
    differ (a profiler schedule with other wait/warm-up steps, or another cycle of the same run: #6, #7 against
    #2, #3): the k-th profiled iteration of one is the k-th of the other. Iterations without a partner (one side
    profiled more) are left out of the matching, and ``notes`` says so."""
    ours, theirs = (sorted(iterations(t.frame, MEASURED)["iteration"].unique().to_list()) for t in (base, other))
    if ours == theirs:
        return other
    pairs = dict(zip(theirs, ours))
    notes.append(f"iterations paired in order, their ProfilerStep numbers differ: {other.path} "
                 f"#{', #'.join(map(str, list(pairs)))} with {base.path} #{', #'.join(map(str, pairs.values()))}"
                 + (f"; unpaired: {len(ours) - len(pairs)} of {base.path}, {len(theirs) - len(pairs)} of "
                    f"{other.path}" if len(ours) != len(theirs) else ""))
    frame = other.frame.with_columns(
        iteration=pl.col("iteration").replace_strict(pairs, default=None, return_dtype=other.frame["iteration"].dtype))
    return replace(other, frame=frame, steady=[pairs[i] for i in other.steady if i in pairs])


#: the least share of a recording's operator time that finds a partner in another recording of the same job
#: (the shipped pairs: see tests/test_whatif_pairs.py); below it, --durations-from says the two may be other jobs
SAME_JOB_SHARE = 0.5


def _durations_from(base: TraceSet, other: TraceSet, ops_only: bool,
                    notes: list[str]) -> tuple[np.ndarray, np.ndarray, Matching]:
    """Every holder's time, and the wait for peers in it, taken from ``other`` where it has a partner there (see
    :func:`what_if`)."""
    _check_same_job(base, other)
    graphs = [_replays_graphs(each) for each in (base, other)]
    if graphs[0] != graphs[1]:
        replaying, eager = (other.path, base.path) if graphs[1] else (base.path, other.path)
        notes.append(f"{replaying} replays CUDA graphs and {eager} launches each kernel: operators' durations carry "
                     f"over, the host's launches do not (the prediction keeps {base.path}'s host), so it cannot "
                     "stand for a change between them")
    matching = match_events(base.frame, other.frame, base.own, other.own)
    partner = _partner_holders(matching.other_event, other.owned.events, host=not ops_only)
    new_held = np.where(partner >= 0, other.held[np.maximum(partner, 0)], base.held)
    new_wait = np.where(partner >= 0, other.wait[np.maximum(partner, 0)], base.wait)
    children, orphans, orphan_us = _unmatched_children_time(matching.other_event, other)
    new_held[:base.owned.events] += children
    counts = matching.counts
    if counts["base"] or counts["other"]:
        left_out = (f"; {orphans} of them, {orphan_us / 1e3:,.3f} ms in all, have no matched operator around them "
                    "(device activities among them) and are left out of the prediction" if orphans else "")
        notes.append(f"{counts['base']} event(s) with own time in {base.path} have no partner in {other.path} "
                     f"(they keep their own duration); {counts['other']} in {other.path} have none in "
                     f"{base.path} (their time counts for the matched operator around them{left_out})")
    own = base.own
    matched = float(own[matching.other_event >= 0].sum()) / float(own.sum()) if own.sum() > 0 else 1.0
    if matched < SAME_JOB_SHARE:
        notes.append(f"only {matched:.0%} of {base.path}'s operator time has a partner in {other.path}: are they "
                     "recordings of the same job? (the rest keeps its own duration)")
    return new_held, new_wait, matching


def _scaled_held(held: np.ndarray, wait: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """Every holder's time under the scale ``factors``: the wait for peers in it stays, the rest is multiplied."""
    return wait + (held - wait) * factors


def edited_delays(owned: OwnedGraph, held: np.ndarray, new_held: np.ndarray) -> np.ndarray:
    """Edge delays with every holder's edges rescaled to its new time (a holder that had none gets the new time
    spread evenly over its edges)."""
    delay = owned.delay.copy()
    has = owned.holder != NO_OWNER
    event = owned.holder[has]
    before = held[event]
    after = new_held[event]
    edges_per_event = np.bincount(event, minlength=len(held))[event]
    delay[has] = np.where(before > 0, delay[has] * np.divide(after, before, out=np.zeros_like(after),
                                                             where=before > 0),
                          after / edges_per_event)
    return delay


def _scalable(base: TraceSet) -> tuple[list[str | None], list[str | None]]:
    """Class and name of every holder a scale rule may change (``None``: none may): on GPU ranks the device
    activities (a CPU operator there only launches its kernels) and the collectives run on the host (gloo's), on
    CPU-only ranks every operator and collective; then the host stretches (class ``host``, no name)."""
    frame = base.frame
    scalable = (frame["kind"] == "device") | ~frame["gpu_rank"] | frame["collective"].is_not_null()
    classes = [c if ok else None for c, ok in zip(frame["op_class"], scalable)]
    names = [n if ok else None for n, ok in zip(frame["name"], scalable)]
    host_stretches = 2 * base.owned.events
    return classes + [HOST] * host_stretches, names + [None] * host_stretches


def _unmatched_children_time(other_event: np.ndarray, other: TraceSet) -> tuple[np.ndarray, int, float]:
    """Per base event, the own time of the other recording's events without a partner that its partner
    encloses (through other unmatched events): work the other recording split off into operators of its own
    (``aten::cat`` on two threads calls ``aten::narrow``/``aten::slice``) stays its caller's. With it, how many
    unmatched events no matched event encloses (device activities: a kernel has no enclosing operator on its
    stream) and their own time: those are left out of the prediction."""
    base_of = np.full(other.owned.events, -1, dtype=np.int64)
    matched = other_event >= 0
    base_of[other_event[matched]] = np.flatnonzero(matched)
    extra = np.zeros(len(other_event))
    parent = other.owned.parent
    orphans, orphan_us = 0, 0.0
    for event in np.flatnonzero((base_of < 0) & (other.own > 0)).tolist():
        ancestor = parent[event]
        while ancestor != NO_OWNER and base_of[ancestor] < 0:
            ancestor = parent[ancestor]
        if ancestor != NO_OWNER:
            extra[base_of[ancestor]] += other.own[event]
        else:
            orphans, orphan_us = orphans + 1, orphan_us + float(other.own[event])
    return extra, orphans, orphan_us


def _partner_holders(other_event: np.ndarray, other_events: int, host: bool) -> np.ndarray:
    """Per holder of the base, the other recording's holder (-1: none): an event's partner event, and (with
    ``host``) the host stretch ending at the partner's matching point."""
    events = len(other_event)
    points = np.arange(2 * events)
    partner_of_point = other_event[points // 2]
    stretches = np.where(partner_of_point >= 0, other_events + 2 * partner_of_point + points % 2, -1)
    return np.concatenate([other_event, stretches if host else np.full(2 * events, -1)])


def _replays_graphs(traces: TraceSet) -> bool:
    """Whether a recording replays CUDA graphs: its run.yaml says so, else its host launches graphs."""
    if traces.config is not None:
        return traces.config.cuda_graphs
    return bool(traces.frame["name"].cast(pl.String).str.contains("GraphLaunch").any())


def _check_same_job(base: TraceSet, other: TraceSet) -> None:
    ranks = sorted(base.frame["rank"].unique().to_list())
    other_ranks = sorted(other.frame["rank"].unique().to_list())
    if ranks != other_ranks:
        raise InputError(f"ranks {other_ranks} are not those of {base.path} ({ranks}): not the same job", other.path)
    if base.config is not None and other.config is not None and (
            base.config.model != other.config.model or base.config.parallelism != other.config.parallelism):
        raise InputError(f"run.yaml describes another model or parallelism than {base.path}/run.yaml: not the "
                         f"same job", other.path)


def _with_times(frame: pl.DataFrame, times: np.ndarray) -> pl.DataFrame:
    start = times[0:2 * frame.height:2]
    return frame.with_columns(sim_ts=pl.Series(start), sim_dur=pl.Series(times[1:2 * frame.height:2] - start))


def _unmoved(predicted: dict[int, float], replayed: dict[int, float]) -> bool:
    """Whether no iteration's predicted time differs from its replay by more than rounding (1e-6 relative)."""
    return predicted.keys() == replayed.keys() and all(
        math.isclose(predicted[i], replayed[i], rel_tol=1e-6) for i in predicted)


def _shifted_steps(predicted: dict[int, float], replayed: dict[int, float], steady: list[int]) -> str | None:
    """The note for a change that moves the steady iterations one way and all the iterations together the other:
    an iteration ends where the host marks it, so a longer (shorter) delay can land in the iteration before and
    shorten (lengthen) the steady ones, while the iterations together, the job's time, follow the change."""
    common = [i for i in replayed if i in predicted]
    measured = [i for i in steady if i in common]
    if not measured or not common:
        return None
    whole = sum(predicted[i] for i in common) / sum(replayed[i] for i in common) - 1
    part = sum(predicted[i] for i in measured) / sum(replayed[i] for i in measured) - 1
    if whole * part >= 0 or abs(whole - part) < 1e-3:
        return None
    return (f"the steady iterations {measured} moved {part:+.1%} and all {len(common)} iterations together "
            f"{whole:+.1%}: an iteration ends where the host marks it, so the change moved time across their "
            f"boundaries; the iterations together are the job's time")


def _job_times(frame: pl.DataFrame, side: Side) -> dict[int, float]:
    """Per iteration, the mean over ranks of the iteration time (as `vtrain validate` defines it)."""
    table = iterations(frame, side).group_by("iteration").agg(pl.col("time_us").mean())
    return dict(zip(table["iteration"].to_list(), table["time_us"].to_list()))


def _paths(base: TraceSet, delay: np.ndarray, times: np.ndarray, frame: pl.DataFrame,
           steady: list[int]) -> list[CriticalPath]:
    """The critical path of every steady iteration: from its latest point (any rank) back to its start. On GPU
    ranks, the CPU operators' own time is host time (launching), not their class's work."""
    classes = [c if kind == "device" or not gpu else HOST_OPS_LABEL
               for c, kind, gpu in zip(frame["op_class"], frame["kind"], frame["gpu_rank"])]
    finder = PathFinder(base.owned, delay, times, classes, frame["name"].to_list())
    ends = times[1:2 * frame.height:2]
    starts = iterations(frame, REPLAYED).group_by("iteration").agg(pl.col("start").min())
    start_of = dict(zip(starts["iteration"].to_list(), starts["start"].to_list()))
    iteration = frame["iteration"].to_numpy()
    paths = []
    for n in steady:
        members = np.flatnonzero(iteration == n)
        if len(members) == 0 or n not in start_of:
            continue
        last = members[np.argmax(ends[members])]
        paths.append(finder.path(n, 2 * int(last) + 1, start_of[n]))
    return paths


def to_ms(value: float | None) -> float | None:
    """µs -> ms (``None`` stays ``None``)."""
    return None if value is None else value / 1e3


def _ms_dict(values: dict[str, float]) -> dict[str, float]:
    return {key: value / 1e3 for key, value in sorted(values.items(), key=lambda kv: -kv[1])}
