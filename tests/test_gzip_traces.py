"""Gzip traces are read by one function in `vtrain ingest` and `vtrain validate` (:func:`vtrain.ingest.decode.
inflate`), a bounded piece at a time.

- A file of several gzip members (``cat a.gz b.gz``, or a tool that appends as it goes) is every member: validate's
  replay read only the first one before, without a word, where ingest read all.
- A "gzip bomb" (a small file that expands to gigabytes; here 256 MB of blanks from about 250 kB) is one
  error line, exit 2, before it fills memory (validate held the whole text) or disk (ingest spools it): no trace
  expands more than :data:`vtrain.limits.MAX_GZIP_RATIO` times (real ones about 15).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from tests.conftest import TRACES, vtrain_in_process
from vtrain.ingest.pipeline import ingest_traces
from vtrain.limits import GZIP_RATIO_FROM_BYTES, MAX_GZIP_RATIO
from vtrain.replay.trace import read_rank_trace

SOURCE = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same trace as one gzip member and as three (cut anywhere, a zero-padded gap between two, as some tools
    leave)."""
    text = gzip.decompress(SOURCE.read_bytes())
    third = len(text) // 3
    made = {}
    for name, data in (("one", gzip.compress(text, 1)),
                       ("three", gzip.compress(text[:third], 1) + b"\0" * 8 + gzip.compress(text[third:2 * third], 6)
                        + gzip.compress(text[2 * third:], 9))):
        folder = tmp_path_factory.mktemp(name)
        (folder / "rank-0.json.gz").write_bytes(data)
        made[name] = folder
    return made


def test_ingest_reads_every_member(members: dict[str, Path]) -> None:
    one, three = ingest_traces(members["one"]), ingest_traces(members["three"])
    assert one["kernels"].height == 3774
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(three[table], one[table])


def test_the_replay_reads_every_member(members: dict[str, Path]) -> None:
    one = read_rank_trace(members["one"] / "rank-0.json.gz")
    three = read_rank_trace(members["three"] / "rank-0.json.gz")
    assert len(three) == len(one) > 0
    assert three.ts == one.ts and three.name == one.name


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trace of blanks that expands about 1,000 times to four times the size past which the ratio is checked."""
    folder = tmp_path_factory.mktemp("bomb")
    deflate = zlib.compressobj(9, wbits=31)
    parts = [deflate.compress(b'{"traceEvents": [')]
    blanks = b" " * (1 << 20)
    parts += [deflate.compress(blanks) for _ in range(4 * GZIP_RATIO_FROM_BYTES >> 20)]
    parts += [deflate.compress(b"]}"), deflate.flush()]
    (folder / "rank-0.json.gz").write_bytes(b"".join(parts))
    return folder


@pytest.mark.parametrize("command", ["ingest", "validate"])
def test_a_gzip_bomb_is_one_error_line(command: str, bomb: Path, tmp_path: Path) -> None:
    assert 4 * GZIP_RATIO_FROM_BYTES > 2 * MAX_GZIP_RATIO * (bomb / "rank-0.json.gz").stat().st_size
    out = tmp_path / "out"
    ran = vtrain_in_process(command, bomb, "-o", out, *(["--no-hta"] if command == "validate" else []))
    assert ran.returncode == 2
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert f"rank-0.json.gz: gzip data expands more than {MAX_GZIP_RATIO} times" in ran.stderr
    assert not out.exists()
