"""A trace file's JSON text: mapped (plain files) or gunzipped, writable in place, and the file's sha256."""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from vtrain.errors import InputError
from vtrain.ingest.decode import gunzip, is_gzip

Progress = Callable[[int], None]


@dataclass
class TraceText:
    """One trace file's JSON text, writable in place (the file itself is never written)."""

    path: Path
    buffer: mmap.mmap | bytearray
    compressed: bool
    _digest: Future[str] | str

    @property
    def sha256(self) -> str:
        """The sha256 of the file as stored (computed alongside the decoding for plain files)."""
        if isinstance(self._digest, Future):
            try:
                self._digest = self._digest.result()
            except OSError as exc:
                raise InputError(f"cannot read file: {exc.strerror or exc}", self.path) from None
        return self._digest


def load_text(path: Path, progress: Progress | None = None) -> TraceText:
    """Map a plain JSON file, or gunzip a gzip file; errors name the file (empty, not gzip, truncated, ...)."""
    try:
        with path.open("rb") as handle:
            if is_gzip(handle, path):
                digest = hashlib.sha256()
                data = gunzip(handle, path, progress, digest)
                return TraceText(path, data, True, digest.hexdigest())
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", path) from None
    return TraceText(path, buffer, False, _hash_in_background(path))


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
