"""Versioned profiles: a calibrated profile names its version (its folder name), when it was made, and its parent
(the base profile's path and the sha256 of the base's ``metadata.json``), so its lineage can be checked."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from vtrain.errors import InputError
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
