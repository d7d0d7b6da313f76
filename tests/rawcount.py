"""An independent count of a Kineto trace's device activities, straight from its JSON (no vtrain code).

The conformance tests compare vtrain's ``kernels`` table with this: the number of device activities per rank and
their time per class, the class being HolisticTraceAnalysis' ``get_kernel_type`` of the activity's name. What is a
device activity is written out here on its own, from the Chrome trace format and Kineto's categories:

- a complete event (``"ph": "X"``) with a start and a duration that is a number >= 0 (zero-length activities
  count; a missing or negative duration is not a measurement),
- whose category, in any case, is a kernel, memory copy or memory set of any accelerator: ``kernel``,
  ``gpu_memcpy``, ``gpu_memset`` (PyTorch >= 1.10), ``Kernel``, ``Memcpy``, ``Memset`` (1.8-1.9),
  ``mtia_ccp_events`` (MTIA). CUPTI ``cuda_sync`` records and ``gpu_user_annotation`` spans are not activities.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hta.utils.utils import get_kernel_type

ACTIVITY_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
CLASSES = ("computation", "communication", "memory", "other")


@dataclass
class RawCount:
    """One trace file's device activities: how many, their time per HTA class (µs), how many share a
    correlation id with another (graph launches)."""

    activities: int = 0
    time_us: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0.0))
    per_class: Counter[str] = field(default_factory=Counter)
    correlations: Counter[int] = field(default_factory=Counter)


def load_trace(path: Path) -> dict[str, Any]:
    """The JSON of a trace file, gzip or plain."""
    with path.open("rb") as handle:
        head = handle.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rt") as handle:
        return json.load(handle)


def is_activity(event: dict[str, Any]) -> bool:
    """Whether an event is a device activity with a usable duration (see the module's docstring)."""
    if event.get("ph") != "X" or str(event.get("cat", "")).lower() not in ACTIVITY_CATEGORIES:
        return False
    ts, dur = event.get("ts"), event.get("dur")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ts, dur))
    return numbers and math.isfinite(dur) and dur >= 0  # type: ignore[arg-type]


def count_events(events: list[dict[str, Any]]) -> RawCount:
    """The count of a list of trace events."""
    count = RawCount()
    for event in events:
        if not is_activity(event):
            continue
        kind = get_kernel_type(event.get("name", "")).lower()
        count.activities += 1
        count.per_class[kind] += 1
        count.time_us[kind] += float(event["dur"])
        correlation = (event.get("args") or {}).get("correlation")
        if correlation is not None:
            count.correlations[correlation] += 1
    return count


def count_file(path: Path) -> RawCount:
    """The count of one trace file."""
    return count_events(load_trace(path)["traceEvents"])
