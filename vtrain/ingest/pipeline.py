"""`vtrain ingest`: a folder of per-rank Kineto traces -> a profile (tables + metadata)."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

import vtrain
from vtrain.errors import InputError
from vtrain.ingest.assemble import RankTables, assemble_rank
from vtrain.ingest.classify import COMMUNICATION, COMPUTATION, MEMORY
from vtrain.ingest.decode import TraceHeader, readable_trace
from vtrain.ingest.discover import find_trace_files, rank_and_world_size, rank_from_file_name
from vtrain.ingest.events import read_rank_events
from vtrain.ingest.extract import RankEvents
from vtrain.ingest.spans import read_header, read_header_around_events
from vtrain.ingest.text import TraceText, load_text
from vtrain.tables.latency import cpu_op_calls, gpu_op_calls, nccl_latency, op_latency
from vtrain.tables.store import Profile

Warn = Callable[[str], None]
Progress = Callable[[int], None]


@dataclass
class RankSource:
    """One rank's trace file and what its header says."""

    path: Path
    rank: int
    world_size: int | None
    header: TraceHeader


def ingest_traces(trace_dir: str | Path, *, warn: Warn = lambda _: None,
                  progress: Progress | None = None) -> Profile:
    """Read every rank file of ``trace_dir`` and build the profile tables and metadata."""
    files = find_trace_files(trace_dir)
    started = time.time()
    ranks: list[RankTables] = []
    sources: list[RankSource] = []
    hashes: dict[Path, str] = {}
    for path in files:
        with readable_trace(path):
            text = load_text(path, progress)
            source, events = _read_rank(path, text, sources, progress)
        sources.append(source)
        if (source.header.distributedInfo or {}).get("rank") is None and rank_from_file_name(path) is None:
            warn(f"{path}: no rank in the trace or its name; the only trace of its folder is taken as rank 0")
        hashes[path] = text.sha256
        del text
        _check_events(path, events, warn)
        tables = assemble_rank(source.rank, events, source.header.distributedInfo)
        _report_rank(path, tables, warn)
        ranks.append(tables)
    world_size = _world_size(sources)
    missing = sorted(set(range(world_size)) - {s.rank for s in sources}) if world_size else []
    if missing:
        shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
        warn(f"{Path(trace_dir)}: {len(missing)} of {world_size} ranks have no trace file (missing: {shown})")
    profile = _build_profile(ranks)
    profile.metadata = _metadata(Path(trace_dir), sources, ranks, hashes, world_size, missing, started)
    return profile


def _read_rank(path: Path, text: TraceText, earlier: list[RankSource],
               progress: Progress | None) -> tuple[RankSource, RankEvents]:
    """A rank file's header and events. The header is first read without parsing the events for it (see
    :func:`~vtrain.ingest.spans.read_header_around_events`: 0.07 s of a 127 MB trace), which is right when the
    events then decode; else it is all read again the usual way, which reports what is wrong."""
    around = read_header_around_events(text)
    if around:
        try:
            source = _rank_source(path, around[0])
            _check_against(source, earlier)
            return source, read_rank_events(text, around[1], progress)
        except (InputError, msgspec.DecodeError):
            pass
    header, span = read_header(text)
    source = _rank_source(path, header)
    _check_against(source, earlier)
    return source, read_rank_events(text, span, progress)


def _check_events(path: Path, events: RankEvents, warn: Warn) -> None:
    """Events ingest cannot read are said, never skipped in silence; a file with events of which none can be
    read is an error (it would give an empty profile)."""
    counts = events.counts
    if not counts.events:
        warn(f"{path}: the trace holds no events (traceEvents is empty): nothing of this rank is in the profile")
    unread = [f"{n} have no {what}" for n, what in ((counts.no_phase, "phase (ph)"),
                                                    (counts.uncategorised, "category (cat)")) if n]
    if counts.events and events.device.is_empty() and events.cpu.is_empty() and events.runtime.is_empty():
        raise InputError(f"none of its {counts.events} events is a device activity, CPU op or runtime call"
                         + (f" ({', '.join(unread)})" if unread else ""), path)
    if unread:
        warn(f"{path}: left out {counts.no_phase + counts.uncategorised} of {counts.events} events: "
             + ", ".join(unread))


def _report_rank(path: Path, tables: RankTables, warn: Warn) -> None:
    """Warnings for what a rank's tables leave out or could not link, each with its count."""
    if tables.dropped:
        warn(f"{path}: dropped {tables.dropped} events with a missing or negative duration")
    if tables.absurd:
        warn(f"{path}: left out {tables.absurd} device activities with an absurd duration (not finite, or longer "
             f"than the trace's host span): not counted as device time")
    if tables.unlaunched:
        warn(f"{path}: {tables.unlaunched} of {tables.kernels.height} device activities have no launching runtime "
             f"call in the file (a pruned trace, or launched before profiling began): their launch time is their "
             f"start")


def _rank_source(path: Path, header: TraceHeader) -> RankSource:
    rank, world_size = rank_and_world_size(path, header.distributedInfo)
    return RankSource(path=path, rank=rank, world_size=world_size, header=header)


def _check_against(source: RankSource, earlier: list[RankSource]) -> None:
    for other in earlier:
        if other.rank == source.rank:
            raise InputError(f"rank {source.rank} is claimed by both {other.path.name} and {source.path.name}",
                             source.path)
        if other.world_size and source.world_size and other.world_size != source.world_size:
            raise InputError(f"world size {source.world_size} here but {other.world_size} in "
                             f"{other.path.name}: the files come from different jobs", source.path)
    if source.world_size and source.rank >= source.world_size:
        raise InputError(f"rank {source.rank} is outside the world size {source.world_size}", source.path)


def _world_size(sources: list[RankSource]) -> int | None:
    sizes = {s.world_size for s in sources if s.world_size}
    return sizes.pop() if sizes else None


def _build_profile(ranks: list[RankTables]) -> Profile:
    kernels = pl.concat([r.kernels for r in ranks])
    cpu_ops = pl.concat([r.cpu_ops for r in ranks])
    collectives = pl.concat([r.collectives for r in ranks])
    graph_launches = pl.concat([r.graph_launches for r in ranks])
    gpu_ranks = set(kernels["rank"].unique().to_list())
    cpu_only = cpu_ops.filter(~pl.col("rank").is_in(list(gpu_ranks)))
    calls = pl.concat([gpu_op_calls(kernels).select(_CALL_COLUMNS), cpu_op_calls(cpu_only).select(_CALL_COLUMNS)])
    return Profile(tables={
        "kernels": kernels, "cpu_ops": cpu_ops, "collectives": collectives, "graph_launches": graph_launches,
        "op_latency": op_latency(calls), "nccl_latency": nccl_latency(collectives, cpu_ops),
    })


_CALL_COLUMNS = ["op", "input_dims", "input_types", "device_type", "kernels", "n_kernels", "dur"]


def _metadata(trace_dir: Path, sources: list[RankSource], ranks: list[RankTables], hashes: dict[Path, str],
              world_size: int | None, missing: list[int], started: float) -> dict[str, Any]:
    device = _device_properties(sources, ranks)
    first_info = next((s.header.distributedInfo for s in sources if s.header.distributedInfo), {}) or {}
    headers = [s.header for s in sources]
    return {
        "kind": "profile",
        "vtrain_version": vtrain.__version__,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ingest_seconds": round(time.time() - started, 3),
        "parent": None,
        "source_dir": str(trace_dir),
        "device": device,
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
        "iterations": sorted({i for r in ranks for i in r.iterations}),
        "dropped_events": sum(r.dropped for r in ranks),
        "sources": [
            {"file": s.path.name, "rank": s.rank, "bytes": s.path.stat().st_size, "sha256": hashes[s.path],
             "base_time_ns": s.header.baseTimeNanoseconds, **_activity_counts(r)}
            for s, r in zip(sources, ranks)
        ],
    }


def _activity_counts(tables: RankTables) -> dict[str, int]:
    """A rank's device activities and where each went: ``device_activities`` = ``kernel_rows`` +
    ``dropped_activities`` (missing or negative duration) + ``absurd_activities``."""
    return {"device_activities": tables.device_activities, "kernel_rows": tables.kernels.height,
            "dropped_activities": tables.counts.device_dropped, "absurd_activities": tables.absurd,
            "unlaunched_activities": tables.unlaunched, "graph_launches": tables.graph_launches.height}


def _first(values: Any) -> Any:
    return next((v for v in values if v not in (None, "")), None)


def _device_properties(sources: list[RankSource], ranks: list[RankTables]) -> dict[str, Any]:
    """The device of the first rank that lists deviceProperties; for traces without them, only the type (``cuda``,
    ``rocm``, ``mtia``: :func:`vtrain.kineto.accelerator`; ``cpu`` where no rank has device activity)."""
    kind = next((r.accelerator for r in ranks if r.accelerator), "cpu")
    for source in sources:
        for props in source.header.deviceProperties or []:
            if props.get("name"):
                return {
                    "name": props["name"],
                    "compute_capability": f"{props.get('computeMajor')}.{props.get('computeMinor')}",
                    "memory_bytes": props.get("totalGlobalMem"),
                    "sm_count": props.get("numSms"),
                    "type": kind if kind != "cpu" else "cuda",
                }
    return {"name": None, "compute_capability": None, "memory_bytes": None, "sm_count": None,
            "type": kind}


def rank_summary(profile: Profile) -> dict[str, Any]:
    """Per-rank kernel counts and time per HTA kernel class (over the whole trace), plus iteration counts."""
    kernels = profile["kernels"]
    per_rank: dict[str, Any] = {}
    for rank in profile.metadata.get("ranks", []):
        mine = kernels.filter(pl.col("rank") == rank)
        by_class = dict(mine.group_by("kernel_class").agg(pl.col("dur").sum()).iter_rows())
        iterations = profile["cpu_ops"].filter(
            (pl.col("rank") == rank) & pl.col("name").str.starts_with("ProfilerStep#")).height
        per_rank[str(rank)] = {
            "kernels": mine.height,
            "computation_us": round(by_class.get(COMPUTATION, 0.0), 3),
            "communication_us": round(by_class.get(COMMUNICATION, 0.0), 3),
            "memory_us": round(by_class.get(MEMORY, 0.0), 3),
            "iterations": iterations,
        }
    return per_rank
