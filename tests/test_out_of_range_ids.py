"""Ids, streams and counts beyond 64 bits (a corrupt or hand-edited trace: JSON numbers have no size limit) were a
polars overflow traceback in `vtrain ingest` and in `vtrain validate`. Now: ingest, which fails a file for a field of
the wrong type, names the event and the field in one line (exit 2); validate's replay, which leaves out what it
cannot read, reads such an id as no id (an event whose lane it was is left out and counted)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TRACES, changed_trace, one_trace_folders, vtrain_in_process
from vtrain.kineto import parse_stream

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"
TOO_BIG = 1 << 70


def _kernel(events: list[dict[str, Any]]) -> dict[str, Any]:
    return [event for event in events if event.get("cat") == "kernel"][3]


def _cpu_op(events: list[dict[str, Any]]) -> dict[str, Any]:
    return [event for event in events if event.get("cat") == "cpu_op"][3]


CASES = {  # name -> (event, where the value goes, field path as ingest names it)
    "tid": (_cpu_op, lambda e: e.update(tid=TOO_BIG), "tid"),
    "external-id": (_kernel, lambda e: e["args"].update({"External id": TOO_BIG}), "args.External id"),
    "correlation": (_kernel, lambda e: e["args"].update(correlation=-TOO_BIG), "args.correlation"),
    "stream": (_kernel, lambda e: e["args"].update(stream=TOO_BIG), "args.stream"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return one_trace_folders(tmp_path_factory, {
        name: ("rank-0.json", changed_trace(SOURCE, lambda events, pick=pick, change=change: change(pick(events))))
        for name, (pick, change, _) in CASES.items()})


@pytest.mark.parametrize("name", CASES)
def test_ingest_names_the_event_and_field(name: str, folders: dict[str, Path], tmp_path: Path) -> None:
    ran = vtrain_in_process("ingest", folders[name], "-o", tmp_path / "profile")
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and "malformed trace event: Expected `int`" in ran.stderr, ran.stderr
    assert "`$.traceEvents[" in ran.stderr and f"].{CASES[name][2]}`" in ran.stderr
    assert not (tmp_path / "profile").exists()


@pytest.mark.parametrize("name", CASES)
def test_validate_reads_it_as_no_id(name: str, folders: dict[str, Path], tmp_path: Path) -> None:
    ran = vtrain_in_process("validate", folders[name], "-o", tmp_path / "report", "--no-hta")
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    if name == "tid":  # a CPU op's lane: the event is left out, and said (a kernel's lane falls back to its tid)
        assert "rank-0.json: 1 event(s) without a usable time, duration or lane were left out" in ran.stderr


@pytest.mark.parametrize(("value", "expected"), [
    ((1 << 63) - 1, (1 << 63) - 1), (1 << 63, None), (-(1 << 63), -(1 << 63)), (1e300, None), ("0x" + "f" * 17, None),
    ("0x7f", 127), (7.0, 7), (7.5, None), (True, None)])
def test_ids_are_64_bit(value: object, expected: int | None) -> None:
    assert parse_stream(value) == expected


def test_validate_of_a_recording_reads_a_launch_thread_beyond_64_bits_as_none(tmp_path: Path) -> None:
    """A recording with its run config is also ingested by validate (the model side): a kernel launch's tid beyond
    64 bits, in a file where some other event's tid is text, was a polars traceback there."""
    recording = TRACES / "gpu" / "h100-small-eager"

    def change(events: list[dict[str, Any]]) -> None:
        launches = [event for event in events if event.get("cat") in ("cuda_runtime", "cuda_driver")]
        launches[3]["tid"], launches[5]["tid"] = TOO_BIG, "7"

    folder = tmp_path / "recording"
    folder.mkdir()
    (folder / "rank-0.json").write_bytes(changed_trace(recording / "rank-0.json.gz", change))
    shutil.copy(recording / "run.yaml", folder)
    ran = vtrain_in_process("validate", folder, "-o", tmp_path / "report", "--no-hta")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert "1 event(s) without a usable time, duration or lane were left out" in ran.stderr
