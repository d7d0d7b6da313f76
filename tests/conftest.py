"""Shared fixtures: paths of the shipped trace sets."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
HTA_TRACE_SETS = sorted(p for p in TRACES.glob("hta-*") if p.is_dir())


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
