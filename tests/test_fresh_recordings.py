"""Recordings made here and now with the installed torch (CPU), with profiler options and workloads the shipped
traces do not cover, read by `vtrain ingest` and `vtrain validate --no-hta`.

Each recording is made in the test (each takes well under a second once torch is imported) and each test fails on
the code before its fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import vtrain_in_process

torch = pytest.importorskip("torch")
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function  # noqa: E402


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> None:
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 16)


def test_an_execution_trace_beside_the_kineto_trace_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """``profile(execution_trace_observer=ExecutionTraceObserver().register_callback(FOLDER/...))`` writes the
    execution trace beside the Kineto trace. One over 1 MiB (a few hundred small operators already make one) was
    read as a trace and stopped ingest and validate ("not a Kineto trace: no traceEvents list"); it is now left
    out with a warning saying what it is, whatever its size."""
    folder = tmp_path / "traces"
    folder.mkdir()
    model, optimizer, batch = _model()
    observer = ExecutionTraceObserver().register_callback(str(folder / "execution_trace.json"))
    with profile(activities=[ProfilerActivity.CPU], execution_trace_observer=observer) as prof:
        for _ in range(3):
            _train_step(model, optimizer, batch)
            for _ in range(150):  # small operators: each is a node of the execution trace
                batch.add(1.0)
            prof.step()
    prof.export_chrome_trace(str(folder / "rank-0.json"))
    execution_trace = folder / "execution_trace.json"
    assert execution_trace.stat().st_size > 1 << 20, "the execution trace must be larger than 1 MiB"
    assert "nodes" in json.loads(execution_trace.read_text())
    line = f"warning: {execution_trace}: not read: a PyTorch execution trace (ExecutionTraceObserver)"
    ingested = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile", "--json")
    assert ingested.returncode == 0, ingested.stderr
    assert line in ingested.stderr
    assert list(json.loads(ingested.stdout)["ranks"]) == ["0"]
    validated = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")
    assert validated.returncode == 0, validated.stderr
    assert line in validated.stderr
