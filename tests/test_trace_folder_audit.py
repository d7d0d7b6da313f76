"""Files beside the traces that are small on disk and hostile inside (an audit): a JSON file nested 100,000 deep
was a RecursionError traceback from the check that tells a run's ``config.json`` from a trace, and a 1 MiB gzip
file expanding to 1 GB was decompressed whole by that check (2.1 GB of memory) before the trace reader refused it."""

from __future__ import annotations

import gzip
import resource
import shutil
from pathlib import Path

from tests.conftest import REPO, vtrain_in_process

TRACES = REPO / "traces" / "t1p2d1"


def test_a_deeply_nested_json_beside_the_traces_is_left_out_with_a_warning(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(TRACES, folder)
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert "config.json: not read" in ran.stderr


def test_a_gzip_bomb_beside_the_traces_is_refused_without_expanding_it(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    shutil.copytree(TRACES, folder)
    with gzip.open(folder / "config.json.gz", "wb", 9) as bomb:
        for _ in range(512):
            bomb.write(b" " * (1 << 20))  # 512 MiB of spaces, about half a MiB on disk
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert ran.returncode == 2 and "gzip bomb" in ran.stderr, ran.stderr
    assert grown_mib < 256, f"the check expanded the bomb: peak memory grew by {grown_mib:.0f} MiB"
