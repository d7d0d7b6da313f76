"""Output folders never lose the user's data: an output that is, contains or lies in an input is refused before
anything is touched, `--force` replaces only folders vtrain wrote, and unwritable outputs are refused up front."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HTA_TRACE_SETS, REPO, vtrain_in_process

A100 = next(p for p in HTA_TRACE_SETS if "a100" in p.name)
RECORDED = REPO / "traces" / "t1p1d2"


def vtrain_process(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)


#: the commands run through their entry point in this process (tests/conftest.py: exit code, stdout and stderr as
#: a process gives them), sparing a second of start-up a call; ingest's first test and calibrate's run the command
#: as a real process (no other test runs calibrate as one)
vtrain = vtrain_in_process


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def traces(tmp_path: Path) -> Path:
    copy = tmp_path / "my-traces"
    shutil.copytree(A100, copy)
    return copy


def _refused(result: subprocess.CompletedProcess[str], words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and words in lines[0], result.stderr


@pytest.mark.parametrize("force", [False, True])
def test_ingest_into_its_own_trace_folder_is_refused(traces: Path, force: bool) -> None:
    before = _snapshot(traces)
    result = vtrain_process("ingest", traces, "-o", traces, *(["--force"] if force else []))
    _refused(result, "is the input")
    assert _snapshot(traces) == before
    assert sorted(p.name for p in traces.parent.iterdir()) == ["my-traces"]  # no staging folder either


def test_output_that_contains_the_input_is_refused(traces: Path) -> None:
    before = _snapshot(traces)
    _refused(vtrain("ingest", traces, "-o", traces.parent, "--force"), "contains the input")
    assert _snapshot(traces) == before


def test_force_replaces_only_what_vtrain_wrote(traces: Path, tmp_path: Path) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    _refused(vtrain("ingest", traces, "-o", mine, "--force"), "not written by vtrain")
    assert (mine / "thesis.tex").read_text() == "years of work"
    # another trace folder given as -o is the user's data too
    other = tmp_path / "other-traces"
    shutil.copytree(A100, other)
    before = _snapshot(other)
    _refused(vtrain("ingest", traces, "-o", other, "--force"), "not written by vtrain")
    assert _snapshot(other) == before
    # nor is a folder taken for vtrain's by the names in it: a metadata.json is a common name (it was replaced,
    # the notes beside it deleted, when a profile's or report's file names were read as vtrain's signature)
    (mine / "metadata.json").write_text("{}")
    (mine / "metrics.json").write_text("{}")
    _refused(vtrain("ingest", traces, "-o", mine, "--force"), "not written by vtrain")
    assert (mine / "thesis.tex").read_text() == "years of work"


def test_force_replaces_a_profile_vtrain_wrote(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "profile"
    assert vtrain("ingest", traces, "-o", out).returncode == 0
    _refused(vtrain("ingest", traces, "-o", out), "already exists")
    result = vtrain("ingest", traces, "-o", out, "--force")
    assert result.returncode == 0, result.stderr
    assert (out / "metadata.json").is_file() and (out / ".vtrain-output").is_file()


def test_output_that_is_a_file_or_under_a_file_is_refused(traces: Path, tmp_path: Path) -> None:
    a_file = tmp_path / "results.txt"
    a_file.write_text("keep me")
    _refused(vtrain("ingest", traces, "-o", a_file, "--force"), "not a folder")
    _refused(vtrain("ingest", traces, "-o", a_file / "profile"), "is a file")
    assert a_file.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_parent_is_refused(traces: Path, tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _refused(vtrain("ingest", traces, "-o", locked / "profile"), "permission denied")
    finally:
        locked.chmod(0o700)


def test_validate_report_into_the_trace_folder_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(RECORDED, copy)
    before = _snapshot(copy)
    _refused(vtrain("validate", copy, "-o", copy, "--no-hta"), "is the input")
    assert _snapshot(copy) == before


def test_simulate_output_over_its_own_config_folder_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(RECORDED, copy)
    before = _snapshot(copy)
    _refused(vtrain("simulate", copy / "run.yaml", "-o", copy, "--force"), "contains the input")
    _refused(vtrain("simulate", RECORDED / "run.yaml", "-o", copy, "--force"), "not written by vtrain")
    assert _snapshot(copy) == before


def test_calibrate_into_its_trace_folder_is_refused(traces: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    assert vtrain("ingest", traces, "-o", base).returncode == 0
    before = _snapshot(traces)
    _refused(vtrain_process("calibrate", traces, "--base", base, "-o", traces, "--force"), "is the input")
    assert _snapshot(traces) == before


def test_a_report_replaces_only_an_earlier_report(tmp_path: Path) -> None:
    """Report commands have no --force (their folder is rewritten on every run) and replaced any folder vtrain
    wrote: `vtrain validate traces/x -o profiles/x` put a report where the user's profile was, `-o` a recording
    replaced the traces (an audit, with `validate`, `validate --measurements`, `whatif` and `calibrate
    --report-dir`). Now a report replaces an earlier report, and a profile or recording is refused, untouched."""
    profile = tmp_path / "profile"
    assert vtrain("ingest", RECORDED, "-o", profile).returncode == 0
    before = _snapshot(profile)
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", profile), "holds vtrain's profile")
    _refused(vtrain("whatif", RECORDED, "--scale", "gemm=0.5", "-o", profile), "holds vtrain's profile")
    assert _snapshot(profile) == before
    report = tmp_path / "report"
    for _ in range(2):  # the second run replaces the first's report
        ran = vtrain("validate", RECORDED, "--no-hta", "-o", report)
        assert ran.returncode == 0, ran.stderr
    assert (report / "report.md").is_file()


def test_force_keeps_what_the_user_added_to_a_vtrain_folder(tmp_path: Path) -> None:
    """`--force` replaced a vtrain folder whole, with the notes and data a user had put in it since (an audit:
    `simulate -o out; echo notes > out/NOTES.md; simulate -o out --force` removed NOTES.md in silence). The
    marker lists what vtrain wrote; anything else makes the folder refused, named."""
    out = tmp_path / "out"
    config = REPO / "examples" / "tiny-cpu.yaml"
    assert vtrain("simulate", config, "-o", out).returncode == 0
    (out / "NOTES.md").write_text("mine\n")
    (out / "mydata").mkdir()
    _refused(vtrain("simulate", config, "-o", out, "--force"), "2 entries vtrain did not write (NOTES.md, mydata)")
    assert (out / "NOTES.md").read_text() == "mine\n"
    (out / "NOTES.md").unlink()
    (out / "mydata").rmdir()
    assert vtrain("simulate", config, "-o", out, "--force").returncode == 0


def test_folders_of_an_older_vtrain_are_kept(tmp_path: Path) -> None:
    """A marker of an older vtrain says neither the kind nor the entries: a folder with a report's files was taken
    for a report and replaced by the next, the notes a user had put beside it too (an audit: NOTES.md gone). What
    it wrote cannot be told from what was added since: the folder is refused, and kept; one with a profile's
    metadata is not a report either."""
    old_report, old_profile = tmp_path / "old-report", tmp_path / "old-profile"
    for folder, name in ((old_report, "report.md"), (old_profile, "metadata.json")):
        folder.mkdir()
        (folder / ".vtrain-output").write_text("written by vtrain; `--force` may replace this folder\n")
        (folder / name).write_text("{}\n")
    (old_report / "NOTES.md").write_text("mine\n")
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", old_report), "marker does not list what it wrote")
    assert (old_report / "NOTES.md").read_text() == "mine\n"
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", old_profile), "earlier vtrain output")
    assert (old_profile / "metadata.json").read_text() == "{}\n"


def test_what_a_user_put_anywhere_in_a_vtrain_folder_or_while_it_ran_is_kept(tmp_path: Path) -> None:
    """The marker listed only a folder's top level: a file a user put in a report's ``tables/`` was removed with the
    report by the next run, and one added while the command ran by the rename at its end (an audit: both gone).
    Now every file and folder vtrain wrote is listed, at any depth, and the folder is checked again before the new
    output replaces it: refused, named, kept, and no staging folder left. A marker of vtrain before this lists the
    top level only: its folders' contents cannot be told from a user's."""
    from vtrain.errors import InputError
    from vtrain.outputs import REPORT, check_output, staged

    target = tmp_path / "out"
    with staged(target, REPORT) as staging:
        (staging / "tables").mkdir()
        (staging / "tables" / "rows.parquet").write_text("vtrain's\n")
        (staging / "report.md").write_text("first\n")
    (target / "tables" / "mine.csv").write_text("mine\n")
    with pytest.raises(InputError, match=r"1 entries vtrain did not write \(tables/mine.csv\)"):
        check_output(target, replaces=REPORT)
    (target / "tables" / "mine.csv").unlink()
    check_output(target, replaces=REPORT)
    with pytest.raises(InputError, match=r"vtrain did not write \(added while vtrain ran\) \(NOTES.md\)"):
        with staged(target, REPORT) as staging:
            (staging / "report.md").write_text("second\n")
            (target / "NOTES.md").write_text("mine\n")
    assert (target / "NOTES.md").read_text() == "mine\n" and (target / "report.md").read_text() == "first\n"
    assert sorted(child.name for child in tmp_path.iterdir()) == ["out"]
    (target / "NOTES.md").unlink()
    (target / ".vtrain-output").write_text(json.dumps({"written_by": "vtrain", "kind": REPORT,
                                                       "entries": ["report.md", "tables"]}))
    with pytest.raises(InputError, match=r"tables/ \(what is in it is not listed\)"):
        check_output(target, replaces=REPORT)


def test_an_output_named_by_the_current_folder_is_that_folder(traces: Path, tmp_path: Path) -> None:
    """``-o .`` (or ``-o ""``, ``-o ..``) was a traceback in every command (a staging folder is named after its
    target, and ``.`` has no name; an audit). It is the folder it names: an empty one takes the output, one holding
    the input is refused in one line; a model's name given where a run config goes is no input folder of the
    plan's (it was "the output folder contains the input gpt-3-350m")."""
    empty = tmp_path / "empty"
    empty.mkdir()
    ran = vtrain("ingest", traces, "-o", ".", cwd=empty)
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert (empty / "metadata.json").is_file()
    _refused(vtrain("ingest", traces.name, "-o", "", cwd=traces.parent), "contains the input my-traces")
    _refused(vtrain("ingest", traces, "-o", "..", cwd=empty), "contains the input")
    planned = vtrain("plan", "gpt-3-350m", "--global-batch", "8", "--gpus", "1", "-o", ".", cwd=tmp_path)
    assert planned.returncode == 2 and "contains the input" not in planned.stderr, planned.stderr
    assert "Traceback" not in planned.stderr


def test_a_place_the_file_system_refuses_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`-o` where no folder can be made (under /proc), or on a full disk: a Python traceback and exit code 1
    before (found by an audit); one line and exit code 2 now, nothing left behind."""
    from vtrain.cli.main import _refused_by_the_file_system

    ran = vtrain_in_process("plan", "--layers", "2", "--hidden", "256", "--heads", "4", "--seq", "128", "--vocab",
                            "512", "--global-batch", "8", "--gpus", "2", "--device", "A100-80GB", "-o",
                            "/proc/vtrain-plans")
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.splitlines()[-1].endswith(": No such file or directory"), ran.stderr
    full = type("ComputeError", (Exception,), {"__module__": "polars.exceptions"})(
        "parquet: File out of specification: underlying IO error: No space left on device (os error 28)")
    assert _refused_by_the_file_system(full) == "the file system refused it: " + os.strerror(errno.ENOSPC)
    assert _refused_by_the_file_system(ValueError("(os error 28)")) is None  # not the file system's
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], capture_output=True).returncode:
        return  # no right to mount here: the full disk is the line above, polars' message
    try:
        ran = vtrain_in_process("plan", "examples/gpt-1.3b-a100.yaml", "--gpus", "16", "--profile", "profiles/a100",
                                "-o", tiny / "out")
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stderr.splitlines()[-1] == "error: the file system refused it: No space left on device"
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=True)


def test_a_file_of_a_vtrain_folder_a_user_edited_is_not_replaced(tmp_path: Path) -> None:
    """An edit to a report vtrain wrote (a note added to its report.md) was lost to the next `--force` (an audit):
    each file's content is stamped in the marker, and a changed file is refused, named and
    kept, as an added one is; an unchanged folder is replaced as before. (Stamped by content: a git checkout or a
    copy changes every modification time.)"""
    from vtrain.errors import InputError
    from vtrain.outputs import REPORT, check_output, staged

    target = tmp_path / "out"
    with staged(target, REPORT) as staging:
        (staging / "tables").mkdir()
        (staging / "tables" / "rows.csv").write_text("a,b\n")
        (staging / "report.md").write_text("first\n")
    check_output(target, replaces=REPORT)  # nothing changed: replaceable
    with (target / "tables" / "rows.csv").open("a") as edited:
        edited.write("1,2\n")
    with pytest.raises(InputError, match=r"1 file\(s\) changed since vtrain wrote them, or that its marker has no "
                                         r"stamp of \(tables/rows.csv\)"):
        check_output(target, replaces=REPORT)
    with pytest.raises(InputError, match="changed since vtrain wrote them"):
        check_output(target, force=True)
    assert (target / "tables" / "rows.csv").read_text() == "a,b\n1,2\n"


def test_a_report_replaces_no_other_commands_report(tmp_path: Path) -> None:
    """Every report command marked its folder "report", and each replaced any other's without --force: `whatif -o`
    a plan's folder replaced plans.parquet, plans.csv and the frontier (an audit). The marker names the command;
    another command's report is refused, untouched; the same command's is replaced."""
    plan = tmp_path / "plan"
    ran = vtrain("plan", REPO / "examples" / "tiny-cpu.yaml", "--gpus", "2", "--device-memory", "8", "-o", plan)
    assert ran.returncode == 0, ran.stderr
    before = _snapshot(plan)
    _refused(vtrain("whatif", RECORDED, "--scale", "gemm=0.5", "-o", plan), "holds vtrain's report of `vtrain plan`")
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", plan), "holds vtrain's report of `vtrain plan`")
    assert _snapshot(plan) == before
    report = tmp_path / "whatif"
    for _ in range(2):
        ran = vtrain("whatif", RECORDED, "--scale", "gemm=0.5", "-o", report)
        assert ran.returncode == 0, ran.stderr


def _calibrate_again_with_a_file_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, added_to: str,
                                       refusal: str) -> dict[str, dict[str, bytes]]:
    """Calibrate once, then again with ``--force`` while a user adds ``notes.md`` to the folder ``added_to``
    (``new``: the profile, ``report``: the drift report) once the report is written: the second run is refused with
    ``refusal``. The two outputs as the first run left them."""
    import vtrain.calibrate.calibration as calibration
    from vtrain.errors import InputError

    base, new, report = tmp_path / "base", tmp_path / "new", tmp_path / "report"
    assert vtrain("ingest", RECORDED, "-o", base).returncode == 0
    assert vtrain("calibrate", RECORDED, "--base", base, "-o", new, "--report-dir", report).returncode == 0
    before = {"new": _snapshot(new), "report": _snapshot(report)}
    write_report = calibration.write_drift_report

    def user_adds_a_file(result: object, staging: Path) -> None:
        write_report(result, staging)
        (tmp_path / added_to / "notes.md").write_text("mine\n")  # while the command runs

    monkeypatch.setattr(calibration, "write_drift_report", user_adds_a_file)
    result = calibration.calibrate(RECORDED, base, new, report_dir=report, force=True)
    with pytest.raises(InputError, match=refusal):
        calibration.write_calibration(result, force=True)
    assert (tmp_path / added_to / "notes.md").read_text() == "mine\n"
    return before


def test_calibrate_keeps_the_profile_it_would_replace_when_its_report_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate --force` published the new profile (the old one removed) inside the drift report's staging; when
    the report was then refused (a file added to its folder while it ran), the new profile was removed too: the
    user's profile was gone (an audit). The report is written first; the profile it would replace is untouched."""
    before = _calibrate_again_with_a_file_added(tmp_path, monkeypatch, "report", "added while vtrain ran")
    assert _snapshot(tmp_path / "new") == before["new"]


def test_calibrate_puts_back_the_report_it_replaced_when_its_profile_cannot_be_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate --force`, the profile refused after the drift report was published (a file added to the profile
    folder while it ran): the new report was removed, and the previous one, which it had replaced, was gone with
    it. Both outputs are left as they were."""
    before = _calibrate_again_with_a_file_added(tmp_path, monkeypatch, "new", "vtrain did not write")
    (tmp_path / "new" / "notes.md").unlink()
    assert {"new": _snapshot(tmp_path / "new"), "report": _snapshot(tmp_path / "report")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "new", "report"]  # no backup left


@pytest.mark.parametrize("layout", ["same", "profile inside", "report inside"])
def test_calibrates_two_outputs_are_never_one_inside_the_other(tmp_path: Path, layout: str) -> None:
    """`calibrate -o X --report-dir X` (X new) published the profile, then the report over it: exit 0, the
    profile gone; `-o X/prof --report-dir X` did all the work, then refused and left X behind (an audit: the
    check skipped outputs not there yet). Refused before any work, nothing made."""
    out = tmp_path / "x"
    profile, report = {"same": (out, out), "profile inside": (out / "prof", out),
                       "report inside": (out, out / "rep")}[layout]
    _refused(vtrain("calibrate", RECORDED, "--base", REPO / "profiles" / "a100", "-o", profile, "--report-dir",
                    report), "would be one inside the other")
    assert not out.exists()


def test_a_loop_of_links_as_the_output_is_one_line(tmp_path: Path) -> None:
    """An output that is a loop of links gave Python's "RuntimeError: Symlink loop" traceback, exit 1 (an
    audit: ingest -o, validate's default report folder, whatif)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    _refused(vtrain("ingest", RECORDED, "-o", tmp_path / "loop1", "--force"), "is a loop of links")
    _refused(vtrain("simulate", REPO / "examples" / "tiny-cpu.yaml", "-o", tmp_path / "loop1" / "x"),
             "is a loop of links")


def test_the_cache_removes_only_its_own_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache's trim removed every ``*.pickle`` in $VTRAIN_CACHE_DIR, oldest first: a user's 300 MB
    model-weights.pickle in the folder named there was deleted by a `simulate` (an audit)."""
    from vtrain import cache

    monkeypatch.setenv("VTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "MAX_CACHE_BYTES", 1)
    mine = tmp_path / "model-weights.pickle"
    mine.write_bytes(b"x" * 1000)
    os.utime(mine, (0, 0))  # the oldest
    cache.keep("a", "digest", list(range(1000)))
    cache.keep("b", "digest", list(range(1000)))
    assert mine.read_bytes() == b"x" * 1000
    assert len(list(tmp_path.glob("digest-*.pickle"))) == 1  # its own older entry went


def test_no_other_commands_force_replaces_a_recording(tmp_path: Path) -> None:
    """`ingest -o REC --force` replaced a `vtrain record` folder with a profile, `simulate -o REC --force` with
    predicted traces of the same kind (a recording turned into a prediction that looks like one): measured data
    lost to a flag meant for vtrain's derived outputs (an audit). Only `record --force` replaces a recording."""
    from vtrain.outputs import RECORDER, TRACES, staged

    recording = tmp_path / "rec"
    with staged(recording, TRACES, RECORDER) as staging:
        shutil.copytree(RECORDED, staging, dirs_exist_ok=True)
    before = _snapshot(recording)
    _refused(vtrain("ingest", RECORDED, "-o", recording, "--force"), "holds a recording")
    _refused(vtrain("simulate", RECORDED / "run.yaml", "-o", recording, "--force"), "holds a recording")
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", recording), "holds a recording")
    assert _snapshot(recording) == before


def _without_command(folder: Path) -> None:
    """Make ``folder``'s marker an older vtrain's, which did not name the command that wrote it."""
    written = json.loads((folder / ".vtrain-output").read_text())
    del written["command"]
    (folder / ".vtrain-output").write_text(json.dumps(written))


def test_outputs_of_an_older_vtrain_keep_their_protection(tmp_path: Path) -> None:
    """Markers written before they named the command: a recording was replaced by `simulate -o --force` (its
    measured trace by a predicted one), a plan's folder by `validate -o` (an audit). Traces of an older vtrain
    may be a recording: only `record --force` replaces them; a report is known by the file only its command
    writes (a plan's summary.json)."""
    from vtrain.outputs import RECORDER, TRACES, staged

    recording = tmp_path / "rec"
    with staged(recording, TRACES, RECORDER) as staging:
        shutil.copytree(RECORDED, staging, dirs_exist_ok=True)
    _without_command(recording)
    before = _snapshot(recording)
    _refused(vtrain("simulate", RECORDED / "run.yaml", "-o", recording, "--force"), "which may be a recording")
    assert _snapshot(recording) == before
    plan = tmp_path / "plan"
    ran = vtrain("plan", REPO / "examples" / "tiny-cpu.yaml", "--gpus", "2", "--device-memory", "8", "-o", plan)
    assert ran.returncode == 0, ran.stderr
    _without_command(plan)
    before = _snapshot(plan)
    _refused(vtrain("validate", RECORDED, "--no-hta", "-o", plan), "holds vtrain's report of `vtrain plan`")
    assert _snapshot(plan) == before


def test_a_marker_written_by_hand_never_gets_a_users_file_removed(tmp_path: Path) -> None:
    """A marker forged to list a user's file, without the stamps vtrain writes (``{"written_by": "vtrain", "kind":
    "profile", "files": ["thesis.tex"]}``), had `ingest --force` delete ``thesis.tex`` (an audit); one that is a
    named pipe hung the command. A file whose stamp is missing cannot be told unchanged: refused, kept."""
    from vtrain.outputs import MARKER

    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "thesis.tex").write_text("my thesis\n")
    (forged / MARKER).write_text(json.dumps({"written_by": "vtrain", "kind": "profile", "files": ["thesis.tex"]}))
    ran = vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", forged, "--force")
    assert ran.returncode == 2 and "thesis.tex" in ran.stderr and "stamps none of its files" in ran.stderr, \
        ran.stderr
    assert (forged / "thesis.tex").read_text() == "my thesis\n"
    piped = tmp_path / "piped"
    piped.mkdir()
    (piped / "notes.txt").write_text("mine\n")
    os.mkfifo(piped / MARKER)
    ran = vtrain_in_process("ingest", REPO / "traces" / "t1p1d2", "-o", piped, "--force")
    assert ran.returncode == 2 and (piped / "notes.txt").read_text() == "mine\n", ran.stderr


def test_the_shipped_outputs_can_be_rebuilt_and_an_older_vtrains_output_is_said(tmp_path: Path) -> None:
    """Markers without stamps (vtrain's before 2026-11-28) count their files as not known unchanged: the shipped
    profiles' had none, so `make profile-a100` (`fit -o profiles/a100 --force`) was refused (a review). Every shipped
    marker stamps its files now, and an older vtrain's output is refused as such, not as "changed since"."""
    from vtrain.errors import InputError
    from vtrain.outputs import MARKER, check_output

    shipped = [REPO / line for line in subprocess.run(["git", "ls-files", f"*{MARKER}"], cwd=REPO, capture_output=True,
                                                      text=True, check=True).stdout.split()]
    assert shipped
    for path in shipped:
        assert isinstance(json.loads(path.read_text()).get("stamps"), dict), path
    copy = tmp_path / "a100"
    shutil.copytree(REPO / "profiles" / "a100", copy)
    (copy / "README.md").unlink()  # as the Makefile does: put back after
    check_output(copy, force=True)
    written = json.loads((copy / MARKER).read_text())
    (copy / MARKER).write_text(json.dumps({key: value for key, value in written.items() if key != "stamps"}))
    with pytest.raises(InputError, match="output of a vtrain before 2026-11-28, whose marker stamps none of its"):
        check_output(copy, force=True)
