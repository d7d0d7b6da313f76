"""The torch profiler as the recorder uses it: CPU (and CUDA) activity, shapes on, ``ProfilerStep#N`` marks.

Iterations ``0 .. warmup-1`` run under the profiler but are discarded (its warm-up); iterations
``warmup .. warmup+steps-1`` are kept and exported as one Chrome/Kineto trace, gzipped.
"""

from __future__ import annotations

import gzip
import shutil
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def gzip_file(source: Path, target: Path) -> None:
    """Compress ``source`` into ``target`` (level 6: several times faster than torch's own level-9 export)."""
    with open(source, "rb") as plain, gzip.open(target, "wb", compresslevel=6) as packed:
        shutil.copyfileobj(plain, packed, 1 << 20)


def trace_profiler(trace_path: Path, warmup: int, steps: int, cuda: bool) -> profile:
    """A profiler that records ``steps`` iterations after ``warmup`` and writes them to ``trace_path``
    (a ``.json.gz`` file) when done. Call ``.step()`` after every iteration."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # One cycle only: torch warns that events of earlier cycles are dropped, which is what we want.
    warnings.filterwarnings("ignore", message="Profiler clears events at the end of each cycle")

    def export(prof: profile) -> None:
        if cuda:
            torch.cuda.synchronize()
        plain = trace_path.with_name(f".{trace_path.name}.json")
        prof.export_chrome_trace(str(plain))
        gzip_file(plain, trace_path)
        plain.unlink()

    return profile(activities=activities, record_shapes=True,
                   schedule=schedule(wait=0, warmup=warmup, active=steps, repeat=1),
                   on_trace_ready=export)
