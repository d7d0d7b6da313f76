"""Versioned profiles: a calibrated profile names its version (its folder name), when it was made, and its parent
(the base profile's path and the sha256 of the base's ``metadata.json``), so its lineage can be checked."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError
from vtrain.tables.schema import TRACE_SOURCE
from vtrain.tables.store import METADATA_FILE, Profile, load_profile


def metadata_sha256(profile_dir: str | Path) -> str:
    """sha256 of a profile folder's ``metadata.json`` (hex)."""
    return hashlib.sha256((Path(profile_dir) / METADATA_FILE).read_bytes()).hexdigest()


def load_base_profile(path: str | Path) -> Profile:
    """The base of a calibration: a profile folder (from `vtrain ingest` or `vtrain calibrate`)."""
    profile = load_profile(path)
    if not isinstance(profile.metadata, dict) or profile.metadata.get("kind", "profile") != "profile":
        raise InputError(f"not a profile folder: {METADATA_FILE} does not describe a profile", path)
    return profile


def with_base_benchmarks(new: Profile, base: Profile) -> tuple[Profile, str | None]:
    """``new`` (a fresh ingest) with what the base measured outside its traces and new traces cannot measure again:
    its ``op_benchmarks`` (LLMCompass, vidur, ...) and its ``nccl_latency`` rows of other sources (nccl-tests), which
    its fitted device model was fitted to. Without them the new profile's kernel model and collective curves were
    fitted from the new traces alone: a profile fitted to 34,000 kernel benchmarks lost its kernel model and 12 of
    its 14 collective curves, silently, and MT-NLG's prediction moved 36 %. Returns the line saying what was carried
    over (measured with the base's software), or ``None`` when there was nothing."""
    carried: dict[str, pl.DataFrame] = {}
    benchmarks = base.tables.get("op_benchmarks")
    if benchmarks is not None and benchmarks.height:
        own = new.tables.get("op_benchmarks")
        carried["op_benchmarks"] = benchmarks if own is None else pl.concat([own, benchmarks], how="diagonal_relaxed")
    collectives = base.nccl_latency.filter(pl.col("source") != TRACE_SOURCE)
    if collectives.height:
        carried["nccl_latency"] = pl.concat([new.nccl_latency, collectives], how="diagonal_relaxed")
    if not carried:
        return new, None
    counts = {"op_benchmarks": benchmarks.height if "op_benchmarks" in carried else 0,
              "nccl_latency": collectives.height}
    sources = sorted({*_sources(benchmarks if "op_benchmarks" in carried else None), *_sources(collectives)})
    metadata = {**new.metadata, "carried_over": {"from": str(base.path), **counts, "sources": sources}}
    line = (f"carried over from the base profile {base.path}: {counts['op_benchmarks']:,} kernel benchmarks and "
            f"{counts['nccl_latency']:,} collective measurements ({', '.join(sources)}), measured outside its traces "
            "with the base's software (the new traces measure neither): the device model is refitted to them and "
            "the new traces; run the benchmarks again to calibrate those too")
    return Profile(tables={**new.tables, **carried}, metadata=metadata, path=new.path), line


def _sources(table: pl.DataFrame | None) -> list[str]:
    return [] if table is None or "source" not in table.columns else [str(s) for s in table["source"].unique()]


def derive_profile(new_profile: Profile, base_profile_path: str | Path, *, version: str,
                   fitted: dict[str, Any] | None = None) -> Profile:
    """``new_profile`` as a version derived from the profile at ``base_profile_path``.

    Sets ``version``, ``created_at`` and ``parent`` (``{"path", "sha256", "version"}``, the sha256 being that of the
    base's ``metadata.json``). ``fitted`` is the place of a device model fitted to the new tables: written as
    ``metadata["fitted"]`` when given, absent otherwise (the fit itself is not part of this package).
    """
    base = Path(base_profile_path)
    base_metadata = json.loads((base / METADATA_FILE).read_text())
    metadata = {
        "kind": new_profile.metadata.get("kind", "profile"),
        "version": version,
        **{k: v for k, v in new_profile.metadata.items() if k not in ("kind", "version", "parent", "fitted")},
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "parent": {"path": str(base), "sha256": metadata_sha256(base),
                   "version": base_metadata.get("version", base.name)},
    }
    if fitted is not None:
        metadata["fitted"] = fitted
    return Profile(tables=new_profile.tables, metadata=metadata, path=new_profile.path)


def verify_lineage(profile: Profile) -> str | None:
    """Why ``profile``'s parent cannot be confirmed (missing, or its ``metadata.json`` changed since), or ``None``
    when the parent is there and unchanged. A profile without a parent (`vtrain ingest`) has nothing to check.
    A relative parent path is taken from the current folder, as it was given to `vtrain calibrate`."""
    parent = profile.metadata.get("parent")
    if not isinstance(parent, dict):
        return None
    folder = Path(parent["path"])
    if not (folder / METADATA_FILE).is_file():
        return f"parent {folder} is missing"
    if metadata_sha256(folder) != parent["sha256"]:
        return f"parent {folder} has changed since (sha256 of {METADATA_FILE} differs)"
    return None
