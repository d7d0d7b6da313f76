"""Reading the events the replay needs from one rank's Kineto trace.

Ingest keeps kernels and CPU operators; the replay also needs every CUDA runtime call (launches,
synchronisations, memcpys, event record/wait) and, where newer PyTorch versions write them, the CUPTI
``cuda_sync`` activities ("Stream Wait Event", "Event Sync", "Stream Sync", "Context Sync") with the stream and
the ``cudaEventRecord`` they wait on. This module decodes exactly those fields, reusing ingest's reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from vtrain.errors import InputError
from vtrain.ingest.decode import BATCH_EVENTS, EventArgs, TraceEvent, decode_header, iter_event_batches, read_bytes
from vtrain.ingest.discover import find_trace_files, rank_and_world_size

#: event categories, as Kineto writes them
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "python_function"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime"})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
SYNC_CATEGORY = "cuda_sync"

#: what an event is in the replay
CPU, RUNTIME, DEVICE, SYNC = "cpu", "runtime", "device", "sync"


_NO_ARGS = EventArgs()


@dataclass
class RankTrace:
    """The replay's view of one rank: every complete event it uses, as columns (one entry per event).

    ``kind`` is cpu (operators and annotations), runtime (CUDA runtime/driver calls), device (kernels,
    memcpys, memsets) or sync (CUPTI synchronisation activities). ``lane`` is the thread id for cpu and
    runtime events and the stream for device and sync events. ``index`` is the event's position in the file's
    ``traceEvents`` (used to write the predicted trace).
    """

    rank: int
    path: Path
    world_size: int | None
    process_groups: list[dict[str, Any]]
    kind: list[str]
    cat: list[str]
    name: list[str]
    lane: list[int]
    ts: list[float]
    dur: list[float]
    correlation: list[int | None]
    external_id: list[int | None]
    wait_on_stream: list[int | None]
    wait_on_event_record: list[int | None]
    collective_name: list[str | None]
    elements: list[int | None]
    pg_ranks: list[str | None]
    pg_name: list[str | None]
    input_dims: list[str | None]  # CPU operators: their ``Input Dims`` as compact JSON text
    index: list[int]
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def has_device_activity(self) -> bool:
        return DEVICE in self.kind


def read_rank_trace(path: Path) -> RankTrace:
    """Decode one rank file; errors name the file."""
    data, _digest = read_bytes(path)
    header = decode_header(data, path)
    del data
    info = header.distributedInfo or {}
    rank, world_size = rank_and_world_size(path, info)
    trace = RankTrace(rank=rank, path=path, world_size=world_size,
                      process_groups=list(info.get("pg_config") or []),
                      kind=[], cat=[], name=[], lane=[], ts=[], dur=[], correlation=[], external_id=[],
                      wait_on_stream=[], wait_on_event_record=[], collective_name=[], elements=[], pg_ranks=[],
                      pg_name=[], input_dims=[], index=[])
    strings: dict[str, str] = {}
    for batch, events in enumerate(iter_event_batches(header, path)):
        _append(trace, events, batch * BATCH_EVENTS, strings)
    return trace


def _append(trace: RankTrace, events: list[TraceEvent], offset: int, strings: dict[str, str]) -> None:
    """Add the events the replay uses; repeated strings (names, categories, dims) are stored once."""
    for position, event in enumerate(events):
        if event.ph != "X":
            continue
        cat = event.cat
        if cat in CPU_CATEGORIES or cat in RUNTIME_CATEGORIES:
            kind = CPU if cat in CPU_CATEGORIES else RUNTIME
            lane = event.tid
        elif cat in DEVICE_CATEGORIES:
            kind = DEVICE
            lane = event.args.stream if event.args and event.args.stream is not None else event.tid
        elif cat == SYNC_CATEGORY:
            kind = SYNC
            lane = event.args.stream if event.args and event.args.stream is not None else event.tid
        else:
            continue
        if event.ts is None or event.dur is None or event.dur < 0 or not isinstance(lane, int):
            trace.dropped += 1
            continue
        args = event.args or _NO_ARGS
        trace.kind.append(kind)
        trace.cat.append(strings.setdefault(cat, cat))
        trace.name.append(strings.setdefault(event.name, event.name))
        trace.lane.append(lane)
        trace.ts.append(event.ts)
        trace.dur.append(event.dur)
        trace.correlation.append(args.correlation)
        trace.external_id.append(args.external_id)
        trace.wait_on_stream.append(args.wait_on_stream)
        trace.wait_on_event_record.append(args.wait_on_event_record)
        trace.collective_name.append(args.collective_name)
        sized = cat == "user_annotation" or event.name.startswith(("c10d::", "record_param_comms"))
        trace.elements.append(args.in_nelems or args.out_nelems or (_elements(args.input_dims) if sized else None))
        trace.pg_ranks.append(args.pg_ranks)
        trace.pg_name.append(args.pg_name)
        dims = _compact(args.input_dims) if cat == "cpu_op" else None
        trace.input_dims.append(dims if dims is None else strings.setdefault(dims, dims))
        trace.index.append(offset + position)


def _compact(raw: msgspec.Raw) -> str | None:
    """JSON text without spaces (Kineto writes ``[[8, 64]]``, other writers ``[[8,64]]``)."""
    return bytes(raw).replace(b" ", b"").decode() if raw else None


def _elements(raw: msgspec.Raw) -> int | None:
    """Elements of the first tensor in ``Input Dims`` (collective annotations carry their buffer there)."""
    if not raw:
        return None
    try:
        dims = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    while isinstance(dims, list) and dims and isinstance(dims[0], list):
        dims = dims[0]
    if not isinstance(dims, list) or not dims or not all(isinstance(x, int) for x in dims):
        return None
    total = 1
    for x in dims:
        total *= x
    return total


def read_trace_set(trace_dir: str | Path) -> list[RankTrace]:
    """Every rank file of a trace folder, sorted by rank; two files claiming one rank is an error."""
    traces: list[RankTrace] = []
    seen: dict[int, Path] = {}
    for path in find_trace_files(trace_dir):
        trace = read_rank_trace(path)
        if trace.rank in seen:
            raise InputError(f"rank {trace.rank} is claimed by both {seen[trace.rank].name} and {path.name}", path)
        seen[trace.rank] = path
        traces.append(trace)
    return sorted(traces, key=lambda t: t.rank)
