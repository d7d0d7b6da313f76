"""Which CPU operators do the work in validate's measured timeline of a rank without device activity
(``vtrain/tables/latency.py: work_op_mask``): decided per operator by most of its calls, so that one call stalled
outside its children does not make a wrapper a work op.

The flaky CI failure it mends: `tests/test_llama_layers.py::test_validate_pairs_every_attention_operator[flash]`
found ``aten::scaled_dot_product_attention`` "measured only" in a loaded run: one of its calls, preempted around
the kernel operator it calls, had most of its time to itself, and that one call made the wrapper a work op.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.conftest import REPO, vtrain_in_process

RANK = REPO / "traces" / "t1p1d2" / "rank-1.json.gz"


def _stalled(events: list[dict], name: str, call: int, stall_us: float) -> tuple[list[dict], dict]:
    """The trace's events with the ``call``-th call of ``name`` stalled for ``stall_us`` after its children end (as a
    preempted thread is): it, and every span holding it, lasts that much longer, and everything after it on its
    process starts that much later."""
    calls = sorted((e for e in events if e.get("name") == name and e.get("ph") == "X"), key=lambda e: e["ts"])
    stalled = calls[call]
    end = stalled["ts"] + stalled["dur"]
    for event in events:
        if event.get("pid") != stalled["pid"] or "ts" not in event:
            continue
        if event["ts"] >= end:
            event["ts"] += stall_us
        elif event.get("ph") == "X" and event["ts"] <= stalled["ts"] and event["ts"] + event["dur"] >= end:
            event["dur"] += stall_us  # the stalled call and the spans that hold it
    return events, stalled


def test_one_stalled_call_does_not_make_its_wrapper_a_measured_operator(tmp_path: Path) -> None:
    """A real CPU rank of vtrain's GPT (gloo, t1p1d2) with one ``aten::linear`` call stalled after its
    ``aten::addmm`` returned, validated: that call's time is then mostly its own, and ``aten::linear`` was one of
    the operators found on the measured side only (the model places ``aten::addmm``); now the operator is decided
    by most of its calls."""
    trace = json.loads(gzip.decompress(RANK.read_bytes()))
    _stalled(trace["traceEvents"], "aten::linear", 40, 50_000.0)
    folder = tmp_path / "stalled"
    folder.mkdir()
    (folder / RANK.name).write_bytes(gzip.compress(json.dumps(trace).encode()))
    (folder / "run.yaml").write_bytes((RANK.parent / "run.yaml").read_bytes())
    ran = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    model = json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]
    assert not [row for row in model["one_side_only"] if row["op"].startswith("aten::linear ")], model["one_side_only"]
