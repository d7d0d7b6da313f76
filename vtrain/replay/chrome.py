"""Writing the replayed timeline as Kineto traces: each rank's original trace with every replayed event moved
to its replayed start and duration, so that Perfetto opens it and HTA analyses it like the measured one.

Flow arrows (``ph`` ``s``/``f``) are dropped: they point at the measured times. The GPU-side copies of user
annotations (``cat`` ``gpu_user_annotation``: a span from the first to the last kernel that ran inside a
``record_function`` region, on one device and stream) are not replayed events; each is moved to span its
kernels' replayed times, and dropped where none of its kernels was replayed (or where the rank ran on several
devices, whose streams share numbers). Everything else (metadata, arguments, events the replay does not use) is
copied unchanged.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import polars as pl

from vtrain.kineto import DEVICE
from vtrain.naming import rank_trace_file
from vtrain.replay.replayer import Replay
from vtrain.replay.trace import KeptText

#: a GPU-side annotation's category
GPU_ANNOTATION = "gpu_user_annotation"
#: how far (µs) a kernel may stick out of the annotation that holds it: Kineto's times are rounded to the ns
_SLACK_US = 1e-3


def write_replayed_traces(replay: Replay, out_dir: Path) -> list[Path]:
    """One ``rank-N.json.gz`` per rank in ``out_dir`` (which must exist), from the traces' content kept in memory
    (``RankTrace.source``: the files are not read again), one batch of events at a time; returns the files
    written."""
    written = []
    for trace in replay.traces:
        mine = (replay.events.select("rank", "event", "kind", "lane", "ts", "dur", "sim_ts", "sim_dur")
                .filter(pl.col("rank") == trace.rank).sort("event"))  # a copy of the few columns needed
        start = np.round(mine["sim_ts"].to_numpy() + replay.origin, 3)
        dur = np.round(mine["sim_dur"].to_numpy(), 3)
        kernels = _Kernels(mine, replay.origin) if len(trace.devices) <= 1 else None
        path = out_dir / rank_trace_file(trace.rank)
        _rewrite(trace.source, path, np.frombuffer(trace.index, dtype=np.int64), start, dur, kernels)
        written.append(path)
    return written


class _Kind(msgspec.Struct):
    ph: Any = ""
    cat: Any = ""


class _Span(msgspec.Struct):
    ts: Any = None
    dur: Any = None
    tid: Any = None


_KIND = msgspec.json.Decoder(_Kind)
_SPAN = msgspec.json.Decoder(_Span)


def _kind(raw: msgspec.Raw) -> _Kind:
    """An event's ``ph`` and ``cat`` (empty for an entry that is not an event object: it is copied as it is)."""
    try:
        return _KIND.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return _Kind()


class _Kernels:
    """A rank's replayed device activities, stream by stream in measured order, in the file's times."""

    def __init__(self, events: pl.DataFrame, origin: float) -> None:
        device = events.filter(pl.col("kind") == DEVICE).sort("lane", "ts")
        self.lanes: dict[int, tuple[np.ndarray, ...]] = {}
        for (lane,), part in device.group_by("lane", maintain_order=True):
            ts = part["ts"].to_numpy() + origin
            self.lanes[int(lane)] = (ts, ts + part["dur"].to_numpy(), part["sim_ts"].to_numpy() + origin,
                                     (part["sim_ts"] + part["sim_dur"]).to_numpy() + origin)

    def replayed_span(self, lane: Any, begin: float, end: float) -> tuple[float, float] | None:
        """The replayed start and end of the activities measured within ``[begin, end]`` on stream ``lane``;
        ``None`` if there are none."""
        if not isinstance(lane, int) or lane not in self.lanes:
            return None
        ts, stop, sim_ts, sim_stop = self.lanes[lane]
        first, last = np.searchsorted(ts, [begin - _SLACK_US, end + _SLACK_US], side="left")
        inside = np.flatnonzero(stop[first:last] <= end + _SLACK_US) + first
        if not inside.size:
            return None
        return float(sim_ts[inside].min()), float(sim_stop[inside].max())


def _replayed(raw: msgspec.Raw, kernels: _Kernels | None) -> tuple[float, float] | None:
    """An annotation's replayed ``(ts, dur)`` from the kernels it holds, ``None`` if it holds none replayed (or
    the rank's kernels cannot be told apart by stream: ``kernels`` None)."""
    if kernels is None:
        return None
    try:
        event = _SPAN.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if not all(isinstance(value, (int, float)) for value in (event.ts, event.dur)):
        return None
    span = kernels.replayed_span(event.tid, float(event.ts), float(event.ts) + float(event.dur))
    return None if span is None else (round(span[0], 3), round(span[1] - span[0], 3))


def _rewrite(text: KeptText, target: Path, index: np.ndarray, start: np.ndarray, dur: np.ndarray,
             kernels: _Kernels | None) -> None:
    """Write the trace ``text`` to ``target``, batch by batch, with event ``index[k]`` moved to ``start[k]`` and
    ``dur[k]``, and each GPU annotation moved to span its ``kernels`` (dropped where it holds none)."""
    encode = _ENCODER.encode
    with gzip.open(target, "wb", compresslevel=1) as handle:
        handle.write(b"{\n")
        for key, value in text.fields:
            handle.write(encode(key) + b": " + value + b",\n")
        handle.write(b'"traceEvents": [\n')
        first = True
        row, position = 0, 0  # the next moved event (index is increasing) and the position in traceEvents
        for batch in text.events():
            for raw in batch:
                here, position = position, position + 1
                if row < len(index) and index[row] == here:
                    text_out = _moved(raw, start[row], dur[row])
                    row += 1
                else:
                    kind = _kind(raw)
                    if kind.ph in ("s", "f"):
                        continue
                    if kind.cat == GPU_ANNOTATION:
                        span = _replayed(raw, kernels)
                        if span is None:
                            continue
                        text_out = _moved(raw, *span)
                    else:
                        text_out = bytes(raw)
                if not first:
                    handle.write(b",\n")
                handle.write(text_out)
                first = False
        handle.write(b"\n]\n}\n")


_ENCODER = msgspec.json.Encoder()


def _moved(raw: msgspec.Raw, ts: float, dur: float) -> bytes:
    """The event ``raw`` with its ``ts`` and ``dur`` replaced."""
    event = msgspec.json.decode(raw)
    event["ts"], event["dur"] = float(ts), float(dur)
    return _ENCODER.encode(event)
