"""Profiler cycles in one trace folder: which cycle's files are read.

``torch.profiler.tensorboard_trace_handler`` writes a file per worker (rank) and profiler cycle,
``WORKER.TIME_NS.pt.trace.json[.gz]``. A ``schedule`` with ``repeat=N`` writes N cycles, and its default
``repeat=0`` a cycle after every ``wait + warmup + active`` steps for as long as the run lasts: a folder of such a
run holds many files of each rank. One cycle is read, the latest whole one: every worker's n-th file (by the time in
its name) is cycle n. Only the last cycle can have been cut short (the run ended in it: an empty or partial last
step): where its files hold less than :data:`WHOLE_SHARE` of the bytes of the cycle before it, that one is read. It
is not measured against the largest cycle: a first cycle swollen by warm-up (autotuning, CUDA graph capture) would
then be read instead of every later one. The others are left out, and said (:func:`cycles_warning`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: the name ``tensorboard_trace_handler`` gives the file of each profiler cycle
CYCLE_FILE = re.compile(r"^(?P<worker>.+)\.(?P<time>\d+)\.pt\.trace\.json(\.gz)?$")
#: the last cycle was cut short where its files hold less than this share of the bytes of the cycle before it
WHOLE_SHARE = 0.8


@dataclass(frozen=True)
class Cycles:
    """The files of a folder to read (one profiler cycle's, and any file not named as a cycle's) and those of its
    other cycles, left out."""

    read: list[Path]
    left_out: list[Path] = field(default_factory=list)
    count: int = 1  # cycles of the worker with the most
    chosen: int = 1  # the cycle read, from 1
    cut_short: list[int] = field(default_factory=list)  # cycles after the chosen one, cut short


def cycle_worker(path: Path) -> str | None:
    """The worker of a file named as ``tensorboard_trace_handler`` names a cycle's file, else ``None``."""
    match = CYCLE_FILE.match(path.name)
    return match["worker"] if match else None


def one_cycle(files: list[Path]) -> Cycles:
    """Of a folder's trace ``files`` (sorted), those of its latest whole profiler cycle where a worker wrote
    several (see the module's description); else all of them."""
    workers = _cycles_by_worker(files)
    if all(len(each) < 2 for each in workers.values()):
        return Cycles(read=files)
    common = min(len(each) for each in workers.values())
    chosen = common - 2 if common > 1 and _bytes(workers, common - 1) < WHOLE_SHARE * _bytes(workers, common - 2) \
        else common - 1
    kept = {each[chosen] for each in workers.values()}
    cycle_files = {path for each in workers.values() for path in each}
    return Cycles(read=[path for path in files if path not in cycle_files or path in kept],
                  left_out=sorted(cycle_files - kept), count=max(len(each) for each in workers.values()),
                  chosen=chosen + 1, cut_short=[n + 1 for n in range(chosen + 1, common)])


def _bytes(workers: dict[str, list[Path]], cycle: int) -> int:
    """The bytes of the files of cycle ``cycle`` (from 0) of every worker."""
    return sum(each[cycle].stat().st_size for each in workers.values())


def _cycles_by_worker(files: list[Path]) -> dict[str, list[Path]]:
    """The cycle files of each worker, in the order they were written (the time in their names)."""
    workers: dict[str, list[Path]] = {}
    for path in files:
        if (worker := cycle_worker(path)) is not None:
            workers.setdefault(worker, []).append(path)
    return {worker: sorted(each, key=_written_at) for worker, each in workers.items()}


def _written_at(path: Path) -> int:
    match = CYCLE_FILE.match(path.name)
    return int(match["time"]) if match else 0


def cycles_warning(folder: Path, cycles: Cycles) -> str | None:
    """The warning line for a folder of several profiler cycles: which is read, which are not and why."""
    if not cycles.left_out:
        return None
    cut = (f"; cycle {', '.join(map(str, cycles.cut_short))} after it was cut short (its files hold under "
           f"{WHOLE_SHARE:.0%} of the bytes of the cycle before it)") if cycles.cut_short else ""
    return (f"{folder}: {cycles.count} profiler cycles (tensorboard_trace_handler writes a file per rank and "
            f"cycle): cycle {cycles.chosen} is read, not the other cycles' {len(cycles.left_out)} "
            f"file{'s' if len(cycles.left_out) > 1 else ''}"
            f"{cut}; put a cycle's files in a folder of their own to read that one")
