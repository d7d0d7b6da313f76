"""The model reproduces what it measured: simulated from a profile of one iteration of a recorded CPU/gloo run,
the predicted iteration time is that iteration's measured time, within 5 %.

This is the model's own error. The validation suite compares against the *next* iteration instead, which on
these recordings (a shared 2-core machine) differs from the profiled one by 2-43 %; the report states that
change beside the error.

Two pipeline sets stay further off: gloo transfers rendezvous (a receive posted after its send still spends the
transfer once posted, about 5 ms on the recording machine), while the simulator's graph starts a pipeline
transfer as soon as the sender is done, so a late receiver gets its data at once.
"""

from __future__ import annotations

import polars as pl
import pytest

from tests.conftest import TRACES
from vtrain.ingest.pipeline import ingest_traces
from vtrain.runconfig import load_run_config
from vtrain.simulate import simulate
from vtrain.validate.model import held_out_profile

PROFILED = 2
WITHIN_5_PCT = ["t2p1d1", "t2p1d1-recompute", "t1p2d1-gpipe", "t1p1d2", "t1p1d2-overlap", "t2p2d2"]
RENDEZVOUS = ["t1p2d1", "t1p2d1-interleaved"]  # see the module docstring


def in_sample_error_pct(name: str) -> float:
    folder = TRACES / name
    profile = ingest_traces(folder)
    steps = profile["cpu_ops"].filter(pl.col("name") == f"ProfilerStep#{PROFILED}")
    measured_us = steps["dur"].mean()
    predicted_us = simulate(load_run_config(folder / "run.yaml"), held_out_profile(profile, [PROFILED])).iteration_us
    return 100.0 * (predicted_us - measured_us) / measured_us


@pytest.mark.parametrize("name", WITHIN_5_PCT)
def test_the_model_reproduces_the_profiled_iteration(name: str) -> None:
    assert abs(in_sample_error_pct(name)) <= 5.0


@pytest.mark.parametrize("name", RENDEZVOUS)
def test_pipelines_with_late_receivers_stay_within_a_known_bound(name: str) -> None:
    assert abs(in_sample_error_pct(name)) <= 25.0
