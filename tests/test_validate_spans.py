"""`vtrain validate` reads a rank file as `vtrain ingest` does, a span of its text at a time (the text mapped, each
span's pages handed back once decoded: memory bounded by what is kept of the events, not by the file). What it reads
must not depend on where the spans are cut: a cut that lands inside a string (a name ending in ``}, {``, where the
closing quote looks like the start of the next event) makes the rest be read event by event, and entries that are
not events keep every later event's position in ``traceEvents`` (the replayed trace is written by position)."""

from __future__ import annotations

import gzip
import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from polars.testing import assert_frame_equal

import vtrain.ingest.spans as spans
import vtrain.replay.trace as replay_trace
from tests.conftest import TRACES
from vtrain.replay.trace import RankTrace, read_rank_trace
from vtrain.validate.profile import RankTablesSink

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"  # 40,573 events, 9.8 MB of JSON
#: where spans are cut by default, and never (one span)
SMALL, WHOLE = 4096, 1 << 40


@pytest.fixture(scope="module")
def odd_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """The real rank with the kernels of its second half named ``... }, {`` and three entries that are not events
    (a number, a text, a list) in the middle of ``traceEvents``."""
    trace = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = trace["traceEvents"]
    kernels = [event for event in events if event.get("cat") == "kernel"]
    for kernel in kernels[len(kernels) // 2:]:
        kernel["name"] += " }, {"
    middle = len(events) // 2
    events[middle:middle] = [5, "text", []]
    path = tmp_path_factory.mktemp("odd") / "rank-0.json"
    path.write_text(json.dumps(trace))
    return path, events


def _read(path: Path, span_bytes: int, monkeypatch: pytest.MonkeyPatch) -> tuple[RankTrace, RankTablesSink, int]:
    """The rank read with spans of ``span_bytes``, ingest's tables built from it, and how many times the rest of
    the events were found one by one."""
    fallbacks = 0
    whole = spans.whole_event_spans

    def counted(*args: Any, **kwargs: Any) -> list[spans.Span]:
        nonlocal fallbacks
        fallbacks += 1
        return whole(*args, **kwargs)

    sink = RankTablesSink()
    with monkeypatch.context() as patch:
        patch.setattr(replay_trace, "decode_spans", partial(spans.decode_spans, span_bytes=span_bytes))
        patch.setattr(spans, "whole_event_spans", counted)
        return read_rank_trace(path, sink), sink, fallbacks


def test_what_is_read_does_not_depend_on_the_spans(odd_trace: tuple[Path, list[Any]],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path, events = odd_trace
    cut, cut_sink, fallbacks = _read(path, SMALL, monkeypatch)
    one, one_sink, _ = _read(path, WHOLE, monkeypatch)
    assert fallbacks == 1  # a cut inside a name: the rest read event by event
    assert len(cut) > 20_000 and len(cut.source.batches) > 100 and len(one.source.batches) == 1
    for column in replay_trace._COLUMNS:
        assert getattr(cut, column) == getattr(one, column), column
    assert (cut.dropped, cut.absurd, cut.repeated) == (one.dropped, one.absurd, one.repeated)
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(getattr(cut_sink.ranks[0], table), getattr(one_sink.ranks[0], table))
    kept = [json.loads(bytes(raw)) for batch in cut.source.events() for raw in batch]
    assert kept == events  # the text kept for the replayed trace: every entry, in order
    assert all(events[i]["name"] == name for i, name in zip(cut.index, cut.name))  # positions past the non-events
    assert sum(name.endswith("}, {") for name in cut.name) > 1000
