"""The trace sets `vtrain record` shipped in traces/ (see traces/RECORDED.md): complete, loadable by HTA and
`vtrain ingest`, named in the vtrain span scheme, and still what the current code records."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from tests.conftest import TRACES
from vtrain.naming import parse_span_name
from vtrain.record.launcher import record
from vtrain.runconfig import load_run_config

RECORDED_SETS = sorted(p for p in TRACES.glob("t*p*d*") if (p / "run.yaml").exists())
REQUIRED = {"t2p1d1", "t1p2d1", "t1p1d2", "t2p2d2"}


class _Event(msgspec.Struct):
    """The fields of a trace event that name a span (the rest of the event is skipped while decoding)."""

    ph: str = ""
    cat: str = ""
    name: str = ""


class _Trace(msgspec.Struct):
    traceEvents: list[_Event]


def user_spans(trace: Path) -> list[str]:
    """The names of the complete ``user_annotation`` events (decoded with msgspec: the standard library's json
    takes ~1 s a file to build every event's dict)."""
    events = msgspec.json.decode(gzip.decompress(trace.read_bytes()), type=_Trace).traceEvents
    return [e.name for e in events if e.ph == "X" and e.cat == "user_annotation"]


def test_required_sets_are_shipped() -> None:
    assert REQUIRED <= {p.name for p in RECORDED_SETS}


@pytest.mark.parametrize("trace_set", RECORDED_SETS, ids=lambda p: p.name)
def test_set_is_complete_small_and_loads_in_hta_and_ingest(trace_set: Path, shipped_profile) -> None:
    from vtrain.validate.hta import hta_analysis

    config = load_run_config(trace_set)
    world = config.parallelism.world_size
    assert config.constraint_errors() == []
    assert sorted(p.name for p in trace_set.iterdir()) == sorted(
        [f"rank-{r}.json.gz" for r in range(world)] + ["run.yaml"])
    assert sum(p.stat().st_size for p in trace_set.iterdir()) < 8 << 20

    steps = config.recording["steps"]
    analysis = hta_analysis(trace_set, include_last_profiler_step=True)
    traces = analysis.t.get_all_traces()
    assert sorted(traces) == list(range(world))
    for frame in traces.values():
        assert frame["iteration"][frame["iteration"] >= 0].nunique() == steps

    profile = shipped_profile(trace_set)  # `ingest_traces`, once per test run (tests/conftest.py)
    assert profile.metadata["world_size"] == world
    assert profile.tables["cpu_ops"].height > 0 and profile.tables["op_latency"].height > 0
    assert profile.tables["collectives"].height > 0


def test_t2p2d2_spans_follow_the_schedule() -> None:
    """Every rank of the 8-rank set has the spans its place in the grid implies, per profiled step."""
    trace_set = TRACES / "t2p2d2"
    config = load_run_config(trace_set)
    par, layers = config.parallelism, config.model.layers
    steps, mbs, per_stage = config.recording["steps"], par.micro_batches, layers // par.pp
    for rank in range(par.world_size):
        stage = rank // (par.dp * par.tp)
        counts = Counter()
        for name in user_spans(trace_set / f"rank-{rank}.json.gz"):
            parsed = parse_span_name(name)
            if parsed:
                kind, fields = parsed
                counts[(kind, fields.get("purpose"), fields.get("op"), fields.get("phase"))] += 1
        first, last = stage == 0, stage == par.pp - 1
        expected = {
            ("forward", None, None, None): mbs,
            ("backward", None, None, None): mbs,
            ("optimizer", None, None, None): 1,
            ("layer", None, None, "forward"): mbs * per_stage,
            ("layer", None, None, "backward"): mbs * per_stage,
            ("embedding", None, None, "forward"): mbs * first,
            ("embedding", None, None, "backward"): mbs * first,
            ("head", None, None, "forward"): mbs * last,
            ("head", None, None, "backward"): mbs * last,
            ("comm", "tp", "all_reduce", "forward"): mbs * (2 * per_stage + first + 3 * last),
            ("comm", "tp", "all_reduce", "backward"): mbs * (2 * per_stage + last),
            ("comm", "pp", "send", "forward"): mbs * (not last),
            ("comm", "pp", "recv", "forward"): mbs * (not first),
            ("comm", "pp", "send", "backward"): mbs * (not first),
            ("comm", "pp", "recv", "backward"): mbs * (not last),
            ("comm", "dp", "all_reduce", None): 1,
        }
        assert counts == Counter({key: n * steps for key, n in expected.items() if n}), f"rank {rank}"


def test_shipped_losses_are_what_the_code_records_today(tmp_path: Path) -> None:
    """All sets share one model, seed and batch, so every split must have logged the same losses; a fresh
    single-rank recording must reproduce them (re-record the sets when this fails after a model change)."""
    configs = {p.name: load_run_config(p) for p in RECORDED_SETS}
    reference = configs["t2p2d2"]
    for name, config in configs.items():
        assert (config.model, config.recording["seed"]) == (reference.model, reference.recording["seed"]), name
        assert config.recording["loss"] == pytest.approx(reference.recording["loss"], rel=1e-5), name
    single = reference.with_overrides(tp=1, pp=1, dp=1)
    fresh = record(single, tmp_path / "t1p1d1", steps=1, warmup=1, seed=reference.recording["seed"], device="cpu")
    assert fresh is not None
    assert fresh.losses == pytest.approx(reference.recording["loss"][:2], rel=1e-5)
