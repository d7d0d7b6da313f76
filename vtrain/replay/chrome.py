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
from vtrain.replay.run import Replay


def write_replayed_traces(replay: Replay, out_dir: Path) -> list[Path]:
    """One ``rank-N.json.gz`` per rank in ``out_dir`` (which must exist), from the traces' content kept in memory
    (``RankTrace.source``: the files are not read again); returns the files written."""
    written = []
    for trace in replay.traces:
        mine = replay.events.filter(pl.col("rank") == trace.rank).sort("event")
        start = np.round(mine["sim_ts"].to_numpy() + replay.origin, 3)
        dur = np.round(mine["sim_dur"].to_numpy(), 3)
        path = out_dir / f"rank-{trace.rank}.json.gz"
        _rewrite(trace.source, trace.path, path, np.frombuffer(trace.index, dtype=np.int64), start, dur)
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


def _rewrite(content: bytes, source: Path, target: Path, index: np.ndarray, start: np.ndarray,
             dur: np.ndarray) -> None:
    """Write ``content`` (a trace's gzip-compressed text) to ``target`` with event ``index[k]`` moved to
    ``start[k]`` and ``dur[k]``."""
    try:
        document = _TOP_LEVEL.decode(gzip.decompress(content))
        raw_events = _EVENTS.decode(document.pop("traceEvents"))
    except (msgspec.DecodeError, KeyError, OSError) as exc:
        raise InputError(f"cannot re-read the trace to write its replay: {exc}", source) from None
    row_of = np.full(len(raw_events), -1, dtype=np.int64)
    row_of[index] = np.arange(len(index))
    encode = msgspec.json.Encoder().encode
    with gzip.open(target, "wb", compresslevel=1) as handle:
        handle.write(b"{\n")
        for key, value in document.items():
            handle.write(encode(key) + b": " + bytes(value) + b",\n")
        handle.write(b'"traceEvents": [\n')
        first = True
        for position, raw in enumerate(raw_events):
            row = row_of[position]
            if row >= 0:
                event = msgspec.json.decode(raw)
                event["ts"], event["dur"] = float(start[row]), float(dur[row])
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
