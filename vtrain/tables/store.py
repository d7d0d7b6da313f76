"""Reading and writing a profile folder: one Parquet file per table plus ``metadata.json``.

Profiles are written atomically: everything goes to a hidden temporary folder beside the target, which is renamed
into place only when complete, so a failed run never leaves a half-written profile behind.

A profile read from a folder keeps its tables' digest (what predictions read, :mod:`vtrain.tables.digest`) in
vtrain's cache (:mod:`vtrain.cache`), under the key of the folder's contents: read again, its tables are not read
(nor polars imported) until something asks for them, and every table was checked when it was first read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vtrain import cache
from vtrain.errors import InputError
from vtrain.limits import MAX_METADATA_BYTES, MAX_TRACE_US, fitted_problem
from vtrain.outputs import PROFILE, check_output, staged
from vtrain.runconfig import RunConfig, run_config_from_dict
from vtrain.tables.digest import DIGEST_TABLES, ProfileDigest, digest_of

if TYPE_CHECKING:
    import polars as pl

METADATA_FILE = "metadata.json"


class FolderTables(MutableMapping[str, "pl.DataFrame"]):
    """The tables of a profile folder, each read from its Parquet file (and checked) when first asked for, with the
    key of the folder's contents (:func:`vtrain.cache.content_key`) while none was replaced."""

    def __init__(self, path: Path, key: str | None, frames: dict[str, pl.DataFrame] | None = None) -> None:
        self.path = path
        self.key = key
        self.version = object()  # replaced whenever a table is: what a digest of them was made of
        self._frames = dict(frames or {})

    def __getitem__(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            self._frames[name] = _read_table(self.path, name)
        return self._frames[name]

    def __setitem__(self, name: str, frame: pl.DataFrame) -> None:
        self._frames[name] = frame
        self.key, self.version = None, object()

    def __delitem__(self, name: str) -> None:
        del self._frames[name]
        self.key, self.version = None, object()

    def __iter__(self) -> Iterator[str]:
        from vtrain.tables.schema import TABLES

        return iter([*TABLES, *(name for name in self._frames if name not in TABLES)])

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class Profile:
    """The tables of one profile folder and its metadata."""

    tables: MutableMapping[str, pl.DataFrame]
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    _digest: tuple[tuple[object, ...], ProfileDigest] | None = field(default=None, init=False, repr=False,
                                                                      compare=False)

    def __getitem__(self, name: str) -> pl.DataFrame:
        return self.tables[name]

    @property
    def op_latency(self) -> pl.DataFrame:
        return self.tables["op_latency"]

    @property
    def nccl_latency(self) -> pl.DataFrame:
        return self.tables["nccl_latency"]

    @property
    def source(self) -> str | Path | None:
        """Where the tables come from, for a warning: the profile's folder, else the trace folder they were read from
        in memory (`vtrain validate`'s own profile)."""
        return self.path or self.metadata.get("source_dir")

    @property
    def digest(self) -> ProfileDigest:
        """What predictions read from the tables (made again when a table was replaced since)."""
        made_of = self._made_of()
        if self._digest is None or any(a is not b for a, b in zip(self._digest[0], made_of)):
            self._digest = (made_of, digest_of(self.tables))
        return self._digest[1]

    def content_key(self) -> str | None:
        """The key of the folder's contents when the tables are still those read from it, else ``None``."""
        return self.tables.key if isinstance(self.tables, FolderTables) else None

    def _made_of(self) -> tuple[object, ...]:
        if isinstance(self.tables, FolderTables):
            return (self.tables, self.tables.version)
        return tuple(self.tables.get(name) for name in DIGEST_TABLES)

    def traced_run(self) -> RunConfig | None:
        """The run config of the job whose timeline this profile holds (``metadata.json``'s ``run``, written by
        `vtrain ingest` from the traces' ``run.yaml``), ``None`` when it was not described. Raises
        :class:`InputError` naming ``metadata.json`` when it does not load."""
        data = self.metadata.get("run")
        if not data:
            return None
        where = self.path / METADATA_FILE if self.path is not None else METADATA_FILE
        return run_config_from_dict(data, f"{where} (run)").validate(f"{where} (run)")


def empty_table(name: str) -> pl.DataFrame:
    """An empty frame with the schema of table ``name``."""
    import polars as pl

    from vtrain.tables.schema import TABLES

    return pl.DataFrame(schema=TABLES[name])


def conform(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    """Select and cast ``frame``'s columns to the schema of table ``name`` (missing columns become null)."""
    import polars as pl

    from vtrain.tables.schema import TABLES

    schema = TABLES[name]
    if frame.width == 0:
        return empty_table(name)
    return frame.select([
        (pl.col(col) if col in frame.columns else pl.lit(None)).cast(dtype).alias(col)
        for col, dtype in schema.items()
    ])


def write_profile(profile: Profile, target: str | Path, *, overwrite: bool = False) -> Path:
    """Write all tables and the metadata to ``target`` atomically; returns the final path."""
    target = check_output(target, force=overwrite, what="profile folder")
    _check_before_writing(profile, target)
    with staged(target, PROFILE) as staging:
        for name, frame in profile.tables.items():
            frame.write_parquet(staging / f"{name}.parquet")
        (staging / METADATA_FILE).write_text(json.dumps(profile.metadata, indent=2, sort_keys=False) + "\n")
    profile.path = target
    return target


def _check_before_writing(profile: Profile, target: Path) -> None:
    """Refuse to write a profile that :func:`load_profile` would refuse (a row or fitted parameter out of its
    bounds): `vtrain fit` wrote one from an nccl-tests file of a 0-GPU group, which every later command refused."""
    from vtrain.tables.schema import TABLES

    try:
        for name, frame in profile.tables.items():
            if name in TABLES:
                _with_schema(frame, name, target / f"{name}.parquet")
        problem = _fitted_problem(profile.metadata["fitted"]) if profile.metadata.get("fitted") else None
    except InputError as exc:
        raise InputError(f"not written: every command would refuse it ({exc})", target) from None
    if problem:
        raise InputError(f"not written: every command would refuse its fitted device model ({problem})", target)


def load_profile(path: str | Path) -> Profile:
    """Read a profile folder written by :func:`write_profile` (``vtrain ingest`` or ``vtrain calibrate``): its
    metadata, and its tables unless the cache holds the digest of these contents (then each table is read when
    first asked for)."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("is a file, not a profile folder (give the folder `vtrain ingest` or `vtrain fit` wrote)"
                         if path.exists() else "no such profile folder", path)
    meta_file = path / METADATA_FILE
    if not meta_file.exists():
        raise InputError(f"not a profile folder: {METADATA_FILE} is missing", path)
    metadata = _read_metadata(meta_file)
    key = _folder_key(path)
    digest = cache.lookup(key, "digest") if key is not None else None
    if isinstance(digest, ProfileDigest):
        tables = FolderTables(path, key)
    else:
        from vtrain.tables.schema import TABLES

        tables = FolderTables(path, key, {name: _read_table(path, name) for name in TABLES})
        digest = digest_of(tables)
        if key is not None:
            cache.keep(key, "digest", digest)
    profile = Profile(tables=tables, metadata=metadata, path=path)
    profile._digest = (profile._made_of(), digest)
    return profile


def _folder_key(path: Path) -> str | None:
    """The key of a profile folder's contents (its tables and metadata), ``None`` when a file cannot be read."""
    try:
        return cache.content_key([*path.glob("*.parquet"), path / METADATA_FILE])
    except OSError:
        return None


def _read_table(path: Path, name: str) -> pl.DataFrame:
    """Table ``name`` of the profile folder ``path``, checked (:func:`_with_schema`), its operator signatures as
    today's vtrain writes them (:func:`~vtrain.tables.signature.read_signatures`); an optional table the folder
    lacks is empty."""
    import polars as pl

    from vtrain.tables.schema import OPTIONAL_TABLES, TABLES
    from vtrain.tables.signature import read_signatures

    if name not in TABLES:
        raise KeyError(name)
    file = path / f"{name}.parquet"
    if not file.exists() and name in OPTIONAL_TABLES:
        return empty_table(name)
    if not file.exists():
        raise InputError(f"not a profile folder: {file.name} is missing", path)
    if not file.is_file():  # a pipe or a device would be read without end
        raise InputError("not a regular file", file)
    try:
        frame = pl.read_parquet(file)
    except Exception as exc:  # polars raises several error types for corrupt Parquet
        raise InputError(f"corrupt table: {str(exc).splitlines()[0]}", file) from None
    return read_signatures(_with_schema(frame, name, file), name)


def _read_metadata(meta_file: Path) -> dict[str, Any]:
    """``metadata.json`` (a UTF-8 byte-order mark skipped, as in run configs), refused when it is not JSON, gives a
    key twice, or is not of the shape vtrain writes (see
    :data:`_METADATA_SHAPE`) or when a fitted device's numbers lie outside physical bounds."""
    if not meta_file.is_file():
        raise InputError("not a regular file", meta_file)
    if meta_file.stat().st_size > MAX_METADATA_BYTES:
        raise InputError(f"larger than {MAX_METADATA_BYTES:,} bytes", meta_file)
    try:
        metadata = json.loads(meta_file.read_bytes().decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InputError(f"key {exc} given twice", meta_file) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid JSON: not UTF-8 (byte {exc.start})", meta_file) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", meta_file) from None
    except RecursionError:
        raise InputError("not valid JSON: nested too deeply", meta_file) from None
    except ValueError as exc:  # an integer beyond Python's 4,300 digits
        raise InputError(f"not valid JSON: {str(exc).split(';')[0]}", meta_file) from None
    if not isinstance(metadata, dict):
        raise InputError(f"must hold a JSON object (got {type(metadata).__name__})", meta_file)
    for key, kinds in _METADATA_SHAPE.items():
        value = metadata.get(key)
        if value is not None and not isinstance(value, kinds):
            raise InputError(f"{key} must be {' or '.join(k.__name__ for k in kinds)} "
                             f"(got {type(value).__name__})", meta_file)
    for key in ("world_size", "dropped_events"):
        value = metadata.get(key)
        if isinstance(value, bool) or isinstance(value, int) and value < 0:
            raise InputError(f"{key} must be a count >= 0 (got {value!r})", meta_file)
    for key in ("ranks", "ranks_missing", "iterations"):
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in metadata.get(key) or []):
            raise InputError(f"{key} must be a list of whole numbers >= 0", meta_file)
    if any(not isinstance(line, str) for line in metadata.get("warnings") or []):
        raise InputError("warnings must be a list of text", meta_file)
    if metadata.get("fitted"):
        problem = _fitted_problem(metadata["fitted"])
        if problem:
            raise InputError(f"fitted device model: {problem}", meta_file)
    return metadata


class _DuplicateKey(ValueError):
    """A JSON object that gives a key twice (Python's json keeps the last silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's pairs as a dict, refusing a key given twice (as run configs are read: ``configfile``)."""
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _DuplicateKey(repr(next(key for key in keys if keys.count(key) > 1)))
    return dict(pairs)


#: the keys of ``metadata.json`` that commands read, and the JSON types each may have (or null)
_METADATA_SHAPE: dict[str, tuple[type, ...]] = {
    "kind": (str,), "version": (str,), "source_dir": (str,), "device": (dict,), "software": (dict,),
    "world_size": (int,), "ranks": (list,), "ranks_missing": (list,), "iterations": (list,),
    "dropped_events": (int,), "sources": (list,), "parent": (dict, str), "fitted": (dict,), "fit_rows": (dict,),
    "run": (dict,), "warnings": (list,), "carried_over": (dict,),
}


def _fitted_problem(fitted: dict[str, Any]) -> str | None:
    """The first fitted parameter that is not a number within :data:`vtrain.limits.FITTED_BOUNDS`."""
    sections: list[tuple[str, Any]] = [(key, fitted.get(key)) for key in ("gemm", "memory_bound", "host")]
    provenance = fitted.get("provenance", {})
    if not isinstance(provenance, dict):
        return f"provenance must be a mapping (got {type(provenance).__name__})"
    if not all(isinstance(value, str) for value in provenance.values()):
        return "provenance must say where each parameter came from as text"
    collectives = fitted.get("collectives") or []
    if not isinstance(collectives, list):
        return "collectives must be a list"
    sections += [(f"collectives[{i}]", curve) for i, curve in enumerate(collectives)]
    for where, section in sections:
        if section is None:
            continue
        if not isinstance(section, dict):
            return f"{where} must be a mapping (got {type(section).__name__})"
        for name, value in section.items():
            problem = fitted_problem(name, value)
            if problem:
                return f"{where}.{problem}"
    if "non_gemm_scale" in fitted:
        return fitted_problem("non_gemm_scale", fitted["non_gemm_scale"])
    return None


def _with_schema(frame: pl.DataFrame, name: str, file: Path) -> pl.DataFrame:
    """``frame`` with the columns and types of table ``name``: a column of another type is cast when every value
    converts (integers to floats), else refused; a table written before a column was added to its schema gets
    that column as nulls."""
    import polars as pl

    from vtrain.tables.schema import TABLES

    schema = TABLES[name]
    if frame.width and not set(frame.columns) & set(schema):
        raise InputError(f"wrong schema: none of the {name} table's columns ({', '.join(list(schema)[:4])}, ...)",
                         file)
    missing = [col for col in _KEY_COLUMNS.get(name, ()) if col not in frame.columns]
    if frame.width and missing:  # another table's file under this name: its shared columns alone are no table
        raise InputError(f"wrong schema: no {', '.join(missing)} column (another table's file?)", file)
    columns = []
    for col, dtype in schema.items():
        if col not in frame.columns:
            columns.append(pl.lit(None).cast(dtype).alias(col))
        elif frame.schema[col] != dtype:
            columns.append(_cast(frame, col, dtype, file))
    frame = frame.with_columns(columns) if columns else frame
    _check_latencies(frame, name, file)
    return frame


#: the columns that say what a table's rows are of: without them a row is of nothing (a table from another file)
_KEY_COLUMNS = {"op_latency": ("op", "input_dims", "input_types"), "nccl_latency": ("collective",),
                "op_benchmarks": ("op_class",), "kernels": ("name",), "cpu_ops": ("name",)}

#: the columns that say whose and what each row is (and, for events, when): ingest writes them for every row (a row
#: without them is of no rank, operator, collective or time; the readers that place a profile's events and the
#: reports that name its operators assume them). Not a collective call's kind: ingest keeps a call it cannot name
#: (an NCCL kernel of no known name, with neither args nor an op that say it), counted and left out of nccl_latency
_REQUIRED_COLUMNS = {"kernels": ("rank", "name", "ts", "dur"), "cpu_ops": ("rank", "name", "ts", "dur"),
                     "collectives": ("rank", "ts", "dur"),
                     "graph_launches": ("rank", "name", "ts", "dur"), "op_latency": ("op",),
                     "nccl_latency": ("collective",)}

#: the columns of the latency tables that every prediction reads: finite and >= 0 (medians and counts present)
_LATENCY_COLUMNS = {"op_latency": ("count", "median_us", "p10_us", "p90_us", "mean_us"),
                    "nccl_latency": ("bytes", "count", "median_us", "p10_us", "p90_us", "mean_us", "wait_us",
                                     "algbw_gbps", "busbw_gbps"),
                    "op_benchmarks": ("median_us", "p10_us", "p90_us", "flops", "bytes")}

#: the time columns (µs), at most :data:`~vtrain.limits.MAX_TRACE_US` (a week: no trace holds a longer call; a
#: median of 1e300 µs made predictions of 1e300 ms without a word)
_TIME_COLUMNS = ("median_us", "p10_us", "p90_us", "mean_us", "wait_us")

#: the tables whose medians are of work that takes time: an imported kernel measurement of 0 µs is no measurement.
#: The tables ingest writes keep 0: Kineto before 1.9 wrote whole microseconds, so a tiny operator's kernels or a
#: small collective could last 0 (refused, such a trace made a profile vtrain could not read)
_POSITIVE_MEDIANS = ("op_benchmarks",)


#: the columns of the latency tables that count ranks, nodes or elements of a shape: at least 1 where given (a group
#: of 0 ranks or a GEMM of -5 rows changed predictions without a word)
_COUNT_COLUMNS = {"nccl_latency": ("group_size", "nodes"),
                  "op_benchmarks": ("batch", "m", "k", "n", "elements", "tp")}


def _check_latencies(frame: pl.DataFrame, name: str, file: Path) -> None:
    """Refuse a latency table whose times or counts are negative, NaN, infinite, beyond a week or (median, count)
    missing, whose group sizes or shapes are below 1, whose measured kernels or collectives take no time or
    whose GEMMs no FLOPs, or whose operator signatures do not parse: a prediction would use them as they are."""
    _check_rows(frame, name, file)
    for col in _COUNT_COLUMNS.get(name, ()):
        _refuse_rows(frame, frame[col] < 1, f"a {col} below 1", col, file)
    for col in _LATENCY_COLUMNS.get(name, ()):
        values = frame[col]
        if (col == "median_us" or col == "count" and name != "op_benchmarks") and values.null_count():
            raise InputError(f"{values.null_count()} row(s) without {col}", file)
        bad = values < 0
        if values.dtype.is_float():
            bad = bad | values.is_nan() | values.is_infinite()
        _refuse_rows(frame, bad, f"a {col} that is negative or not finite", col, file)
        if col in _TIME_COLUMNS:
            _refuse_rows(frame, values > MAX_TRACE_US, f"a {col} beyond a week ({MAX_TRACE_US:.0e} us)", col, file)


def _check_rows(frame: pl.DataFrame, name: str, file: Path) -> None:
    """The per-row rules beyond ranges: who, what and when present where ingest writes them, positive medians where
    work was measured, FLOPs for GEMMs, signatures that parse."""
    import polars as pl

    for col in _REQUIRED_COLUMNS.get(name, ()):
        if frame[col].null_count():
            raise InputError(f"{frame[col].null_count()} row(s) without {col} (ingest writes it for every row)", file)

    if name in _POSITIVE_MEDIANS:
        _refuse_rows(frame, frame["median_us"] == 0, "a median_us of 0 (a measured call takes time)", "median_us",
                     file)
    if name == "op_benchmarks":
        gemm = frame["op_class"] == "gemm"
        _refuse_rows(frame, gemm & (frame["flops"] <= 0), "a GEMM of no FLOPs", "flops", file)
    if name == "op_latency":
        unreadable = pl.Series([_unreadable(d) or _unreadable(t) for d, t in
                                zip(frame["input_dims"], frame["input_types"])], dtype=pl.Boolean)
        _refuse_rows(frame, unreadable, "input_dims or input_types that are no JSON list (a signature no "
                     "prediction can match)", "input_dims", file)


def _unreadable(text: str | None) -> bool:
    if text is None:
        return False
    try:
        return not isinstance(json.loads(text), list)
    except (ValueError, RecursionError):
        return True


def _refuse_rows(frame: pl.DataFrame, bad: pl.Series, what: str, col: str, file: Path) -> None:
    bad = bad.fill_null(False)
    if bad.any():
        row = int(bad.arg_true()[0])
        raise InputError(f"{bad.sum()} row(s) with {what} (first: row {row}, {frame[col][row]!r})", file)


def _cast(frame: pl.DataFrame, col: str, dtype: pl.DataType, file: Path) -> pl.Series:
    import polars as pl

    problem = f"column {col} holds {frame.schema[col]}, not {dtype}"
    if frame.schema[col] == pl.String and dtype.is_numeric():
        raise InputError(f"wrong schema: {problem}", file)
    if frame.schema[col].is_float() and dtype.is_integer() and (frame[col] != frame[col].floor()).any():
        raise InputError(f"wrong schema: {problem} (fractional values)", file)
    try:
        return frame[col].cast(dtype, strict=True)
    except Exception:  # polars raises InvalidOperationError or ComputeError depending on the types
        raise InputError(f"wrong schema: {problem}", file) from None
