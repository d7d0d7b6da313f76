"""``--workers`` asks for processes; more than the cores this process may use add memory and no speed (each worker
holds its own libraries and profile), and `vtrain plan --workers 10000` spawned that many. Both commands that take
it now use at most one process per usable core, and say so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
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


def _workers_of(pid: int) -> list[int]:
    """The spawned worker processes whose parent is ``pid`` (Linux's /proc)."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
            and _stat_parent(entry) == pid and _is_worker(int(entry.name))]


def _stat_parent(entry: Path) -> int | None:
    try:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _is_worker(pid: int) -> bool:
    """Whether ``pid`` is alive and a multiprocessing worker."""
    try:
        return b"spawn_main" in (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_workers_go_silently_with_a_command_killed_at_once(tmp_path: Path) -> None:
    """A `plan --workers 2` killed at once (kill -9, as an out-of-memory kill) left its workers writing into a closed
    pipe, each printing two BrokenPipeError tracebacks on the terminal (an audit). They die with it, silently."""
    err = tmp_path / "stderr"
    with err.open("w") as stream:
        command = subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", "plan",
                                    str(REPO / "examples" / "gpt-1.3b-a100.yaml"), "--gpus", "..256", "--profile",
                                    str(REPO / "profiles" / "a100"), "--workers", "2", "-o", str(tmp_path / "plans")],
                                   stdout=subprocess.DEVNULL, stderr=stream)
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while command.poll() is None and len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = _workers_of(command.pid)
        if command.poll() is not None or len(workers) < 2:
            command.kill()
            pytest.skip("the plan ended before its workers were seen")
        time.sleep(4.0)  # the workers at work (started: a kill while one reads what it starts with is Python's own
        # traceback, "pickle data was truncated", before any of vtrain's code runs in it)
        command.send_signal(signal.SIGKILL)
        command.wait()
    deadline = time.monotonic() + 30
    while any(map(_is_worker, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # what a dying worker writes, written
    assert not any(map(_is_worker, workers))
    assert "BrokenPipeError" not in err.read_text(), err.read_text()


def _pid_after_a_while(_: int) -> int:
    time.sleep(1.5)
    return os.getpid()


def test_a_pool_started_on_a_thread_that_ends_keeps_its_workers() -> None:
    """Linux's parent-death signal comes when the thread that started a worker ends: a pool started on a thread that
    then ended lost its workers mid-task (killed, replaced, the tasks never done: a review). Only the main thread's
    workers ask for it."""
    from contextlib import ExitStack

    started: dict[str, object] = {}
    with ExitStack() as stack:
        def start() -> None:
            pool = stack.enter_context(distributed.worker_pool(2))
            started["workers"] = sorted(process.pid for process in pool._pool)  # type: ignore[attr-defined]
            started["result"] = pool.map_async(_pid_after_a_while, range(2))
            started["pool"] = pool
            time.sleep(0.3)

        thread = threading.Thread(target=start)
        thread.start()
        thread.join()
        result = started["result"]
        result.wait(60)  # type: ignore[attr-defined]
        assert result.ready()  # type: ignore[attr-defined]
        assert set(result.get()) <= set(started["workers"])  # type: ignore[attr-defined]
