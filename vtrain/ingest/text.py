"""A trace file's JSON text: mapped, writable in place, and the file's sha256.

A plain file is mapped as it is; a gzip file is first decompressed into an unnamed temporary file, which is mapped
in turn. Either way the text is read through a private mapping whose pages can be handed back once their events
are decoded (:meth:`TraceText.release`), so a rank's text never has to be resident all at once: memory is bounded
by the decoded events, not by the file.
"""

from __future__ import annotations

import hashlib
import mmap
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from vtrain.errors import InputError
from vtrain.ingest.decode import BOM, inflate, is_gzip

Progress = Callable[[int], None]


@dataclass
class TraceText:
    """One trace file's JSON text, writable in place (the file itself is never written)."""

    path: Path
    buffer: mmap.mmap | bytearray
    compressed: bool
    _digest: Future[str] | str
    #: text before this is released; the first page never is: a byte-order mark there is read as blanks in the
    #: mapping only (:func:`_without_bom`), and the text may be read again from the start (a header read anew)
    _released: int = mmap.PAGESIZE
    bare_numbers: int = 0  # NaN or Infinity values read as null (see vtrain.ingest.decode.decode_text)

    @property
    def sha256(self) -> str:
        """The sha256 of the file as stored (computed alongside the decoding for plain files)."""
        if isinstance(self._digest, Future):
            try:
                self._digest = self._digest.result()
            except OSError as exc:
                raise InputError(f"cannot read file: {exc.strerror or exc}", self.path) from None
        return self._digest

    def release(self, end: int) -> None:
        """Hand the mapped pages of the text before ``end`` back to the system: their events are decoded and
        are not read again (a later read would still see the same bytes, paged in again from the file)."""
        if not isinstance(self.buffer, mmap.mmap):
            return
        end -= end % mmap.PAGESIZE
        if end > self._released:
            self.buffer.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            self._released = end


def load_text(path: Path, progress: Progress | None = None, scratch: Path | None = None, *,
              hashed: bool = True) -> TraceText:
    """Map a plain JSON file, or gunzip a gzip file into an unnamed file in ``scratch`` (the system's temporary
    folder by default, which may be in memory: `vtrain ingest` gives the folder it writes in) and map that; errors
    name the file (empty, not gzip, truncated, ...). Without ``hashed`` a plain file's sha256 is not computed (it
    is read a second time for it)."""
    try:
        with path.open("rb") as handle:
            if is_gzip(handle, path):
                return _gunzipped(path, handle, progress, scratch)
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", path) from None
    return TraceText(path, _without_bom(buffer), False, _hash_in_background(path) if hashed else "")


def _gunzipped(path: Path, handle: BinaryIO, progress: Progress | None, scratch: Path | None) -> TraceText:
    """The gzip file's text, decompressed into an unnamed file in ``scratch`` and mapped; where that file cannot
    be written (no space left, a folder that cannot be written), decompressed into memory instead: the command
    still works, with the whole text resident (whoever writes to that folder next says what is wrong with it)."""
    digest = hashlib.sha256()
    try:
        plain = tempfile.TemporaryFile(prefix="vtrain-text-", dir=scratch)
    except OSError:
        plain = None
    if plain is not None:
        with plain:
            try:
                _gunzip_to(handle, plain, path, progress, digest)
                return TraceText(path, _without_bom(mmap.mmap(plain.fileno(), 0, access=mmap.ACCESS_COPY)), True,
                                 digest.hexdigest())
            except _NotWritten:
                pass
    handle.seek(0)
    digest = hashlib.sha256()
    text = bytearray().join(inflate(handle, path, None, digest))  # progress was given these bytes already
    if not text:
        raise InputError("file is empty (gzip holds no data)", path)
    return TraceText(path, _without_bom(text), True, digest.hexdigest())


class _NotWritten(Exception):
    """The decompressed text could not be written to its unnamed file."""


def _without_bom(buffer: mmap.mmap | bytearray) -> mmap.mmap | bytearray:
    """The text with a UTF-8 byte-order mark before it read as blanks (JSON readers may skip one; the mapping is a
    private copy: the file is not written)."""
    if buffer[:len(BOM)] == BOM:
        buffer[:len(BOM)] = b" " * len(BOM)
    return buffer


def _gunzip_to(handle: BinaryIO, out: BinaryIO, path: Path, progress: Progress | None, digest: Any) -> None:
    """Decompress the gzip file ``handle`` into ``out`` a bounded piece at a time (:func:`~vtrain.ingest.decode.
    inflate`: every member, errors naming the file); an error for a file with no data at all."""
    written = 0
    for piece in inflate(handle, path, progress, digest):
        try:
            written += out.write(piece)
        except OSError:
            raise _NotWritten() from None
    if not written:
        raise InputError("file is empty (gzip holds no data)", path)
    try:
        out.flush()
    except OSError:
        raise _NotWritten() from None


def _hash_in_background(path: Path) -> Future[str]:
    """sha256 of the file on a thread (reading and hashing release the GIL). The file is read, not mapped again:
    a second mapping's pages would count twice in the resident set."""
    def digest() -> str:
        with path.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()

    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(digest)
    pool.shutdown(wait=False)
    return future
