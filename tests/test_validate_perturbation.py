"""A known perturbation shows up where it belongs: every GEMM of a recorded run made 2x slower in a copy of its
traces moves the GEMM class's error in the report, and nothing else."""

from __future__ import annotations

import gzip
import json
import shutil
from bisect import bisect_right
from itertools import accumulate
from pathlib import Path

import pytest

from tests.conftest import TRACES
from vtrain.tables.store import write_profile
from vtrain.validate.opclass import GEMM, op_class
from vtrain.validate.traces import validate_traces

RUN = TRACES / "t1p1d2"
SLOWER = 2.0


def slow_down_gemms(source: Path, target: Path, factor: float) -> int:
    """Copy ``source`` with every GEMM operator ``factor`` times longer; each rank's later events move by the
    time added before them (a monotonic warp of the rank's clock, so nesting and order are kept)."""
    target.mkdir()
    shutil.copy(source / "run.yaml", target / "run.yaml")
    slowed = 0
    for path in sorted(source.glob("rank-*.json.gz")):
        with gzip.open(path, "rt") as handle:
            trace = json.load(handle)
        gemms = sorted((e["ts"] + e["dur"], (factor - 1.0) * e["dur"]) for e in innermost_gemms(trace))
        ends = [end for end, _ in gemms]
        added = [0.0, *accumulate(extra for _, extra in gemms)]

        def warp(t: float) -> float:
            return t + added[bisect_right(ends, t)]

        for event in trace["traceEvents"]:
            if "ts" not in event or isinstance(event.get("pid"), str):
                continue
            end = event["ts"] + event.get("dur", 0.0)
            event["ts"] = warp(event["ts"])
            if "dur" in event:
                event["dur"] = warp(end) - event["ts"]
        slowed += len(gemms)
        with gzip.open(target / path.name, "wt", compresslevel=1) as handle:  # fast: a test's copy
            handle.write(json.dumps(trace))
    return slowed


def innermost_gemms(trace: dict) -> list[dict]:
    """GEMM operators holding no other GEMM (``aten::linear`` grows with the ``aten::addmm`` inside it)."""
    gemms = [e for e in trace["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") == "cpu_op" and op_class(e["name"]) == GEMM]
    return [g for g in gemms if not any(
        h is not g and h["tid"] == g["tid"] and g["ts"] <= h["ts"] and h["ts"] + h["dur"] <= g["ts"] + g["dur"]
        for h in gemms)]


def by_class(comparison) -> dict[str, dict]:
    return {row["op_class"]: row for row in comparison.classes}


@pytest.fixture(scope="module")
def validations(tmp_path_factory: pytest.TempPathFactory, shipped_profile):
    tmp = tmp_path_factory.mktemp("perturbation")
    profile = tmp / "profile"
    write_profile(shipped_profile(RUN), profile)  # `ingest_traces(RUN)`, once per test run (tests/conftest.py)
    slowed = tmp / "slowed"
    assert slow_down_gemms(RUN, slowed, SLOWER) > 0
    results = []
    for folder, name in ((RUN, "original"), (slowed, "slowed")):
        work = tmp / f"work-{name}"
        work.mkdir()
        results.append(validate_traces(folder, work, profile_dir=profile, with_hta=False))
    return results


def test_only_the_gemm_class_moves(validations) -> None:
    original, slowed = (by_class(v.model) for v in validations)
    assert set(original) == set(slowed) and GEMM in original
    gemm_before, gemm_after = original[GEMM], slowed[GEMM]
    assert gemm_after["measured_ms"] == pytest.approx(SLOWER * gemm_before["measured_ms"], rel=1e-6)
    assert gemm_after["predicted_ms"] == pytest.approx(gemm_before["predicted_ms"], rel=1e-9)
    expected = 100.0 * ((1.0 + gemm_before["error_pct"] / 100.0) / SLOWER - 1.0)
    assert gemm_after["error_pct"] == pytest.approx(expected, abs=1e-4)
    assert gemm_after["error_pct"] < gemm_before["error_pct"] - 10.0
    for op_class_name, row in original.items():
        if op_class_name == GEMM:
            continue
        for key in ("measured_ms", "predicted_ms"):  # equal up to float rounding of microsecond timestamps
            assert slowed[op_class_name][key] == pytest.approx(row[key], rel=1e-6, abs=1e-4), (op_class_name, key)
        assert slowed[op_class_name]["error_pct"] == pytest.approx(row["error_pct"], abs=1e-2), op_class_name
        # the rewritten trace's timestamps carry float64 rounding of ~1e-3 us (absolute times near 4e12 us), which
        # a MAPE scales by predicted/measured: relative tolerance
        assert slowed[op_class_name]["mape_pct"] == pytest.approx(row["mape_pct"], rel=1e-4, abs=1e-2), op_class_name


def test_the_slower_run_is_measured_slower_and_predicted_the_same(validations) -> None:
    original, slowed = validations
    assert slowed.model.measured_ms > original.model.measured_ms
    assert slowed.model.predicted_ms == pytest.approx(original.model.predicted_ms, rel=1e-9)
    worst = slowed.model.worst_ops[0]
    gemm_rows = [r for r in slowed.model.worst_ops if r["op_class"] == GEMM]
    assert gemm_rows and (worst["op_class"] == GEMM or abs(gemm_rows[0]["error_pct"]) > 40.0)
