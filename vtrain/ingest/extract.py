"""From typed trace events to per-rank polars frames: device activities, CPU ops, runtime launches."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import json

import msgspec
import polars as pl

from vtrain.ingest.classify import kernel_class
from vtrain.ingest.decode import EventArgs, TraceEvent

DEVICE_CATEGORIES = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
CPU_CATEGORIES = {"cpu_op", "user_annotation"}
RUNTIME_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime"}

_NO_ARGS = EventArgs()


@dataclass
class RankEvents:
    """The frames of one rank's trace, before tables are assembled."""

    device: pl.DataFrame
    cpu: pl.DataFrame
    runtime: pl.DataFrame
    dropped: int


class _JsonText:
    """Canonical JSON text of raw ``Input Dims`` / ``Input type`` values, cached (they repeat a lot)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, str] = {}

    def __call__(self, raw: msgspec.Raw) -> str | None:
        if not raw:
            return None
        key = bytes(raw)
        text = self._cache.get(key)
        if text is None:
            text = json.dumps(json.loads(key))
            self._cache[key] = text
        return text


def _memory_kind(kind: str, name: str) -> str | None:
    if kind == "memcpy":
        return name.removeprefix("Memcpy ").strip() or None
    if kind == "memset":
        return name.removeprefix("Memset ").strip(" ()") or None
    return None


def extract_rank_events(batches: Iterable[list[TraceEvent]]) -> RankEvents:
    """Split a rank's events into device, CPU and runtime frames; complete events with a missing or negative
    duration are dropped and counted."""
    device_parts: list[pl.DataFrame] = []
    cpu_parts: list[pl.DataFrame] = []
    runtime_parts: list[pl.DataFrame] = []
    dropped = 0
    json_text = _JsonText()
    for events in batches:
        device: list[TraceEvent] = []
        cpu: list[TraceEvent] = []
        runtime: list[TraceEvent] = []
        for event in events:
            if event.ph != "X":
                continue
            if event.dur is None or event.dur < 0 or event.ts is None:
                dropped += 1
                continue
            cat = event.cat
            if cat in DEVICE_CATEGORIES:
                device.append(event)
            elif cat in CPU_CATEGORIES:
                cpu.append(event)
            elif cat in RUNTIME_CATEGORIES:
                runtime.append(event)
        device_parts.append(_device_frame(device))
        cpu_parts.append(_cpu_frame(cpu, json_text))
        runtime_parts.append(_runtime_frame(runtime))
    return RankEvents(
        device=pl.concat(device_parts) if device_parts else _device_frame([]),
        cpu=pl.concat(cpu_parts) if cpu_parts else _cpu_frame([], json_text),
        runtime=pl.concat(runtime_parts) if runtime_parts else _runtime_frame([]),
        dropped=dropped,
    )


#: collective metadata that Kineto puts on NCCL kernels and on ``record_param_comms`` ops
COLLECTIVE_ARG_SCHEMA = {
    "arg_collective": pl.String, "arg_in_nelems": pl.Int64, "arg_out_nelems": pl.Int64,
    "arg_group_size": pl.Int32, "arg_dtype": pl.String, "arg_pg_name": pl.String, "arg_pg_ranks": pl.String,
}


def _collective_arg_columns(args: list[EventArgs]) -> dict[str, list[object]]:
    """The collective-metadata columns; all null without a pass per column when no event carries any."""
    if not any(a.collective_name is not None or a.in_nelems is not None for a in args):
        nulls: list[object] = [None] * len(args)
        return dict.fromkeys(COLLECTIVE_ARG_SCHEMA, nulls)
    return {
        "arg_collective": [a.collective_name for a in args],
        "arg_in_nelems": [a.in_nelems for a in args],
        "arg_out_nelems": [a.out_nelems for a in args],
        "arg_group_size": [a.group_size for a in args],
        "arg_dtype": [a.dtype for a in args],
        "arg_pg_name": [a.pg_name for a in args],
        "arg_pg_ranks": [a.pg_ranks for a in args],
    }


def _device_frame(events: list[TraceEvent]) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    names = [e.name for e in events]
    kinds = [DEVICE_CATEGORIES[e.cat] for e in events]
    return pl.DataFrame(
        {
            "device": [a.device if a.device is not None else (e.pid if isinstance(e.pid, int) else None)
                       for a, e in zip(args, events)],
            "stream": [a.stream if a.stream is not None else (e.tid if isinstance(e.tid, int) else None)
                       for a, e in zip(args, events)],
            "name": names,
            "kind": kinds,
            "memory_kind": [_memory_kind(k, n) for k, n in zip(kinds, names)],
            "kernel_class": [kernel_class(n) for n in names],
            "ts": [e.ts for e in events],
            "dur": [e.dur for e in events],
            "correlation": [a.correlation for a in args],
            "external_id": [a.external_id for a in args],
            **_collective_arg_columns(args),
        },
        schema={
            "device": pl.Int32, "stream": pl.Int64, "name": pl.String, "kind": pl.String,
            "memory_kind": pl.String, "kernel_class": pl.String, "ts": pl.Float64, "dur": pl.Float64,
            "correlation": pl.Int64, "external_id": pl.Int64, **COLLECTIVE_ARG_SCHEMA,
        },
    )


def _cpu_frame(events: list[TraceEvent], json_text: _JsonText) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    return pl.DataFrame(
        {
            "tid": [e.tid if isinstance(e.tid, int) else None for e in events],
            "cat": [e.cat for e in events],
            "name": [e.name for e in events],
            "ts": [e.ts for e in events],
            "dur": [e.dur for e in events],
            "external_id": [a.external_id for a in args],
            "input_dims": [json_text(a.input_dims) for a in args],
            "input_types": [json_text(a.input_types) for a in args],
            **_collective_arg_columns(args),
        },
        schema={
            "tid": pl.Int64, "cat": pl.String, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
            "external_id": pl.Int64, "input_dims": pl.String, "input_types": pl.String,
            **COLLECTIVE_ARG_SCHEMA,
        },
    )


def _runtime_frame(events: list[TraceEvent]) -> pl.DataFrame:
    args = [e.args or _NO_ARGS for e in events]
    return pl.DataFrame(
        {
            "tid": [e.tid if isinstance(e.tid, int) else None for e in events],
            "name": [e.name for e in events],
            "ts": [e.ts for e in events],
            "dur": [e.dur for e in events],
            "correlation": [a.correlation for a in args],
            "external_id": [a.external_id for a in args],
        },
        schema={"tid": pl.Int64, "name": pl.String, "ts": pl.Float64, "dur": pl.Float64,
                "correlation": pl.Int64, "external_id": pl.Int64},
    )
