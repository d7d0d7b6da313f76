"""The model reproduces what it measured: simulated from a profile of every other steady iteration of a recorded
CPU/gloo run (as `vtrain validate` builds it), the predicted iteration time is those iterations' measured time
(the median over them of the mean over ranks), within 5 %.

This is the model's own error. `vtrain validate` compares against the iterations in between instead, which on
a shared 2-core machine can run slower or faster than the profiled ones; its report states that change (and
the GEMM speed of both) beside the error.

The 8-rank set stays further off: its 8 ranks shared 2 cores, so operators ran slower than alone (the profile
measures the average slowdown) by how many ranks were running at the time, which a simulator giving every rank
its own processor cannot follow; its pass times match, its pipeline bubbles come out too long.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TRACES
from vtrain.replay.replayer import read_timeline
from vtrain.replay.trace import RankTrace
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.tables.store import Profile
from vtrain.validate.predictions import measured_job_ms
from vtrain.validate.model import held_out_profile, split_iterations
from vtrain.validate.timeline import annotate

WITHIN_5_PCT = ["t2p1d1", "t2p1d1-recompute", "t1p2d1", "t1p2d1-gpipe", "t1p2d1-interleaved", "t1p1d2",
                "t1p1d2-overlap"]
SHARED_CORES = ["t2p2d2"]  # see the module docstring


def in_sample_error_pct(name: str, ingest_traces: Callable[[Path], Profile],
                        read_trace_set: Callable[[Path], list[RankTrace]]) -> float:
    """``ingest_traces`` and ``read_trace_set``: vtrain's, each folder read once per test run (tests/conftest.py)."""
    folder = TRACES / name
    profile = ingest_traces(folder)
    steady = sorted(profile["cpu_ops"]["iteration"].drop_nulls().unique().to_list())[1:]
    profiled = split_iterations(steady).profile
    measured_ms = measured_job_ms(annotate(read_timeline(read_trace_set(folder))), profiled)
    config = load_run_config(folder / "run.yaml")
    predicted_ms = simulate(config, held_out_profile(profile, profiled)).iteration_us / 1e3
    return 100.0 * (predicted_ms - measured_ms) / measured_ms


@pytest.mark.parametrize("name", WITHIN_5_PCT)
def test_the_model_reproduces_the_profiled_iterations(name: str, shipped_profile, shipped_traces) -> None:
    assert abs(in_sample_error_pct(name, shipped_profile, shipped_traces)) <= 5.0


@pytest.mark.parametrize("name", SHARED_CORES)
def test_ranks_sharing_cores_stay_within_a_known_bound(name: str, shipped_profile, shipped_traces) -> None:
    assert abs(in_sample_error_pct(name, shipped_profile, shipped_traces)) <= 12.0
