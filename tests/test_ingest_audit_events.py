"""Trace events that ingest misread or left out in silence, found by an audit; each input is made in tmp_path from
traces/hta-a100-2rank-nccl/rank-0.json.gz (a real A100 rank: 3 ProfilerSteps, 3,774 kernels, 2,700 launches).

- CPU ops written as ``"ph": "B"``/``"E"`` pairs were dropped without a word (their kernels credited to the op
  around them).
- ``pid``/``tid`` written as text (``"[tid] 456"``, ``"stream 7"``) became null: every kernel was said to have no
  launching call, and kernels without args.device/stream had no device or stream, in silence.
- ``--json`` counted a ProfilerStep marked on two threads twice.
- Kernels dropped for their duration were said a second time as launches without device activity.
- Launches sharing a correlation id were accepted in silence.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TRACES, vtrain_in_process
from tests.rawcount import load_trace
from vtrain.ingest.pipeline import ingest_traces

A100 = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"
HOST = ("cpu_op", "cuda_runtime", "user_annotation")
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")

Trace = dict[str, Any]


@pytest.fixture(scope="module")
def a100() -> Trace:
    return load_trace(A100)


def _complete(trace: Trace, *categories: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in categories]


def _ingest(trace: Trace, folder: Path) -> tuple[Any, list[str]]:
    folder.mkdir(parents=True)
    (folder / "rank-0.json").write_text(json.dumps(trace))
    warnings: list[str] = []
    return ingest_traces(folder, warn=warnings.append), warnings


def _file_warnings(warnings: list[str]) -> list[str]:
    """The warnings about the rank file (not the folder's: missing rank 1, no input shapes)."""
    return [w for w in warnings if "rank-0.json:" in w]


def test_duration_event_pairs_are_said(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with its aten:: ops written as "B"/"E" pairs (as exporters other than Kineto
    write spans): 10,797 ops vanished from cpu_ops without a warning."""
    trace = copy.deepcopy(a100)
    events = []
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and event.get("cat") == "cpu_op" and event["name"].startswith("aten::"):
            begin = dict(event, ph="B")
            end = {"ph": "E", "cat": event["cat"], "name": event["name"], "pid": event["pid"], "tid": event["tid"],
                   "ts": event["ts"] + begin.pop("dur")}
            events += [begin, end]
        else:
            events.append(event)
    pairs = (len(events) - len(trace["traceEvents"]))
    trace["traceEvents"] = events
    _, warnings = _ingest(trace, tmp_path / "pairs")
    said = [w for w in _file_warnings(warnings) if "duration events" in w]
    assert len(said) == 1 and f": {2 * pairs} duration events" in said[0], warnings


def test_events_of_a_phase_the_format_has_not_are_said(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with every 50th CPU op's phase written "x" (no phase of the Chrome trace format):
    they were left out of cpu_ops without a word (an audit); a missing phase was said already."""
    trace = copy.deepcopy(a100)
    ops = [event for event in trace["traceEvents"] if event.get("ph") == "X" and event.get("cat") == "cpu_op"]
    for event in ops[::50]:
        event["ph"] = "x"
    _, warnings = _ingest(trace, tmp_path / "lower")
    said = [w for w in _file_warnings(warnings) if "left out" in w]
    expected = f"{len(ops[::50])} have a phase (ph) the Chrome trace format has not"
    assert len(said) == 1 and expected in said[0], warnings


def test_thread_ids_written_as_text_are_read(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with host pids/tids as "[pid] 123"/"[tid] 456" and kernels without
    args.device/stream on pid "GPU 0", tid "stream 7": ingest said "3774 of 3774 device activities have no
    launching runtime call", and the kernels had null device and stream without a word."""
    trace = copy.deepcopy(a100)
    for event in _complete(trace, *HOST):
        event["pid"], event["tid"] = f"[pid] {event['pid']}", f"[tid] {event['tid']}"
    for event in _complete(trace, *DEVICE):
        event["args"].pop("device", None)
        stream = event["args"].pop("stream")
        event["pid"], event["tid"] = f"GPU {event['pid']}", f"stream {stream}"
    profile, warnings = _ingest(trace, tmp_path / "text")
    assert not _file_warnings(warnings), warnings
    plain = load_trace(A100)
    assert profile["cpu_ops"]["tid"].null_count() == 0
    assert sorted(profile["cpu_ops"]["tid"].unique()) == sorted({e["tid"] for e in _complete(plain, "cpu_op")})
    kernels = profile["kernels"]
    assert kernels["device"].null_count() == 0 and kernels["stream"].null_count() == 0
    assert sorted(kernels["stream"].unique()) == sorted({e["args"]["stream"] for e in _complete(plain, *DEVICE)})


def test_thread_ids_without_a_number_are_said(a100: Trace, tmp_path: Path) -> None:
    """The same A100 trace with kernels on pid "GPU", tid "main stream" and no args.device/stream: left null, and
    now said."""
    trace = copy.deepcopy(a100)
    for event in _complete(trace, *DEVICE):
        event["args"].pop("device", None)
        event["args"].pop("stream")
        event["pid"], event["tid"] = "GPU", "main stream"
    _, warnings = _ingest(trace, tmp_path / "unreadable")
    said = [w for w in _file_warnings(warnings) if "no device or stream" in w]
    assert len(said) == 1 and ": 3774 device activities have no device or stream" in said[0], warnings


def test_a_step_on_two_threads_is_one_iteration(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with each ProfilerStep#N also marked on a second thread: ``ingest --json`` said
    6 iterations for the 3 of the metadata ([4, 5, 6])."""
    trace = copy.deepcopy(a100)
    steps = [e for e in _complete(trace, "user_annotation", "cpu_op") if e["name"].startswith("ProfilerStep#")]
    for step in steps:
        trace["traceEvents"].append(dict(step, tid=step["tid"] + 1, ts=step["ts"] + 10, dur=step["dur"] - 20))
    folder = tmp_path / "steps"
    folder.mkdir()
    (folder / "rank-0.json").write_text(json.dumps(trace))
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["ranks"]["0"]["iterations"] == len(steps) == 3
    assert "name steps one after another" not in ran.stderr  # one step marked twice is no repeated number


def test_step_numbers_repeated_one_after_another_are_said(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with its three ProfilerStep spans all named #5 (a trace stitched or renamed):
    read as one iteration without a word (an audit: "iterations [5]", a global batch ten times the run's)."""
    trace = copy.deepcopy(a100)
    for step in _complete(trace, "user_annotation", "cpu_op"):
        if step["name"].startswith("ProfilerStep#"):
            step["name"] = "ProfilerStep#5"
    _, warnings = _ingest(trace, tmp_path / "repeated")
    said = [w for w in _file_warnings(warnings) if "name steps one after another" in w]
    assert len(said) == 1 and "1 ProfilerStep number(s) name steps one after another (#5 x3)" in said[0], warnings


def test_kernels_dropped_for_their_duration_are_said_once(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with 5 kernels of negative and 5 without duration: besides "dropped", the same
    10 were said as "10 of 2700 kernel launches have no device activity in the file" (a wrong reason)."""
    trace = copy.deepcopy(a100)
    kernels = _complete(trace, "kernel")
    for event in kernels[:5]:
        event["dur"] = -event["dur"]
    for event in kernels[5:10]:
        del event["dur"]
    _, warnings = _ingest(trace, tmp_path / "dropped")
    assert [w for w in _file_warnings(warnings)] == [
        f"{tmp_path / 'dropped' / 'rank-0.json'}: dropped 10 events with a missing or negative duration"]


def test_launches_sharing_a_correlation_id_are_said(a100: Trace, tmp_path: Path) -> None:
    """traces/hta-a100-2rank-nccl with 20 launches (and their kernels) given another launch's correlation id:
    accepted without a word, each kernel credited to the first launch."""
    trace = copy.deepcopy(a100)
    launches = [e for e in _complete(trace, "cuda_runtime") if e["name"] == "cudaLaunchKernel"]
    kernel_of = {e["args"]["correlation"]: e for e in _complete(trace, "kernel")}
    for first, second in zip(launches[100:140:2], launches[101:141:2]):
        kernel_of[second["args"]["correlation"]]["args"]["correlation"] = first["args"]["correlation"]
        second["args"]["correlation"] = first["args"]["correlation"]
    _, warnings = _ingest(trace, tmp_path / "shared")
    said = [w for w in _file_warnings(warnings) if "share their correlation id" in w]
    assert len(said) == 1 and ": 20 runtime calls share" in said[0], warnings


def test_the_shipped_trace_has_none_of_these_warnings(a100: Trace, tmp_path: Path) -> None:
    """The A100 trace unchanged: nothing of the above is said of it."""
    _, warnings = _ingest(copy.deepcopy(a100), tmp_path / "plain")
    assert not _file_warnings(warnings), warnings
