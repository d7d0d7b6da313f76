"""``validate_traces``: the measured side, both predictions and their diffs for one trace folder.

In two steps: :func:`prepare_validation` reads each trace file once, replays and simulates, writing nothing;
:func:`finish_validation` writes the predicted traces (into the report's staging folder) and compares."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.devices.catalog import canonical_device_name
from vtrain.distributed import release_freed_memory
from vtrain.errors import InputError
from vtrain.parallel import Layout
from vtrain.ingest.inferred_run import INFERRED, InferredRun, infer_run
from vtrain.ingest.rank import without_empty_steps
from vtrain.kineto import traced_gpu_name
from vtrain.replay.chrome import write_replayed_traces
from vtrain.replay.replayer import Replay, replay_graph
from vtrain.replay.trace import KeptRank, KeptText, TextAside, check_replayable, trace_set_warnings
from vtrain.run_argument import given_run
from vtrain.runconfig import DescribedRun, RunConfig, described_run
from vtrain.tables.store import Profile
from vtrain.validate.diff import Comparison
from vtrain.validate.hta import hta_summary
from vtrain.validate.peak_memory import SOURCE as PEAK_SOURCE
from vtrain.validate.peak_memory import peak_memory_rows
from vtrain.validate.predictions import (
    ModelRun,
    compare_model,
    compare_replay,
    predict_model,
)
from vtrain.validate.profile import RankTablesSink
from vtrain.validate.rank_checks import rank_warnings, renumbered
from vtrain.validate.ranks import read_for_validation
from vtrain.validate.steady import steady_set
from vtrain.validate.timeline import (
    MEASURED,
    REPLAYED,
    Side,
    annotate,
    iterations,
    measured_iterations,
    ops,
    step_layout_warnings,
    without_made_iterations,
)

Warn = Callable[[str], None]

#: operators drawn per timeline in the report (the longest ones of the iteration shown)
TIMELINE_OPS = 4000
#: columns of the replay's event frame that only :func:`~vtrain.validate.timeline.annotate` reads: a validation
#: keeps the annotated frame without them (``lane`` stays: the replayed traces move GPU annotations by stream)
ANNOTATION_ONLY = ("cat", "external_id", "launch", "work_op")


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
    steady_basis: str  # why the steady iterations are these (:func:`vtrain.validate.steady.steady_set`)
    measured: dict[str, Any]
    replay: Comparison
    model: Comparison | None
    model_reason: str | None
    hta: dict[str, Any]
    timelines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    iteration_table: pl.DataFrame | None = None  # measured and replayed time of every rank and iteration
    memory: list[dict[str, Any]] = field(default_factory=list)  # measured peak memory against the model, by rank

    def summary(self) -> dict[str, Any]:
        """What ``--json`` prints."""
        return {"trace_dir": str(self.trace_dir), "replay": self.replay.summary(),
                "model": self.model.summary() if self.model else None,
                "model_reason": self.model_reason, "memory": self.memory or None}

    def to_dict(self) -> dict[str, Any]:
        """Everything, for ``metrics.json``."""
        return {
            "trace_dir": str(self.trace_dir), "ranks": self.ranks, "world_size": self.world_size,
            "device": self.device, "config": self.config_source, "iterations": self.iterations,
            "steady_iterations": self.steady, "steady_basis": self.steady_basis, "measured": self.measured,
            "replay": self.replay.to_dict(),
            "model": self.model.to_dict() if self.model else None, "model_reason": self.model_reason,
            "hta": self.hta, "warnings": self.warnings,
            "memory": {"source": PEAK_SOURCE, "ranks": self.memory} if self.memory else None,
        }


@dataclass
class Prepared:
    """A trace folder read, replayed and (when the run is described) simulated: everything of a validation that
    needs no file written (:func:`prepare_validation`); :func:`finish_validation` writes the predicted traces and
    compares."""

    trace_dir: Path
    traces: list[KeptRank]
    config: RunConfig | None
    config_source: str | None
    replayed: Replay
    frame: pl.DataFrame  # the annotated replay (measured and replayed times of every event)
    all_iterations: list[int]
    steady: list[int]
    steady_basis: str
    model: ModelRun | None
    model_reason: str | None
    warnings: list[str]
    text: TextAside  # holds the ranks' kept text until the replayed traces are written
    memory: list[dict[str, Any]] = field(default_factory=list)  # :func:`peak_memory_rows`


def validate_traces(trace_dir: str | Path, work_dir: Path, *, config_path: str | Path | None = None,
                    profile_dir: str | Path | None = None, with_hta: bool = True,
                    warn: Warn = lambda _: None, workers: int = 1, ray_address: str | None = None) -> Validation:
    """Validate the replay and (when the run is described) the model against the traces in ``trace_dir``.

    Predicted traces are written under ``work_dir`` (``predicted/replay``, ``predicted/model``). ``with_hta``
    off skips HTA's side-by-side analysis (it parses every trace folder once more).
    """
    prepared = prepare_validation(trace_dir, config_path=config_path, profile_dir=profile_dir, warn=warn,
                                  workers=workers, ray_address=ray_address)
    return finish_validation(prepared, work_dir, with_hta=with_hta)


def prepare_validation(trace_dir: str | Path, *, config_path: str | Path | None = None,
                       profile_dir: str | Path | None = None, warn: Warn = lambda _: None, workers: int = 1,
                       ray_address: str | None = None) -> Prepared:
    """Read every trace file once (by ``workers`` processes or as Ray tasks at ``ray_address``:
    :mod:`vtrain.validate.ranks`), replay the set and simulate the described run, writing nothing.

    The replay's decoding of each file also feeds ingest's tables for the model's profile
    (:class:`vtrain.validate.profile.RankTablesSink`) when the run is described and no ``profile_dir`` is given.
    """
    trace_dir = Path(trace_dir)
    (config, config_source, config_problem), logged = traced_run_config(trace_dir, config_path)
    # ingest's tables: the model's profile (no --profile), and the shapes a run without run.yaml is read from
    sink = RankTablesSink() if not config_problem and (profile_dir is None or config is None) else None
    builder, traces, text = read_for_validation(trace_dir, config, sink, workers=workers, ray_address=ray_address)
    if logged and config is not None:
        config = _on_traced_gpu(config, traces)
    check_replayable(trace_dir, traces)
    _check_world(config, config_source, traces)
    warnings: list[str] = []

    def note(line: str) -> None:
        warnings.append(line)
        warn(line)

    if text.problem:
        note(f"{trace_dir}: the traces' text could not be set aside in a temporary file ({text.problem}); it is kept "
             f"in memory until the replayed traces are written")
    world_size = config.parallelism.world_size if config else next((t.world_size for t in traces if t.world_size), None)
    for line in trace_set_warnings(trace_dir, traces, world_size):
        note(line)
    replayed = replay_graph(builder.graph(traces), each_rank=_annotated)  # annotated rank by rank
    for trace in traces:
        trace.release_columns()
    for line in replayed.notes:
        note(line)
    shifts = replayed.step_shifts
    frame, line = renumbered(trace_dir, without_made_iterations(replayed.events, traces), traces, shifts)
    if line:
        note(line)
    measured = iterations(frame, MEASURED)
    all_iterations = measured_iterations(frame, trace_dir)
    for line in rank_warnings(trace_dir, traces, measured):
        note(line)
    for line in step_layout_warnings(trace_dir, frame):
        note(line)
    chosen = steady_set(trace_dir, frame, all_iterations, {trace.rank: trace.path for trace in traces})
    steady, steady_basis = chosen.iterations, chosen.basis
    for line in chosen.notes:
        note(line)

    graphed = replayed.stats.graph_launches
    warning = _graph_warning(trace_dir, graphed, config, profile_dir) if graphed and config is not None else None
    if warning:
        note(warning)
    model, model_reason = None, None
    if config_problem:
        model_reason = f"{config_problem}: the run is not simulated, the traces are replayed"
    else:
        ingested = _ingested(sink, trace_dir, traces, shifts) if sink else None
        if ingested is not None:  # the device it was traced on, as ingest's metadata says it
            ingested.metadata["device"] = {"name": _traced_gpu(traces), "type": _accelerator(traces) or "cpu"}
        del sink
        if config is None and ingested is not None:
            config, model_reason = _read_off_traces(trace_dir, traces, ingested, note)
            config_source = INFERRED if config is not None else None
        elif config is not None and ingested is not None:
            if line := _unlike_the_traces(trace_dir, traces, ingested, config, config_source or ""):
                note(line)
        if config is not None:
            model, model_reason = predict_model(trace_dir, config, config_source or "", profile_dir, steady,
                                                ingested if profile_dir is None else None, note)
    if model_reason and model is None:
        note(f"{trace_dir}: model-driven prediction skipped: {model_reason}")
    memory: list[dict[str, Any]] = []
    if config is not None:
        try:
            memory = peak_memory_rows(config, [trace.rank for trace in traces])
        except ValueError as exc:
            note(f"{config_source}: {exc}: the memory model is not compared with it")
    release_freed_memory()  # the decoding, replay and annotation are done: what they freed goes back before comparing
    return Prepared(trace_dir=trace_dir, traces=traces, config=config, config_source=config_source,
                    replayed=replayed, frame=frame, all_iterations=all_iterations, steady=steady,
                    steady_basis=steady_basis, model=model,
                    model_reason=model_reason, warnings=warnings, text=text, memory=memory)


def _ingested(sink: RankTablesSink, trace_dir: Path, traces: list[KeptRank], shifts: dict[int, int]) -> Profile:
    """Ingest's tables of the traces, as `vtrain ingest` makes them: each rank's steps that hold nothing numbered
    none (:func:`vtrain.ingest.rank.without_empty_steps`; the run is read off the iterations that hold its
    operators), the ranks in ``shifts`` renumbered."""
    sink.ranks = [without_empty_steps(tables)[0] for tables in sink.ranks]
    return sink.profile(trace_dir, traces[0].world_size if traces else None, shifts)


def _graph_warning(trace_dir: Path, launches: int, config: RunConfig,
                   profile_dir: str | Path | None) -> str | None:
    """What the model side cannot follow in traces whose CUDA graph launches released several kernels each
    (nothing when the run config says so and another profile times the graphs' operators)."""
    said = f"{trace_dir}: {launches:,} CUDA graph launches released several kernels each"
    if not config.cuda_graphs:
        return (f"{said}, but the run config does not say cuda_graphs: true: the model places every operator launched "
                f"on its own with the host gap before it, as an eager run: its prediction is not this run's")
    if profile_dir is None:
        return (f"{said}: a graph's kernels belong to its launch, not to the operators it captured, so these traces "
                f"time none of those operators: the model interpolates or models them (--profile with an eager "
                f"recording's profile times them as measured)")
    return None


def finish_validation(prepared: Prepared, work_dir: Path, *, with_hta: bool = True) -> Validation:
    """Write the predicted traces under ``work_dir`` (``predicted/replay``, ``predicted/model``), compare both
    predictions with the measurement and (``with_hta``) run HTA on the three folders."""
    trace_dir, traces, frame, steady = prepared.trace_dir, prepared.traces, prepared.frame, prepared.steady
    measured_iterations = iterations(frame, MEASURED)
    replay_result = compare_replay(frame, steady, _stage_of(traces, prepared.config), prepared.replayed)
    predicted_root = work_dir / "predicted"
    replay_dir = predicted_root / "replay"
    replay_dir.mkdir(parents=True, exist_ok=True)
    write_replayed_traces(prepared.replayed, replay_dir)
    for trace in traces:
        trace.source = KeptText()  # written: the text is not needed any more
    prepared.text.close()

    model_result, model_frame = None, None
    if prepared.model is not None and prepared.config is not None:
        model_result, model_frame = compare_model(prepared.model, prepared.config, frame, predicted_root / "model")

    device = next((trace.accelerator for trace in traces if trace.accelerator), "cpu")
    hta = (_hta(trace_dir, replay_dir, predicted_root / "model" if model_result else None, device) if with_hta
           else {"reason": "skipped (--no-hta)"})
    shown = (model_result.details["test_iterations"][0] if model_result else steady[0])
    timelines = {"measured": _timeline_rows(frame, MEASURED, shown),
                 "replay": _timeline_rows(frame, REPLAYED, shown)}
    if model_frame is not None:
        timelines["model"] = _timeline_rows(model_frame, MEASURED, None)
    return Validation(
        trace_dir=trace_dir, ranks=[t.rank for t in traces], world_size=traces[0].world_size if traces else None,
        device=device, config_source=prepared.config_source, iterations=prepared.all_iterations, steady=steady,
        steady_basis=prepared.steady_basis,
        measured=_measured_summary(measured_iterations, steady), replay=replay_result, model=model_result,
        model_reason=prepared.model_reason, hta=hta, timelines=timelines, warnings=prepared.warnings,
        memory=prepared.memory,
        iteration_table=measured_iterations.join(
            iterations(frame, REPLAYED).select("rank", "iteration", replay_time_us="time_us"),
            on=["rank", "iteration"], how="left"))


def _annotated(frame: pl.DataFrame) -> pl.DataFrame:
    """One rank's event frame annotated, less the columns only the annotation reads."""
    return annotate(frame).drop(ANNOTATION_ONLY)


def traced_run_config(trace_dir: Path, config_path: str | Path | None) -> tuple[DescribedRun, bool]:
    """The run the traces are of, and whether it is a log's: ``--config`` (a run config or the run's Megatron log,
    :func:`~vtrain.run_argument.given_run`; an error if it does not load, the user asked for it, or gives a model
    without its run), else the ``run.yaml`` beside them (one that does not load leaves the run undescribed, and says
    why)."""
    if config_path is None:
        return described_run(trace_dir), False
    given = given_run(Path(config_path))
    if given.model_only:
        raise InputError("gives a model, not the run the traces recorded (its parallelism and batch): give the run's "
                         "config (run.yaml) or its Megatron log", config_path)
    return DescribedRun(given.config.validate(config_path), str(config_path), None), given.logged


def _read_off_traces(trace_dir: Path, traces: list, ingested: Profile,
                     note: Callable[[str], None]) -> tuple[RunConfig | None, str | None]:
    """The run of traces without a run.yaml or --config, read off their operators' shapes
    (:func:`vtrain.ingest.inferred_run.infer_run`) and said on one line, or why there is none."""
    inferred = _inferred_run(traces, ingested)
    if inferred.config is None:
        return None, (f"no run described (no run.yaml in the trace folder, no --config) and none read off the "
                      f"traces: {inferred.reason}")
    run = inferred.config
    note(f"{trace_dir}: no run.yaml: the run is {INFERRED}: {inferred.describe()}; taken as {inferred.assumed} "
         f"(--config gives the run)")
    return run, None


def _inferred_run(traces: list, ingested: Profile) -> InferredRun:
    """The run the traces' operators show (:func:`vtrain.ingest.inferred_run.infer_run`)."""
    world = next((trace.world_size for trace in traces if trace.world_size), None) or len(traces)
    groups = next((trace.process_groups for trace in traces if trace.process_groups), [])
    device = ingested.metadata["device"]  # set by prepare_validation, as ingest's metadata holds it
    return infer_run(ingested["cpu_ops"], world, device["name"] or device["type"], groups)


#: what a run config says that the traces' operators show for sure: the model's depth and shape, the tensor- and
#: pipeline-parallel degrees and the micro-batch (the vocabulary is shown padded, the batch by the ranks traced)
_SHOWN = (("layers", lambda run: run.model.layers), ("hidden", lambda run: run.model.hidden),
          ("heads", lambda run: run.model.heads), ("seq", lambda run: run.model.seq),
          ("tp", lambda run: run.parallelism.tp), ("pp", lambda run: run.parallelism.pp),
          ("micro-batch", lambda run: run.parallelism.micro_batch))


def _unlike_the_traces(trace_dir: Path, traces: list, ingested: Profile, config: RunConfig,
                       source: str) -> str | None:
    """A warning when the given run config says other than the traces' operators show (:data:`_SHOWN`): a run of
    12 layers validated against traces of 24 was predicted 46 % fast, a miss of the config's, silently (an audit);
    ``None`` when they agree or the traces show no run."""
    inferred = _inferred_run(traces, ingested)
    if inferred.config is None:
        return None
    differ = [f"{name} {said(config)} (the traces: {said(inferred.config)})" for name, said in _SHOWN
              if name not in inferred.unsure and said(config) != said(inferred.config)]
    if not differ:
        return None
    return (f"{source} says {', '.join(differ)}, read off {trace_dir}'s operators' shapes: does it describe these "
            f"traces? The model simulates the run it says, and the error is then the config's")


def _traced_gpu(traces: list) -> str | None:
    """The device the traces' deviceProperties name first (None: a CPU run, or traces that list none)."""
    for trace in traces:
        for key, value in trace.source.fields:
            if key != "deviceProperties":
                continue
            properties = json.loads(value)
            names = (traced_gpu_name(p) for p in properties if isinstance(p, dict)) if isinstance(properties, list) \
                else ()
            if name := next((name for name in names if name), None):
                return name
    return None


def _accelerator(traces: list) -> str | None:
    """The kind of accelerator the traces' device activities ran on (``cuda``, ``rocm``, ``mtia``), None on CPUs."""
    return next((trace.accelerator for trace in traces if trace.accelerator), None)


def _on_traced_gpu(config: RunConfig, traces: list) -> RunConfig:
    """A log's run on the GPU its traces name (a Megatron log does not say it), where they name one vtrain knows."""
    gpu = _traced_gpu(traces)
    known = gpu is not None and canonical_device_name(gpu) not in (None, "cpu")
    return replace(config, hardware=replace(config.hardware, device=gpu)) if known else config


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
    return {t.rank: layout.stage(t.rank) for t in traces}


def _measured_summary(table: pl.DataFrame, steady: list[int]) -> dict[str, Any]:
    """Iteration time over the steady iterations: the job's (mean over ranks) median and spread, and per rank."""
    steady_rows = table.filter(pl.col("iteration").is_in(steady))
    job = steady_rows.group_by("iteration").agg(pl.col("time_us").mean()).sort("iteration")["time_us"].to_list()
    per_rank = {str(rank): _spread([t for t in group["time_us"].to_list()])
                for (rank,), group in steady_rows.group_by("rank")}
    return {"iteration_ms": _spread(job), "per_rank": dict(sorted(per_rank.items(), key=lambda kv: int(kv[0]))),
            "definition": "ProfilerStep#N start (or the previous iteration's end, when steps overlap on the device) "
                          "to the later of its end and the end of the last device activity it launched; job time = "
                          "mean over ranks; the first profiled iteration is excluded, and a last one the "
                          "profiler's stop cut short"}


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


def _hta(trace_dir: Path, replay_dir: Path, model_dir: Path | None, device: str) -> dict[str, Any]:
    if device == "cpu":
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

