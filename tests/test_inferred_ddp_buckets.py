"""PyTorch DDP's gradient buckets read off real traces and simulated as DDP fills them (``tests/data/audit-ddp``:
2-rank gloo runs of a 2-layer GPT recorded with torchrun, torch 2.13).

DDP closes its first bucket once it holds 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``), the others
once they hold ``bucket_cap_mb`` (25 MiB by default). With the defaults the run all-reduces 393,984 then 1,480,960
floats a step: the first bucket (1.503 MiB) was read as the cap, said as fact, and the model all-reduced 4 buckets of
about 1.5 MiB; its first bucket now says nothing of the cap (the default, said). The model does not yet close the
reference framework's first bucket at 1 MiB as DDP does: with it, an autocast run's gradients (fp32, which the
reference model prices at 2 bytes under bf16) fall into one late bucket (tests/test_gloo_gpu_traces.py's
h100-gloo-world2: -17.2 -> -29.6 %); it waits for autocast's fp32 gradients to be modelled."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import REPO
from vtrain.ingest.inferred_run import InferredRun, infer_run
from vtrain.simulate import simulate
from vtrain.tables.store import Profile

AUDIT = REPO / "tests" / "data" / "audit-ddp"
#: each traced run's gradient all-reduces of a step, in floats, as its traces record them
TRACED_BUCKETS = {"ddp-base": [393_984, 1_480_960],
                  "ddp-bucket1": [393_984, 263_168, 263_680, 262_912, 263_168, 263_680, 164_352]}


def _inferred(profile: Profile, folder: Path) -> InferredRun:
    """The run ``folder``'s traces (ingested: ``profile``) show, read as ingest reads it."""
    groups = (json.loads(gzip.decompress((folder / "rank-0.json.gz").read_bytes())).get("distributedInfo")
              or {}).get("pg_config")
    return infer_run(profile["cpu_ops"], profile.metadata["world_size"], "cpu", groups)


def _simulated_buckets(inferred: InferredRun, profile: Profile) -> list[int]:
    """The floats each gradient bucket of the simulated run all-reduces, in the order filled."""
    assert inferred.config is not None, inferred.reason
    tasks = sorted((task for task in simulate(inferred.config, profile).graph.tasks if task.kind == "dp"),
                   key=lambda task: task.bucket)
    return [task.work.bytes // 4 for task in tasks]  # type: ignore[union-attr]


def test_ddp_first_bucket_says_nothing_of_its_cap(shipped_profile: Callable[[Path], Profile]) -> None:
    """DDP's defaults: its two buckets are the first (closed past 1 MiB) and the last (the rest, under the cap):
    neither says the cap, so it is the default, said; it was read as the first bucket's 1.503 MiB."""
    folder = AUDIT / "ddp-base"
    inferred = _inferred(shipped_profile(folder), folder)
    layout = inferred.config.parallelism
    assert (layout.dp, layout.dp_overlap, layout.dp_bucket_mb) == (2, True, 25.0)
    assert "buckets of 25 MiB" in inferred.assumed


#: DDP's first bucket, closed at 1 MiB, is not simulated yet (the module's description)
_FIRST_BUCKET = pytest.mark.xfail(strict=True, reason="DDP's 1 MiB first bucket is not simulated until autocast's "
                                                      "fp32 gradients are")


@pytest.mark.parametrize("name", [pytest.param("ddp-base", marks=_FIRST_BUCKET), "ddp-bucket1"])
def test_simulated_buckets_are_the_traced_ones(name: str, shipped_profile: Callable[[Path], Profile]) -> None:
    """The run read off the traces all-reduces the buckets the traces do: 2 with DDP's defaults (4 of about
    1.5 MiB before), and the 7 of ``bucket_cap_mb=1`` (6 before: its cap read as the median bucket, 1.006 MiB, more
    than a bucket of 1.003 MiB that closed; now the smallest bucket but the first and the last, 1.002 MiB)."""
    folder = AUDIT / name
    profile = shipped_profile(folder)
    inferred = _inferred(profile, folder)
    assert _simulated_buckets(inferred, profile) == TRACED_BUCKETS[name]
    if name == "ddp-bucket1":
        assert 1.0 <= inferred.config.parallelism.dp_bucket_mb < 1.003
        assert "buckets of" not in inferred.assumed


def test_only_ddp_closes_its_first_bucket_at_one_mib(shipped_profile: Callable[[Path], Profile]) -> None:
    """The same run as Megatron's (its gradient buffer), or all-reduced after the backward pass (not DDP's
    reducer), fills every bucket to the cap: one bucket of every gradient."""
    folder = AUDIT / "ddp-base"
    profile = shipped_profile(folder)
    inferred = _inferred(profile, folder)
    megatron = replace(inferred, config=replace(inferred.config, framework="megatron", fused_kernels=False))
    after = replace(inferred, config=replace(inferred.config, parallelism=replace(inferred.config.parallelism,
                                                                                  dp_overlap=False)))
    assert len(_simulated_buckets(megatron, profile)) == 1
    assert _simulated_buckets(after, profile) == [sum(TRACED_BUCKETS["ddp-base"])]
