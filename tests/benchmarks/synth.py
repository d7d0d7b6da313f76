"""Large Kineto traces for benchmarks, made by repeating a real trace's events (never committed).

Each copy of the source trace's events is shifted in time past the previous copy, and its correlation ids,
External ids, flow ids and ProfilerStep numbers are offset, so the result is a valid, longer trace of the
same job.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec


def _load(source: Path) -> dict:
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rb") as handle:
        return json.load(handle)


def repeat_trace(source: Path, target: Path, min_bytes: int) -> int:
    """Write ``target`` (plain JSON) holding enough copies of ``source``'s events to reach ``min_bytes``."""
    trace = _load(source)
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000.0
    steps = [int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")]
    step_stride = (max(steps) - min(steps) + 1) if steps else 0
    id_stride = 1 + max(
        [e.get("id", 0) for e in events if isinstance(e.get("id"), int)]
        + [e.get("args", {}).get(k, 0) or 0 for e in events for k in ("correlation", "External id")
           if isinstance(e.get("args", {}).get(k, 0), int)]
    )
    encoder = msgspec.json.Encoder()
    header = encoder.encode(trace)
    written = 0
    with target.open("wb") as out:
        out.write(header[:-1] + (b',"traceEvents":[' if len(header) > 2 else b'"traceEvents":['))
        copy = 0
        while written < min_bytes:
            shifted = [_shift(e, copy, span, id_stride, step_stride) for e in events]
            chunk = encoder.encode(shifted)[1:-1]
            if copy:
                out.write(b",\n")
            out.write(chunk)
            written += len(chunk)
            copy += 1
        out.write(b"]}")
    return target.stat().st_size


def _shift(event: dict, copy: int, span: float, id_stride: int, step_stride: int) -> dict:
    if copy == 0:
        return event
    e = dict(event)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + copy * span
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + copy * id_stride
    args = e.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] = args[key] + copy * id_stride
        e["args"] = args
    name = e.get("name", "")
    if name.startswith("ProfilerStep#") and step_stride:
        e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copy * step_stride}"
    return e
