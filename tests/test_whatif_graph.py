"""`vtrain whatif`'s re-timing on hand-written traces with a closed form, and on a shipped trace: scaling one class
by F moves the iteration by exactly (F - 1) x that class's time on the critical path, and nothing that does not
depend on the scaled operators moves at all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests import test_replay_graph
from tests.test_replay_graph import cpu, write_trace
from vtrain.replay.build import build_graph
from vtrain.replay.engine import evaluate
from vtrain.replay.graph import EDGE_KINDS, THREAD
from vtrain.replay.trace import read_trace_set
from vtrain.whatif.changes import parse_scale, parse_scale_kernel
from vtrain.whatif.owners import NO_OWNER, own_edges
from vtrain.whatif.retime import TraceSet, edited_delays, load_trace_set, predict, what_if

TRACES = Path(__file__).resolve().parents[1] / "traces"
gpu_trace = test_replay_graph.gpu_trace  # the fixture: one GPU rank launching a GEMM, an add and a memcpy


def one_thread_iterations(mm: float = 1.0, drop_first_add: bool = False, split_softmax: bool = False) -> list[dict]:
    """Two iterations of one thread. Per iteration (400 µs): an add (40), a linear (150: 20 of its own around
    an mm of 130), a softmax (40), an mm (140), Python gaps between them. GEMM time on the path: 290 µs.
    ``mm`` multiplies the mm durations (the rest of the timeline follows); ``drop_first_add`` leaves out the
    first iteration's add (its time stays a gap); ``split_softmax`` gives the softmax a child operator of
    10 µs (the same 40 µs in all)."""
    events = []
    base = 0.0
    for step in (1, 2):
        first, second = 130 * mm, 140 * mm
        length = 130 + first + second
        events.append(cpu(f"ProfilerStep#{step}", base, length, cat="user_annotation"))
        if not (drop_first_add and step == 1):
            events.append(cpu("aten::add", base + 2, 40))
        events += [cpu("aten::linear", base + 50, 20 + first), cpu("aten::mm", base + 60, first),
                   cpu("aten::softmax", base + 75 + first, 40), cpu("aten::mm", base + 120 + first, second)]
        if split_softmax:
            events.append(cpu("aten::narrow", base + 80 + first, 10))
        base += length
    return events


@pytest.fixture()
def single(tmp_path: Path) -> Path:
    write_trace(tmp_path / "single", 0, one_thread_iterations())
    return tmp_path / "single"


def test_own_time_is_self_time_of_operators_and_nothing_of_annotations(single: Path) -> None:
    owned = own_edges(build_graph(read_trace_set(single)))
    trace = owned.graph.traces[0]
    own = dict(zip(range(len(trace)), owned.held_time[:owned.events]))
    by_name: dict[str, float] = {}
    for i, name in enumerate(trace.name):
        by_name[name] = by_name.get(name, 0.0) + own[i]
    assert by_name == {"ProfilerStep#1": 0.0, "ProfilerStep#2": 0.0, "aten::add": 80.0, "aten::linear": 40.0,
                       "aten::mm": 540.0, "aten::softmax": 80.0}
    gaps = (owned.kind == EDGE_KINDS.index(THREAD)) & (owned.owner == NO_OWNER)
    assert (owned.holder[gaps] >= owned.events).all()  # Python between operators: host stretches
    assert owned.delay[gaps].sum() == pytest.approx(2 * (400 - 40 - 150 - 40 - 140))


@pytest.mark.parametrize("factor", [0.5, 2.0, 3.0])
def test_scaling_a_class_moves_the_iteration_by_its_critical_path_share(single: Path, factor: float) -> None:
    before = what_if(single, [])
    share_us = before.baseline_paths[0].by_class["gemm"]
    assert share_us == pytest.approx(290.0)  # the closed form: linear's own 20 + mm 130 + mm 140 (iteration 2)
    after = what_if(single, [parse_scale(f"gemm={factor}")])
    assert after.predicted_us[2] - after.replayed_us[2] == pytest.approx((factor - 1.0) * share_us, abs=1e-6)
    assert after.predicted_paths[0].by_class["gemm"] == pytest.approx(factor * share_us)
    assert after.predicted_paths[0].by_class["elementwise/norm"] == pytest.approx(80.0)


def test_a_pattern_scales_only_the_named_operator(single: Path) -> None:
    after = what_if(single, [parse_scale_kernel("^aten::softmax$=3")])
    assert after.predicted_us[2] - after.replayed_us[2] == pytest.approx(2 * 40.0)
    assert after.scale_hits == {"/^aten::softmax$/": 2}


def test_operators_before_the_scaled_ones_do_not_move(single: Path) -> None:
    after = what_if(single, [parse_scale("gemm=2")])
    frame = after.replay.events
    add = frame.filter(frame["name"] == "aten::add").sort("ts")
    assert add["sim_ts"][0] == add["ts"][0] and add["sim_dur"][0] == add["dur"][0]
    mm = frame.filter(frame["name"] == "aten::mm").sort("ts")
    assert mm["sim_dur"].to_list() == pytest.approx([260.0, 280.0, 260.0, 280.0])


@pytest.fixture(scope="module")
def pipeline() -> TraceSet:
    return load_trace_set(TRACES / "t1p2d1")


def test_no_change_reproduces_the_replay_exactly(pipeline: TraceSet) -> None:
    result = predict(pipeline, [parse_scale("gemm=1")])
    assert result.predicted_us == result.replayed_us
    assert result.replayed_us == pytest.approx(result.measured_us, rel=1e-6)


@pytest.mark.parametrize("scale", ["gemm=2", "send/recv=3", "memory=0.5"])
def test_scaling_a_class_moves_nothing_that_does_not_depend_on_it(pipeline: TraceSet, scale: str) -> None:
    """On a shipped pipeline trace: every point not reachable from a scaled own time keeps its replayed time
    exactly, and what depends on it moves."""
    owned, rule = pipeline.owned, parse_scale(scale)
    hit = np.array([rule.applies(c, n) for c, n in zip(pipeline.frame["op_class"], pipeline.frame["name"])])
    held = pipeline.held
    scaled_held = np.concatenate([np.where(hit, rule.factor * pipeline.own, pipeline.own), held[owned.events:]])
    delay = edited_delays(owned, held, scaled_held)
    replayed, _ = evaluate(owned.graph.measured, owned.src, owned.dst, owned.delay)
    changed, _ = evaluate(owned.graph.measured, owned.src, owned.dst, delay)
    scaled = np.flatnonzero((owned.owner != NO_OWNER) & hit[np.maximum(owned.owner, 0)] & (owned.delay > 0))
    reachable = _reachable(owned.src, owned.dst, len(replayed), owned.dst[scaled])
    assert (~reachable).sum() > 0
    assert np.array_equal(changed[~reachable], replayed[~reachable])
    assert (changed[reachable] != replayed[reachable]).mean() > 0.5


def _reachable(src: np.ndarray, dst: np.ndarray, n: int, seeds: np.ndarray) -> np.ndarray:
    order = np.argsort(src, kind="stable")
    first = np.searchsorted(src[order], np.arange(n + 1))
    targets = dst[order]
    seen = np.zeros(n, dtype=bool)
    stack = list(set(seeds.tolist()))
    seen[stack] = True
    while stack:
        p = stack.pop()
        for q in targets[first[p]:first[p + 1]].tolist():
            if not seen[q]:
                seen[q] = True
                stack.append(q)
    return seen


def test_on_a_gpu_rank_a_class_scales_its_kernels_not_the_cpu_operator_that_launched_them(gpu_trace: Path) -> None:
    """The GEMM kernel (265 µs) halves; aten::mm on the CPU (its launch) keeps its 50 µs; the memcpy queued
    behind the GEMM and the add starts 132.5 µs earlier."""
    result = what_if(gpu_trace, [parse_scale("gemm=0.5")])
    frame = result.replay.events
    durations = dict(zip(frame["name"], frame["sim_dur"]))
    assert durations["ampere_sgemm_128x64_nn"] == pytest.approx(132.5)
    assert durations["aten::mm"] == pytest.approx(50.0)
    starts = dict(zip(frame["name"], frame["sim_ts"]))
    assert starts["Memcpy DtoH (Device -> Pageable)"] == pytest.approx(405 - 132.5)
    assert result.scale_hits == {"gemm": 1}


def test_a_kernel_renamed_by_another_build_is_matched_by_the_operator_that_launched_it(gpu_trace: Path,
                                                                                       tmp_path: Path) -> None:
    """The other recording picked another GEMM kernel (another name, 100 µs): it still replaces the GEMM, found
    by the operator that launched it (the kernel's External id is aten::mm's, as PyTorch writes them)."""
    document = json.loads((gpu_trace / "rank-0.json").read_text())
    for event in document["traceEvents"]:
        if event["name"] == "aten::mm":
            event["args"]["External id"] = 101
    (gpu_trace / "rank-0.json").write_text(json.dumps(document))
    for event in document["traceEvents"]:
        if event["name"] == "ampere_sgemm_128x64_nn":
            event["name"], event["dur"] = "sm80_xmma_gemm_f32f32_tn_n", 100
    other = tmp_path / "other-build"
    other.mkdir()
    (other / "rank-0.json").write_text(json.dumps(document))
    result = what_if(gpu_trace, [], other)
    assert result.matching is not None and result.matching.counts == {"base": 0, "other": 0}
    durations = dict(zip(result.replay.events["name"], result.replay.events["sim_dur"]))
    assert durations["ampere_sgemm_128x64_nn"] == pytest.approx(100.0)


def test_a_change_that_moves_the_steady_iterations_against_the_job_is_said() -> None:
    """An iteration ends where the host marks it: all-reduces 10x longer lengthened a recording's first two steps
    and shortened its third, which had waited on the scheduler (a CI run: the steady steps' mean -1.2 %). The
    iterations together, the job's time, only grow; where the two disagree in sign the what-if says so, and where
    they agree (a recording made here: +1.4 % steady, +9.4 % together) it says nothing."""
    from vtrain.whatif.retime import _shifted_steps

    replayed = {1: 2814.0, 2: 3365.0, 3: 16823.0}
    said = _shifted_steps({1: 4695.0, 2: 3441.0, 3: 16534.0}, replayed, [2, 3])
    assert said is not None and said.startswith("the steady iterations [2, 3] moved -1.1% and all 3 iterations "
                                                "together +7.3%")
    assert _shifted_steps({1: 4695.0, 2: 4441.0, 3: 16034.0}, replayed, [2, 3]) is None
    assert _shifted_steps(replayed, replayed, [2, 3]) is None
