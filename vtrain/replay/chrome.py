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

from vtrain.replay.replayer import Replay
from vtrain.replay.trace import KeptText


def write_replayed_traces(replay: Replay, out_dir: Path) -> list[Path]:
    """One ``rank-N.json.gz`` per rank in ``out_dir`` (which must exist), from the traces' content kept in memory
    (``RankTrace.source``: the files are not read again), one batch of events at a time; returns the files
    written."""
    written = []
    for trace in replay.traces:
        mine = (replay.events.select("rank", "event", "sim_ts", "sim_dur")  # a copy of the few columns needed
                .filter(pl.col("rank") == trace.rank).sort("event"))
        start = np.round(mine["sim_ts"].to_numpy() + replay.origin, 3)
        dur = np.round(mine["sim_dur"].to_numpy(), 3)
        path = out_dir / f"rank-{trace.rank}.json.gz"
        _rewrite(trace.source, path, np.frombuffer(trace.index, dtype=np.int64), start, dur)
        written.append(path)
    return written


class _Phase(msgspec.Struct):
    ph: Any = ""


_PHASE = msgspec.json.Decoder(_Phase)


def _phase(raw: msgspec.Raw) -> str:
    """An event's ``ph`` (empty for an entry that is not an event object: it is copied as it is)."""
    try:
        return _PHASE.decode(raw).ph
    except (msgspec.ValidationError, msgspec.DecodeError):
        return ""


def _rewrite(text: KeptText, target: Path, index: np.ndarray, start: np.ndarray, dur: np.ndarray) -> None:
    """Write the trace ``text`` to ``target``, batch by batch, with event ``index[k]`` moved to ``start[k]`` and
    ``dur[k]``."""
    encode = msgspec.json.Encoder().encode
    with gzip.open(target, "wb", compresslevel=1) as handle:
        handle.write(b"{\n")
        for key, value in text.fields:
            handle.write(encode(key) + b": " + value + b",\n")
        handle.write(b'"traceEvents": [\n')
        first = True
        row, position = 0, 0  # the next moved event (index is increasing) and the position in traceEvents
        for batch in text.events():
            for raw in batch:
                if row < len(index) and index[row] == position:
                    event = msgspec.json.decode(raw)
                    event["ts"], event["dur"] = float(start[row]), float(dur[row])
                    text_out = encode(event)
                    row += 1
                elif _phase(raw) in ("s", "f"):
                    position += 1
                    continue
                else:
                    text_out = bytes(raw)
                position += 1
                if not first:
                    handle.write(b",\n")
                handle.write(text_out)
                first = False
        handle.write(b"\n]\n}\n")
