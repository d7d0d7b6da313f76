"""`vtrain validate` holds per rank only compact columns, never a rank's whole decoded trace: the replay graph is
built rank by rank as the files are read (:class:`vtrain.replay.build.GraphBuilder`), and what is kept of a rank
(:class:`vtrain.replay.trace.KeptRank`, :class:`vtrain.replay.build.RankPart`) is arrays of a few bytes per event,
not Python objects per event. Peak memory itself is measured by the benchmark
(``tests/benchmarks/test_validate_bench.py``), not asserted here."""

from __future__ import annotations

import errno
import gc
import gzip
import io
import os
import subprocess
import sys
import tempfile
from array import array
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import TRACES
from vtrain.replay.build import GraphBuilder, build_graph
from vtrain.replay.replayer import replay, replay_graph
from vtrain.replay.trace import KeptRank, KeptText, RankTrace, TextAside, read_rank_trace, read_ranks, read_trace_set
from vtrain.validate.timeline import annotate
from vtrain.validate.traces import ANNOTATION_ONLY, finish_validation, prepare_validation

TWO = TRACES / "t1p1d2"  # two ranks of a recorded data-parallel run (CPU, gloo): collectives matched across ranks
GPU = TRACES / "hta-sm80-128rank-sampled"  # two GPU ranks of a 128-rank job: kernels, NCCL, CPU ops of one start
RECORDED = TRACES / "t1p1d2"  # two ranks and a run.yaml: the model side is prepared too


def _built(folder) -> tuple[GraphBuilder, list[KeptRank]]:
    builder = GraphBuilder()

    def keep(path: Path) -> KeptRank:
        trace = read_rank_trace(path)
        builder.add(trace)
        return trace.kept()

    return builder, read_ranks(folder, keep)


def test_kept_ranks_are_compact_columns() -> None:
    builder, kept = _built(TWO)
    assert [rank.rank for rank in kept] == [0, 1]
    for rank in kept:
        schema = rank.columns.schema
        assert all(schema[c] == pl.Categorical for c in ("kind", "cat", "name", "input_dims")), schema
        assert schema["lane"] == pl.Int64 and schema["external_id"] == pl.Int64
        assert isinstance(rank.index, array) and rank.index.typecode == "q" and len(rank.index) == len(rank)
        part = builder.parts[rank.rank]
        assert len(part) == len(rank)
        for column in (part.ts, part.dur, part.launch):
            assert isinstance(column, np.ndarray) and column.dtype.itemsize == 8 and len(column) == len(rank)
        edges = part.edges
        assert [type(c) for c in (edges.src, edges.dst, edges.delay, edges.kind)] == [array] * 4
        assert (edges.src.itemsize, edges.delay.itemsize, edges.kind.itemsize) == (4, 8, 1)  # numbered in the rank
        assert len(edges) > len(rank)  # a few edges per event
        # every point an edge names is one of this rank's (numbered from 0 until the ranks are put together)
        assert max(max(edges.src), max(edges.dst)) < 2 * len(rank)
        # the collective calls are a small part of the events: they are kept as objects
        assert 0 < len(part.calls) < len(rank) / 10


def test_rank_by_rank_build_is_the_whole_build() -> None:
    """Building rank by rank gives the graph and the replay of building from every rank's trace at once."""
    builder, kept = _built(GPU)
    streamed = replay_graph(builder.graph(kept))
    whole = replay(read_trace_set(GPU))
    assert streamed.edge_counts == whole.edge_counts and streamed.origin == whole.origin
    assert streamed.events.equals(whole.events)
    graph = build_graph(read_trace_set(GPU))
    assert graph.offsets == [0, len(kept[0])] == [0, len(graph.traces[0])]


def test_annotating_rank_by_rank_is_annotating_the_whole() -> None:
    builder, kept = _built(GPU)
    by_rank = replay_graph(builder.graph(kept), each_rank=annotate).events
    assert by_rank.equals(annotate(replay(read_trace_set(GPU)).events))


def test_prepared_validation_holds_no_decoded_trace() -> None:
    """Once prepared, a validation holds what it keeps of each rank, not a rank's decoded trace (a few hundred
    bytes an event as Python objects), and its frame lacks the columns only the annotation reads."""
    gc.collect()
    before = sum(type(o) is RankTrace for o in gc.get_objects())
    prepared = prepare_validation(RECORDED)
    gc.collect()
    assert sum(type(o) is RankTrace for o in gc.get_objects()) == before
    assert all(isinstance(t, KeptRank) for t in prepared.traces)
    assert all(t.columns.is_empty() for t in prepared.traces)  # released: the frame holds them
    assert not set(ANNOTATION_ONLY) & set(prepared.frame.columns)
    assert prepared.replayed.events is prepared.frame
    assert all(not t.source.batches and t.source.places for t in prepared.traces)  # the text is in a file


def _events(text: KeptText) -> list[bytes]:
    return [bytes(raw) for batch in text.events() for raw in batch]


def test_text_set_aside_reads_back_the_same_events() -> None:
    trace = read_rank_trace(next(GPU.glob("*rank*")))
    before, batches = _events(trace.source), len(trace.source.batches)
    aside = TextAside()
    aside.take(trace.source)
    assert aside.problem is None and not trace.source.batches and len(trace.source.places) == batches
    assert _events(trace.source) == before
    aside.close()


class _Full(io.BytesIO):
    """A file on a full disk."""

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_no_space_for_the_text_keeps_it_in_memory_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    expected = finish_validation(prepare_validation(RECORDED), tmp_path / "roomy", with_hta=False)
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **_: _Full())
    warnings: list[str] = []
    prepared = prepare_validation(RECORDED, warn=warnings.append)
    assert [line for line in warnings if "No space left on device" in line and "kept in memory" in line]
    assert all(t.source.batches and not t.source.places for t in prepared.traces)
    full = finish_validation(prepared, tmp_path / "full", with_hta=False)
    assert (full.replay.measured_ms, full.replay.predicted_ms) == (expected.replay.measured_ms,
                                                                   expected.replay.predicted_ms)
    for name in ("rank-0.json.gz", "rank-1.json.gz"):
        assert gzip.decompress((tmp_path / "full/predicted/replay" / name).read_bytes()) == gzip.decompress(
            (tmp_path / "roomy/predicted/replay" / name).read_bytes())


def test_processes_reading_ranks_do_not_load_the_compiler() -> None:
    """numba and llvmlite take about 70 MB a process: the processes that read ranks and build their graph parts
    (``vtrain.validate.ranks``) do without them; only the process that evaluates the whole graph loads them."""
    probe = "import sys, vtrain.validate.ranks; print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "[]", loaded.stderr
