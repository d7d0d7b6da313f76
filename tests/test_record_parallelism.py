"""Parallelism in `vtrain record` is real: every split of the same model, seed and data trains to the same loss.

Each case is a real multi-process gloo run (2 ranks, tiny model, 3 iterations of Adam); the loss of every
iteration must match the single-rank run to floating-point tolerance. With tp=2 the all-reduces change the
summation order, hence the tolerance.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from vtrain.naming import parse_span_name
from vtrain.record.launcher import Recording, record
from vtrain.runconfig import ModelConfig, ParallelConfig, RunConfig

MODEL = ModelConfig(layers=4, hidden=32, heads=4, seq=16, vocab=128)
BATCH = {"micro_batch": 2, "global_batch": 8}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Recording]:
    """Record a split of the test model (once per split in this module)."""
    done: dict[str, Recording] = {}

    def recorded(**parallel: object) -> Recording:
        key = ",".join(f"{k}={v}" for k, v in sorted(parallel.items())) or "single"
        if key not in done:
            config = RunConfig(model=MODEL, parallelism=ParallelConfig(**BATCH, **parallel))
            result = record(config, tmp_path_factory.mktemp("rec") / "trace", steps=2, warmup=1, seed=7,
                            device="cpu")
            assert result is not None
            done[key] = result
        return done[key]

    return recorded


@pytest.fixture(scope="module")
def single_rank(run: Callable[..., Recording]) -> list[float]:
    losses = run().losses
    assert len(losses) == 3
    return losses


@pytest.mark.parametrize("parallel", [
    {"tp": 2},
    {"pp": 2},
    {"dp": 2},
    {"pp": 2, "schedule": "gpipe"},
    {"pp": 2, "schedule": "interleaved", "virtual_stages": 2},
    {"tp": 2, "recompute": "full"},
    {"dp": 2, "dp_overlap": True, "dp_bucket_mb": 0.01},
], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_split_trains_to_the_single_rank_loss(run: Callable[..., Recording], single_rank: list[float],
                                              parallel: dict[str, object]) -> None:
    result = run(**parallel)
    assert result.losses == pytest.approx(single_rank, rel=1e-5)
    assert result.config.hardware.device_count == 2
    assert sorted(p.name for p in result.path.iterdir()) == [".vtrain-output", "rank-0.json.gz", "rank-1.json.gz", "run.yaml"]


def events(trace: Path) -> list[dict]:
    with gzip.open(trace, "rt") as handle:
        return [e for e in json.load(handle)["traceEvents"] if e.get("ph") == "X"]


def spans(trace: Path, kind: str) -> list[dict[str, str]]:
    parsed = (parse_span_name(e["name"]) for e in events(trace) if e.get("cat") == "user_annotation")
    return [fields for p in parsed if p is not None and p[0] == kind for fields in [p[1]]]


def linear_weight_dims(trace: Path) -> set[tuple[int, ...]]:
    return {tuple(e["args"]["Input Dims"][1]) for e in events(trace) if e["name"] == "aten::linear"}


def test_tensor_parallel_ranks_hold_shards_and_all_reduce(run: Callable[..., Recording]) -> None:
    h = MODEL.hidden
    result = run(tp=2)
    for rank in (0, 1):
        trace = result.path / f"rank-{rank}.json.gz"
        dims = linear_weight_dims(trace)
        assert {(3 * h // 2, h), (h, h // 2), (4 * h // 2, h), (h, 4 * h // 2), (MODEL.vocab // 2, h)} <= dims
        assert (3 * h, h) not in dims and (4 * h, h) not in dims
        tp_comms = [s for s in spans(trace, "comm") if s["purpose"] == "tp"]
        per_step_mb = 2 * 4  # steps x micro-batches
        # 2 per layer forward + 2 per layer backward, 1 embedding, 3 cross-entropy + 1 head backward
        assert len(tp_comms) == per_step_mb * (MODEL.layers * 4 + 1 + 4)


def test_pipeline_stages_hold_their_layers_and_exchange_activations(run: Callable[..., Recording]) -> None:
    result = run(pp=2)
    first, last = (result.path / f"rank-{rank}.json.gz" for rank in (0, 1))
    assert {s["layer"] for s in spans(first, "layer")} == {"0", "1"}
    assert {s["layer"] for s in spans(last, "layer")} == {"2", "3"}
    assert spans(first, "embedding") and not spans(first, "head")
    assert spans(last, "head") and not spans(last, "embedding")
    sends = [s for s in spans(first, "comm") if s["op"] == "send"]
    recvs = [s for s in spans(last, "comm") if s["op"] == "recv"]
    assert len(sends) == len(recvs) == 2 * 4 and all(s["phase"] == "forward" for s in sends)


def test_data_parallel_replicas_split_the_batch_and_all_reduce_gradients(run: Callable[..., Recording]) -> None:
    result = run(dp=2)
    for rank in (0, 1):
        trace = result.path / f"rank-{rank}.json.gz"
        assert len(spans(trace, "forward")) == 2 * 2  # steps x (8 sequences / 2 replicas / 2 per micro-batch)
        assert [s["purpose"] for s in spans(trace, "comm")] == ["dp"] * 2  # one 25 MB bucket per step


def test_training_moves_the_loss(single_rank: list[float]) -> None:
    """Guards the comparison above against a model that does not train at all (losses would match trivially)."""
    assert len(set(single_rank)) == len(single_rank)
