"""A trace whose text starts with a UTF-8 byte-order mark (Windows tools and PowerShell write one; JSON readers
may skip it, and Python's ``json.load`` of bytes does) reads as the same trace in `vtrain ingest` and in `vtrain
validate`'s replay, plain or gzip. It was refused before: "invalid JSON ... invalid character (byte 0)"."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TRACES, one_trace_folders
from vtrain.ingest.pipeline import ingest_traces
from vtrain.replay.trace import read_rank_trace

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    text = gzip.decompress(SOURCE.read_bytes())
    return one_trace_folders(tmp_path_factory, {"plain": ("rank-0.json", text), "bom": ("rank-0.json", BOM + text),
                                                "bom-gzip": ("rank-0.json.gz", gzip.compress(BOM + text, 1))})


@pytest.mark.parametrize("name", ["bom", "bom-gzip"])
def test_ingest_reads_the_trace_after_the_mark(name: str, folders: dict[str, Path]) -> None:
    plain, marked = ingest_traces(folders["plain"]), ingest_traces(folders[name])
    assert marked["kernels"].height == 3774
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(marked[table], plain[table])


@pytest.mark.parametrize("name", ["bom", "bom-gzip"])
def test_the_replay_reads_the_trace_after_the_mark(name: str, folders: dict[str, Path]) -> None:
    plain = read_rank_trace(next(folders["plain"].iterdir()))
    marked = read_rank_trace(next(folders[name].iterdir()))
    assert len(marked) == len(plain) > 0
    assert marked.ts == plain.ts and marked.dur == plain.dur and marked.name == plain.name
