"""Wall time and peak memory of a command together with every process it starts (a pool of workers).

``/usr/bin/time``'s peak RSS is that of the largest single process, which understates a command that reads with
several worker processes: here the resident sets of the process and all its descendants are summed (psutil)
every few milliseconds, and the peak of the sum is reported beside the largest single process's own peak.

    python -m tests.benchmarks.tree_rss vtrain ingest TRACE_DIR -o PROFILE --workers 2
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

#: seconds between two samples of the process tree
SAMPLE_S = 0.02


@dataclass
class TreeCost:
    """A command's wall time, the peak of its process tree's summed RSS, and the largest single process's own
    peak RSS (what ``/usr/bin/time`` reports)."""

    seconds: float
    tree_max_rss_mb: float
    max_rss_mb: float
    code: int
    stderr: str


def _tree_rss(root: psutil.Process) -> int:
    """The summed resident bytes of ``root`` and its descendants (0 for a process gone meanwhile)."""
    total = 0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


def run_tree_measured(command: list[str]) -> TreeCost:
    """Run ``command`` (output discarded, stderr kept) and measure it (see the module docstring). The peak of a
    single process comes from ``wait4``, whose usage of a process covers the descendants it waited for."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(process.pid)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(root))
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    return TreeCost(seconds=seconds, tree_max_rss_mb=max(peak / 2**20, usage.ru_maxrss / 1024),
                    max_rss_mb=usage.ru_maxrss / 1024, code=os.waitstatus_to_exitcode(status),
                    stderr=stderr[-2000:])


def measured_from_a_fresh_process(command: list[str]) -> TreeCost:
    """:func:`run_tree_measured` run by a new small Python process: a process started by a large one (pytest,
    once it generated a large trace) starts with that process's peak RSS as its own (Linux carries the high-water
    mark over fork and exec), which would hide the command's own peak."""
    measured = subprocess.run([sys.executable, "-m", "tests.benchmarks.tree_rss", *command], capture_output=True,
                              text=True, check=False, cwd=Path(__file__).resolve().parents[2])
    return TreeCost(**json.loads(measured.stdout))


if __name__ == "__main__":
    cost = run_tree_measured(sys.argv[1:])
    print(json.dumps(cost.__dict__))
    sys.exit(cost.code)
