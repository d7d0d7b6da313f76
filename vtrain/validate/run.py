"""``validate_traces``: the measured side, both predictions and their diffs for one trace folder."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError
from vtrain.ingest.pipeline import ingest_traces
from vtrain.naming import ITERATION_PREFIX
from vtrain.replay.chrome import write_replayed_traces
from vtrain.replay.collectives import Layout
from vtrain.replay.run import Replay, read_timeline, replay
from vtrain.replay.trace import read_trace_set
from vtrain.runconfig import RunConfig, load_run_config
from vtrain.validate import compare
from vtrain.validate.align import align_events, align_sequences, align_spans
from vtrain.validate.compare import Comparison
from vtrain.validate.hta import hta_summary
from vtrain.validate.model import held_out_profile, load_given_profile, predict, split_iterations
from vtrain.validate.timeline import MEASURED, REPLAYED, Side, annotate, breakdown, iterations, ops, spans

Warn = Callable[[str], None]

#: operators drawn per timeline in the report (the longest ones of the iteration shown)
TIMELINE_OPS = 4000


@dataclass
class Validation:
    """Everything the report shows about one trace folder."""

    trace_dir: Path
    ranks: list[int]
    world_size: int | None
    device: str
    config_source: str | None
    iterations: list[int]
    steady: list[int]
    measured: dict[str, Any]
    replay: Comparison
    model: Comparison | None
    model_reason: str | None
    hta: dict[str, Any]
    timelines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    iteration_table: pl.DataFrame | None = None  # measured and replayed time of every rank and iteration

    def summary(self) -> dict[str, Any]:
        """What ``--json`` prints."""
        return {"trace_dir": str(self.trace_dir), "replay": self.replay.summary(),
                "model": self.model.summary() if self.model else None,
                "model_reason": self.model_reason}

    def to_dict(self) -> dict[str, Any]:
        """Everything, for ``metrics.json``."""
        return {
            "trace_dir": str(self.trace_dir), "ranks": self.ranks, "world_size": self.world_size,
            "device": self.device, "config": self.config_source, "iterations": self.iterations,
            "steady_iterations": self.steady, "measured": self.measured, "replay": self.replay.to_dict(),
            "model": self.model.to_dict() if self.model else None, "model_reason": self.model_reason,
            "hta": self.hta, "warnings": self.warnings,
        }


def validate_traces(trace_dir: str | Path, work_dir: Path, *, config_path: str | Path | None = None,
                    profile_dir: str | Path | None = None, with_hta: bool = True,
                    warn: Warn = lambda _: None) -> Validation:
    """Validate the replay and (when the run is described) the model against the traces in ``trace_dir``.

    Predicted traces are written under ``work_dir`` (``predicted/replay``, ``predicted/model``). ``with_hta``
    off skips HTA's side-by-side analysis (it parses every trace folder once more).
    """
    trace_dir = Path(trace_dir)
    traces = read_trace_set(trace_dir)
    config, config_source = _run_config(trace_dir, config_path)
    _check_world(config, config_source, traces)
    warnings: list[str] = []

    def note(line: str) -> None:
        warnings.append(line)
        warn(line)

    replayed = replay(traces, config)
    for line in replayed.notes:
        note(line)
    frame = annotate(replayed.events)
    measured_iterations = iterations(frame, MEASURED)
    all_iterations = sorted(measured_iterations["iteration"].unique().to_list())
    if not all_iterations:
        raise InputError("no events the replay can use (CPU operators, runtime calls, kernels)", trace_dir)
    steady = all_iterations[1:] or all_iterations
    if not frame.filter(pl.col("name").str.starts_with(ITERATION_PREFIX)).height:
        note(f"{trace_dir}: no ProfilerStep#N spans; the whole trace is taken as one iteration")
    elif len(all_iterations) == 1:
        note(f"{trace_dir}: only one profiled iteration ({all_iterations[0]}); it is used although it is the first")
    stage_of = _stage_of(traces, config)
    replay_result = _compare_replay(frame, steady, stage_of, replayed)
    predicted_root = work_dir / "predicted"
    replay_dir = predicted_root / "replay"
    replay_dir.mkdir(parents=True, exist_ok=True)
    write_replayed_traces(replayed, replay_dir)

    model_result, model_reason, model_frame = None, None, None
    if config is None:
        model_reason = ("no run described: no run.yaml in the trace folder and no --config, so there is nothing "
                        "to simulate")
    else:
        model_result, model_reason, model_frame = _compare_model(
            trace_dir, config, config_source or "", profile_dir, steady, frame, predicted_root / "model", note)
    if model_reason and model_result is None:
        note(f"model-driven prediction skipped: {model_reason}")

    device = "cuda" if frame["gpu_rank"].any() else "cpu"
    hta = (_hta(trace_dir, replay_dir, predicted_root / "model" if model_result else None, device) if with_hta
           else {"reason": "skipped (--no-hta)"})
    shown = (model_result.details["test_iterations"][0] if model_result else steady[0])
    timelines = {"measured": _timeline_rows(frame, MEASURED, shown),
                 "replay": _timeline_rows(frame, REPLAYED, shown)}
    if model_frame is not None:
        timelines["model"] = _timeline_rows(model_frame, MEASURED, None)
    return Validation(
        trace_dir=trace_dir, ranks=[t.rank for t in traces], world_size=traces[0].world_size if traces else None,
        device=device, config_source=config_source, iterations=all_iterations, steady=steady,
        measured=_measured_summary(measured_iterations, steady), replay=replay_result, model=model_result,
        model_reason=model_reason, hta=hta, timelines=timelines, warnings=warnings,
        iteration_table=measured_iterations.join(
            iterations(frame, REPLAYED).select("rank", "iteration", replay_time_us="time_us"),
            on=["rank", "iteration"], how="left"))


def _run_config(trace_dir: Path, config_path: str | Path | None) -> tuple[RunConfig | None, str | None]:
    if config_path is not None:
        config = load_run_config(config_path)
        return config.validate(config_path), str(config_path)
    described = trace_dir / "run.yaml"
    if described.exists():
        return load_run_config(described).validate(described), str(described)
    return None, None


def _check_world(config: RunConfig | None, source: str | None, traces: list) -> None:
    """The described run must have as many ranks as the traces' job (and hold every traced rank)."""
    if config is None:
        return
    world = config.parallelism.world_size
    traced_world = next((t.world_size for t in traces if t.world_size), None)
    if traced_world is not None and traced_world != world:
        raise InputError(f"the run config has tp*pp*dp = {world} ranks but the traces come from a job of "
                         f"{traced_world}", source)
    outside = [t.rank for t in traces if t.rank >= world]
    if outside:
        raise InputError(f"the run config has {world} ranks; the traces include rank {outside[0]}", source)


def _stage_of(traces: list, config: RunConfig | None) -> dict[int, int]:
    if config is None:
        return {}
    layout = Layout.of(config)
    return {t.rank: layout.coords(t.rank)[0] for t in traces}


def _measured_summary(table: pl.DataFrame, steady: list[int]) -> dict[str, Any]:
    """Iteration time over the steady iterations: the job's (mean over ranks) median and spread, and per rank."""
    steady_rows = table.filter(pl.col("iteration").is_in(steady))
    job = steady_rows.group_by("iteration").agg(pl.col("time_us").mean()).sort("iteration")["time_us"].to_list()
    per_rank = {str(rank): _spread([t for t in group["time_us"].to_list()])
                for (rank,), group in steady_rows.group_by("rank")}
    return {"iteration_ms": _spread(job), "per_rank": dict(sorted(per_rank.items(), key=lambda kv: int(kv[0]))),
            "definition": "ProfilerStep#N start to the later of its end and the end of the last device activity "
                          "it launched; job time = mean over ranks; the first profiled iteration is excluded"}


def _spread(values_us: list[float]) -> dict[str, float | int | None]:
    ms = [v / 1e3 for v in values_us]
    if not ms:
        return {"count": 0, "median": None, "min": None, "max": None, "p10": None, "p90": None, "stdev": None}
    ordered = sorted(ms)

    def quantile(q: float) -> float:
        position = q * (len(ordered) - 1)
        low = int(position)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return {"count": len(ms), "median": statistics.median(ms), "min": ordered[0], "max": ordered[-1],
            "p10": quantile(0.1), "p90": quantile(0.9), "stdev": statistics.stdev(ms) if len(ms) > 1 else 0.0}


def _rank_iterations(table: pl.DataFrame) -> int:
    return table.select("rank", "iteration").unique().height


def _compare_replay(frame: pl.DataFrame, steady: list[int], stage_of: dict[int, int], replayed: Replay) -> Comparison:
    tested = pl.col("iteration").is_in(steady)
    m_it = iterations(frame, MEASURED).filter(tested)
    p_it = iterations(frame, REPLAYED).filter(tested)
    rows = compare.iteration_rows(m_it, p_it)
    m_spans = _with_stage(spans(frame, MEASURED).filter(tested), stage_of)
    aligned_spans = align_spans(m_spans, spans(frame, REPLAYED).filter(tested))
    m_ops = ops(frame, MEASURED).filter(tested)
    aligned_ops = align_events(m_ops, ops(frame, REPLAYED).filter(tested))
    n = _rank_iterations(m_it)
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
            "edges": replayed.edge_counts,
        },
        "test_iterations": steady,
    }
    notes = []
    unmatched = sum(stats.collective_calls_unmatched.values())
    if unmatched:
        reasons = ", ".join(f"{n} {reason}" for reason, n in stats.collective_calls_unmatched.items())
        notes.append(f"{unmatched} collective call(s) keep their measured duration ({reasons})")
    return Comparison(
        name="replay", measured_ms=_median_job(rows, "measured_ms"), predicted_ms=_median_job(rows, "predicted_ms"),
        iterations=rows, phases=compare.phase_rows(aligned_spans), stages=compare.stage_rows(aligned_spans),
        micro_batches=compare.micro_batch_rows(aligned_spans),
        classes=compare.class_rows(aligned_ops, n), worst_ops=compare.worst_op_rows(aligned_ops, n),
        one_side_only=compare.one_side_rows(aligned_ops, n),
        breakdown=compare.breakdown_rows(breakdown(frame, MEASURED).filter(tested),
                                         breakdown(frame, REPLAYED).filter(tested)),
        op_errors_pct=compare.op_error_sample(aligned_ops), notes=notes, details=details,
        ops_table=aligned_ops, spans_table=aligned_spans)


def _median_job(rows: list[dict[str, Any]], key: str) -> float:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.median(values) if values else 0.0


def _with_stage(table: pl.DataFrame, stage_of: dict[int, int]) -> pl.DataFrame:
    """Spans without a ``stage=`` field get the rank's pipeline stage from the run's layout."""
    if not stage_of:
        return table
    return table.with_columns(stage=pl.coalesce(
        "stage", pl.col("rank").replace_strict(stage_of, default=None, return_dtype=pl.Int64).cast(pl.String)))


def _compare_model(trace_dir: Path, config: RunConfig, config_source: str, profile_dir: str | Path | None,
                   steady: list[int], frame: pl.DataFrame, out_dir: Path,
                   note: Warn) -> tuple[Comparison | None, str | None, pl.DataFrame | None]:
    split = split_iterations(steady)
    if profile_dir is not None:
        profile = load_given_profile(Path(profile_dir))
        test, source = steady, f"--profile {profile_dir}"
    else:
        profile = held_out_profile(ingest_traces(trace_dir), split.profile)
        test, source = split.test, f"{trace_dir}: {split.describe()}"
        if not split.held_out:
            note(f"{trace_dir}: too few steady iterations to hold some out; the profile saw the tested iteration")
    try:
        prediction = predict(config, profile, out_dir, source, config_source)
    except Exception as exc:  # the simulator is another package: report its failure (never hide it) and keep
        return None, f"vtrain simulate failed: {type(exc).__name__}: {exc}", None  # the replay's results
    predicted_traces = read_trace_set(out_dir)
    predicted = annotate(read_timeline(predicted_traces))
    layout = Layout.of(config)
    ranks = frame["rank"].unique().to_list()
    rank_map = {rank: layout.rank(layout.coords(rank)[0], 0, 0) for rank in ranks}
    tested = pl.col("iteration").is_in(test)
    m_it = iterations(frame, MEASURED).filter(tested)
    p_it = iterations(predicted, MEASURED)
    predicted_iteration = p_it["iteration"].min() if p_it.height else 0
    predicted_ms = prediction.iteration_ms
    job = m_it.group_by("iteration").agg(measured_ms=pl.col("time_us").mean() / 1e3).sort("iteration")
    rows = [{"iteration": it, "measured_ms": m, "predicted_ms": predicted_ms,
             "error_pct": compare.error_pct(predicted_ms, m)} for it, m in job.iter_rows()]
    m_spans = _with_stage(spans(frame, MEASURED).filter(tested), _stage_of_ranks(ranks, layout))
    aligned_spans = align_spans(m_spans, spans(predicted, MEASURED), rank_map, {it: predicted_iteration for it in test})
    aligned_ops = align_sequences(ops(frame, MEASURED).filter(tested), ops(predicted, MEASURED), rank_map,
                                  predicted_iteration)
    n = _rank_iterations(m_it)
    details = {"profile": source, "profile_iterations": split.profile if profile_dir is None else None,
               "test_iterations": test, "coverage": prediction.coverage,
               "simulated_breakdown_ms": prediction.breakdown_ms}
    notes = [f"latencies: {share:.1%} {kind}" for kind, share in prediction.coverage.items() if share > 0]
    comparison = Comparison(
        name="model", measured_ms=_median_job(rows, "measured_ms"), predicted_ms=predicted_ms, iterations=rows,
        phases=compare.phase_rows(aligned_spans), stages=compare.stage_rows(aligned_spans),
        micro_batches=compare.micro_batch_rows(aligned_spans),
        classes=compare.class_rows(aligned_ops, n), worst_ops=compare.worst_op_rows(aligned_ops, n),
        one_side_only=compare.one_side_rows(aligned_ops, n),
        breakdown=compare.breakdown_rows(breakdown(frame, MEASURED).filter(tested), breakdown(predicted, MEASURED)),
        op_errors_pct=compare.op_error_sample(aligned_ops), notes=notes, details=details,
        ops_table=aligned_ops, spans_table=aligned_spans)
    return comparison, None, predicted


def _stage_of_ranks(ranks: list[int], layout: Layout) -> dict[int, int]:
    return {rank: layout.coords(rank)[0] for rank in ranks}


def _hta(trace_dir: Path, replay_dir: Path, model_dir: Path | None, device: str) -> dict[str, Any]:
    if device != "cuda":
        return {"reason": "CPU-only traces: HTA's temporal breakdown and overlap are computed from GPU kernels"}
    result: dict[str, Any] = {}
    for side, folder in (("measured", trace_dir), ("replay", replay_dir), ("model", model_dir)):
        if folder is None:
            continue
        summary, reason = hta_summary(folder)
        result[side] = summary if summary is not None else {"reason": reason}
    return result


def _timeline_rows(frame: pl.DataFrame, side: Side, iteration: int | None) -> list[dict[str, Any]]:
    """Operators of one iteration of the lowest rank, for the report's timeline plot (times in ms from the
    iteration's start)."""
    table = ops(frame, side)
    if iteration is not None:
        table = table.filter(pl.col("iteration") == iteration)
    if table.is_empty():
        return []
    rank = table["rank"].min()
    table = table.filter(pl.col("rank") == rank)
    first = iterations(frame, side).filter((pl.col("rank") == rank)
                                           & (pl.col("iteration") == table["iteration"][0]))
    origin = first["start"][0] if first.height else table["start"].min()
    if table.height > TIMELINE_OPS:
        table = table.sort("dur", descending=True).head(TIMELINE_OPS)
    return [{"rank": rank, "name": name, "op_class": cls, "start_ms": (start - origin) / 1e3, "dur_ms": dur / 1e3}
            for name, cls, start, dur in table.select("name", "op_class", "start", "dur").iter_rows()]

