"""An output folder that is a mount point (``docker run -v out:/out ... vtrain ingest traces -o /out``, an audit):
it cannot be renamed, and the staging folder beside it lay on another file system than its contents, so the command
did all its work and then failed with a traceback (``OSError: [Errno 16] Device or resource busy``), even on an
empty volume. It is now written in place (:mod:`vtrain.outputs`): staged inside it, the old output (vtrain's own,
as its marker and stamps prove) moved aside inside it and removed only once the new one is in place; a user's file
there is never removed. Both a bind mount of a folder of the same file system (which :func:`os.path.ismount` does
not see: the audit's case) and a tmpfs (another file system) are tried. Mounting needs root: skipped without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, TRACES, vtrain_in_process
from vtrain.errors import InputError
from vtrain.outputs import MARKER, PROFILE, check_output, forget_checks, mark, publish, restored_on_failure, staged

RECORDED = TRACES / "t1p1d2"
PROFILE_FILES = {MARKER, "metadata.json", "kernels.parquet"}  # some of what a profile holds


def _mount(args: list[str]) -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture(params=["bind", "tmpfs"])
def mount_point(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """An empty mount point ``tmp_path/out``: a bind mount of ``tmp_path/volume`` or a tmpfs."""
    point = tmp_path / "out"
    point.mkdir()
    if request.param == "bind":
        (tmp_path / "volume").mkdir()
        args = ["--bind", str(tmp_path / "volume"), str(point)]
    else:
        args = ["-t", "tmpfs", "-o", "size=50m", "tmpfs", str(point)]
    if not _mount(args):
        pytest.skip("mounting is not permitted here (needs root)")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], check=True)


def names(folder: Path) -> set[str]:
    return {child.name for child in folder.iterdir()}


def left_behind(point: Path) -> list[str]:
    """vtrain's temporaries in the mount point or beside it."""
    return sorted(p.name for folder in (point, point.parent) for p in folder.iterdir()
                  if ".vtrain-" in p.name and p.name != MARKER)


def ingest(point: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return vtrain_in_process("ingest", RECORDED, "-o", point, *flags)


def test_an_empty_mount_point_takes_the_output(mount_point: Path) -> None:
    ran = ingest(mount_point)
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    assert PROFILE_FILES <= names(mount_point)
    assert json.loads((mount_point / MARKER).read_text())["kind"] == PROFILE
    assert left_behind(mount_point) == []
    shown = vtrain_in_process("tables", mount_point)
    assert shown.returncode == 0, shown.stderr


def test_force_replaces_only_vtrains_own_output_in_a_mount_point(mount_point: Path) -> None:
    assert ingest(mount_point).returncode == 0
    first = (mount_point / MARKER).read_text()
    again = ingest(mount_point)
    assert again.returncode == 2 and "--force" in again.stderr and "Traceback" not in again.stderr
    (mount_point / "kernels.parquet").write_bytes(b"stale")  # an edit: refused, not replaced
    refused = ingest(mount_point, "--force")
    assert refused.returncode == 2 and "changed since" in refused.stderr
    assert (mount_point / "kernels.parquet").read_bytes() == b"stale"
    (mount_point / "kernels.parquet").unlink()
    (mount_point / "old-only.parquet").write_text("x")  # stands for a file only the old output had
    mark(mount_point, PROFILE, sorted(n for n in names(mount_point) if n != MARKER))
    ran = ingest(mount_point, "--force")
    assert ran.returncode == 0, ran.stderr
    assert PROFILE_FILES <= names(mount_point) and "old-only.parquet" not in names(mount_point)
    assert json.loads((mount_point / MARKER).read_text())["files"] == json.loads(first)["files"]
    assert left_behind(mount_point) == []


def test_a_users_file_in_a_mount_point_is_never_removed(mount_point: Path) -> None:
    (mount_point / "thesis.tex").write_text("years of work")
    for flags in ((), ("--force",)):
        ran = ingest(mount_point, *flags)
        assert ran.returncode == 2 and "not written by vtrain" in ran.stderr and "Traceback" not in ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1
    assert names(mount_point) == {"thesis.tex"}
    (mount_point / "thesis.tex").unlink()
    assert ingest(mount_point).returncode == 0
    (mount_point / "notes.md").write_text("mine")  # beside vtrain's output now
    ran = ingest(mount_point, "--force")
    assert ran.returncode == 2 and "notes.md" in ran.stderr
    assert (mount_point / "notes.md").read_text() == "mine" and PROFILE_FILES <= names(mount_point)
    assert left_behind(mount_point) == []


def test_a_file_added_while_the_run_wrote_is_kept(mount_point: Path) -> None:
    """The folder is checked again just before the new output goes in: what the user added since stays."""
    forget_checks()
    check_output(mount_point)
    with pytest.raises(InputError, match="did not write"), staged(mount_point, PROFILE) as staging:
        (staging / "new.parquet").write_text("new")
        (mount_point / "thesis.tex").write_text("years of work")
    assert names(mount_point) == {"thesis.tex"}


def test_an_interrupt_leaves_nothing_in_a_mount_point(mount_point: Path) -> None:
    forget_checks()
    check_output(mount_point)
    with pytest.raises(KeyboardInterrupt), staged(mount_point, PROFILE) as staging:
        assert staging.parent == mount_point  # staged inside, on the mount's file system
        (staging / "half.parquet").write_text("half")
        raise KeyboardInterrupt
    assert names(mount_point) == set() and left_behind(mount_point) == []


def test_a_failed_command_puts_the_old_output_back_in_a_mount_point(mount_point: Path) -> None:
    forget_checks()
    with staged(mount_point, PROFILE) as staging:
        (staging / "old.parquet").write_text("old")
    forget_checks()
    check_output(mount_point, force=True)
    with pytest.raises(InputError, match="refused"), restored_on_failure(mount_point):
        with staged(mount_point, PROFILE) as staging:
            (staging / "new.parquet").write_text("new")
        assert names(mount_point) >= {"new.parquet"} and "old.parquet" not in names(mount_point)
        raise InputError("refused")
    assert names(mount_point) == {MARKER, "old.parquet"}
    assert left_behind(mount_point) == []


def test_a_killed_runs_half_moved_output_is_settled_by_the_next_run(mount_point: Path) -> None:
    """SIGKILL while the entries were being moved: the next check finishes the move (the backup holds the old
    marker, the staging folder still the new one) and removes the temporaries; a user's file is left alone."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    backup = mount_point / f".vtrain-inplace-backup-{dead}-0123abcd"
    staging = mount_point / f".vtrain-inplace-staging-{dead}-0123abcd"
    for folder, files in ((backup, ["old.parquet"]), (staging, ["b.parquet"])):
        folder.mkdir()
        for name in files:
            (folder / name).write_text(name)
        mark(folder, PROFILE, files)
    (mount_point / "a.parquet").write_text("a.parquet")  # moved in before the kill
    marked = json.loads((staging / MARKER).read_text())
    marked["files"], marked["entries"] = ["a.parquet", "b.parquet"], ["a.parquet", "b.parquet"]
    marked["stamps"]["a.parquet"] = hashlib.sha256(b"a.parquet").hexdigest()
    (staging / MARKER).write_text(json.dumps(marked))
    forget_checks()
    check_output(mount_point, force=True)
    assert names(mount_point) == {MARKER, "a.parquet", "b.parquet"}
    stale = mount_point / f".vtrain-inplace-staging-{dead}-89abcdef"  # a user's look-alike: no marker
    stale.mkdir()
    (stale / "thesis.tex").write_text("years of work")
    mark(mount_point, PROFILE, ["a.parquet", "b.parquet"])
    ran = ingest(mount_point, "--force")
    assert ran.returncode == 0, ran.stderr
    assert (stale / "thesis.tex").read_text() == "years of work"
    assert PROFILE_FILES <= names(mount_point) and "a.parquet" not in names(mount_point)


def test_an_output_staged_beside_a_mount_point_is_moved_in(mount_point: Path) -> None:
    """A torchrun recording stages beside its output (``record/launcher.py``), on the parent's file system: its
    entries are moved onto the mount's file system first, then published in place."""
    forget_checks()
    check_output(mount_point)
    beside = mount_point.parent / ".out.partial-run"
    (beside / "sub").mkdir(parents=True)
    (beside / "sub" / "rank-0.json.gz").write_text("trace")
    mark(beside, "traces", command="record")
    publish(mount_point, beside)
    assert names(mount_point) == {MARKER, "sub"} and (mount_point / "sub" / "rank-0.json.gz").read_text() == "trace"
    assert json.loads((mount_point / MARKER).read_text())["files"] == ["sub", "sub/rank-0.json.gz"]
    assert left_behind(mount_point) == []


def test_the_repository_is_not_a_mount_point() -> None:
    """The in-place path is taken for mount points only: an ordinary folder is still staged beside it."""
    from vtrain.outputs import _is_mount

    assert not _is_mount(REPO / "vtrain") and not _is_mount(REPO / "missing")


@pytest.mark.parametrize("options", ["size=600k", "ro,size=1m"])
def test_a_full_or_read_only_file_system_is_named(options: str, tmp_path: Path) -> None:
    """A full disk said "the file system refused it: No space left on device" (naming no file; polars' refusal of
    ingest's tables, an OSError of no number, was a traceback), a read-only one "permission denied" (an audit). The
    output is named, the read-only file system said, and nothing is left."""
    point = tmp_path / "small"
    point.mkdir()
    if not _mount(["-t", "tmpfs", "-o", options, "tmpfs", str(point)]):
        pytest.skip("mounting is not permitted here (needs root)")
    try:
        for command in (["ingest", REPO / "traces" / "t1p2d1"], ["validate", REPO / "traces" / "t1p1d2", "--no-hta"]):
            ran = vtrain_in_process(*command, "-o", point / "out")
            assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
            said = ": No space left on device" if "ro" not in options else \
                ": cannot write here (a read-only file system)"  # after the place, cut where its name is long
            line = ran.stderr.splitlines()[-1]
            assert line.startswith(f"error: {str(point)[:40]}") and line.endswith(said), ran.stderr
            assert "the file system refused it" not in line
            assert not list(point.iterdir())
    finally:
        subprocess.run(["umount", str(point)], check=True)
