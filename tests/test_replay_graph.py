"""The replay's dependency model on small hand-written Kineto traces: which edges it finds, and that a change in
one duration moves exactly what depends on it (and nothing else)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vtrain.replay.build import build_graph
from vtrain.replay.engine import GroupedEdges, evaluate
from vtrain.replay.graph import (
    EDGE_KINDS,
    EVENT,
    INFERRED,
    PEER,
    THREAD,
    WAKE,
    WORK,
    EdgeList,
    end_point,
    start_point,
)
from vtrain.replay.replayer import replay_traces
from vtrain.replay.trace import read_trace_set


def cpu(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


def runtime(name: str, ts: float, dur: float, correlation: int, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "External id": correlation}}


def kernel(name: str, ts: float, dur: float, correlation: int, stream: int = 7, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": correlation, "stream": stream, "device": 0, "External id": correlation}}


def write_trace(folder: Path, rank: int, events: list[dict], world: int = 1) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    document = {"schemaVersion": 1, "traceEvents": events,
                "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                    "pg_config": [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]}}
    (folder / f"rank-{rank}.json").write_text(json.dumps(document))


def index_of(trace, name: str, occurrence: int = 0) -> int:
    return [i for i, n in enumerate(trace.name) if n == name][occurrence]


def replay_with_extra(folder: Path, rank: int, name: str, kind: str, extra_us: float) -> tuple[np.ndarray, np.ndarray, list]:
    """Measured and replayed point times after adding ``extra_us`` to the duration edge (``kind``) of event
    ``name`` on ``rank``."""
    traces = read_trace_set(folder)
    graph = build_graph(traces)
    src, dst, delay, kinds = graph.edges.arrays()
    trace = next(t for t in traces if t.rank == rank)
    event = graph.offsets[traces.index(trace)] + index_of(trace, name)
    edge = np.flatnonzero((src == start_point(event)) & (dst == end_point(event))
                          & (kinds == EDGE_KINDS.index(kind)))
    assert len(edge) == 1, f"no single {kind} edge over {name}"
    delay = delay.copy()
    delay[edge] += extra_us
    times, released = evaluate(graph.measured, src, dst, delay)
    assert released == 0
    return graph.measured, times, traces


def shift(measured: np.ndarray, times: np.ndarray, traces: list, rank: int, name: str, end: bool = False) -> float:
    graph_offsets = np.cumsum([0] + [len(t) for t in traces])
    position = [t.rank for t in traces].index(rank)
    event = graph_offsets[position] + index_of(traces[position], name)
    point = end_point(event) if end else start_point(event)
    return float(times[point] - measured[point])


@pytest.fixture()
def gpu_trace(tmp_path: Path) -> Path:
    """One thread: a GEMM and an add launched, then ``.item()``: a DtoH memcpy and a stream synchronize."""
    events = [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        cpu("aten::mm", 10, 50), runtime("cudaLaunchKernel", 20, 10, 101),
        cpu("aten::add", 70, 30), runtime("cudaLaunchKernel", 80, 10, 102),
        cpu("aten::item", 110, 390), runtime("cudaMemcpyAsync", 120, 10, 103),
        runtime("cudaStreamSynchronize", 140, 315, 104),
        cpu("aten::mul", 600, 40), runtime("cudaLaunchKernel", 610, 10, 105),
        kernel("ampere_sgemm_128x64_nn", 35, 265, 101), kernel("vectorized_elementwise_kernel", 305, 95, 102),
        kernel("Memcpy DtoH (Device -> Pageable)", 405, 45, 103, cat="gpu_memcpy"),
        kernel("vectorized_elementwise_kernel", 635, 20, 105),
    ]
    write_trace(tmp_path / "gpu", 0, events)
    return tmp_path / "gpu"


def test_unchanged_durations_replay_the_trace_exactly(gpu_trace: Path) -> None:
    replayed = replay_traces(gpu_trace)
    events = replayed.events
    assert np.allclose(events["sim_ts"].to_numpy(), events["ts"].to_numpy(), atol=1e-6)
    assert np.allclose(events["sim_dur"].to_numpy(), events["dur"].to_numpy(), atol=1e-6)
    assert replayed.stats.blocked_calls["inferred"] == 1  # the synchronize waited for the memcpy
    assert replayed.stats.device_started_by["launch"] >= 2 and replayed.stats.device_started_by["stream"] == 2


def test_a_slower_kernel_delays_its_stream_the_synchronize_and_what_follows(gpu_trace: Path) -> None:
    measured, times, traces = replay_with_extra(gpu_trace, 0, "ampere_sgemm_128x64_nn", WORK, 100.0)
    assert shift(measured, times, traces, 0, "vectorized_elementwise_kernel") == pytest.approx(100.0)
    assert shift(measured, times, traces, 0, "Memcpy DtoH (Device -> Pageable)") == pytest.approx(100.0)
    assert shift(measured, times, traces, 0, "cudaStreamSynchronize", end=True) == pytest.approx(100.0)
    assert shift(measured, times, traces, 0, "aten::mul") == pytest.approx(100.0)
    assert shift(measured, times, traces, 0, "ProfilerStep#1", end=True) == pytest.approx(100.0)
    # the CPU ran ahead of the GEMM until it had to wait: launches before the synchronize do not move
    assert shift(measured, times, traces, 0, "aten::add") == pytest.approx(0.0)
    assert shift(measured, times, traces, 0, "cudaStreamSynchronize") == pytest.approx(0.0)


def test_a_faster_kernel_lets_the_synchronize_return_sooner(gpu_trace: Path) -> None:
    measured, times, traces = replay_with_extra(gpu_trace, 0, "ampere_sgemm_128x64_nn", WORK, -200.0)
    assert shift(measured, times, traces, 0, "cudaStreamSynchronize", end=True) == pytest.approx(-200.0)
    assert shift(measured, times, traces, 0, "aten::mul") == pytest.approx(-200.0)


def two_stream_events(with_sync_record: bool) -> list[dict]:
    events = [
        cpu("ProfilerStep#1", 0, 500, cat="user_annotation"),
        runtime("cudaLaunchKernel", 10, 10, 201), runtime("cudaEventRecord", 25, 3, 202),
        runtime("cudaStreamWaitEvent", 30, 3, 203), runtime("cudaLaunchKernel", 35, 10, 204),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 50, 250, 201, stream=20),
        kernel("ampere_sgemm_64x64_nn", 303, 97, 204, stream=7),
    ]
    if with_sync_record:
        events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 7, "ts": 33,
                       "dur": 0, "args": {"stream": 7, "correlation": 203, "wait_on_stream": 20,
                                          "wait_on_cuda_event_record_corr_id": 202}})
    return events


@pytest.mark.parametrize(("recorded", "kind"), [(True, EVENT), (False, INFERRED)])
def test_cross_stream_waits_from_cuda_sync_records_or_timing(tmp_path: Path, recorded: bool, kind: str) -> None:
    folder = tmp_path / "streams"
    write_trace(folder, 0, two_stream_events(recorded))
    replayed = replay_traces(folder)
    assert replayed.stats.device_started_by[kind] == 1
    measured, times, traces = replay_with_extra(folder, 0, "ncclKernel_AllReduce_RING_LL_Sum_float", WORK, 60.0)
    assert shift(measured, times, traces, 0, "ampere_sgemm_64x64_nn") == pytest.approx(60.0)


@pytest.fixture()
def gloo_job(tmp_path: Path) -> Path:
    """Two CPU ranks; rank 0 computes longer, so rank 1's all-reduce waits for it; both then resume."""
    folder = tmp_path / "gloo"
    for rank, mm_dur, worker_start in ((0, 790.0, 850.0), (1, 90.0, 150.0)):
        issue = 10 + mm_dur + 10
        write_trace(folder, rank, [
            cpu("ProfilerStep#1", 0, 2000, cat="user_annotation"),
            cpu("aten::mm", 10, mm_dur), cpu("c10d::allreduce_", issue, 20),
            cpu("aten::add", 1560, 40),
            cpu("gloo:all_reduce", worker_start, 1500 - worker_start, tid=2, cat="user_annotation",
                **{"Input Dims": [[1024]]}),
        ], world=2)
    return folder


def test_collectives_are_matched_and_their_waiting_is_replayed_from_the_last_arrival(gloo_job: Path) -> None:
    replayed = replay_traces(gloo_job)
    assert replayed.stats.collectives_matched == 1
    assert np.allclose(replayed.events["sim_ts"].to_numpy(), replayed.events["ts"].to_numpy(), atol=1e-6)
    measured, times, traces = replay_with_extra(gloo_job, 0, "aten::mm", THREAD, 100.0)
    # the late rank is later still: both ends of the all-reduce and rank 1's resumption move with it
    assert shift(measured, times, traces, 0, "gloo:all_reduce", end=True) == pytest.approx(100.0)
    assert shift(measured, times, traces, 1, "gloo:all_reduce", end=True) == pytest.approx(100.0)
    assert shift(measured, times, traces, 1, "aten::add") == pytest.approx(100.0)
    assert shift(measured, times, traces, 1, "gloo:all_reduce") == pytest.approx(0.0)
    graph = build_graph(read_trace_set(gloo_job))
    kinds = {EDGE_KINDS[k] for k in graph.edges.kinds}
    assert {PEER, WAKE} <= kinds


def test_the_early_rank_getting_slower_is_absorbed_by_its_wait(gloo_job: Path) -> None:
    measured, times, traces = replay_with_extra(gloo_job, 1, "aten::mm", THREAD, 300.0)
    assert shift(measured, times, traces, 1, "gloo:all_reduce", end=True) == pytest.approx(0.0)
    assert shift(measured, times, traces, 0, "aten::add") == pytest.approx(0.0)


def test_collectives_without_their_peers_keep_the_measured_duration(gloo_job: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "rank-1.json").write_text((gloo_job / "rank-1.json").read_text())
    replayed = replay_traces(alone)
    assert replayed.stats.collectives_matched == 0
    assert sum(replayed.stats.collective_calls_unmatched.values()) == 1
    assert replayed.stats.collective_ends["measured"] == 1


def test_dependency_cycles_are_released_not_fatal() -> None:
    measured = np.array([0.0, 10.0, 20.0])
    src, dst, delay = np.array([0, 1, 2]), np.array([1, 2, 1]), np.array([5.0, 5.0, 0.0])
    times, released = evaluate(measured, src, dst, delay)
    assert released == 1
    assert np.isfinite(times).all()


@pytest.mark.parametrize("seed", range(20))
def test_edges_are_grouped_by_source_in_the_order_they_were_added(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 60)), int(rng.integers(0, 400))
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    delay, kind = rng.random(m), rng.integers(0, len(EDGE_KINDS), m).astype(np.int8)
    grouped = GroupedEdges.from_arrays(n, src, dst, delay, kind)
    order = np.argsort(src, kind="stable")  # the plain way: a stable sort of the edges by source
    assert np.array_equal(grouped.first, np.searchsorted(src[order], np.arange(n + 1)))
    assert np.array_equal(grouped.targets, dst[order]) and np.array_equal(grouped.delays, delay[order])
    assert np.array_equal(grouped.kinds, kind[order])
    back = grouped.arrays()
    for column, expected in zip(back, (src[order], dst[order], delay[order], kind[order])):
        assert np.array_equal(column, expected)


@pytest.mark.parametrize("seed", range(10))
def test_edges_gathered_from_rank_lists_are_grouped_as_one_list(seed: int) -> None:
    """Gathering several lists numbered from 0 (each moved by its shift) groups exactly as one list of every
    edge at its global number would, and empties the lists."""
    rng = np.random.default_rng(seed)
    lists, shifts, whole = [], [], []
    shift = 0
    for _ in range(int(rng.integers(1, 5))):
        n, m = int(rng.integers(1, 30)), int(rng.integers(0, 100))
        edge_list = EdgeList()
        for s_, d_, t_ in zip(rng.integers(0, n, m), rng.integers(0, n, m), rng.random(m)):
            edge_list.add(int(s_), int(d_), float(t_), EDGE_KINDS[int(s_) % len(EDGE_KINDS)])
            whole.append((int(s_) + shift, int(d_) + shift, float(t_), int(s_) % len(EDGE_KINDS)))
        lists.append(edge_list)
        shifts.append(shift)
        shift += n
    src, dst, delay, kind = (np.array([edge[i] for edge in whole]) for i in range(4))
    gathered = GroupedEdges.gather(shift, list(zip(lists, shifts)))
    expected = GroupedEdges.from_arrays(shift, src.astype(np.int64), dst.astype(np.int64), delay.astype(float),
                                        kind.astype(np.int8))
    for a, b in zip(gathered.arrays(), expected.arrays()):
        assert np.array_equal(a, b)
    assert all(len(edge_list) == 0 for edge_list in lists)


@pytest.mark.parametrize("seed", range(20))
def test_acyclic_graphs_replay_as_their_latest_paths(seed: int) -> None:
    """Without cycles a point's time is the latest of its incoming edges' ``source + delay``, or its measured
    time when nothing leads to it: checked against the plain recursion over a random order of the points."""
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(2, 80)), int(rng.integers(0, 300))
    rank = rng.permutation(n)  # edges go from a lower to a higher rank: no cycle
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = a != b
    src = np.where(rank[a] < rank[b], a, b)[keep]
    dst = np.where(rank[a] < rank[b], b, a)[keep]
    delay = rng.random(len(src)) * 10
    measured = rng.random(n) * 100
    expected = measured.copy()
    for q in np.argsort(rank):
        incoming = dst == q
        if incoming.any():
            expected[q] = max(expected[s] + d for s, d in zip(src[incoming], delay[incoming]))
    times, released = evaluate(measured, src, dst, delay)
    assert released == 0
    assert np.allclose(times, expected, rtol=0, atol=1e-9)
