"""A trace whose kernels no operator launched (its ``External id`` links stripped, as a converter or an anonymiser
leaves it): ingest said nothing of its empty op_latency, and `vtrain validate` ended in a traceback
(``compiled_markers`` read the names of operators that are none: an audit)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.pipeline import ingest_traces

TRACE = REPO / "traces" / "gpu" / "h200-small-eager"


def _stripped(folder: Path) -> Path:
    """A copy of the H200 trace with every ``External id`` left out of its events' args."""
    shutil.copytree(TRACE, folder)
    path = folder / "rank-0.json.gz"
    document = json.loads(gzip.decompress(path.read_bytes()))
    for event in document["traceEvents"]:
        event.get("args", {}).pop("External id", None)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    return folder


def test_kernels_no_operator_launched_are_said_and_validated(tmp_path: Path) -> None:
    folder = _stripped(tmp_path / "stripped")
    said: list[str] = []
    profile = ingest_traces(folder, warn=said.append)
    assert profile.tables["op_latency"].is_empty()
    assert [line for line in said if "kernels have no launching operator" in line], said
    recorded: list[str] = []
    ingest_traces(TRACE, warn=recorded.append)
    assert not [line for line in recorded if "launching operator" in line], recorded
    ran = vtrain_in_process("validate", folder, "--no-hta", "--json", "-o", tmp_path / "report")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert json.loads(ran.stdout)["replay"]["error_pct"] == 0.0
