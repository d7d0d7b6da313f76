"""`vtrain ingest`: a folder of per-rank Kineto traces -> a profile (tables + metadata).

Ranks are read one at a time per process (:func:`vtrain.ingest.rank.ingest_rank`), each writing its tables to a
spool folder, so memory is bounded by one rank's events, not by the folder; with ``workers`` > 1 the files are
read by a pool of processes, rank-parallel, or beyond one machine as Ray tasks (as `vtrain plan --ray` does), and
the results are taken in file order (the same tables, warnings and errors as a serial run). The profile's tables
are then put together from the spool: streamed from the spooled files into the profile folder
(:func:`ingest_to_folder`, what `vtrain ingest` does) or read into memory (:func:`ingest_traces`, for the
commands and tests that use a profile at once).
"""

from __future__ import annotations

import json
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

import vtrain
from vtrain import runconfig
from vtrain.distributed import map_in_order, usable_cores
from vtrain.errors import InputError
from vtrain.ingest.clocks import (
    clocks_disagree,
    iteration_starts,
    renumber_steps,
    renumbered_steps_warning,
    step_shifts,
)
from vtrain.ingest.discover import RankClaims, find_trace_files, missing_ranks_warning
from vtrain.ingest.inferred_run import INFERRED, infer_run
from vtrain.ingest.rank import (
    SPOOLED,
    RankResult,
    RankSource,
    empty_steps_warning,
    ingest_rank,
    rank_row,
    shapeless_warning,
    unmarked_warning,
)
from vtrain.kineto import traced_gpu_name
from vtrain.limits import MAX_KEPT_WARNINGS
from vtrain.outputs import PROFILE, staged
from vtrain.tables.latency import cpu_op_calls, nccl_latency, op_latency
from vtrain.tables.store import METADATA_FILE, Profile, conform

Warn = Callable[[str], None]
Progress = Callable[[int], None]

#: the profile's tables that are the spooled per-rank tables one after the other
EVENT_TABLES = ("kernels", "cpu_ops", "collectives", "graph_launches")
#: below this many bytes of trace files a pool of processes costs more than it saves
PARALLEL_MIN_BYTES = 64 << 20


def default_workers(files: list[Path]) -> int:
    """Processes for ingesting ``files``: one per CPU core this process may run on and per file, but one for a
    small folder (starting a worker costs about as much as ingesting 20 MB of trace)."""
    if sum(f.stat().st_size for f in files) < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(len(files), usable_cores()))


@dataclass
class IngestedRanks:
    """Every rank of a folder, ingested into ``spool``: what each left to report, and the profile's metadata."""

    spool: Path
    results: list[RankResult]
    metadata: dict[str, Any]

    def spooled(self, table: str, ranks: list[RankResult] | None = None) -> list[Path]:
        """The spooled files of ``table`` of ``ranks`` (all by default), in folder order."""
        return [r.spooled(self.spool, table) for r in (self.results if ranks is None else ranks)]

    def event_table(self, table: str) -> pl.DataFrame:
        """One of :data:`EVENT_TABLES`, every rank's rows in folder order."""
        return _read(self.spooled(table), table)

    def latency_tables(self) -> dict[str, pl.DataFrame]:
        """``op_latency`` and ``nccl_latency``. Operator calls come from the ranks' kernels, or on ranks without
        device activity from their CPU ops (:func:`vtrain.tables.latency.cpu_op_calls`, which needs all those
        ranks' CPU ops at once)."""
        cpu_only = [r for r in self.results if not r.has_device_activity]
        gpu_calls = _read(self.spooled("calls"), None, categorical=_CALL_TEXT)
        cpu_ops = _read(self.spooled("cpu_ops", cpu_only), "cpu_ops")
        calls = [gpu_calls.select(_CALL_COLUMNS)] if gpu_calls.height else []
        if cpu_ops.height:
            calls.append(cpu_op_calls(cpu_ops).select(_CALL_COLUMNS)
                         .with_columns(pl.col(_CALL_TEXT).cast(pl.Categorical)))
        return {
            "op_latency": op_latency(pl.concat(calls) if calls else pl.DataFrame()),
            "nccl_latency": nccl_latency(self.event_table("collectives"), _read(self.spooled("comm_ops"), "cpu_ops")),
        }

    def write_tables(self, folder: Path) -> dict[str, int]:
        """Write every table into ``folder`` (the event tables streamed from the spool, never all in memory);
        returns the rows of each."""
        rows = {}
        for table in EVENT_TABLES:
            files = self.spooled(table)
            if files:
                pl.scan_ipc(files).sink_parquet(folder / f"{table}.parquet")
            else:
                conform(pl.DataFrame(), table).write_parquet(folder / f"{table}.parquet")
            rows[table] = sum(r.rows[table] for r in self.results)
        for table, frame in self.latency_tables().items():
            frame.write_parquet(folder / f"{table}.parquet")
            rows[table] = frame.height
        return rows

    def summary(self) -> dict[str, Any]:
        """Per-rank kernel counts and time per HTA kernel class, and iteration counts (see
        :func:`rank_summary`)."""
        return {str(r.source.rank): r.summary for r in sorted(self.results, key=_rank) if r.source}


_CALL_COLUMNS = ["op", "input_dims", "input_types", "device_type", "kernels", "n_kernels", "dur"]
#: the text columns of the operator calls: the same few hundred texts repeated on millions of calls
_CALL_TEXT = ["op", "input_dims", "input_types", "device_type", "kernels"]


def _read(files: list[Path], table: str | None, categorical: list[str] | None = None) -> pl.DataFrame:
    """The spooled ``files`` one after the other (an empty ``table`` when there are none); the ``categorical``
    columns are read as categories, batch by batch (a tenth of the memory of the texts)."""
    if not files:
        return conform(pl.DataFrame(), table) if table else pl.DataFrame()
    frames = pl.scan_ipc(files)
    if categorical:
        return frames.with_columns(pl.col(categorical).cast(pl.Categorical)).collect(engine="streaming")
    return frames.collect()


def _rank(result: RankResult) -> int:
    return result.source.rank if result.source else -1


def ingest_traces(trace_dir: str | Path, *, warn: Warn = lambda _: None, progress: Progress | None = None,
                  workers: int = 1, ray_address: str | None = None) -> Profile:
    """Read every rank file of ``trace_dir`` and build the profile tables and metadata, in memory."""
    with tempfile.TemporaryDirectory(prefix="vtrain-ingest-") as spool:
        ranks = ingest_ranks(trace_dir, Path(spool), warn=warn, progress=progress, workers=workers,
                             ray_address=ray_address)
        tables = {table: ranks.event_table(table) for table in EVENT_TABLES}
        return Profile(tables={**tables, **ranks.latency_tables()}, metadata=ranks.metadata)


def ingest_to_folder(trace_dir: str | Path, output: Path, *, warn: Warn = lambda _: None,
                     progress: Progress | None = None, workers: int = 1,
                     ray_address: str | None = None) -> tuple[IngestedRanks, dict[str, int]]:
    """Ingest ``trace_dir`` into the profile folder ``output`` (which :func:`vtrain.outputs.check_output` must
    have allowed): staged beside it with the spool inside, and renamed into place when complete. Returns the
    ingested ranks and the rows of each table."""
    with staged(output, PROFILE) as staging:
        spool = staging / ".ranks"
        spool.mkdir()
        ranks = ingest_ranks(trace_dir, spool, warn=warn, progress=progress, workers=workers,
                             ray_address=ray_address)
        rows = ranks.write_tables(staging)
        shutil.rmtree(spool)
        (staging / METADATA_FILE).write_text(json.dumps(ranks.metadata, indent=2, sort_keys=False) + "\n")
    return ranks, rows


def ingest_ranks(trace_dir: str | Path, spool: Path, *, warn: Warn = lambda _: None,
                 progress: Progress | None = None, workers: int = 1, ray_address: str | None = None) -> IngestedRanks:
    """Ingest every rank file of ``trace_dir`` into ``spool`` with ``workers`` processes, or as Ray tasks on the
    cluster at ``ray_address`` (see :func:`_map_ranks_on_ray`); the checks across ranks, warnings and errors come
    in folder order, as in a serial run."""
    files = find_trace_files(trace_dir)
    said: list[str] = []  # every warning, kept in the metadata: `vtrain tables` says them again

    def say(line: str) -> None:
        said.append(line)
        warn(line)

    started = time.time()
    results: list[RankResult] = []
    sources: list[RankSource] = []
    claims = RankClaims()
    mapped = (_map_ranks_on_ray(ray_address, files, spool, progress) if ray_address
              else _map_ranks(files, spool, workers, progress))
    # closed on any error or interrupt before it goes further: the workers are stopped before anyone removes the
    # spool they write in
    with closing(mapped):
        for result in mapped:
            if result.source:
                claims.claim(result.source.path, result.source.rank, result.source.world_size)
            if result.error:
                raise result.error
            assert result.source is not None
            sources.append(result.source)
            results.append(result)
    if results and not any(result.counts.events for result in results):
        raise InputError(f"no event in any of its {len(results)} trace file(s) (traceEvents empty): a profile of "
                         "them would hold nothing", trace_dir)
    for result in results:  # said once every file is read: a folder refused is its one error line
        for line in result.warnings:
            say(line)
    world_size = _world_size(sources)
    missing = sorted(set(range(world_size)) - {s.rank for s in sources}) if world_size else []
    if line := missing_ranks_warning(trace_dir, (s.rank for s in sources), world_size):
        say(line)
    if world_size is None and (line := _world_of_the_collectives(Path(trace_dir), results, sources, spool)):
        say(line)
    starts = iteration_starts(pl.scan_ipc([r.spooled(spool, "cpu_ops") for r in results])) if len(results) > 1 \
        else None  # each rank's steps, read once: for their numbering and their clocks
    if starts is not None:
        starts, line = _renumber_shifted_steps(Path(trace_dir), results, spool, starts)
        if line:
            say(line)
    for line in (empty_steps_warning(results), shapeless_warning(Path(trace_dir), results),
                 unmarked_warning(Path(trace_dir), results), _clocks_line(Path(trace_dir), starts)):
        if line:
            say(line)
    metadata = _metadata(Path(trace_dir), results, world_size, missing, started)
    described = described_run(Path(trace_dir), say)
    _with_recorded_software(metadata["software"], described)
    metadata["run"] = _of_the_traced_job(described, world_size, Path(trace_dir), say)
    if metadata["run"] is None and not (Path(trace_dir) / "run.yaml").exists():
        metadata["run"] = _run_read_off(Path(trace_dir), [r.spooled(spool, "cpu_ops") for r in results], sources,
                                        metadata, say)
        if metadata["run"] is not None:
            metadata["run_source"] = INFERRED
    metadata["warnings"] = said[:MAX_KEPT_WARNINGS] + (
        [f"... and {len(said) - MAX_KEPT_WARNINGS} more warning(s)"] if len(said) > MAX_KEPT_WARNINGS else [])
    return IngestedRanks(spool=spool, results=results, metadata=metadata)


def _map_ranks(files: list[Path], spool: Path, workers: int, progress: Progress | None) -> Iterator[RankResult]:
    """:func:`~vtrain.ingest.rank.ingest_rank` of every file, in folder order: in this process, or by a pool of
    ``workers`` processes (``progress`` then gets each file's size as it is done)."""
    if workers <= 1 or len(files) == 1:
        for index, path in enumerate(files):
            yield ingest_rank(index, path, spool, progress)
        return
    with closing(map_in_order(_ingest_rank_job, [(index, path, spool) for index, path in enumerate(files)],
                              workers)) as results:
        for result in results:
            if progress:
                progress(result.path.stat().st_size)
            yield result


def _map_ranks_on_ray(address: str, files: list[Path], spool: Path,
                      progress: Progress | None) -> Iterator[RankResult]:
    """:func:`~vtrain.ingest.rank.ingest_rank` of every file as one Ray task each (``pip install
    'vtrain[ray]'``; ``address`` as for `vtrain plan --ray-address`, see :func:`vtrain.distributed.run_on_ray`),
    in folder order. A task reads its file at the same path on its node (the folder must be on a shared file
    system) and returns its spooled tables as bytes, which are written to ``spool`` here: only the trace folder
    needs to be shared."""
    from vtrain.distributed import map_on_ray_in_order

    for result, tables in map_on_ray_in_order(address, _ingest_rank_shipped, list(enumerate(files))):
        for name, data in tables.items():
            result.spooled(spool, name).write_bytes(data)
        if progress:
            progress(result.path.stat().st_size)
        yield result


def _ingest_rank_shipped(job: tuple[int, Path]) -> tuple[RankResult, dict[str, bytes]]:
    """A Ray task: one rank ingested into a spool of its own, returned with the spooled files' bytes."""
    index, path = job
    with tempfile.TemporaryDirectory(prefix="vtrain-ingest-") as spool:
        result = ingest_rank(index, path, Path(spool))
        tables = {name: result.spooled(Path(spool), name).read_bytes() for name in SPOOLED} if not result.error else {}
    return result, tables


def _ingest_rank_job(job: tuple[int, Path, Path]) -> RankResult:
    return ingest_rank(*job)


def _world_of_the_collectives(trace_dir: Path, results: list[RankResult], sources: list[RankSource],
                              spool: Path) -> str | None:
    """Where no trace says the job's world size: the warning line for collectives whose groups name more ranks than
    the folder's files (one rank of a 64-rank job, traced without ``distributedInfo``, read as a job of one)."""
    highest = -1
    for result in results:
        groups = pl.scan_ipc(result.spooled(spool, "collectives")).select("group_ranks", "group_size").collect()
        ranks = groups["group_ranks"].drop_nulls().str.extract_all(r"\d+").explode().cast(pl.Int64, strict=False)
        highest = max(highest, ranks.max() or -1, (groups["group_size"].max() or 0) - 1)
    have = {source.rank for source in sources}
    if highest < 0 or highest < max(have, default=-1) or len(have) > highest:
        return None
    return (f"{trace_dir}: no trace says the job's world size, and its collectives' groups name ranks up to "
            f"{highest}: at least {highest + 1} ranks, {highest + 1 - len(have & set(range(highest + 1)))} of them "
            f"with no trace file here (their collectives are kept at this rank's times)")


def _world_size(sources: list[RankSource]) -> int | None:
    sizes = {s.world_size for s in sources if s.world_size}
    return sizes.pop() if sizes else None


def _metadata(trace_dir: Path, results: list[RankResult], world_size: int | None, missing: list[int],
              started: float) -> dict[str, Any]:
    sources = [r.source for r in results if r.source]
    first_info = next((s.header.distributedInfo for s in sources if s.header.distributedInfo), {}) or {}
    headers = [s.header for s in sources]
    return {
        "kind": "profile",
        "vtrain_version": vtrain.__version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ingest_seconds": round(time.time() - started, 3),
        "parent": None,
        "source_dir": str(trace_dir),
        "device": _device_properties(results),
        "software": {
            "pytorch": _first(h.pytorch_version for h in headers),
            "cuda_runtime": _first(h.cuda_runtime_version for h in headers),
            "cuda_driver": _first(h.cuda_driver_version for h in headers),
            "cupti": _first(h.cupti_version for h in headers),
            "nccl": first_info.get("nccl_version"),
            "distributed_backend": first_info.get("backend"),
            "trace_schema_version": _first(h.schemaVersion for h in headers),
            "ingest_python": platform.python_version(),
        },
        "world_size": world_size,
        "ranks": sorted(s.rank for s in sources),
        "ranks_missing": missing,
        "iterations": sorted({i for r in results for i in r.iterations}),
        "dropped_events": sum(r.counts.dropped for r in results),
        "sources": [
            {"file": r.path.name, "rank": r.source.rank, "bytes": r.path.stat().st_size, "sha256": r.sha256,
             "base_time_ns": r.source.header.baseTimeNanoseconds, **r.activity_counts}
            for r in results if r.source
        ],
    }


def described_run(trace_dir: Path, warn: Warn) -> dict[str, Any] | None:
    """The run config of the traced job (``run.yaml`` beside the traces, as `vtrain record` writes it), as plain
    data for the profile's metadata: what the simulator needs to tell the operators it models in this timeline
    from the time between them when the profile stands for another run. ``None`` without one; a ``run.yaml``
    that does not load is a warning (the traces are read all the same)."""
    described = runconfig.described_run(trace_dir)
    if described.problem:
        warn(f"{described.problem}; the profile is written without the traced run's config")
    return described.config.to_dict() if described.config else None


def _with_recorded_software(software: dict[str, Any], run: dict[str, Any] | None) -> None:
    """Fill the PyTorch version, which the traces' headers do not say (Kineto writes none), from the run config
    `vtrain record` wrote beside them (``software.torch``): calibrate compares it, and a recorded run's PyTorch
    upgrade was reported as no change (an audit)."""
    recorded = (run or {}).get("software") or {}
    if software.get("pytorch") is None and recorded.get("torch"):
        software["pytorch"] = str(recorded["torch"])


def _of_the_traced_job(run: dict[str, Any] | None, world_size: int | None, trace_dir: Path,
                       warn: Warn) -> dict[str, Any] | None:
    """``run`` (a ``run.yaml``'s, :func:`described_run`) where its ranks are as many as the traced job's; else None,
    said (validate refuses such a run.yaml: it describes another job)."""
    if run is None or not world_size:
        return run
    layout = run.get("parallelism") or {}
    ranks = int(layout.get("tp", 1)) * int(layout.get("pp", 1)) * int(layout.get("dp", 1))
    if ranks == world_size:
        return run
    warn(f"{trace_dir / 'run.yaml'}: the run config has tp*pp*dp = {ranks} ranks but the traces come from a job of "
         f"{world_size}; the profile is written without the traced run's config")
    return None


def _renumber_shifted_steps(trace_dir: Path, results: list[RankResult], spool: Path,
                            starts: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """Renumber the steps of the ranks whose ``ProfilerStep#N`` numbers run ahead of or behind the others'
    (:func:`~vtrain.ingest.clocks.step_shifts` of ``starts``, their steps' starts) in their spooled tables, before
    anything matches ranks by iteration (a send matched with the receive of the step after read 99 ms, not 1.7);
    the starts renumbered alike, and the line that says it."""
    shifts = step_shifts(starts)
    for result in results:
        if result.source is not None and result.source.rank in shifts:
            result.iterations = [number - shifts[result.source.rank] for number in result.iterations]
            for table in SPOOLED:
                path = result.spooled(spool, table)
                if path.exists():
                    renumber_steps(pl.scan_ipc(path).collect(), shifts).write_ipc(path)
    files = {r.source.rank: r.source.path for r in results if r.source}
    return renumber_steps(starts, shifts), renumbered_steps_warning(trace_dir, shifts, files)


def _clocks_line(trace_dir: Path, starts: pl.DataFrame | None) -> str | None:
    """The warning for ranks whose clocks disagree (:func:`~vtrain.ingest.clocks.clocks_disagree` of their steps'
    ``starts``; ``None`` for one rank): a collective's time is then read across clocks (a 3 s offset made
    send/recv 3,075 µs where they took 284)."""
    if starts is None:
        return None
    line = clocks_disagree(trace_dir, starts)
    return line and line + "; the collectives' latencies, timed across ranks, are not either"


def _run_read_off(trace_dir: Path, cpu_ops: list[Path], sources: list[RankSource], metadata: dict[str, Any],
                  warn: Warn) -> dict[str, Any] | None:
    """The run of traces without a run.yaml read off their operators' shapes
    (:func:`~vtrain.ingest.inferred_run.infer_run`), as plain data, said on one warning line; None when they show
    none (anything but a language model's training: nothing is said)."""
    if not cpu_ops:
        return None
    groups = next((s.header.distributedInfo.get("pg_config") for s in sources
                   if isinstance(s.header.distributedInfo, dict)), None)
    device = metadata.get("device") or {}
    inferred = infer_run(pl.scan_ipc(cpu_ops), metadata.get("world_size"), device.get("name") or device.get("type"),
                         groups)
    if inferred.config is None:
        return None
    warn(f"{trace_dir}: no run.yaml: the traced run, {INFERRED}, is the profile's: {inferred.describe()}; taken as "
         f"{inferred.assumed}")
    return inferred.config.to_dict()


def _first(values: Any) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def _device_properties(results: list[RankResult]) -> dict[str, Any]:
    """The device of the first rank that lists deviceProperties; for traces without them, only the type (``cuda``,
    ``rocm``, ``mtia``: :func:`vtrain.kineto.accelerator`; ``cpu`` where no rank has device activity)."""
    kind = next((r.accelerator for r in results if r.accelerator), "cpu")
    for result in results:
        for props in (result.source.header.deviceProperties if result.source else None) or []:
            if name := traced_gpu_name(props):
                return {
                    "name": name,
                    "compute_capability": f"{props.get('computeMajor')}.{props.get('computeMinor')}",
                    "memory_bytes": props.get("totalGlobalMem"),
                    "sm_count": props.get("numSms"),
                    "type": kind if kind != "cpu" else "cuda",
                }
    return {"name": None, "compute_capability": None, "memory_bytes": None, "sm_count": None,
            "type": kind}


def rank_summary(profile: Profile) -> dict[str, Any]:
    """Per-rank kernel counts and time per HTA kernel class (over the whole trace), plus iteration counts."""
    kernels, cpu_ops = profile["kernels"], profile["cpu_ops"]
    return {str(rank): rank_row(kernels.filter(pl.col("rank") == rank), cpu_ops.filter(pl.col("rank") == rank))
            for rank in profile.metadata.get("ranks", [])}
