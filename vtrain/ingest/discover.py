"""Finding the rank files of a trace folder."""

from __future__ import annotations

import functools
import gzip
import json
import re
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from vtrain.errors import InputError
from vtrain.ingest.cycles import cycles_warning, one_cycle
from vtrain.limits import MAX_RANKS, shown_count

TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"(?<![a-z])(?<!local[-_])rank[-_]?(\d+)", re.IGNORECASE)  # not local_rank, frank


def find_trace_files(trace_dir: str | Path) -> list[Path]:
    """Every ``*.json`` / ``*.json.gz`` (including ``*.pt.trace.json[.gz]``) directly in ``trace_dir``; of several
    profiler cycles' files, one cycle's (:func:`vtrain.ingest.cycles.one_cycle`)."""
    folder = Path(trace_dir)
    if not folder.exists():
        raise InputError("no such trace folder", folder)
    if not folder.is_dir():
        raise InputError("not a folder (give the folder that holds one trace file per rank)", folder)
    files = _trace_named_files(folder)
    if not files:
        raise InputError("no trace files (*.json, *.json.gz) in the folder" + _compressed_hint(folder)
                         + _nested_hint(folder), folder)
    kept = _traces(folder, files)
    if not kept:
        raise InputError(f"no trace files in the folder: its {len(files)} JSON file(s) are no Kineto trace (no "
                         f"traceEvents)", folder)
    return one_cycle(kept).read


def _trace_named_files(folder: Path) -> list[Path]:
    """The files of ``folder`` named ``*.json`` / ``*.json.gz``, sorted."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))


def _traces(folder: Path, files: list[Path]) -> list[Path]:
    """Of ``files`` (:func:`_trace_named_files`), those read as traces: not a gzipped trace's plain copy
    (:func:`duplicate_trace_files`), not plainly another JSON file (:func:`other_json_files`)."""
    left_out = {plain for plain, _ in duplicate_trace_files(folder)} | set(other_json_files(folder))
    return [path for path in files if path not in left_out]


def other_json_files(trace_dir: str | Path) -> list[Path]:
    """The JSON files of a trace folder that are plainly no trace, left out with a warning (:func:`not_a_trace`
    says why). A file named like a trace is read as one, and one that is not is an error there."""
    folder = Path(trace_dir)
    return [path for path in sorted(folder.iterdir())
            if path.name.endswith(TRACE_SUFFIXES) and path.is_file() and not_a_trace(path) is not None]


def not_a_trace(path: Path) -> str | None:
    """Why the JSON file ``path`` is plainly no Kineto trace, else ``None``. Whatever its size: a PyTorch execution
    trace (``ExecutionTraceObserver``'s file, whatever its name: its text begins ``{"schema": ..., "nodes": [``),
    or a file named like no trace (no rank number, not ``*.pt.trace.json``) whose text is a JSON array of arrays
    (``export_memory_timeline``'s file); a small file (at most :data:`OTHER_JSON_BYTES`) named like no trace holding
    no ``traceEvents`` list (a training run's ``config.json`` or ``metrics.json`` beside its traces)."""
    key = _file_key(path)
    head = _head_kind(*key)
    if head == "execution trace":
        return "a PyTorch execution trace (ExecutionTraceObserver), no Kineto trace"
    if _plainly_not_a_trace(*key):
        return "a JSON file but no Kineto trace (no traceEvents)"
    if head == "arrays" and not named_like_a_trace(path):
        return "a JSON array of arrays (export_memory_timeline writes one), no Kineto trace"
    return None


def named_like_a_trace(path: Path) -> bool:
    """Whether the name of ``path`` says it is a trace: a rank number in it, or ``*.pt.trace.json[.gz]``."""
    return rank_from_file_name(path) is not None or ".pt.trace.json" in path.name


#: the bytes of a file's text :func:`_head_kind` reads: an execution trace's keys come before its nodes (sorted, its
#: first node's)
_HEAD_BYTES = 4096
#: the head of a PyTorch execution trace (``torch.profiler.ExecutionTraceObserver``): an object with a ``nodes`` list
#: (its operators) and a ``schema`` key (its first, as PyTorch writes it: a Kineto trace's is ``schemaVersion``) or,
#: where a tool re-wrote the file with its keys sorted (``nodes`` first), the nodes' ``ctrl_deps``; and no
#: ``traceEvents``
_EXECUTION_TRACE_HEAD = re.compile(rb'^(\xef\xbb\xbf)?\s*\{(?!.*"traceEvents")(?=.*?"nodes"\s*:\s*\[)'
                                   rb'(?=.*?"(schema|ctrl_deps)"\s*:)', re.DOTALL)
#: the head of a JSON text that is an array of arrays, never a trace (a Kineto trace is an object, a trace in
#: Chrome's array format an array of objects: its error says what it is)
_ARRAYS_HEAD = re.compile(rb"^(\xef\xbb\xbf)?\s*\[\s*\[")


@functools.lru_cache(maxsize=256)
def _head_kind(name: str, size: int, time: int) -> str | None:
    """What the head of the file ``name`` shows it to be: ``"execution trace"``, ``"arrays"``, else ``None`` (see
    :func:`not_a_trace`; the size and modification time key the cache)."""
    opener = gzip.open if name.endswith(".gz") else open
    try:
        with opener(name, "rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except (OSError, EOFError, zlib.error):
        return None  # unreadable: read as a trace, whose error names the problem
    if _EXECUTION_TRACE_HEAD.match(head):
        return "execution trace"
    return "arrays" if _ARRAYS_HEAD.match(head) else None


#: the largest JSON file :func:`other_json_files` opens to see whether it is a trace (a trace is rarely this small)
OTHER_JSON_BYTES = 1 << 20


@functools.lru_cache(maxsize=256)
def _plainly_not_a_trace(name: str, size: int, time: int) -> bool:
    """See :func:`other_json_files` (the size and modification time key the cache: a folder is listed by every
    command several times, and a file changed since is read again)."""
    path = Path(name)
    if named_like_a_trace(path) or size > OTHER_JSON_BYTES:
        return False
    try:
        data = _read_at_most(path, _OTHER_JSON_TEXT_BYTES)
        value = json.loads(data) if data is not None else None
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):
        return False  # unreadable or nested beyond Python's parser: read as a trace, whose error names the problem
    return data is not None and not (isinstance(value, dict) and isinstance(value.get("traceEvents"), list))


#: the text of a small JSON file beside the traces is read up to this many bytes: a gzip file of 1 MiB that
#: expands to 1 GB (a "bomb") was decompressed whole here, 2.1 GB of memory, before the trace reader refused it
_OTHER_JSON_TEXT_BYTES = 64 << 20


def _read_at_most(path: Path, limit: int) -> bytes | None:
    """The (decompressed) bytes of ``path``, None when there are more than ``limit``."""
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as handle:
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


def duplicate_trace_files(trace_dir: str | Path) -> list[tuple[Path, Path]]:
    """The ``(X.json, X.json.gz)`` pairs of ``trace_dir`` that hold the same trace (a trace gzipped and its original
    kept): the plain file is not read, and the caller says so; a pair that differs is two claims of one rank."""
    folder = Path(trace_dir)
    pairs = [(plain, plain.with_name(plain.name + ".gz")) for plain in sorted(folder.glob("*.json"))]
    return [(plain, packed) for plain, packed in pairs
            if plain.is_file() and packed.is_file() and _same_bytes(*_file_key(plain), *_file_key(packed))]


def _file_key(path: Path) -> tuple[str, int, int]:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=64)
def _same_bytes(plain: str, plain_size: int, plain_time: int, packed: str, packed_size: int, packed_time: int) -> bool:
    """Whether the gzip file ``packed`` decompresses to the bytes of ``plain`` (compared a megabyte at a time; the
    sizes and times key the cache, so a file changed since is compared again)."""
    try:
        with open(plain, "rb") as one, gzip.open(packed, "rb") as other:
            while True:
                a, b = one.read(1 << 20), other.read(1 << 20)
                if a != b:
                    return False
                if not a:
                    return plain_size > 0
    except (OSError, EOFError, zlib.error):
        return False


#: compressions a trace may come in that vtrain does not read (gzip it, or decompress it)
OTHER_COMPRESSIONS = (".zst", ".zstd", ".xz", ".bz2", ".lz4", ".zip", ".7z")


def _compressed_hint(folder: Path) -> str:
    """Where the folder holds traces compressed otherwise than gzip (``rank-0.json.zst``): how many and what to do."""
    packed = sorted(path.name for path in folder.iterdir()
                    if path.is_file() and any(path.name.endswith(".json" + suffix) for suffix in OTHER_COMPRESSIONS))
    if not packed:
        return ""
    return f"; {len(packed)} compressed otherwise ({packed[0]} ...): gzip them (or decompress them) to read them"


def _nested_hint(folder: Path, depth: int = 3) -> str:
    """Where a folder holds no trace itself but its subfolders do (a folder per rank, a log folder above the
    traces): how many, and where the first is; else nothing."""
    found: list[Path] = []
    level = [folder]
    try:
        for _ in range(depth):
            level = [entry for parent in level for entry in sorted(parent.iterdir()) if entry.is_dir()]
            found += [path for sub in level for path in sorted(sub.iterdir())
                      if path.is_file() and path.name.endswith(TRACE_SUFFIXES)]
            if found or not level:
                break
    except OSError:  # a subfolder that cannot be listed: no hint rather than another error
        return ""
    if not found:
        return ""
    return (f"; {len(found)} in its subfolders ({found[0].relative_to(folder)} ...): give the folder that holds one "
            f"trace file per rank, or gather the ranks' files in one folder")


def unreadable_trace_names(trace_dir: str | Path) -> list[Path]:
    """Entries of ``trace_dir`` named like a trace file that are no file (a folder, a named pipe, a socket, a
    broken link): they are not read (a named pipe would block the reader forever), and the caller says so."""
    return sorted(p for p in Path(trace_dir).iterdir() if p.name.endswith(TRACE_SUFFIXES) and not p.is_file())


def not_read_warnings(trace_dir: str | Path) -> list[str]:
    """The warning lines for the entries of a trace folder that are not read: named like a trace but no file
    (:func:`unreadable_trace_names`), a trace whose gzipped copy lies beside it (:func:`duplicate_trace_files`),
    JSON files that are no trace (:func:`other_json_files`) and other profiler cycles' files than the one read
    (:func:`vtrain.ingest.cycles.one_cycle`)."""
    folder = Path(trace_dir)
    copies = duplicate_trace_files(folder)
    cycles = cycles_warning(folder, one_cycle(_traces(folder, _trace_named_files(folder))))
    return ([f"{path}: not read: named like a trace but not a file" for path in unreadable_trace_names(trace_dir)]
            + [f"{plain}: not read: the same trace as {packed.name}" for plain, packed in copies]
            + [f"{path}: not read: {not_a_trace(path)}" for path in other_json_files(trace_dir)]
            + ([cycles] if cycles else []))


def missing_ranks_warning(trace_dir: str | Path, ranks: Iterable[int], world_size: int | None) -> str | None:
    """The warning line for the ranks of a job of ``world_size`` that have no trace among ``ranks`` (``None`` if
    none is missing or the world size is not known)."""
    missing = sorted(set(range(world_size)) - set(ranks)) if world_size else []
    if not missing:
        return None
    shown = ", ".join(map(str, missing[:16])) + (" ..." if len(missing) > 16 else "")
    return f"{Path(trace_dir)}: {len(missing)} of {world_size} ranks have no trace file (missing: {shown})"


class RankClaims:
    """The ranks and the world size that the files of one trace folder claim, checked file by file, in `vtrain
    ingest` and in the replay's readers alike: one file per rank, and one world size for all of them (files that
    disagree on it come from different jobs)."""

    def __init__(self) -> None:
        self.files: dict[int, Path] = {}
        self.world: tuple[int, Path] | None = None  # the world size first claimed, and the file that claimed it

    def claim(self, path: Path, rank: int, world_size: int | None) -> None:
        """Take the claim of ``path`` (its rank and world size, if it says one); an error where it conflicts with
        a file taken before."""
        if rank in self.files:
            raise InputError(f"rank {rank} is claimed by both {self.files[rank].name} and {path.name}", path)
        if world_size:
            if self.world is not None and self.world[0] != world_size:
                raise InputError(f"world size {world_size} here but {self.world[0]} in {self.world[1].name}: the "
                                 f"files come from different jobs", path)
            self.world = self.world or (world_size, path)
        self.files[rank] = path


def rank_from_file_name(path: Path) -> int | None:
    """The rank written in a file name (``rank-3.json.gz``, ``trace_rank_3.pt.trace.json``), else ``None``."""
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def is_only_trace(path: Path) -> bool:
    """Whether ``path`` is the only trace file of its folder."""
    return find_trace_files(path.parent) == [path]


class RankOfFile(NamedTuple):
    """A trace file's rank and world size (:func:`rank_and_world_size`), and the warning line for a file whose name
    says another rank than its trace, or whose rank neither says (``None`` otherwise)."""

    rank: int
    world_size: int | None
    warning: str | None


def rank_and_world_size(path: Path, distributed_info: dict[str, Any] | None) -> RankOfFile:
    """The rank (``distributedInfo.rank``, else from the file name, else 0 for the only trace file of its folder:
    a single-process job's ``host_pid.timestamp.pt.trace.json``) and the world size if the trace says it. A rank
    or world size written as a string of digits (``"3"``) is read as the number, as every number of a trace is.
    Where the file name says another rank than the trace, the trace's is kept (it is what the run said) and the
    result's warning says so."""
    info = distributed_info or {}
    given = info.get("rank")
    rank = json_count(given)
    named = rank_from_file_name(path)
    warning = None
    if given is None:
        rank = named
        if rank is None and is_only_trace(path):
            rank = 0
            warning = f"{path}: no rank in the trace or its name; the only trace of its folder is taken as rank 0"
        if rank is None:
            raise InputError("cannot tell the rank: no distributedInfo.rank in the trace and no rank number in the "
                             "file name (name it rank-N.json.gz)", path)
    elif rank is None:
        raise InputError(f"distributedInfo.rank is {given!r}: a rank is an integer >= 0", path)
    world = json_count(info.get("world_size"))
    if info.get("world_size") is not None and not (world is not None and world > 0):
        raise InputError(f"distributedInfo.world_size is {info.get('world_size')!r}: a world size is an integer >= 1",
                         path)
    for what, value in (("rank", rank), ("world size", world)):
        if value is not None and value > MAX_RANKS:
            raise InputError(f"{what} {shown_count(value)} is beyond the {MAX_RANKS:,} ranks vtrain takes a job to "
                             f"have", path)
    if world is not None and rank >= world:
        raise InputError(f"rank {rank} is outside the world size {world}", path)
    if named is not None and named != rank:
        warning = (f"{path}: the file name says rank {named} but its distributedInfo.rank is {rank}: read as rank "
                   f"{rank}, as the trace says")
    return RankOfFile(rank, world, warning)


def json_count(value: Any) -> int | None:
    """A JSON value read as an integer >= 0: an integer, or a string of ASCII digits (``true``, ``1.5``, ``-1`` and
    ``"zero"`` are not); None otherwise."""
    if type(value) is int:
        return value if value >= 0 else None
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        return int(value)
    return None
