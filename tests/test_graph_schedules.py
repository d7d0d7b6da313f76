"""Pipeline schedules and the execution graph: orders, dependencies, and size independent of replicas."""

from __future__ import annotations

import networkx as nx
import pytest

from vtrain.parallel import BACKWARD, FORWARD, stage_order
from vtrain.runconfig import RunConfig, run_config_from_dict
from vtrain.simulate import simulate

CASES = [(schedule, v, p, m) for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3))
         for p, m in ((1, 3), (2, 4), (3, 6), (4, 8)) if schedule != "interleaved" or p > 1]


@pytest.mark.parametrize(("schedule", "v", "p", "m"), CASES)
def test_every_pass_runs_once_and_forward_precedes_backward(schedule: str, v: int, p: int, m: int) -> None:
    for stage in range(p):
        order = stage_order(schedule, p, m, stage, v)
        assert sorted(order) == sorted((phase, c, mb) for phase in (FORWARD, BACKWARD) for c in range(v)
                                       for mb in range(m))
        for c in range(v):
            for mb in range(m):
                assert order.index((FORWARD, c, mb)) < order.index((BACKWARD, c, mb))


def test_1f1b_warms_up_with_p_minus_stage_minus_1_forwards_and_bounds_in_flight() -> None:
    p, m = 4, 8
    for stage in range(p):
        order = stage_order("1f1b", p, m, stage)
        first_backward = next(i for i, (phase, _, _) in enumerate(order) if phase == BACKWARD)
        assert first_backward == p - stage  # warm-up forwards, then one more forward
        in_flight = peak = 0
        for phase, _, _ in order:
            in_flight += 1 if phase == FORWARD else -1
            peak = max(peak, in_flight)
        assert peak == p - stage


def test_interleaved_order_is_megatrons() -> None:
    f, b = FORWARD, BACKWARD
    assert stage_order("interleaved", 2, 4, 0, 2) == [
        (f, 0, 0), (f, 0, 1), (f, 1, 0), (f, 1, 1),  # warm-up: (p - 1) * 2 + (v - 1) * p = 4 forwards
        (f, 0, 2), (b, 1, 0), (f, 0, 3), (b, 1, 1), (f, 1, 2), (b, 0, 0), (f, 1, 3), (b, 0, 1),
        (b, 1, 2), (b, 1, 3), (b, 0, 2), (b, 0, 3),
    ]


def config(dp: int, **parallelism: object) -> RunConfig:
    par = {"tp": 2, "pp": 4, "dp": dp, "micro_batch": 1, "global_batch": 8 * dp, "dp_overlap": True,
           "dp_bucket_mb": 1.0, **parallelism}
    return run_config_from_dict({
        "model": {"layers": 8, "hidden": 512, "heads": 8, "seq": 256, "vocab": 1024},
        "parallelism": par, "precision": "fp16",
        "hardware": {"device": "A100", "device_count": 2 * 4 * dp},
    })


@pytest.mark.parametrize(("schedule", "v"), [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_schedule_respects_dependencies_and_stream_order(schedule: str, v: int) -> None:
    sim = simulate(config(2, schedule=schedule, virtual_stages=v))
    graph, result = sim.graph, sim.schedule
    assert nx.is_directed_acyclic_graph(graph.graph)
    for u, w in graph.graph.edges:
        assert result.start_us[w] >= result.end_us[u] - 1e-9
    for order in graph.stream_order.values():
        for before, after in zip(order, order[1:]):
            assert result.start_us[after] >= result.end_us[before] - 1e-9
    per_stream: dict[int, list[int]] = {}
    for i, task in enumerate(graph.tasks):
        per_stream.setdefault(task.stream, []).append(i)
    for tasks in per_stream.values():  # no two tasks of one stream overlap
        spans = sorted((result.start_us[i], result.end_us[i]) for i in tasks)
        assert all(a_end <= b_start + 1e-9 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    path = sim.critical_path
    assert result.end_us[path[-1]] == pytest.approx(sim.iteration_us)
    assert result.start_us[path[0]] == 0.0


def test_graph_size_does_not_grow_with_data_parallel_replicas() -> None:
    small, large = simulate(config(2)), simulate(config(64))
    assert len(small.graph.tasks) == len(large.graph.tasks)
    assert small.graph.graph.number_of_edges() == large.graph.graph.number_of_edges()
    assert large.config.parallelism.world_size == 512
    # same micro-batches per replica: only the data-parallel all-reduce gets slower
    assert large.breakdown_us["compute"] == pytest.approx(small.breakdown_us["compute"])


def test_task_counts() -> None:
    p, m = 4, 8
    sim = simulate(config(1, pp=p, global_batch=m, dp_overlap=False))
    kinds = [t.kind for t in sim.graph.tasks]
    assert kinds.count("forward") == kinds.count("backward") == p * m
    assert kinds.count("pp") == 2 * (p - 1) * m
    assert kinds.count("optimizer") == p and kinds.count("dp") == 0
