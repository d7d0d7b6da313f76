"""PyTorch's ``ZeroRedundancyOptimizer`` under DDP (``tests/data/audit-ddp/ddp-zero``: 2 gloo ranks): after its
step each rank broadcasts its share of the parameters, 29 ``gloo:broadcast`` calls a rank a step (about a tenth of
the step), which vtrain does not simulate. It was read as plain data parallelism without a word; the inferred run
now says that the broadcasts are not simulated, as measured, and the run is not modelled as sharded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.inferred_run import infer_run
from vtrain.tables.store import Profile

AUDIT = REPO / "tests" / "data" / "audit-ddp"


def test_its_broadcasts_are_said_not_simulated(shipped_profile: Callable[[Path], Profile]) -> None:
    profile = shipped_profile(AUDIT / "ddp-zero")
    inferred = infer_run(profile["cpu_ops"], profile.metadata["world_size"], "cpu")
    assert inferred.config is not None, inferred.reason
    assert not inferred.config.parallelism.distributed_optimizer
    said = next(part for part in inferred.assumed.split(", its ") if "ZeroRedundancyOptimizer" in part)
    assert "the parameters' broadcasts (29 calls, " in said and "ms a step as measured on rank 0) not simulated" in said
    milliseconds = float(said.split("29 calls, ")[1].split(" ms")[0])
    assert 5 < milliseconds < 200  # rank 0's 29.6 ms of its 261 ms step


def test_ingest_says_it(tmp_path: Path) -> None:
    """The warning ingest writes for traces without a run.yaml carries it."""
    ran = vtrain_in_process("ingest", AUDIT / "ddp-zero", "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert "(PyTorch's ZeroRedundancyOptimizer) simulated as data parallelism without it" in ran.stderr


def test_plain_ddp_says_nothing_of_it(shipped_profile: Callable[[Path], Profile]) -> None:
    profile = shipped_profile(AUDIT / "ddp-base")
    assert "ZeroRedundancyOptimizer" not in infer_run(profile["cpu_ops"], 2, "cpu").assumed
