"""Where vtrain may write: one check for every output folder, made before any work starts.

A command's output folder (a profile, a report, a recording, predicted traces) is refused when

- it is, contains or lies inside one of the command's inputs (``vtrain ingest traces/x -o traces/x --force`` would
  otherwise replace the user's traces with a profile);
- it exists and is not a folder, or the nearest existing folder above it is not writable, or a parent is a file;
- it exists and is not empty, unless ``--force`` is given, and even then only when vtrain wrote it: a folder
  holding :data:`MARKER` (written into every output folder). A folder is not taken for vtrain's by the names of
  the files in it (a ``metadata.json`` is a common name: a user's folder holding one and their notes was replaced).
  The marker names what vtrain wrote: the kind of output (:data:`KINDS`) and every file and folder it put in the
  folder, at any depth. A report command, which has no ``--force`` (its report folder is rewritten on every run),
  replaces only an earlier *report* of its own (``vtrain validate traces/x -o profiles/x`` replaced the profile,
  ``vtrain whatif ... -o plans/x`` a plan's tables: the marker names the command that wrote it); and neither
  it nor ``--force`` ever removes what someone added to a vtrain folder since (their notes beside a report, a file
  in its ``tables/``, one added while the command ran): such a folder is refused, naming them, before the work and
  again before the new output replaces it. A folder whose marker lists nothing (an older vtrain's) or lists its
  top level only (its subfolders' contents unknown) cannot be told apart from what a user added, and is refused.

An output given as a link to a folder is checked and written where the link points; the link itself stays.

Every writer stages its folder beside the target with :func:`staged` and renames it into place
(``tables/store.py``, every report command, ``simulate/chrome_trace.py``, ``record/launcher.py``); the staging
folder is marked with :func:`mark` so that a later ``--force`` may replace it. A staging folder is named
``.<target>.vtrain-staging-<pid>-<token>`` and locked by its run while it lives: when a run is killed (SIGKILL,
power loss) its staging folder stays behind, and the next :func:`check_output` in that folder removes it,
recognised by that name, by the marker in it, by its process being gone and by its lock being free (a process id
says nothing across PID namespaces: containers sharing a volume). Nothing else is ever removed. The new output
replaces only what :func:`check_output` allowed: a folder another run published meanwhile is left as it is.

A target that is a mount point (``docker run -v out:/out ... -o /out``; :func:`_is_mount`) cannot be renamed, and
its contents lie on another file system than its parent: its output is written *in place*. The staging folder is
made inside it (``.vtrain-inplace-staging-<pid>-<token>``, locked and marked as above); once complete, the previous
output's entries (what :func:`check_output` allowed: vtrain's own, as its marker and stamps prove) are moved into
``.vtrain-inplace-backup-<pid>-<token>`` in it, marker last, and the staged entries into the folder, marker last; the
backup is removed only then. Anything else in the folder is never moved or removed (it is refused, as in any
folder). A run killed (SIGKILL) between those moves leaves them locked by nobody: the next :func:`check_output` of
that folder finishes or undoes them (:func:`_recover_in_place`), by which marker has moved.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vtrain.errors import InputError, os_error_number, raise_if_stopped, some_of, stops_deferred, warn_input

#: a file in every folder vtrain writes; ``--force`` replaces only folders that hold it
MARKER = ".vtrain-output"
#: the kinds of output folder: a profile (tables), recorded or predicted traces, a report (validate, whatif,
#: calibrate's drift report, plan, cluster, size)
PROFILE, TRACES, REPORT = "profile", "traces", "report"
KINDS = (PROFILE, TRACES, REPORT)
#: the command whose output is a measurement: no other command's ``--force`` replaces it
RECORDER = "record"


#: what each output folder's marker said when :func:`check_output` allowed it (None: no marker, or no folder), so
#: that :func:`publish` replaces only that: two runs writing one folder at once replaced each other's output
_SEEN: dict[Path, str | None] = {}
_WRITTEN_MEANWHILE = ("output folder was written by another run while this one ran (it is left as that run wrote "
                      "it): give another -o")
#: a report of a vtrain that did not name the command in its marker: the command, by the file only it writes
_REPORT_FILES = {"summary.json": "plan", "schedule.json": "cluster", "size.json": "size", "whatif.json": "whatif",
                 "drift.json": "calibrate", "metrics.json": "validate"}

#: a staging (or, while renaming, backup) folder: ``.<target name>.vtrain-<kind>-<pid>-<token>``
_STAGING = re.compile(r"^\..+\.vtrain-(staging|backup)-(?P<pid>[1-9][0-9]{0,9})-[0-9a-f]{8}$")
#: a staging or backup folder inside a mount point written in place: ``.vtrain-inplace-<kind>-<pid>-<token>``
_IN_PLACE = re.compile(r"^\.vtrain-inplace-(?P<kind>staging|backup)-(?P<pid>[1-9][0-9]{0,9})"
                       r"-(?P<token>[0-9a-f]{8})$")
_NOT_RENAMEABLE = ("output folder cannot be renamed (a mount point: a Docker volume?) and was not recognised as one: "
                   "give a folder inside it as -o")


def check_output(target: str | Path, *, inputs: Iterable[str | Path | None] = (), force: bool = False,
                 what: str = "output folder", replaces: str | None = None, command: str | None = None,
                 option: str = "-o") -> Path:
    """Raise :class:`InputError` when ``target`` may not be written (see the module docstring); returns it.
    ``replaces``: the kind of earlier output (:data:`KINDS`) that is replaced without ``force``, when ``command``
    wrote it (or a vtrain that did not say which command did); ``option``: the flag that gave ``target``, which the
    error's advice names."""
    target = Path(target)
    try:
        _check_not_an_input(target, inputs, what)
        target = followed(target)
        in_place = _is_mount(target)
        if in_place:
            _check_writable_mount(target)
            _recover_in_place(target)
        if target.exists() or target.is_symlink():
            _check_replaceable(target, force, what, replaces, command)
    except InputError as refused:
        if option == "-o":
            raise
        raise InputError(str(refused).replace("give another -o", f"give another {option}")) from None
    if not in_place:
        _check_writable_parent(target)
    remove_stale_staging(target.absolute().parent)
    key, seen = target.absolute(), _marker_text(target)
    if _SEEN.get(key, seen) != seen:  # checked again by the writer, and changed since its command's first check
        raise InputError(_WRITTEN_MEANWHILE, target)
    _SEEN[key] = seen
    return target


def forget_checks() -> None:
    """Forget what earlier :func:`check_output` calls saw: a command starts afresh (several run in one process)."""
    _SEEN.clear()


def write_text(path: Path, text: str) -> None:
    """A report's text as UTF-8. A path the system gave with bytes that are no UTF-8 (a Latin-1 folder name from an
    old host or an archive) holds them as lone surrogates, which UTF-8 cannot write: they are written as ``\\udcff``
    escapes, as the error lines show them, rather than failing the report once its work is done."""
    path.write_text(text, encoding="utf-8", errors="backslashreplace")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """JSON with NaN and infinities written as null (they are not JSON)."""
    path.write_text(json.dumps(_finite(data), indent=2) + "\n")


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def mark(folder: Path, kind: str, files: list[str] | None = None, command: str | None = None) -> None:
    """Label ``folder`` (a staging folder) as vtrain's output of ``kind`` written by ``command``, holding ``files``
    (every file and folder at any depth, as :func:`_listing` gives them; None: not known yet, :func:`publish` lists
    them). ``entries``, the top level, is what vtrain before 2026-11-28 listed and read."""
    entries = None if files is None else sorted({name.split("/")[0] for name in files})
    stamps = None if files is None else {name: _stamp(folder / name) for name in files
                                         if (folder / name).is_file() and not (folder / name).is_symlink()}
    (folder / MARKER).write_text(json.dumps({"written_by": "vtrain", "kind": kind, "command": command,
                                             "entries": entries,
                                             "files": files, "stamps": stamps,
                                             "note": "`--force` may replace this folder"}) + "\n")


def _stamp(path: Path) -> str:
    """A file's content as a SHA-256 digest: what an edit changes and a copy or a git checkout keeps (a
    modification time would not be kept)."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _marker_text(folder: Path) -> str | None:
    """The text of ``folder``'s marker, None without one (or without the folder)."""
    try:
        return _regular_text(folder / MARKER)
    except OSError:
        return None


def _regular_text(path: Path) -> str:
    """The text of a marker that is a regular file; one that is not (a named pipe, whose reading never ends; a
    device) reads as a marker of no known kind (:func:`marker`)."""
    if not stat.S_ISREG(path.stat().st_mode):
        return ""
    return path.read_text(errors="replace")


def marker(folder: Path) -> dict[str, Any] | None:
    """What ``folder``'s marker says (``kind``, ``entries``), None when it has none. The marker of an older vtrain
    said neither: its folder is a report when it holds a report's files and none of a profile's or a recording's,
    else of no known kind (either way it lists nothing vtrain wrote: nothing replaces it)."""
    try:
        text = _regular_text(folder / MARKER)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        return data
    names = {child.name for child in folder.iterdir()}
    looks_like_report = names & {"report.md", "suite.md"} and not names & {"metadata.json", "run.yaml"}
    return {"kind": REPORT} if looks_like_report else {}


@contextmanager
def staged(target: Path, kind: str, command: str | None = None) -> Iterator[Path]:
    """Yield an empty staging folder beside ``target``, marked as vtrain's ``kind`` of output written by
    ``command`` (a report's: another command's report is not replaced without ``--force``); when the block
    ends without error it replaces
    ``target`` (which :func:`check_output` must have allowed), on any error or interrupt it is removed, with the
    parent folders this call created."""
    target = followed(target)
    if _is_mount(target):  # written in place: staged inside it, on its file system (see the module docstring)
        created, staging = [], _inside(target, "staging")
    else:
        created, staging = _make_parents(target.absolute().parent), _sibling(target, "staging")
    lock = None
    try:
        staging.mkdir()
        lock = _locked(staging)
        mark(staging, kind, command=command)
        yield staging
        raise_if_stopped()  # a stopped run is never published, even if its stop's exception was dropped
        publish(target, staging)
    except BaseException as failed:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in created:  # innermost first; only if still empty
            _remove_if_empty(folder)
        if isinstance(failed, OSError) and failed.filename is None:  # a write's refusal names no file (a full disk,
            raise _naming(failed, target) from None  # a size limit): the output it was writing is its place
        raise
    finally:
        if lock is not None:
            os.close(lock)


#: the outputs whose replaced folder is kept aside until the command is done (:func:`restored_on_failure`): the
#: backup published over and the descriptor of its lock (``(None, None)``: nothing replaced), ``None`` before the
#: output is published
_HELD: dict[Path, tuple[Path | None, int | None] | None] = {}


@contextmanager
def restored_on_failure(target: Path) -> Iterator[None]:
    """Within the block, the first output this run publishes at ``target`` (:func:`staged`) keeps the folder it
    replaces aside, locked; when the block ends in an error or an interrupt, the new output is removed and the old
    one put back, so that a command writing two outputs, the second refused, leaves the first as it was (calibrate's
    drift report, then its profile: the previous report was lost when the profile was refused); otherwise the old
    one is removed. A new output the user has added to or edited since is not removed: both are kept, said."""
    key = followed(target).absolute()
    _HELD[key] = None
    try:
        yield
    except BaseException:
        with stops_deferred():
            held = _HELD.pop(key, None)
            if held is not None:
                try:
                    _put_back(key, held[0])
                finally:
                    _unlock(held[1])
        raise
    held = _HELD.pop(key, None)
    if held is not None and held[0] is not None:
        shutil.rmtree(held[0], ignore_errors=True)
        _unlock(held[1])


def _put_back(target: Path, backup: Path | None) -> None:
    """Remove the output this run published at ``target`` and rename ``backup`` (what it replaced, if anything)
    back; where the user added to or edited the new output since, keep both (the backup beside it) and warn."""
    if _is_mount(target):
        _put_back_in_place(target, backup)
        return
    written = marker(target) or {}
    if _added_since(target, written) or _changed_since(target, written):
        if backup is not None:  # a name no clean-up takes for a dead run's staging
            kept = backup.rename(target.with_name(f"{target.name}.replaced-{secrets.token_hex(4)}"))
            warn_input(f"the output this run wrote is kept, for files added to or edited in it since, and the one "
                       f"it replaced beside it, as {kept.name}", target)
        return
    shutil.rmtree(target)
    if backup is not None:
        backup.rename(target)


def _unlock(handle: int | None) -> None:
    if handle is not None:
        os.close(handle)


def remove_stale_staging(folder: Path) -> list[Path]:
    """Remove the staging folders that killed vtrain runs left in ``folder``; returns them.

    A folder is removed only when its name is a staging name, it holds the marker (or nothing at all: killed
    between creating and marking it) and the process named in it is no longer running. A stale *backup* (the old
    output, moved aside while the new one was renamed in) is put back when its target is missing."""
    removed: list[Path] = []
    try:
        children = list(folder.iterdir())
    except OSError:
        return removed
    for child in children:
        match = _STAGING.match(child.name)
        if match is None or not child.is_dir() or child.is_symlink() or _running(int(match["pid"])) or _in_use(child):
            continue
        try:
            names = {grandchild.name for grandchild in child.iterdir()}
        except OSError:  # not ours to read, so not ours to remove
            continue
        if names and MARKER not in names:
            continue
        target = folder / child.name[1:].rsplit(".vtrain-", 1)[0]
        if match[1] == "backup" and not target.exists():
            child.rename(target)
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed


def resolved(path: Path) -> Path:
    """``path`` with every link followed (:meth:`Path.resolve`); a loop of links is bad input, not a traceback."""
    try:
        return path.resolve()
    except RuntimeError:  # Python 3.11-3.12 raise it for a loop (3.13: OSError ELOOP, refused as the system's)
        raise InputError("is a loop of links", path) from None


def check_apart(first: Path, second: Path, what: str, option: str) -> None:
    """Raise :class:`InputError` when two outputs of one command are one folder or one inside the other, whether
    or not they exist yet (publishing the second would replace, or write into, the first)."""
    one, other = resolved(first), resolved(second)
    if one == other or one in other.parents or other in one.parents:
        raise InputError(f"the {what} and {first} would be one inside the other; give another {option}", second)


def followed(target: Path) -> Path:
    """``target``, or the folder it links to: an output given as a link to a folder is written there and the link
    is kept (renaming the link aside left it behind as a backup, and the old output where it pointed). A target
    of no name of its own (``-o .``, ``-o ..``, ``-o ""``) is the folder it names (a staging folder is named after
    its target: ``.`` had none, a traceback)."""
    if target.name in ("", ".."):
        return resolved(target)
    return resolved(target) if target.is_symlink() and target.is_dir() else target


def _added_since(folder: Path, written: dict[str, Any]) -> list[str]:
    """The files and folders in ``folder``, at any depth, that its marker does not list. A marker that lists only
    the top level (vtrain's before 2026-11-28): its unlisted entries, and its listed folders, whose contents it does
    not list."""
    files, entries = written.get("files"), written.get("entries")
    if isinstance(files, list):
        return sorted(set(_listing(folder)) - set(map(str, files)))
    listed = set(map(str, entries)) if isinstance(entries, list) else set()
    return sorted(child.name + ("/ (what is in it is not listed)" if child.name in listed else "")
                  for child in _entries(folder) if child.name != MARKER
                  and (child.name not in listed or (child.is_dir() and not child.is_symlink())))


def _listing(folder: Path) -> list[str]:
    """Every file and folder in ``folder`` at any depth (links not followed), as paths relative to it, but the
    marker."""
    found = []
    skipped = _temporaries(folder)
    for root, folders, files in os.walk(folder):
        base = Path(root).relative_to(folder)
        if base == Path("."):
            folders[:] = [name for name in folders if name not in skipped]
            files = [name for name in files if name not in skipped]
        found += [(base / name).as_posix() for name in (*folders, *files)]
    return sorted(name for name in found if name != MARKER)


def _check_not_an_input(target: Path, inputs: Iterable[str | Path | None], what: str) -> None:
    place = resolved(target)
    for given in inputs:
        if given is None or not Path(given).exists():  # nothing there to overwrite (a model's name, not a path)
            continue
        source = resolved(Path(given))
        if place == source:
            raise InputError(f"the {what} is the input {given}; give another -o", target)
        if place in source.parents:
            raise InputError(f"the {what} contains the input {given}; give another -o", target)
        if source in place.parents:
            kind = "file" if source.is_file() else "folder"
            raise InputError(f"the {what} would lie inside the input {kind} {given} (nothing is ever written into "
                             f"an input); give another -o", target)


def _check_replaceable(target: Path, force: bool, what: str, replaces: str | None, command: str | None) -> None:
    if not target.is_dir():
        raise InputError(f"the {what} exists and is not a folder", target)
    if not _entries(target):
        return
    written = marker(target)
    if written is None:
        raise InputError(f"{what} exists and was not written by vtrain: "
                         + ("--force replaces only vtrain's own output; give another -o" if force
                            else "give another -o"), target)
    kind, writer = written.get("kind"), written.get("command") or _older_writer(target, written.get("kind"))
    if writer == RECORDER and command != RECORDER:
        held = ("a recording (`vtrain record`'s measured traces)" if written.get("command") else
                "traces of an older vtrain, which may be a recording (its marker does not say)")
        raise InputError(f"{what} holds {held}, which only `vtrain record --force` replaces: give another -o, or "
                         f"remove it yourself", target)
    if not force and (replaces is None or kind != replaces or writer not in (None, command)):
        held = f"it holds vtrain's {kind}" if kind in KINDS else "it holds an earlier vtrain output"
        held += f" of `vtrain {writer}`" if writer else ""
        advice = "use --force to replace it" if replaces is None else "give another -o, or remove it first"
        raise InputError(f"{what} already exists ({held}; {advice})", target)
    _refuse_added(target, written, what)


def _older_writer(folder: Path, kind: Any) -> str | None:
    """The command that wrote an older vtrain's output, whose marker does not say: a report's by the file only that
    command writes (None if none is there); traces may be a recording, and are taken for one."""
    if kind == TRACES:
        return RECORDER
    if kind != REPORT:
        return None
    names = {child.name for child in folder.iterdir()}
    return next((command for file, command in _REPORT_FILES.items() if file in names), None)


def _refuse_added(target: Path, written: dict[str, Any], what: str, when: str = "") -> None:
    """Raise where ``target`` holds files or folders its marker (``written``) does not list (:func:`_added_since`)."""
    if not isinstance(written.get("files"), list) and not isinstance(written.get("entries"), list):
        raise InputError(f"{what} holds an older vtrain's output, whose marker does not list what it wrote (its files "
                         "cannot be told from ones added since): remove it first or give another -o", target)
    if added := _added_since(target, written):
        raise InputError(f"{what} holds {len(added)} entries vtrain did not write{when} ({some_of(added)}): "
                         "replacing it would remove them; move them out or give another -o", target)
    if (changed := _changed_since(target, written)) and not isinstance(written.get("stamps"), dict):
        raise InputError(f"{what} is the output of a vtrain before 2026-11-28, whose marker stamps none of its files "
                         f"({some_of(changed)}): vtrain cannot tell them unchanged since, so it does not replace "
                         "them; remove the folder yourself or give another -o", target)
    if changed:
        raise InputError(f"{what} holds {len(changed)} file(s) changed since vtrain wrote them{when}, or that its "
                         f"marker has no stamp of ({some_of(changed)}): replacing it could lose them; move them out "
                         "or give another -o", target)


def _changed_since(folder: Path, written: dict[str, Any]) -> list[str]:
    """The files of ``folder`` vtrain cannot tell unchanged since it wrote them: a content not what its marker
    stamped (an edit since), or no stamp at all (a marker of vtrain's before 2026-11-28, or one written by hand: a
    marker forged to list a user's ``thesis.tex`` had ``--force`` delete it)."""
    stamps = written.get("stamps") if isinstance(written.get("stamps"), dict) else {}
    return sorted(name for name in _listing(folder)
                  if (folder / name).is_file() and not (folder / name).is_symlink()
                  and (name not in stamps or _stamp(folder / name) != stamps[name]))


def _check_writable_parent(target: Path) -> None:
    parent = target.absolute().parent
    while not parent.exists():
        if parent.is_symlink():
            raise InputError("a parent of the output is a broken link", parent)
        parent = parent.parent
    if not parent.is_dir():
        raise InputError("a parent of the output is a file, not a folder", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(_not_writable(parent), parent)


def _sibling(target: Path, kind: str) -> Path:
    return target.with_name(f".{target.name}.vtrain-{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def publish(target: Path, staging: Path) -> None:
    """Rename ``staging`` to ``target``; an existing target is moved aside first and removed after. Ctrl-C and
    SIGTERM wait until this is done (they arrive right after), so an interrupt never leaves the old output moved
    aside and the new one not yet in place."""
    target = followed(target)
    written = marker(staging) or {}
    mark(staging, str(written.get("kind", "")), _listing(staging), written.get("command"))
    with stops_deferred():
        if _is_mount(target):
            _publish_in_place(target, staging)
            return
        if not (target.exists() or target.is_symlink()):
            staging.rename(target)
            _SEEN[target.absolute()] = _marker_text(target)  # this run's own output now
            if _HELD.get(target.absolute(), "") is None:
                _HELD[target.absolute()] = (None, None)
            return
        current = _marker_text(target)
        if _SEEN.get(target.absolute(), current) != current:
            raise InputError(_WRITTEN_MEANWHILE, target)
        if target.is_dir() and any(target.iterdir()):  # what was added since check_output, the new output unwritten
            written = marker(target)
            if written is None:
                raise InputError("output folder was made while vtrain ran, by someone else (it holds files vtrain "
                                 "did not write): move them out or give another -o", target)
            _refuse_added(target, written, "output folder", " (added while vtrain ran)")
        backup = _sibling(target, "backup")
        lock = _locked(target)  # taken before the rename: no clean-up elsewhere takes the backup for a dead run's
        try:
            try:
                target.rename(backup)
            except OSError as failed:  # a mount point /proc/self/mountinfo did not show
                if failed.errno in (errno.EBUSY, errno.EXDEV):
                    raise InputError(_NOT_RENAMEABLE, target) from None
                raise
            try:
                staging.rename(target)
            except OSError:
                backup.rename(target)
                raise
        except BaseException:
            _unlock(lock)
            raise
        _SEEN[target.absolute()] = _marker_text(target)
        if _HELD.get(target.absolute(), "") is None:  # the first replaced, kept aside (:func:`restored_on_failure`)
            _HELD[target.absolute()] = (backup, lock)
        else:
            shutil.rmtree(backup, ignore_errors=True)
            _unlock(lock)


def _is_mount(folder: Path) -> bool:
    """Whether ``folder`` is a mount point (a Docker volume, a bind mount, a tmpfs), which cannot be renamed: by
    :func:`os.path.ismount`, which does not see a bind mount of a folder of the same file system, or by the
    mount table (``/proc/self/mountinfo``), which does."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return False
        if os.path.ismount(folder):
            return True
        place = os.path.realpath(folder)
    except (OSError, ValueError):
        return False
    try:
        lines = Path("/proc/self/mountinfo").read_text(errors="surrogateescape").splitlines()
    except OSError:
        return False
    return any(_unescaped(fields[4]) == place for fields in (line.split(" ") for line in lines) if len(fields) > 4)


def _unescaped(text: str) -> str:
    """A path of the mount table, whose space, tab, newline and backslash are written as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda found: chr(int(found[1], 8)), text)


def _check_writable_mount(target: Path) -> None:
    """A mount point is written in place: it must be writable itself (its parent, ``/`` in a container, need not)."""
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(_not_writable(target), target)


def _naming(failed: OSError, target: Path) -> OSError:
    """A write's refusal that names no file, naming ``target``: Python's with its number, polars' (whose number is
    in its text: ``(os error 28)``) as Python's."""
    number = os_error_number(failed)
    return failed if number is None else OSError(number, os.strerror(number), str(target))


def _not_writable(folder: Path) -> str:
    """Why a folder cannot be written: its file system mounted read-only, or its permissions."""
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    return "cannot write here (a read-only file system)" if read_only else "cannot write here (permission denied)"


def _inside(target: Path, kind: str, token: str | None = None) -> Path:
    """A staging or backup folder inside the mount point ``target`` (:data:`_IN_PLACE`)."""
    return target / f".vtrain-inplace-{kind}-{os.getpid()}-{token or secrets.token_hex(4)}"


def _temporaries(folder: Path) -> frozenset[str]:
    """The staging and backup folders of runs writing the mount point ``folder`` in place: no part of its output
    (nothing where ``folder`` is no mount point)."""
    try:
        if not _is_mount(folder):
            return frozenset()
        return frozenset(child.name for child in folder.iterdir() if _IN_PLACE.match(child.name))
    except OSError:
        return frozenset()


def _entries(folder: Path) -> list[Path]:
    """What ``folder`` holds, but for the staging and backup folders of runs writing it in place."""
    skipped = _temporaries(folder)
    return [child for child in folder.iterdir() if child.name not in skipped]


def _move(source: Path, destination: Path, names: Iterable[str], moved: list[str]) -> None:
    """Rename the entries ``names`` of ``source`` into ``destination`` (one file system), the marker last, each
    appended to ``moved`` once moved; never over an existing entry (a rename would replace it)."""
    for name in sorted(names, key=lambda name: (name == MARKER, name)):
        if os.path.lexists(destination / name):
            raise FileExistsError(errno.EEXIST, "exists", str(destination / name))
        os.rename(source / name, destination / name)
        moved.append(name)


def _publish_in_place(target: Path, staging: Path) -> None:
    """:func:`publish` into the mount point ``target``: its previous output (what :func:`check_output` allowed)
    moved into a backup folder inside it, the staged entries into it, the backup removed after (kept instead for
    :func:`restored_on_failure`). Called with stops deferred."""
    key = target.absolute()
    current = _marker_text(target)
    if _SEEN.get(key, current) != current:
        raise InputError(_WRITTEN_MEANWHILE, target)
    old = [child.name for child in _entries(target)]
    if old:
        written = marker(target)
        if written is None:
            raise InputError("output folder was written while vtrain ran, by someone else (it holds files vtrain "
                             "did not write): move them out or give another -o", target)
        _refuse_added(target, written, "output folder", " (added while vtrain ran)")
    inner, inner_lock = staging, None
    if not (_IN_PLACE.match(staging.name) and staging.parent.absolute() == key):  # staged elsewhere (a torchrun
        inner = _inside(target, "staging")  # recording's, beside it): onto the mount's own file system first
        inner.mkdir()
        inner_lock = _locked(inner)
        try:
            for child in sorted(staging.iterdir(), key=lambda child: (child.name == MARKER, child.name)):
                shutil.move(child, inner / child.name)
        except BaseException:
            shutil.rmtree(inner, ignore_errors=True)
            _unlock(inner_lock)
            raise
    match = _IN_PLACE.match(inner.name)
    backup = _inside(target, "backup", match["token"] if match else None)
    moved_old: list[str] = []
    moved_new: list[str] = []
    lock = None
    try:
        backup.mkdir()
        lock = _locked(backup)
        if not old:  # the backup's marker says the old output is all aside (:func:`_recover_in_place`)
            mark(backup, "", [])
        _move(target, backup, old, moved_old)
        _move(inner, target, [child.name for child in inner.iterdir()], moved_new)
        inner.rmdir()
    except BaseException:
        _move(target, inner, reversed(moved_new), [])
        _move(backup, target, reversed(moved_old), [])
        shutil.rmtree(backup, ignore_errors=True)
        _unlock(lock)
        if inner is not staging:
            shutil.rmtree(inner, ignore_errors=True)
        raise
    finally:
        _unlock(inner_lock)
    _SEEN[key] = _marker_text(target)
    if _HELD.get(key, "") is None and old:  # the first replaced, kept aside (:func:`restored_on_failure`)
        _HELD[key] = (backup, lock)
        return
    if _HELD.get(key, "") is None:
        _HELD[key] = (None, None)
    shutil.rmtree(backup, ignore_errors=True)
    _unlock(lock)


def _put_back_in_place(target: Path, backup: Path | None) -> None:
    """:func:`_put_back` for a mount point written in place: the new output's entries removed and the backup's
    moved back; where the user added to or edited the new output since, both kept (the backup in it) and said."""
    written = marker(target) or {}
    if _added_since(target, written) or _changed_since(target, written):
        if backup is not None:
            kept = backup.rename(target / f"vtrain-replaced-{secrets.token_hex(4)}")
            warn_input(f"the output this run wrote is kept, for files added to or edited in it since, and the one "
                       f"it replaced in it, as {kept.name}", target)
        return
    for child in _entries(target):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    if backup is not None:
        _move(backup, target, [child.name for child in backup.iterdir()], [])
        backup.rmdir()


def _recover_in_place(target: Path) -> None:
    """Finish or undo the in-place publishing (:func:`_publish_in_place`) of runs killed (SIGKILL) while they moved
    entries in the mount point ``target``, and remove their staging folders; by which marker has moved: old
    entries half moved aside (the backup has no marker yet) are moved back; a new output half moved in (the
    backup has the old marker, ``target`` none yet) is moved in whole; once ``target`` has its marker, the backup
    is removed. A staging or backup folder of a live run (its process running, its lock held), one holding
    files but no marker, or one whose entries would land on an existing name, is left as it is."""
    stale: dict[str, dict[str, Path]] = {}
    try:
        children = list(target.iterdir())
    except OSError:
        return
    for child in children:
        match = _IN_PLACE.match(child.name)
        if match is None or not child.is_dir() or child.is_symlink() or _running(int(match["pid"])) or _in_use(child):
            continue
        stale.setdefault(match["token"], {})[match["kind"]] = child
    for parts in stale.values():
        backup, staging = parts.get("backup"), parts.get("staging")
        try:
            if backup is not None:
                if not (backup / MARKER).exists():
                    _move(backup, target, [child.name for child in backup.iterdir()], [])
                    backup.rmdir()
                elif (target / MARKER).exists():
                    shutil.rmtree(backup)
                elif staging is not None and (staging / MARKER).exists():
                    _move(staging, target, [child.name for child in staging.iterdir()], [])
                    shutil.rmtree(backup)
                else:
                    continue
            if staging is not None and staging.exists():
                names = {child.name for child in staging.iterdir()}
                if not names or MARKER in names:
                    shutil.rmtree(staging)
        except OSError:  # not ours to settle: left as it is
            continue


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; returns the ones created, innermost first."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
    return missing


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _locked(folder: Path) -> int | None:
    """Hold an exclusive lock on ``folder`` (a staging folder) while this process lives: its descriptor, to close
    once the folder is published or removed; None where the file system has no locks. The process id in the
    folder's name says nothing to a process in another PID namespace (a container sharing the volume): the lock
    does (:func:`_in_use`)."""
    return _try_lock(folder)[0]


def _in_use(folder: Path) -> bool:
    """Whether a live vtrain holds ``folder``'s lock (:func:`_locked`); False where it cannot be told."""
    handle, held = _try_lock(folder)
    if handle is not None:
        os.close(handle)
    return held


def _try_lock(folder: Path) -> tuple[int | None, bool]:
    """Take ``folder``'s exclusive lock without waiting: the descriptor that holds it (None if not taken), and
    whether another open file holds it."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return None, False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as refused:
        os.close(handle)
        return None, isinstance(refused, BlockingIOError)
    return handle, False


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True
