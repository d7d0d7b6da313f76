"""Large multi-rank trace folders for benchmarks, made from one real shipped rank trace (never committed).

A rank's events are the source's events repeated until the rank reaches its share of the target size: each copy
is shifted in time past the previous one with fresh correlation, External and flow ids and ProfilerStep numbers
(the rules of ``synth.py``). The other ranks are that rank with its
rank number (``distributedInfo.rank``, and the world size) and its host process id changed, as the ranks of one
job on identical nodes are.

Run as a script to make a folder for measuring by hand::

    python -m tests.benchmarks.trace_folder traces/hta-v100-2rank/rank-1.json.gz /tmp/trace-1gb --gb 1 --ranks 8
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from tests.benchmarks.synth import _load, _shift

#: a large real trace: Tesla V100, 5 ProfilerSteps, 22k kernels, 54 MB of JSON per copy
V100_RANK = Path(__file__).resolve().parents[2] / "traces" / "hta-v100-2rank" / "rank-1.json.gz"
#: a small real trace of a 128-rank job (sm80, 1.7 MB of JSON): the rank of a 1,000-rank folder of small files
SM80_RANK = Path(__file__).resolve().parents[2] / "traces" / "hta-sm80-128rank-sampled" / "rank-0.json.gz"


def make_trace_folder(source: Path, folder: Path, *, total_bytes: int, ranks: int,
                      compress: bool = False) -> list[Path]:
    """Write ``ranks`` files ``rank-N.json`` (``.json.gz`` with ``compress``) into ``folder``, together at least
    ``total_bytes`` of JSON (each rank at least one copy of ``source``); returns the files."""
    trace = _load(source)
    events = trace.pop("traceEvents")
    host_pid = _host_pid(events)
    body = _repeated_events(events, max(1, total_bytes // ranks))
    folder.mkdir(parents=True, exist_ok=True)
    info = dict(trace.get("distributedInfo") or {})
    files = []
    for rank in range(ranks):
        trace["distributedInfo"] = {**info, "rank": rank, "world_size": ranks}
        header = json.dumps(trace).encode()  # spaced as Kineto writes it: HTA finds ranks by '"rank": N'
        path = folder / (f"rank-{rank}.json.gz" if compress else f"rank-{rank}.json")
        with gzip.open(path, "wb", compresslevel=1) if compress else path.open("wb") as out:
            out.write(header[:-1] + b',"traceEvents":[')
            out.write(_with_host_pid(body, host_pid, host_pid + rank))
            out.write(b"]}")
        files.append(path)
    return files


def _host_pid(events: list[dict[str, Any]]) -> int:
    """The process id of the trace's CPU side: that of its ProfilerStep spans (else its most frequent pid)."""
    steps = [e["pid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    pids = steps or [e["pid"] for e in events if isinstance(e.get("pid"), int)]
    return Counter(pids).most_common(1)[0][0]


def _repeated_events(events: list[dict[str, Any]], min_bytes: int) -> bytes:
    """The JSON of ``events`` repeated (shifted copies) until at least ``min_bytes``, without the brackets."""
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - start + 1000.0
    steps = [int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_stride = (max(steps) - min(steps) + 1) if steps else 0
    ids = [e["id"] for e in events if isinstance(e.get("id"), int)]
    ids += [v for e in events for k in ("correlation", "External id")
            if isinstance(v := (e.get("args") or {}).get(k), int)]
    id_stride = 1 + max(ids, default=0)
    encoder = msgspec.json.Encoder()
    chunks: list[bytes] = []
    written = 0
    while written < min_bytes:
        chunk = encoder.encode([_shift(e, len(chunks), span, id_stride, step_stride) for e in events])[1:-1]
        chunks.append(chunk)
        written += len(chunk)
    return b",\n".join(chunks)


def _with_host_pid(body: bytes, old: int, new: int) -> bytes:
    """``body`` with every ``"pid":old`` (as msgspec writes it) made ``"pid":new``."""
    if old == new:
        return body
    return re.sub(rb'"pid":%d(?=[,}])' % old, b'"pid":%d' % new, body)


def main() -> None:
    """``python -m tests.benchmarks.trace_folder SOURCE FOLDER --gb N --ranks R [--gzip]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--gb", type=float, required=True, help="total size of the JSON, in GB (10^9 bytes)")
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--gzip", action="store_true", help="write rank-N.json.gz files")
    args = parser.parse_args()
    files = make_trace_folder(args.source, args.folder, total_bytes=int(args.gb * 1e9), ranks=args.ranks,
                              compress=args.gzip)
    print(f"{args.folder}: {len(files)} files, {sum(f.stat().st_size for f in files) / 1e9:.2f} GB on disk")


if __name__ == "__main__":
    main()
