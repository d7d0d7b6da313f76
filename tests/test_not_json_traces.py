"""Traces that are not quite JSON, read the same way by `vtrain ingest` and by `vtrain validate`'s replay.

- NaN, Infinity and -Infinity where a value belongs: Python's ``json.dump`` writes them for a float that is not
  finite (a tool that post-processes a trace in Python and divides by zero), JSON does not allow them, and msgspec
  refused the whole file ("invalid character"). They are read as ``null``, said in a warning line with their count,
  and the events that lose their time or duration are then left out and counted as such: the result equals that of
  the same trace written with ``null``. A token inside a string (``"x: NaN, y"``) is text and stays.
- Two ``traceEvents`` lists at the top level (two traces pasted into one object): Python's ``json`` and HTA read the
  last, msgspec the first, so each tool read a different trace without a word. Now one error line, exit 2, nothing
  written.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TRACES, one_trace_folders, vtrain_in_process
from vtrain.ingest.decode import bare_numbers_as_null
from vtrain.ingest.pipeline import ingest_traces
from vtrain.replay.trace import read_rank_trace
from vtrain.validate.profile import RankTablesSink

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"
NOT_FINITE = {"nan-dur": ("dur", float("nan")), "inf-ts": ("ts", float("inf")), "neg-inf-dur": ("dur", float("-inf"))}


def _with(trace: dict[str, Any], values: dict[str, float | None]) -> dict[str, Any]:
    """The trace with three kernels near its end (past the first spans of text decoded) with their time or duration
    set (``None``: as the null it is read as) and a fourth kernel named with NaN in its text."""
    changed = copy.deepcopy(trace)
    kernels = [event for event in changed["traceEvents"] if event.get("cat") == "kernel"]
    for kernel, (key, value) in zip(kernels[-13:-10], values.items()):
        kernel[NOT_FINITE[key][0]] = value
    kernels[20]["name"] = "x: NaN, y [NaN] Infinity}"
    return changed


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    bare = _with(trace, {key: value for key, (_, value) in NOT_FINITE.items()})
    null = _with(trace, dict.fromkeys(NOT_FINITE))
    return one_trace_folders(tmp_path_factory, {
        "bare": ("rank-0.json", json.dumps(bare).encode()),
        "bare-compact-gzip": ("rank-0.json.gz", gzip.compress(json.dumps(bare, separators=(",", ":")).encode(), 1)),
        "null": ("rank-0.json", json.dumps(null).encode()),
        "two-lists": ("rank-0.json", json.dumps(trace).encode()[:-1] + b', "traceEvents": []}'),
        "nested-list": ("rank-0.json", json.dumps({"meta": {"traceEvents": [1, 2]}, **trace}).encode())})


@pytest.mark.parametrize("name", ["bare", "bare-compact-gzip"])
def test_ingest_reads_not_finite_values_as_null_and_says_so(name: str, folders: dict[str, Path]) -> None:
    warnings: list[str] = []
    bare, null = ingest_traces(folders[name], warn=warnings.append), ingest_traces(folders["null"])
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(bare[table], null[table])
    assert bare["kernels"].filter(bare["kernels"]["name"] == "x: NaN, y [NaN] Infinity}").height == 1
    said = [line for line in warnings if "NaN or Infinity" in line]
    assert len(said) == 1 and ": 3 value(s) written as NaN or Infinity" in said[0]


@pytest.mark.parametrize("name", ["bare", "bare-compact-gzip"])
def test_the_replay_reads_not_finite_values_as_null(name: str, folders: dict[str, Path]) -> None:
    """The events, and ingest's tables built from them, as those of the trace written with null. The file's
    events are read again once a NaN stops their decoding: the tables built on the way are started again, not
    doubled."""
    sinks = {key: RankTablesSink() for key in (name, "null")}
    bare = read_rank_trace(next(folders[name].iterdir()), sinks[name])
    null = read_rank_trace(next(folders["null"].iterdir()), sinks["null"])
    assert bare.bare_numbers == 3 and null.bare_numbers == 0
    assert bare.dropped == null.dropped >= 3
    assert bare.ts == null.ts and bare.dur == null.dur and bare.name == null.name
    assert "x: NaN, y [NaN] Infinity}" in bare.name
    tables = [sinks[key].ranks for key in (name, "null")]
    assert [len(ranks) for ranks in tables] == [1, 1]
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(getattr(tables[0][0], table), getattr(tables[1][0], table))


def test_validate_says_the_not_finite_values(folders: dict[str, Path], tmp_path: Path) -> None:
    ran = vtrain_in_process("validate", folders["bare"], "-o", tmp_path / "report", "--no-hta")
    assert ran.returncode == 0, ran.stderr
    assert "rank-0.json: 3 value(s) written as NaN or Infinity" in ran.stderr
    assert "3 value(s) written as NaN or Infinity" in (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("command", ["ingest", "validate"])
def test_two_event_lists_are_one_error_line(command: str, folders: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    ran = vtrain_in_process(command, folders["two-lists"], "-o", out, *(["--no-hta"] if command == "validate" else []))
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1 and "rank-0.json: two traceEvents lists" in ran.stderr, ran.stderr
    assert not out.exists()


@pytest.mark.parametrize(("text", "expected", "count"), [
    (b'{"a": NaN, "b": [Infinity, -Infinity ]}', b'{"a": null, "b": [null, null ]}', 3),
    (b'{"a":NaN,"b":"x: NaN, y"}', b'{"a":null,"b":"x: NaN, y"}', 1),
    (b'{"a":"q\\" ,NaN]","b":NaN}', b'{"a":"q\\" ,NaN]","b":null}', 1),  # an escaped quote does not end a string
    (b'{"a":"\\\\","b":NaN}', b'{"a":"\\\\","b":null}', 1),  # an escaped backslash does not escape the quote
    (b'{"a":NaNx,"b":"NaN"}', b'{"a":NaNx,"b":"NaN"}', 0),  # not a token on its own; a string's text
])
def test_bare_numbers_are_found_outside_strings_only(text: bytes, expected: bytes, count: int) -> None:
    nulled, found = bare_numbers_as_null(text)
    assert (bytes(nulled), found) == (expected, count)
    if count:
        assert json.loads(bytes(nulled)) == json.loads(text, parse_constant=lambda _: None)


@pytest.mark.parametrize("command", ["ingest", "validate"])
def test_bytes_that_are_not_utf8_are_shown_not_misplaced(command: str, tmp_path: Path) -> None:
    """A name holding a byte that is not UTF-8: one error line showing the bytes. (The position msgspec gives is
    within the string it was decoding, which said "at byte 0" of a 9.8 MB file.)"""
    text = gzip.decompress(SOURCE.read_bytes())
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank-0.json").write_bytes(text.replace(b'"name": "', b'"name": "\xff', 1))
    ran = vtrain_in_process(command, folder, "-o", tmp_path / "out", *(["--no-hta"] if command == "validate" else []))
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1, ran.stderr
    assert "rank-0.json: not UTF-8 text (invalid start byte in a string, b'\\xff" in ran.stderr, ran.stderr
    assert "at byte" not in ran.stderr


@pytest.mark.parametrize("command", ["ingest", "validate"])
def test_an_events_list_inside_another_value_is_not_a_second_one(command: str, folders: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """``"meta": {"traceEvents": [...]}`` beside the top level's list: every reader takes the top-level one."""
    out = tmp_path / "out"
    ran = vtrain_in_process(command, folders["nested-list"], "-o", out,
                            *(["--no-hta"] if command == "validate" else []))
    assert ran.returncode == 0, ran.stderr
    assert "two traceEvents lists" not in ran.stderr
    if command == "ingest":
        trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
        device = sum(1 for event in trace["traceEvents"]
                     if event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and event.get("ph") == "X")
        assert f"rank 0: {device:,} device activities" in ran.stdout, ran.stdout  # the top-level list's, all
