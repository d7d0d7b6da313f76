"""Interrupts: Ctrl-C (SIGINT) stops `vtrain ingest` and `vtrain validate` at any point with one line
``interrupted``, exit code 130, no traceback and nothing half-written; after SIGKILL, which no process can clean up
after, the next run in the same folder removes the stale staging folder, and nothing else.

The commands run as real processes (signals and exit codes are the point); each is interrupted at points found by
watching its output folder: while reading (before its staging folder exists, or right after), while writing (the
staging folder or a file in it has appeared).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.benchmarks.synth import repeat_trace
from tests.conftest import REPO, TRACES
from vtrain.errors import InputError, InputWarning
from vtrain.outputs import MARKER, PROFILE, check_output, forget_checks, mark, remove_stale_staging, staged

RECORDED = TRACES / "t1p1d2"  # two ranks and a run.yaml: validate replays and simulates
SOURCE_TRACE = TRACES / "hta-v100-2rank" / "rank-1.json.gz"
POLL_S = 0.002
LIMIT_S = 300.0


def start(*args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", *map(str, args)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(process: subprocess.Popen[str], ready: Callable[[], bool]) -> None:
    """Poll until ``ready()``; fail if the process ends first."""
    deadline = time.monotonic() + LIMIT_S
    while not ready():
        assert process.poll() is None, f"finished before the point of interrupt: {process.communicate()}"
        assert time.monotonic() < deadline
        time.sleep(POLL_S)


def hidden(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(".")]


def staging_with(process: subprocess.Popen[str], folder: Path, name: str | None = None) -> Callable[[], bool]:
    """Whether ``process`` has a staging folder in ``folder`` (holding ``name``, when given)."""
    def ready() -> bool:
        return any(f".vtrain-staging-{process.pid}-" in p.name and (name is None or (p / name).exists())
                   for p in hidden(folder))
    return ready


def after(seconds: float) -> Callable[[], bool]:
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


def decoys(parent: Path) -> dict[str, bytes]:
    """Things in the output's parent that are not vtrain's to remove: a user's folder named like a staging
    folder of a dead process but without the marker, a staging folder of a process still running (this one),
    and an ordinary folder. Returns their content."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    lookalike = parent / f".result.vtrain-staging-{dead}-deadbeef"
    lookalike.mkdir(parents=True)
    (lookalike / "thesis.tex").write_text("years of work")
    running = parent / f".result.vtrain-staging-{os.getpid()}-cafef00d"
    running.mkdir()
    (running / MARKER).write_text("a run still going")
    (parent / "notes").mkdir()
    (parent / "notes" / "todo.txt").write_text("keep")
    return contents(parent)


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def interrupted(process: subprocess.Popen[str]) -> None:
    """SIGINT: one line ``interrupted``, exit code 130, no traceback."""
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=LIMIT_S)
    assert process.returncode == 130, (process.returncode, err)
    assert "Traceback" not in err and not [line for line in err.splitlines() if line.startswith("error:")], err
    assert err.splitlines()[-1] == "interrupted", err
    assert err.count("interrupted") == 1


def killed(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.communicate(timeout=LIMIT_S)
    assert process.returncode == -signal.SIGKILL


@pytest.fixture(scope="module")
def large_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40 MB trace (the real V100 rank repeated): ingest spends about a second reading it and a tenth writing."""
    folder = tmp_path_factory.mktemp("large")
    repeat_trace(SOURCE_TRACE, folder / "rank-1.json", 40_000_000)
    return folder


@pytest.fixture(scope="module")
def ingest_staging_s(large_trace: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    """How long an uninterrupted ingest of the large trace takes to create its staging folder (reading time)."""
    parent = tmp_path_factory.mktemp("timing")
    started = time.monotonic()
    process = start("ingest", large_trace, "-o", parent / "result")
    wait_for(process, staging_with(process, parent))
    seen = time.monotonic() - started
    process.communicate(timeout=LIMIT_S)
    assert process.returncode == 0
    return seen


@pytest.mark.parametrize("point", ["reading", "writing"])
def test_ctrl_c_during_ingest(point: str, large_trace: Path, ingest_staging_s: float, tmp_path: Path) -> None:
    parent = tmp_path / "out"
    before = decoys(parent)
    trace_before = contents(large_trace)
    process = start("ingest", large_trace, "-o", parent / "result")
    wait_for(process, after(ingest_staging_s / 2) if point == "reading" else staging_with(process, parent))
    interrupted(process)
    assert contents(parent) == before  # no profile, no staging folder, the decoys untouched
    assert contents(large_trace) == trace_before


@pytest.mark.parametrize("point", ["reading", "writing"])
def test_sigkill_during_ingest_is_cleaned_by_the_next_run(point: str, large_trace: Path, ingest_staging_s: float,
                                                          tmp_path: Path) -> None:
    parent = tmp_path / "out"
    before = decoys(parent)
    process = start("ingest", large_trace, "-o", parent / "result")
    wait_for(process, after(ingest_staging_s / 2) if point == "reading" else staging_with(process, parent, MARKER))
    killed(process)
    if point == "writing":
        assert staging_with(process, parent)(), "the killed run left no staging folder: nothing was tested"
    rerun = start("ingest", TRACES / "hta-sm80-128rank-sampled", "-o", parent / "result")
    _, err = rerun.communicate(timeout=LIMIT_S)
    assert rerun.returncode == 0, err
    after_rerun = contents(parent)
    assert {k: v for k, v in after_rerun.items() if not k.startswith("result")} == before
    assert (parent / "result" / "metadata.json").is_file()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("recorded") / "run"
    shutil.copytree(RECORDED, copy)
    return copy


@pytest.mark.parametrize("point", ["reading", "predicting", "reporting"])
def test_ctrl_c_during_validate(point: str, recorded: Path, tmp_path: Path) -> None:
    parent = tmp_path / "out"
    before = decoys(parent)
    traces_before = contents(recorded)
    process = start("validate", recorded, "-o", parent / "result", "--no-hta")
    wait_for(process, staging_with(process, parent, {"reading": MARKER, "predicting": "predicted",
                                            "reporting": "report.md"}[point]))
    interrupted(process)
    assert contents(parent) == before
    assert contents(recorded) == traces_before


@pytest.mark.parametrize("point", ["reading", "predicting"])
def test_sigkill_during_validate_is_cleaned_by_the_next_run(point: str, recorded: Path, tmp_path: Path) -> None:
    parent = tmp_path / "out"
    before = decoys(parent)
    process = start("validate", recorded, "-o", parent / "result", "--no-hta")
    wait_for(process, staging_with(process, parent, MARKER if point == "reading" else "predicted"))
    killed(process)
    assert staging_with(process, parent, MARKER)(), "the killed run left no staging folder: nothing was tested"
    # the next run in that folder, here one refused at once (an empty trace folder): the clean-up comes first
    empty = tmp_path / "empty"
    empty.mkdir()
    rerun = start("validate", empty, "-o", parent / "result")
    _, err = rerun.communicate(timeout=LIMIT_S)
    assert rerun.returncode == 2 and "no trace files" in err, err
    assert contents(parent) == before


# ----------------------------------------------------------------------------- the clean-up rules, in process


def test_stale_staging_rules(tmp_path: Path) -> None:
    """Removed: a marked staging folder of a process that is gone, or an empty one (killed before marking). Kept:
    a running process's, one without the marker that holds something, anything not named like staging. A stale
    backup (the previous output, moved aside during the final rename) is put back when its target is missing."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()

    def folder(name: str, *files: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        for file in files:
            (path / file).write_text("x")
        return path

    stale = folder(f".profile.vtrain-staging-{dead}-0123abcd", MARKER, "kernels.parquet")
    empty = folder(f".report.vtrain-staging-{dead}-89abcdef")
    live = folder(f".profile.vtrain-staging-{os.getpid()}-0123abcd", MARKER)
    unmarked = folder(f".profile.vtrain-staging-{dead}-fedcba98", "thesis.tex")
    other = folder(f".profile.{dead}-0123abcd", MARKER)
    backup = folder(f".report.vtrain-backup-{dead}-00112233", MARKER, "report.md")
    assert sorted(remove_stale_staging(tmp_path)) == sorted([stale, empty])
    assert live.exists() and unmarked.exists() and other.exists()
    assert not backup.exists() and (tmp_path / "report" / "report.md").is_file()  # put back


def test_a_staging_folder_locked_by_a_live_run_elsewhere_is_kept(tmp_path: Path) -> None:
    """A run in another PID namespace (a container sharing the volume) names its staging folder with a process id
    that is not running here: the next command's clean-up removed the live run's folder, and that run failed with
    "No such file or directory" (an audit, with `unshare --pid`). A live run holds a lock on its staging folder;
    a folder whose lock is held is kept, one whose lock is free (its run gone) is removed."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    held = tmp_path / f".profile.vtrain-staging-{dead}-0123abcd"
    held.mkdir()
    (held / MARKER).write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys, time
handle = os.open({str(held)!r}, os.O_RDONLY)
fcntl.flock(handle, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert remove_stale_staging(tmp_path) == [] and held.is_dir()
    finally:
        holder.kill()
        holder.wait()
    assert remove_stale_staging(tmp_path) == [held] and not held.exists()


def _published(target: Path, name: str) -> None:
    with staged(target, PROFILE) as staging:
        (staging / name).write_text(name)


def test_the_output_a_run_replaces_is_locked_while_it_is_kept_aside(tmp_path: Path) -> None:
    """The folder a new output replaces is moved aside (a backup) and, while a command may still put it back
    (:func:`~vtrain.outputs.restored_on_failure`), kept locked (:func:`~vtrain.outputs._in_use`: what a clean-up in
    another PID namespace, to which this process id means nothing, asks); it is put back when the command fails,
    the first output replaced, however many times the command published there since."""
    from vtrain.outputs import _in_use, restored_on_failure

    target = tmp_path / "out"
    _published(target, "old.parquet")
    with pytest.raises(InputError, match="the second output"):
        with restored_on_failure(target):
            _published(target, "new.parquet")
            [backup] = tmp_path.glob(".out.vtrain-backup-*")
            assert _in_use(backup)
            _published(target, "newer.parquet")  # the first replaced is still the one kept
            raise InputError("the second output was refused")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "old.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_new_output_the_user_added_to_is_kept_when_the_command_fails(tmp_path: Path) -> None:
    """The command failed after publishing, and the user had added notes to its new output meanwhile: removing that
    output to put the old one back removed the notes (a review). Both are kept, the old one beside it, said."""
    from vtrain.outputs import restored_on_failure

    target = tmp_path / "out"
    _published(target, "old.parquet")
    with pytest.warns(InputWarning, match="the output this run wrote is kept"), \
            pytest.raises(InputError, match="refused"):
        with restored_on_failure(target):
            _published(target, "new.parquet")
            (target / "notes.md").write_text("mine")
            raise InputError("refused")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "new.parquet", "notes.md"]
    [kept] = tmp_path.glob("out.replaced-*")
    assert sorted(p.name for p in kept.iterdir()) == [MARKER, "old.parquet"]
    assert remove_stale_staging(tmp_path) == [] and kept.is_dir()


def test_a_run_replaces_no_output_another_run_wrote_while_it_ran(tmp_path: Path) -> None:
    """Publishing checked only for files added since :func:`check_output`: `whatif -o W` and `ingest -o W` at once
    both exited 0, the profile replaced by the report; two `ingest -o D` at once, the second replaced the first
    (an audit). A folder whose marker changed since the check (another run published there) is left as it is."""
    target = tmp_path / "out"
    check_output(target)
    target.mkdir()  # another run (another process) publishes first
    (target / "theirs.parquet").write_text("x")
    mark(target, PROFILE, ["theirs.parquet"])
    with pytest.raises(InputError, match="written by another run while this one ran"):
        with staged(target, PROFILE) as mine:
            (mine / "mine.parquet").write_text("y")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "theirs.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging left
    with pytest.raises(InputError, match="written by another run"):  # a writer's second check sees it too
        check_output(target, force=True)
    forget_checks()  # the next command
    check_output(target, force=True)
    with staged(target, PROFILE) as mine:
        (mine / "mine.parquet").write_text("y")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "mine.parquet"]


def test_a_folder_someone_made_while_vtrain_ran_is_said_so(tmp_path: Path) -> None:
    """A folder made at the output while the run ran was kept (right), but the error said it held "an older
    vtrain's output, whose marker does not list what it wrote" (an audit)."""
    target = tmp_path / "out"
    check_output(target)
    with pytest.raises(InputError, match="made while vtrain ran, by someone else"):
        with staged(target, PROFILE) as mine:
            target.mkdir()
            (target / "notes.txt").write_text("mine\n")
            (mine / "mine.parquet").write_text("y")
    assert (target / "notes.txt").read_text() == "mine\n"


def test_staged_cleans_up_on_an_interrupt_and_removes_the_parents_it_made(tmp_path: Path) -> None:
    target = tmp_path / "reports" / "deep" / "result"
    with pytest.raises(KeyboardInterrupt), staged(target, PROFILE) as staging:
        (staging / "half.parquet").write_text("x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with staged(target, PROFILE) as staging:
        (staging / "whole.parquet").write_text("x")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "whole.parquet"]
    assert [p.name for p in target.parent.iterdir()] == ["result"]


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Ctrl-C handled as Python does by default (KeyboardInterrupt), whatever handler an earlier test or library
    left in place (the full suite once ran this test with Ctrl-C ignored: "DID NOT RAISE"), restored afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_interrupt_during_the_final_rename_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          python_sigint: None) -> None:
    """Ctrl-C while the new output replaces the old one (here: right after the old one was moved aside) arrives
    once the swap is done: never the old output moved aside and the new one not in place."""
    target = tmp_path / "result"
    with staged(target, PROFILE) as staging:
        (staging / "old.txt").write_text("old")
    remove = shutil.rmtree

    def interrupted_removal(path: Path, **kwargs: object) -> None:
        if ".vtrain-backup-" in Path(path).name:
            assert not target.with_name("old.txt").exists() and (target / "new.txt").exists()
            signal.raise_signal(signal.SIGINT)  # held: would otherwise raise KeyboardInterrupt here
        remove(path, **kwargs)

    monkeypatch.setattr("vtrain.outputs.shutil.rmtree", interrupted_removal)
    with pytest.raises(KeyboardInterrupt), staged(target, PROFILE) as staging:
        (staging / "new.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["result"]  # no backup, no staging folder


def test_a_stop_whose_exception_was_dropped_still_stops_the_run(tmp_path: Path) -> None:
    """Python drops an exception raised while a weakref callback runs (an import lock's, say), so Ctrl-C's exception
    can be lost mid-run (seen once in CI: ingest then finished, exit 0). The stop is remembered: the run's output is
    not published, and the run ends as interrupted. And Python's "Exception ignored in ..." with the stop's
    traceback is not printed (seen in CI under polars' 'DataTypeClass': `interrupted` came after a traceback)."""
    script = f"""
import os, signal, sys, weakref
sys.argv = ["vtrain", "ingest", {str(TRACES / 'hta-sm80-128rank-sampled')!r}, "-o", {str(tmp_path / 'result')!r}]
from vtrain.cli import main
class Ref:
    pass
def lose_it(_):
    os.kill(os.getpid(), signal.SIGINT)  # the handler's exception is raised here, and dropped
def lose_a_stop():
    anchor = Ref()
    reference = weakref.ref(anchor, lose_it)
    del anchor  # the callback runs, the signal arrives inside it
    return reference
run = main._run
def run_after_losing_a_stop(args):
    lose_a_stop()
    print("went on", file=sys.stderr)  # only where the stop's exception was lost
    run(args)
main._run = run_after_losing_a_stop
main.main()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=LIMIT_S)
    assert result.stderr.startswith("went on\n")  # the stop's exception was lost, as in the wild
    assert result.returncode == 130, result.stderr
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1] == "interrupted"
    assert not (tmp_path / "result").exists() and list(tmp_path.iterdir()) == []


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started that still run (Linux's /proc)."""
    found = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(each) for each in found.read_text().split()] if found.exists() else []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the worker processes in Linux's /proc")
@pytest.mark.parametrize("point", ["workers starting", "workers timing"])
def test_ctrl_c_to_the_terminals_group_stops_plan_and_its_workers_in_one_line(point: str, tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches every process of its group: the workers of `plan --workers 2` too, while they
    import (before, each printed its KeyboardInterrupt traceback) or time plans. One line, exit 130, no output, no
    worker left running."""
    out = tmp_path / "plans"
    process = subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", "plan", "examples/mtnlg-530b.json",
                                "--gpus", "..1024", "--profile", "profiles/a100", "--workers", "2", "-o", str(out)],
                               cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True, env={**os.environ, "VTRAIN_CACHE_DIR": str(tmp_path)})
    wait_for(process, lambda: len(_children(process.pid)) >= 3)  # the resource tracker and two workers
    if point == "workers timing":
        wait_for(process, after(4.0))
    workers = _children(process.pid)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=LIMIT_S)
    assert process.returncode == 130, (process.returncode, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.splitlines()[-1] == "interrupted" and err.count("interrupted") == 1, err
    assert not out.exists() and not hidden(tmp_path)
    deadline = time.monotonic() + 10
    while any(_running(each) for each in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [each for each in workers if _running(each)]
