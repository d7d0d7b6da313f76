"""The two predictions against the measurement: the replay (same events, one to one) and the model (its
own timeline, aligned by span names and operator sequences)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.ingest.inferred_run import INFERRED
from vtrain.kineto import compiled_markers
from vtrain.parallel import Layout
from vtrain.replay.context import KEPT_CAUSES
from vtrain.replay.replayer import Replay, read_timeline
from vtrain.runconfig import RunConfig
from vtrain.tables.signature import signatures_without_out
from vtrain.tables.store import Profile
from vtrain.validate import diff
from vtrain.validate.align import align_events, align_sequences, align_spans
from vtrain.validate.diff import Comparison
from vtrain.validate.model import (
    ModelPrediction,
    Split,
    held_out_profile,
    load_given_profile,
    predict,
    split_iterations,
    write_prediction,
)
from vtrain.validate.opclass import GEMM
from vtrain.validate.terms import term_notes
from vtrain.validate.timeline import (
    MEASURED,
    REPLAYED,
    annotate,
    breakdown,
    iterations,
    launched_ops,
    ops,
    spans,
)

Warn = Callable[[str], None]


def compare_replay(frame: pl.DataFrame, steady: list[int], stage_of: dict[int, int], replayed: Replay) -> Comparison:
    """The replay against the measurement over the steady iterations (``frame`` is the annotated replay)."""
    tested = pl.col("iteration").is_in(steady)
    m_it = iterations(frame, MEASURED).filter(tested)
    p_it = iterations(frame, REPLAYED).filter(tested)
    rows = diff.iteration_rows(m_it, p_it)
    m_spans = with_stage(spans(frame, MEASURED).filter(tested), stage_of)
    aligned_spans = align_spans(m_spans, spans(frame, REPLAYED).filter(tested))
    m_ops = ops(frame, MEASURED).filter(tested)
    aligned_ops = align_events(m_ops, ops(frame, REPLAYED).filter(tested))
    n = rank_iterations(m_it)
    stats = replayed.stats
    details = {
        "dependencies": {
            "device_activities_started_by": dict(stats.device_started_by),
            "device_unexplained_ms": stats.device_unexplained_us / 1e3,
            "blocked_runtime_calls": dict(stats.blocked_calls),
            "thread_waits": stats.thread_waits,
            "collectives_matched": stats.collectives_matched,
            "collective_calls_unmatched": dict(stats.collective_calls_unmatched),
            "collective_ends": dict(stats.collective_ends),
            "graph_launches": stats.graph_launches,
            "kept_waits": kept_waits(replayed),
            "edges": replayed.edge_counts,
        },
        "test_iterations": steady,
    }
    notes = []
    kept = details["dependencies"]["kept_waits"]
    if kept:
        causes = "; ".join(f"{row['ms']:,.3f} ms in {row['count']:,} {cause}" for cause, row in kept.items())
        notes.append(f"waits the dependency model cannot explain were kept as measured delays on the op that "
                     f"waited (whole trace, all ranks): {causes}")
    unmatched = sum(stats.collective_calls_unmatched.values())
    if unmatched:
        reasons = "; ".join(f"{reason}: {n}" for reason, n in stats.collective_calls_unmatched.items())
        notes.append(f"{unmatched} collective call(s) keep their measured duration ({reasons})")
    return Comparison(
        name="replay", measured_ms=median_job(rows, "measured_ms"), predicted_ms=median_job(rows, "predicted_ms"),
        iterations=rows, phases=diff.phase_rows(aligned_spans), stages=diff.stage_rows(aligned_spans),
        micro_batches=diff.micro_batch_rows(aligned_spans),
        classes=diff.class_rows(aligned_ops, n), worst_ops=diff.worst_op_rows(aligned_ops, n),
        one_side_only=diff.one_side_rows(aligned_ops, n),
        breakdown=diff.breakdown_rows(breakdown(frame, MEASURED).filter(tested),
                                         breakdown(frame, REPLAYED).filter(tested)),
        op_errors_pct=diff.op_error_sample(aligned_ops), notes=notes, details=details,
        ops_table=aligned_ops, spans_table=aligned_spans)


def kept_waits(replayed: Replay) -> dict[str, dict[str, float | int]]:
    """Per cause, the time (ms, whole trace, all ranks) and number of waits the replay kept as measured delays
    because its dependency model cannot explain them."""
    stats = replayed.stats
    return {cause: {"ms": stats.kept_us[cause] / 1e3, "count": stats.kept_count[cause]}
            for cause in KEPT_CAUSES if stats.kept_count[cause]}


@dataclass
class ModelRun:
    """The model's prediction of a trace folder, before it is compared: which iterations built its profile and
    which are tested, and what it predicted."""

    split: Split
    test: list[int]
    source: str  # where the profile came from
    from_traces: bool  # the profile was built from the traces' own iterations (no --profile)
    prediction: ModelPrediction


#: the least share of the simulated operators' time that a run config describing the traces finds measured in
#: them (the shipped recordings: 87-100 %; replayed from CUDA graphs, whose operators are not timed one by one, 62 %;
#: the hidden size of a run.yaml edited from 512 to 256: 5 %)
DESCRIBES_TRACES = 0.5


def predict_model(trace_dir: Path, config: RunConfig, config_source: str, profile_dir: str | Path | None,
                  steady: list[int], ingested: Profile | None, note: Warn) -> tuple[ModelRun | None, str | None]:
    """Simulate ``config`` from a profile of every other steady iteration of ``ingested`` (the traces' own
    tables, :mod:`vtrain.validate.profile`), or from ``profile_dir``. Returns the run, or ``None`` and the
    reason when the simulator failed."""
    split = split_iterations(steady)
    if profile_dir is not None:
        profile = load_given_profile(Path(profile_dir))
        test, source = steady, f"--profile {profile_dir}"
    else:
        assert ingested is not None, "the traces' tables are needed without --profile"
        profile = held_out_profile(ingested, split.profile)
        test, source = split.test, f"{trace_dir}: {split.describe()}"
        if not split.held_out:
            note(f"{trace_dir}: too few steady iterations to hold some out; the profile saw the tested iteration")
    try:
        prediction = predict(config, profile, source, config_source)
    except Exception as exc:  # the simulator is another package: report its failure (never hide it) and keep
        return None, f"vtrain simulate failed: {type(exc).__name__}: {exc}"  # the replay's results
    measured = prediction.coverage.get("measured", 0.0)
    if profile_dir is None and measured < DESCRIBES_TRACES:
        note(_unmeasured_warning(profile, trace_dir, config_source, measured))
    if profile_dir is None:
        from vtrain.simulate.run import attention_mismatch, unplaced_kernel_time  # only when a run is described

        mismatch = attention_mismatch(profile.digest.timeline, config)
        if mismatch:
            note(f"{config_source}: {mismatch}")
        unplaced = unplaced_kernel_time(profile, prediction.simulation.operator_names)
        if unplaced:
            note(f"{trace_dir}: {unplaced}: the traced run ran operators that framework {config.framework} "
                 f"({config_source}) does not place, and the model counts their time between its operators, beside "
                 f"its own versions of what they did")
    return ModelRun(split=split, test=test, source=source, from_traces=profile_dir is None,
                    prediction=prediction), None


def _unmeasured_warning(profile: Profile, trace_dir: Path, config_source: str, measured: float) -> str:
    """The line said when less than :data:`DESCRIBES_TRACES` of the simulated operators' time (``measured``) was
    measured in the traces' own ``profile``, with the reason: traces that recorded no input shapes, which the model
    looks its operators up by (the traces', whatever the run config); a model that ran compiled; a run read off the
    traces, which vtrain simulates with its own operators; else a run config that may not describe the traces."""
    share = f"only {measured:.0%} of the simulated operators' time was measured"
    compiled = compiled_markers(op for op, _, _ in profile.digest.timeline)
    ran_compiled = (f"its model ran compiled ({', '.join(compiled)}: torch.compile), its layers as fused kernels "
                    f"where the run config places PyTorch's operators") if compiled else ""
    if profile.digest.shapeless:
        return (f"{trace_dir}: {share} in it: its traces recorded no operator's input shapes (profiled without "
                f"record_shapes=True), by which the model looks its operators up{'; ' if compiled else ''}"
                f"{ran_compiled}; the rest is modelled")
    why = ran_compiled or "its run has other operators or shapes than the traced one"
    question = ": does it describe these traces?"
    if config_source == INFERRED:  # the run is the traces': what differs is the operators placed for it
        why, question = ("the run read off them is simulated with the operators vtrain places for its layer, "
                         "which the traces ran otherwise"), "; the rest is modelled"
    return f"{config_source}: {share} in {trace_dir} ({why}){question}"


def compare_model(run: ModelRun, config: RunConfig, frame: pl.DataFrame,
                  out_dir: Path) -> tuple[Comparison, pl.DataFrame]:
    """The model against the measurement: write the predicted traces into ``out_dir`` and compare the same events,
    kept in memory, with the tested iterations. Returns the comparison and the predicted timeline."""
    split, test, source, prediction = run.split, run.test, run.source, run.prediction
    predicted_traces = write_prediction(prediction, out_dir)
    predicted = annotate(read_timeline(predicted_traces))
    layout = Layout.of(config)
    ranks = frame["rank"].unique().to_list()
    rank_map = {rank: layout.rank(layout.stage(rank), 0, 0) for rank in ranks}
    tested = pl.col("iteration").is_in(test)
    m_it = iterations(frame, MEASURED).filter(tested)
    p_it = iterations(predicted, MEASURED)
    predicted_iteration = p_it["iteration"].min() if p_it.height else 0
    predicted_ms = prediction.iteration_ms
    job = m_it.group_by("iteration").agg(measured_ms=pl.col("time_us").mean() / 1e3).sort("iteration")
    rows = [{"iteration": it, "measured_ms": m, "predicted_ms": predicted_ms,
             "error_pct": diff.error_pct(predicted_ms, m)} for it, m in job.iter_rows()]
    m_spans = with_stage(spans(frame, MEASURED).filter(tested), stage_of_ranks(ranks, layout))
    aligned_spans = align_spans(m_spans, spans(predicted, MEASURED), rank_map, {it: predicted_iteration for it in test})
    measured_ops = ops(frame, MEASURED)
    measured_calls = launched_ops(signatures_without_out(frame, "name"), MEASURED)  # calls as the model places them
    aligned_ops = align_sequences(measured_calls.filter(tested), launched_ops(predicted, MEASURED), rank_map,
                                  predicted_iteration)
    n = rank_iterations(m_it)
    measured_ms = median_job(rows, "measured_ms")
    profiled_ms = measured_job_ms(frame, split.profile) if run.from_traces else None
    speed = gemm_time_ratio(measured_ops, split.profile, test) if run.from_traces else None
    details = {"profile": source, "profile_iterations": split.profile if run.from_traces else None,
               "test_iterations": test, "coverage": prediction.coverage,
               "simulated_breakdown_ms": prediction.breakdown_ms, "simulated_terms": prediction.terms,
               "profile_iterations_measured_ms": profiled_ms,
               "in_sample_error_pct": diff.error_pct(predicted_ms, profiled_ms),
               "iteration_drift_pct": diff.error_pct(measured_ms, profiled_ms),
               "tested_gemm_time_ratio": speed}
    notes = [f"latencies: {share:.1%} {kind}" for kind, share in prediction.coverage.items() if share > 0]
    notes += term_notes(prediction.terms)
    if profiled_ms is not None and split.held_out:
        notes.append(f"the profiled iterations {split.profile} took {profiled_ms:.3f} ms (the prediction is "
                     f"{diff.error_pct(predicted_ms, profiled_ms):+.2f} % from them); the tested ones {test} took "
                     f"{measured_ms:.3f} ms, {diff.error_pct(measured_ms, profiled_ms):+.2f} % from the profiled "
                     f"ones: a change between iterations that no prediction from the profile can follow")
        if speed is not None:
            notes.append(f"the tested iterations' GEMMs took x{speed:.3f} the time of the profiled ones' (the same "
                         f"operators: far from 1, the machine itself ran slower or faster, e.g. other load or clock "
                         f"changes)")
    hardware = config.hardware
    if hardware.device.lower() == "cpu" and hardware.cores and config.parallelism.world_size > hardware.cores:
        notes.append(f"{config.parallelism.world_size} ranks shared {hardware.cores} cores: operators ran slower "
                     f"than alone (the measured interference, on average), and who ran while whom waited (pipeline "
                     f"bubbles, collectives) changed how fast; the simulator gives every rank a processor of its "
                     f"own at the average speed")
    comparison = Comparison(
        name="model", measured_ms=measured_ms, predicted_ms=predicted_ms, iterations=rows,
        phases=diff.phase_rows(aligned_spans), stages=diff.stage_rows(aligned_spans),
        micro_batches=diff.micro_batch_rows(aligned_spans),
        classes=diff.class_rows(aligned_ops, n), worst_ops=diff.worst_op_rows(aligned_ops, n),
        one_side_only=diff.one_side_rows(aligned_ops, n),
        breakdown=diff.breakdown_rows(breakdown(frame, MEASURED).filter(tested), breakdown(predicted, MEASURED)),
        op_errors_pct=diff.op_error_sample(aligned_ops), notes=notes, details=details,
        ops_table=aligned_ops, spans_table=aligned_spans)
    run.prediction.simulation = None  # written and compared: not needed any more
    return comparison, predicted


def measured_job_ms(frame: pl.DataFrame, selected: list[int]) -> float | None:
    """The measured job time (median over the selected iterations of the mean over ranks)."""
    profiled = iterations(frame, MEASURED).filter(pl.col("iteration").is_in(selected))
    job = profiled.group_by("iteration").agg(measured_ms=pl.col("time_us").mean() / 1e3)
    return statistics.median(job["measured_ms"].to_list()) if job.height else None


def gemm_time_ratio(measured_ops: pl.DataFrame, profiled: list[int], tested: list[int]) -> float | None:
    """Median over the tested iterations of their GEMM time (mean over ranks) over the same median for the
    profiled iterations: how much slower (> 1) the machine ran the same operators in the tested ones."""
    gemms = measured_ops.filter(pl.col("op_class") == GEMM)
    per_iteration = gemms.group_by("iteration", "rank").agg(pl.col("dur").sum()).group_by("iteration").agg(
        pl.col("dur").mean())
    times = dict(per_iteration.iter_rows())
    before = [times[i] for i in profiled if i in times]
    after = [times[i] for i in tested if i in times]
    if not before or not after or statistics.median(before) <= 0:
        return None
    return statistics.median(after) / statistics.median(before)


def rank_iterations(table: pl.DataFrame) -> int:
    """How many (rank, iteration) pairs a table covers."""
    return table.select("rank", "iteration").unique().height


def median_job(rows: list[dict[str, Any]], key: str) -> float:
    """Median over iterations of one column of iteration rows."""
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else 0.0


def with_stage(table: pl.DataFrame, stage_of: dict[int, int]) -> pl.DataFrame:
    """Spans without a ``stage=`` field get the rank's pipeline stage from the run's layout."""
    if not stage_of:
        return table
    return table.with_columns(stage=pl.coalesce(
        "stage", pl.col("rank").replace_strict(stage_of, default=None, return_dtype=pl.Int64).cast(pl.String)))


def stage_of_ranks(ranks: list[int], layout: Layout) -> dict[int, int]:
    """The pipeline stage of each rank in the run's layout."""
    return {rank: layout.stage(rank) for rank in ranks}
