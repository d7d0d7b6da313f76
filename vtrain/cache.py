"""What vtrain derives from a profile, kept between runs: the plain rows a prediction reads from its tables
(:mod:`vtrain.tables.digest`), its fitted kernel models (:func:`vtrain.fit.device.fit_kernels`) and its measured
collective curves (:mod:`vtrain.simulate.collective_latency`).

Deriving them takes longer than a simulation (reading Parquet needs polars, whose import alone is 0.12 s; the
kernel models are rebuilt from thousands of measured kernels), and they depend on nothing but the profile's files
and vtrain's code. So they are kept in the user's cache folder, under a key made of the profile files' contents
(:func:`content_key`) and of vtrain's source files (:func:`code_key`): a profile changed, replaced or copied
elsewhere with other contents, or another vtrain, finds nothing and derives afresh. The folder is
``$VTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/vtrain``, else ``~/.cache/vtrain``; removing it is always safe.
Where it cannot be written (a read-only home), nothing is kept and every run derives what it needs.

Entries are pickles of vtrain's own objects with the key they answer, written atomically (a temporary file renamed
into place, readable and writable by the user alone) and read only when they are regular files (not links) that
the user owns and no one else may write, in a folder no one else may write to (:func:`lookup`); one that does not
load is derived again and rewritten.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import stat
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import vtrain
from vtrain.errors import warn_input

T = TypeVar("T")

CACHE_ENV = "VTRAIN_CACHE_DIR"
#: the most the entries may hold together: past it, the least recently used go (a profile's three entries take 0.9,
#: 0.4 and 2.5 MB for profiles/a100)
MAX_CACHE_BYTES = 256 * 2**20
_PACKAGE = Path(vtrain.__file__).resolve().parent
_CODE_KEY: list[str] = []
#: chosen cache folders others may write to, said once a process (:func:`_readable_folder`)
_SAID_OPEN: set[Path] = set()


def cache_dir() -> Path:
    """The folder entries are kept in."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vtrain"


def content_key(files: Iterable[Path]) -> str:
    """A key of the contents of ``files`` (their names and bytes). Raises ``OSError`` for a file that is not a
    regular one (a pipe or a device never ends: no key)."""
    digest = hashlib.sha256()
    for file in sorted(files):
        if not stat.S_ISREG(os.stat(file).st_mode):
            raise OSError(f"{file}: not a regular file")
        digest.update(file.name.encode() + b"\0")
        with open(file, "rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def code_key() -> str:
    """A key of vtrain's source files (their paths, sizes and modification times), once per process."""
    if not _CODE_KEY:
        digest = hashlib.sha256(vtrain.__version__.encode())
        for root, dirs, files in os.walk(_PACKAGE):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                info = os.stat(os.path.join(root, name))
                digest.update(f"{os.path.relpath(os.path.join(root, name), _PACKAGE)}:{info.st_size}:"
                              f"{info.st_mtime_ns}\0".encode())
        _CODE_KEY.append(digest.hexdigest())
    return _CODE_KEY[0]


def lookup(key: str, what: str) -> object | None:
    """What an earlier run kept under ``key`` (a :func:`content_key`) and ``what`` (the kind of result) with this
    vtrain's code, ``None`` when nothing loads. A pickle runs code when loaded, so only an entry the user alone
    could have written is read: a regular file, not a link (one planted in the folder, pointing at a user's file
    of pickle bytes, was loaded and its code run: an audit), owned by the user and writable by no one else, in a
    folder no one else may write to; and it must hold the key it is asked for (an entry renamed over another gave
    another profile's rows, silently)."""
    file = _entry(key, what)
    try:
        if not _readable_folder(file.parent):
            return None
        descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or not _own(info) or info.st_nlink != 1:
                return None
            kept_key, kept_what, value = pickle.load(handle)
        if (kept_key, kept_what) != (key, what):
            return None
        os.utime(file)  # used now: the last to go (:func:`_trim`)
        return value
    except Exception:  # none kept yet, or an entry that does not load (truncated): the caller derives it again
        return None


def _readable_folder(folder: Path) -> bool:
    """Whether entries may be read from ``folder``: one no one else may write to (:func:`_own`). vtrain's own
    folder (no ``$VTRAIN_CACHE_DIR``) that an older vtrain made under umask 002 (775: others could write to it, so
    nothing in it was ever read, silently) is made the user's alone: each entry is still checked on its own. A
    folder the user chose that others may write to is left as it is, and said once."""
    info = os.stat(folder)
    if _own(info, folder=True):
        return True
    if info.st_uid != os.getuid():
        return False
    if not os.environ.get(CACHE_ENV):
        os.chmod(folder, 0o700)
        return True
    if folder not in _SAID_OPEN:
        _SAID_OPEN.add(folder)
        warn_input(f"other users may write to this cache folder (mode {stat.S_IMODE(info.st_mode):o}), so nothing "
                   f"kept in it is read (a kept result is code run when loaded): every run derives afresh; "
                   f"`chmod go-w` it, or set {CACHE_ENV} to a folder of your own", folder)
    return False


def _own(info: os.stat_result, folder: bool = False) -> bool:
    """Whether an entry (or the ``folder`` of entries) is the user's own and only the user's to write; a folder
    others may write to but not take files from (sticky, as /tmp) is the user's where it is theirs."""
    if not hasattr(os, "getuid"):  # no owners to compare (Windows): nothing is read, every run derives
        return False
    shared_safely = folder and bool(info.st_mode & stat.S_ISVTX)
    return info.st_uid == os.getuid() and (not info.st_mode & 0o022 or shared_safely)


def keep(key: str, what: str, value: object) -> None:
    """Keep ``value`` under ``key`` and ``what``, atomically; nothing when the cache folder cannot be written."""
    file = _entry(key, what)
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the user's alone whatever the umask: under
        # Ubuntu's 002 a folder made 775 was one others could write to, and no entry was ever read from it
        handle, temporary = tempfile.mkstemp(dir=file.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                pickle.dump((key, what, value), out, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, file)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        for older in file.parent.glob(f"{_prefix(key, what)}*.pickle"):
            if older != file:  # the same result of another vtrain's code: one entry per profile is kept
                older.unlink(missing_ok=True)
        _trim(file.parent)
    except OSError:
        pass


#: the name of an entry vtrain wrote (:func:`_entry`): nothing else in the folder is ever removed
_ENTRY_NAME = re.compile(r"^.+-[0-9a-f]{24}-[0-9a-f]{24}\.pickle$")


def _trim(folder: Path) -> None:
    """Remove the least recently used entries until the rest hold at most :data:`MAX_CACHE_BYTES`; only vtrain's
    own entries (:data:`_ENTRY_NAME`: a user's ``model-weights.pickle`` in the folder was removed)."""
    entries = sorted(((entry.stat(), entry) for entry in folder.glob("*.pickle") if _ENTRY_NAME.match(entry.name)),
                     key=lambda e: e[0].st_mtime_ns)
    held = sum(info.st_size for info, _ in entries)
    for info, entry in entries[:-1]:  # the newest stays, however large
        if held <= MAX_CACHE_BYTES:
            break
        entry.unlink(missing_ok=True)
        held -= info.st_size


def derived(key: str | None, what: str, build: Callable[[], T]) -> T:
    """``build()``, kept under ``key`` and ``what``: read back when an earlier run kept it, else built and kept.
    Without a key (tables not read from a folder, or changed since), built every time."""
    if key is None:
        return build()
    found = lookup(key, what)
    if found is not None:
        return found  # type: ignore[return-value]
    value = build()
    keep(key, what, value)
    return value


def _entry(key: str, what: str) -> Path:
    """The file of an entry: named by what it holds, the key and vtrain's code (the key's entries of other code
    share its first part: :func:`keep` removes them)."""
    return cache_dir() / f"{_prefix(key, what)}{code_key()[:24]}.pickle"


def _prefix(key: str, what: str) -> str:
    return f"{what}-{hashlib.sha256(key.encode()).hexdigest()[:24]}-"
