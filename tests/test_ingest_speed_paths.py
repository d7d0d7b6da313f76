"""The fast paths of ingest give what the plain ones would: span sizes, text layout, skipped phases, the
vectorised launch-to-op containment."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.conftest import HTA_TRACE_SETS
from vtrain.errors import InputError
from vtrain.ingest.enclosing import enclosing_op_ids
from vtrain.ingest.events import read_rank_events
from vtrain.ingest.extract import RankEvents
from vtrain.ingest.pipeline import ingest_traces
from vtrain.ingest.spans import read_header
from vtrain.ingest.text import load_text

A100 = next(p for p in HTA_TRACE_SETS if "a100" in p.name)
V100 = next(p for p in HTA_TRACE_SETS if p.name == "hta-v100-2rank")


def _trace(folder: Path) -> dict:
    with gzip.open(next(folder.glob("*.json.gz")), "rt") as handle:
        return json.load(handle)


def _write(folder: Path, trace: dict, indent: int | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank-0.json").write_text(json.dumps(trace, indent=indent))
    return folder


def _assert_same_tables(left: Path, right: Path) -> None:
    a, b = ingest_traces(left), ingest_traces(right)
    for name in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(a[name], b[name])
    for name in ("op_latency", "nccl_latency"):
        assert_frame_equal(a[name].sort(a[name].columns, nulls_last=True),
                           b[name].sort(b[name].columns, nulls_last=True))
    assert a.metadata["dropped_events"] == b.metadata["dropped_events"]


def _rank_events(path: Path, **spans: int) -> RankEvents:
    text = load_text(path)
    return read_rank_events(text, read_header(text)[1], **spans)


def _assert_same_events(left: RankEvents, right: RankEvents) -> None:
    for name in ("device", "cpu", "runtime"):
        assert_frame_equal(getattr(left, name), getattr(right, name))
    assert left.dropped == right.dropped


@pytest.mark.parametrize("span_bytes", [20_000, 97_531, 8 << 20])
def test_span_size_changes_nothing(span_bytes: int) -> None:
    path = next(V100.glob("*.json.gz"))
    _assert_same_events(_rank_events(path, span_bytes=span_bytes), _rank_events(path, span_bytes=10**12))


@pytest.mark.parametrize("events_per_span", [101, 50_000])
@pytest.mark.parametrize("indent", [None, 2])
def test_events_holding_objects_give_the_same_tables(tmp_path: Path, events_per_span: int,
                                                     indent: int | None) -> None:
    """``}, {"`` inside an event (a list of objects in its args): a span cut there does not decode, and the rest
    of the events are found one by one (``events_per_span`` per span)."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace) / "rank-0.json"
    for event in trace["traceEvents"]:
        event.setdefault("args", {})["objects"] = [{"a": 1}, {"b": [2]}]
    holding = _write(tmp_path / "holding", trace, indent) / "rank-0.json"
    _assert_same_events(_rank_events(holding, span_bytes=30_000, events_per_span=events_per_span),
                        _rank_events(plain))


def test_pretty_printed_text_gives_the_same_tables(tmp_path: Path) -> None:
    trace = _trace(A100)
    _assert_same_tables(_write(tmp_path / "compact", trace), _write(tmp_path / "pretty", trace, indent=4))


def test_events_of_other_or_unknown_phases_are_skipped(tmp_path: Path) -> None:
    """Unknown phases and events without one send the span down the plain decoder; nothing changes."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace)
    events = trace["traceEvents"]
    events.insert(5, {"ph": "Q", "name": "an unknown phase", "ts": 1})
    events.insert(9, {"name": "no phase at all", "ts": 3})
    events.append({"ph": "i", "name": "an instant", "s": "t", "ts": 2})
    _assert_same_tables(plain, _write(tmp_path / "odd", trace))


def test_fields_of_other_phases_are_not_read(tmp_path: Path) -> None:
    """Only complete events are decoded: a malformed field of an instant event no longer fails the ingest."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace)
    trace["traceEvents"].append({"ph": "i", "name": "an instant", "ts": "not a number", "args": [1]})
    _assert_same_tables(plain, _write(tmp_path / "odd", trace))


def test_numbers_written_as_strings_are_read_as_the_numbers(tmp_path: Path) -> None:
    """Some exporters write ids and durations as JSON strings (`"External id": "5"`, `"dur": "12.5"`): the same
    tables as the numbers give."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace)
    changed = 0
    for event in trace["traceEvents"]:
        args = event.get("args") or {}
        for key in ("External id", "correlation"):
            if isinstance(args.get(key), int):
                args[key] = str(args[key])
                changed += 1
        if event.get("ph") == "X" and isinstance(event.get("dur"), (int, float)) and changed % 3 == 0:
            event["dur"] = str(event["dur"])
    assert changed > 1000
    _assert_same_tables(plain, _write(tmp_path / "strings", trace))


@pytest.mark.parametrize(("field", "value"), [("dur", '"long"'), ("ts", '"early"'), ("ts", "[1,\n2]"),
                                            ("ts", "1e400"), ("ts", '{"a": 1}, "b": 2')])
@pytest.mark.parametrize("span_bytes", [10_000, 8 << 20])
def test_a_malformed_complete_event_is_named_by_its_index(tmp_path: Path, field: str, value: str,
                                                          span_bytes: int) -> None:
    """``value`` is the field's JSON text (the last one holds a ``},``)."""
    trace = _trace(A100)
    index = [i for i, e in enumerate(trace["traceEvents"]) if e.get("ph") == "X"][-3]
    trace["traceEvents"][index][field] = "VALUE"
    bad = _write(tmp_path / "bad", trace)
    (bad / "rank-0.json").write_text((bad / "rank-0.json").read_text().replace('"VALUE"', value))
    text = load_text(bad / "rank-0.json")
    with pytest.raises(InputError, match=rf"malformed trace event: .* at `\$\.traceEvents\[{index}\]\.{field}`"):
        read_rank_events(text, read_header(text)[1], span_bytes=span_bytes)


def test_long_times_and_missing_or_null_ones(tmp_path: Path) -> None:
    """Start times are parsed by polars, not msgspec: the same floats, including 17 significant digits and
    -0; a missing or null one drops the event."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace)
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    first = min(e["ts"] for e in complete)
    for event in complete:
        event["ts"] = event["ts"] + 1669783689278940.0 + 0.123
    complete[3]["ts"] = None
    del complete[5]["ts"]
    odd = _write(tmp_path / "odd", trace)
    profile = ingest_traces(odd)
    assert profile.metadata["dropped_events"] == ingest_traces(plain).metadata["dropped_events"] + 2
    kernels = [e["ts"] for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ts")
               and e.get("dur", -1) >= 0]
    assert sorted(profile["kernels"]["ts"]) == sorted(kernels)

    # a trace whose clock starts at 0 (a start 0 among epoch times would be a clock glitch, left out as absurd)
    for event in complete:
        if event.get("ts") is not None:
            event["ts"] = event["ts"] - 1669783689278940.0 - 0.123 - first
    complete[4]["ts"] = 0
    zero = _write(tmp_path / "zero", trace)
    (zero / "rank-0.json").write_text((zero / "rank-0.json").read_text().replace('"ts": 0,', '"ts": -0,', 1))
    zeros = [ts for ts in ingest_traces(zero)["cpu_ops"]["ts"] if ts == 0]
    assert zeros and all(math.copysign(1.0, ts) == 1.0 for ts in zeros)  # as msgspec reads the integer -0


@pytest.mark.parametrize("after", [{"logs": ["cpp:1144] done", "{a}]"]}, {"more": [{"a": [1]}]}])
def test_keys_after_the_events_give_the_same_profile(tmp_path: Path, after: dict) -> None:
    """The header is read around the events: brackets in the keys that follow them (Kineto's logs) are skipped,
    and where one is taken for the end of the events (a list of objects), the events do not decode and the
    trace is read again the usual way."""
    trace = _trace(A100)
    plain = _write(tmp_path / "plain", trace)
    for indent in (None, 1):
        odd = _write(tmp_path / f"after-{indent}", {**trace, **after}, indent)
        _assert_same_tables(plain, odd)
        assert ingest_traces(odd).metadata["device"] == ingest_traces(plain).metadata["device"]


def test_a_trace_without_events_is_refused_not_a_profile_of_empty_tables(tmp_path: Path) -> None:
    trace = _trace(A100)
    trace["traceEvents"] = []
    with pytest.raises(InputError, match=r"no event in any of its 1 trace file\(s\)"):
        ingest_traces(_write(tmp_path / "empty", trace))


def _walk(ops: pl.DataFrame, probes: pl.DataFrame) -> pl.DataFrame:
    """The reference: a stack of open ops, walked per thread over the same (stable) sorted order."""
    events = pl.concat([
        ops.select("tid", "ts", end=pl.col("ts") + pl.col("dur"), ident="external_id", is_op=pl.lit(True)),
        probes.select("tid", "ts", end=pl.col("ts"), ident="correlation", is_op=pl.lit(False)),
    ]).sort("tid", "ts", "end", descending=[False, False, True], maintain_order=True)
    found: list[tuple[int, int | None]] = []
    stack: list[tuple[float, int]] = []
    current = object()
    for tid, ts, end, ident, is_op in events.iter_rows():
        if tid != current:
            stack, current = [], tid
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if is_op:
            stack.append((end, ident))
        else:
            found.append((ident, stack[-1][1] if stack else None))
    return pl.DataFrame(found, schema={"correlation": pl.Int64, "enclosing_id": pl.Int64}, orient="row")


def _nested_ops(rng: random.Random, count: int) -> pl.DataFrame:
    """Ops on a few threads (and some without one), overlapping as well as nested, in whole microseconds so
    that starts, ends and probe times often coincide."""
    rows = []
    for ident in range(count):
        tid = rng.choice([1, 2, 3, None])
        start = rng.randrange(0, 400)
        rows.append((tid, float(start), float(rng.choice([0, 1, 2, 5, 20, 100])), ident))
    return pl.DataFrame(rows, schema={"tid": pl.Int64, "ts": pl.Float64, "dur": pl.Float64,
                                      "external_id": pl.Int64}, orient="row")


@pytest.mark.parametrize("seed", range(5))
def test_enclosing_ops_match_a_stack_walk(seed: int) -> None:
    rng = random.Random(seed)
    ops = _nested_ops(rng, 3000)
    probes = pl.DataFrame({
        "correlation": list(range(2000)),
        "tid": [rng.choice([1, 2, 3, 4, None]) for _ in range(2000)],
        "ts": [float(rng.randrange(-5, 520)) + rng.choice([0.0, 0.5]) for _ in range(2000)],
    }, schema={"correlation": pl.Int64, "tid": pl.Int64, "ts": pl.Float64})
    key = ["correlation", "enclosing_id"]
    assert_frame_equal(enclosing_op_ids(ops, probes).sort(key, nulls_last=True),
                       _walk(ops, probes).sort(key, nulls_last=True))
