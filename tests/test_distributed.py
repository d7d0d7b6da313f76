"""``--workers`` asks for processes; more than the cores this process may use add memory and no speed (each worker
holds its own libraries and profile), and `vtrain plan --workers 10000` spawned that many. Both commands that take
it now use at most one process per usable core, and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain import distributed
from vtrain.distributed import workers_within_cores


def test_workers_are_capped_at_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "usable_cores", lambda: 4)
    said: list[str] = []
    assert workers_within_cores(3, said.append) == 3 and said == []
    assert workers_within_cores(10_000, said.append) == 4
    assert said == ["--workers 10000: this process may use 4 CPU core(s); using 4 worker processes"]


@pytest.mark.parametrize("command", ["plan", "ingest"])
def test_the_commands_say_it(command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(distributed, "usable_cores", lambda: 1)  # one process: nothing is spawned
    args = (["plan", "--layers", "4", "--hidden", "512", "--heads", "8", "--seq", "256", "--global-batch", "16",
             "--gpus", "8", "--max-micro-batch", "1", "--json"] if command == "plan"
            else ["ingest", REPO / "traces" / "t1p1d2", "--json"])
    asked = "10000" if command == "plan" else "1000"  # ingest refuses more than 1,024
    ran = vtrain_in_process(*args, "--workers", asked, "-o", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    assert f"warning: --workers {asked}: this process may use 1 CPU core(s); using 1 worker processes\n" in ran.stderr
    if command == "plan":
        assert json.loads(ran.stdout)["simulated"] > 0
