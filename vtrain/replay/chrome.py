"""Writing the replayed timeline as Kineto traces: each rank's original trace with every replayed event moved
to its replayed start and duration, so that Perfetto opens it and HTA analyses it like the measured one.

Flow arrows (``ph`` ``s``/``f``) are dropped: they point at the measured times. Everything else (metadata,
arguments, events the replay does not use) is copied unchanged.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from vtrain.errors import InputError
from vtrain.ingest.decode import read_bytes
from vtrain.replay.run import Replay


def write_replayed_traces(replay: Replay, out_dir: Path) -> list[Path]:
    """One ``rank-N.json.gz`` per rank in ``out_dir`` (which must exist); returns the files written."""
    written = []
    for trace in replay.traces:
        mine = replay.events.filter(pl.col("rank") == trace.rank).sort("event")
        start = (mine["sim_ts"].to_numpy() + replay.origin)
        dur = mine["sim_dur"].to_numpy()
        moved = dict(zip(trace.index, zip(np.round(start, 3).tolist(), np.round(dur, 3).tolist())))
        path = out_dir / f"rank-{trace.rank}.json.gz"
        _rewrite(trace.path, path, moved)
        written.append(path)
    return written


class _Phase(msgspec.Struct):
    ph: Any = ""


_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[msgspec.Raw])
_PHASE = msgspec.json.Decoder(_Phase)


def _phase(raw: msgspec.Raw) -> str:
    """An event's ``ph`` (empty for an entry that is not an event object: it is copied as it is)."""
    try:
        return _PHASE.decode(raw).ph
    except (msgspec.ValidationError, msgspec.DecodeError):
        return ""


def _rewrite(source: Path, target: Path, moved: dict[int, tuple[float, float]]) -> None:
    data, _digest = read_bytes(source)
    try:
        document = _TOP_LEVEL.decode(data)
        raw_events = _EVENTS.decode(document.pop("traceEvents"))
    except (msgspec.DecodeError, KeyError) as exc:
        raise InputError(f"cannot re-read the trace to write its replay: {exc}", source) from None
    del data
    encode = msgspec.json.Encoder().encode
    with gzip.open(target, "wb", compresslevel=1) as handle:
        handle.write(b"{\n")
        for key, value in document.items():
            handle.write(encode(key) + b": " + bytes(value) + b",\n")
        handle.write(b'"traceEvents": [\n')
        first = True
        for position, raw in enumerate(raw_events):
            if position in moved:
                event = msgspec.json.decode(raw)
                event["ts"], event["dur"] = moved[position]
                text = encode(event)
            elif _phase(raw) in ("s", "f"):
                continue
            else:
                text = bytes(raw)
            if not first:
                handle.write(b",\n")
            handle.write(text)
            first = False
        handle.write(b"\n]\n}\n")
