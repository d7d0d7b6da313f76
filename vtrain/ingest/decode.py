"""Reading one Kineto (Chrome JSON) trace file into typed events.

The top level is decoded with ``traceEvents`` kept as raw JSON slices (no Python object per field), then the
events are decoded in batches into small typed structs holding only the fields vtrain keeps. Memory therefore
grows with the kept fields, not with the JSON text, and every error names the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from vtrain.errors import InputError
from vtrain.kineto import EXTERNAL_ID_KEYS, INPUT_DIMS_KEYS

BATCH_EVENTS = 200_000
READ_CHUNK = 16 << 20


class EventArgs(msgspec.Struct, gc=False):
    """The ``args`` of an event, restricted to the keys vtrain reads (all optional: schemas differ).

    Keys spelled differently by older PyTorch versions (:data:`vtrain.kineto.EXTERNAL_ID_KEYS`,
    :data:`vtrain.kineto.INPUT_DIMS_KEYS`) have a field each (``*_legacy``): read the current one, else the
    legacy one. ``stream`` is an integer, or the hex string ROCm traces write on runtime calls (``"0x0"``): read it
    with :func:`vtrain.kineto.parse_stream`.
    """

    external_id: int | None = msgspec.field(default=None, name=EXTERNAL_ID_KEYS[0])
    external_id_legacy: int | None = msgspec.field(default=None, name=EXTERNAL_ID_KEYS[1])  # PyTorch 1.8-1.9
    correlation: int | None = None
    stream: int | str | None = None
    device: int | None = None
    wait_on_stream: int | None = None  # cudaStreamWaitEvent (read by the replay)
    wait_on_event_record: int | None = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name=INPUT_DIMS_KEYS[0])
    input_dims_legacy: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name=INPUT_DIMS_KEYS[1])  # PyTorch 1.8
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    collective_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")  # text or a list


class EventFields(msgspec.Struct, gc=False):
    """The fields vtrain reads from every Chrome-trace event except its phase ``ph``; ``pid``/``tid`` are ints
    in Kineto but strings on its own span rows."""

    cat: str = ""
    name: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: EventArgs | None = None


class TraceEvent(EventFields, gc=False):
    """One Chrome-trace event of any phase."""

    ph: str = ""


class TraceHeader(msgspec.Struct):
    """The top level of a Kineto trace; ``traceEvents`` stays raw until decoded in batches."""

    traceEvents: list[msgspec.Raw]
    schemaVersion: int | None = None
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[dict[str, Any]] | None = None
    baseTimeNanoseconds: int | None = None
    displayTimeUnit: str | None = None
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    cupti_version: Any = None
    pytorch_version: Any = None
    record_shapes: Any = None


_HEADER_DECODER = msgspec.json.Decoder(TraceHeader)
#: decodes a JSON array of trace events
TRACE_EVENTS_DECODER = msgspec.json.Decoder(list[TraceEvent])


@contextmanager
def readable_trace(path: Path) -> Iterator[None]:
    """Errors while decoding a trace file that are the file's fault (bytes that are not UTF-8, JSON nested
    deeper than Python's stack) become one :class:`InputError` line naming the file."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text at byte {exc.start}: not a Kineto trace", path) from None
    except RecursionError:
        raise InputError("JSON nested too deep to be a Kineto trace", path) from None


def read_bytes(path: Path, progress: Callable[[int], None] | None = None) -> tuple[bytes | bytearray, str]:
    """The file's JSON text (gunzipped if it is gzip) and the sha256 of the file as stored.

    Errors name the file: empty, not gzip although named .gz, truncated or corrupt gzip.
    """
    digest = hashlib.sha256()
    try:
        with path.open("rb") as handle:
            if not is_gzip(handle, path):
                data = handle.read()
                digest.update(data)
                if progress:
                    progress(len(data))
                return data, digest.hexdigest()
            return gunzip(handle, path, progress, digest), digest.hexdigest()
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", path) from None


def is_gzip(handle: BinaryIO, path: Path) -> bool:
    """Whether the open file holds gzip data (the handle is left at the start); errors for an empty file or a
    ``.gz`` name on plain data."""
    head = handle.read(2)
    if not head:
        raise InputError("file is empty", path)
    handle.seek(0)
    gzip = head == b"\x1f\x8b"
    if path.suffix == ".gz" and not gzip:
        raise InputError("not a gzip file (the name ends in .gz)", path)
    return gzip


def gunzip(handle: BinaryIO, path: Path, progress: Callable[[int], None] | None, digest: Any) -> bytearray:
    """The decompressed content of a gzip file (writable, see :mod:`vtrain.ingest.spans`); ``digest`` is fed the
    compressed bytes and ``progress`` their count."""
    inflater = zlib.decompressobj(wbits=31)
    parts: list[bytes] = []
    while chunk := handle.read(READ_CHUNK):
        digest.update(chunk)
        try:
            parts.append(inflater.decompress(chunk))
        except zlib.error as exc:
            raise InputError(f"corrupt gzip data: {exc}", path) from None
        if progress:
            progress(len(chunk))
    if not inflater.eof:
        raise InputError("truncated gzip file (the compressed stream ends early)", path)
    parts.append(inflater.flush())
    data = bytearray().join(parts)
    if not data:
        raise InputError("file is empty (gzip holds no data)", path)
    return data


def decode_header(data: bytes, path: Path, decoder: msgspec.json.Decoder = _HEADER_DECODER) -> TraceHeader:
    """Decode the top level of a trace (with ``decoder``, whose type is a :class:`TraceHeader`); the events stay
    raw."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InputError(f"not a Kineto trace: {_describe_validation(exc)}", path) from None
    except msgspec.DecodeError as exc:
        raise InputError(f"invalid JSON: {_describe_decode(exc, len(data))}", path) from None


def iter_event_batches(header: TraceHeader, path: Path) -> Iterator[list[TraceEvent]]:
    """Decode ``traceEvents`` in batches of :data:`BATCH_EVENTS` typed events."""
    raw = header.traceEvents
    for start in range(0, len(raw), BATCH_EVENTS):
        chunk = b"[" + b",".join(raw[start:start + BATCH_EVENTS]) + b"]"
        try:
            yield TRACE_EVENTS_DECODER.decode(chunk)
        except msgspec.ValidationError as exc:
            raise InputError(f"malformed trace event: {_describe_validation(exc)}", path) from None


def _describe_validation(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    if "missing required field `traceEvents`" in text:
        return "no traceEvents list"
    if text.startswith("Expected `object`") and "$" not in text:
        return "the top level is not a JSON object"
    return text


def _describe_decode(exc: msgspec.DecodeError, size: int) -> str:
    text = str(exc)
    if "truncated" in text.lower() or "end of" in text.lower():
        return f"truncated JSON (the text ends early, after {size} bytes)"
    return text
