"""What the readers of a trace folder read in silence is said, one warning line per rank file (an audit found these
read in silence). Each input is made in tmp_path from a small real trace shipped in the repo (traces/wild/mi250-rocm:
an MI250 ROCm trace, 14 kernels).

- A file named for one rank whose ``distributedInfo.rank`` says another is read as the trace's rank, and said, by
  ingest as by the replay (one check: vtrain.ingest.discover.rank_and_world_size).
- The shipped traces give none of these warnings.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TRACES, vtrain_in_process
from tests.test_hostile_trace_audit import COMMANDS, rank_of
from vtrain.replay.trace import trace_set_warnings

SOURCE = TRACES / "wild" / "mi250-rocm" / "rank-0.json.gz"
NEW_WARNINGS = ("the file name says rank",)


def write_trace(folder: Path, change: Callable[[dict], None], name: str = "rank-0.json") -> Path:
    """The shipped MI250 trace, edited by ``change`` (the whole document), written to ``folder/name`` as plain
    JSON."""
    document = json.loads(gzip.decompress(SOURCE.read_bytes()))
    change(document)
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_rank_its_name_contradicts_is_the_traces_and_said(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    path = write_trace(traces, rank_of(3, 4))
    ran = vtrain_in_process(*COMMANDS[command](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines.count(f"warning: {path}: the file name says rank 0 but its distributedInfo.rank is 3: read as rank "
                       f"3, as the trace says") == 1
    assert f"warning: {traces}: 3 of 4 ranks have no trace file (missing: 0, 1, 2)" in lines


SHIPPED = [TRACES / "hta-a100-2rank-nccl", TRACES / "gpu" / "h200-small-eager", TRACES / "t1p1d2"]


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda folder: folder.name)
def test_shipped_traces_give_none_of_these_warnings(folder: Path, shipped_traces, tmp_path: Path) -> None:
    warned = trace_set_warnings(folder, shipped_traces(folder), None)
    assert not [line for line in warned if any(new in line for new in NEW_WARNINGS)], warned
    if folder != SHIPPED[-1]:  # ingest is strict about the rest; the largest folder is spared
        ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
        assert ran.returncode == 0 and not any(new in ran.stderr for new in NEW_WARNINGS), ran.stderr
