"""Host gaps between the operators a model places: idle and unplaced operators count, waiting for a collective
does not, nested placed calls are calls of their own, phases come from the vtrain spans."""

from __future__ import annotations

import polars as pl
import pytest

from vtrain.tables.gaps import ALL, op_gaps, placed_events
from vtrain.tables.store import conform, empty_table

F = '["float", "float"]'
DIMS = "[[4, 4], [4, 4]]"
PLACED = {("aten::mm", DIMS, F), ("aten::add", DIMS, F), ("aten::copy_", DIMS, F)}


def op(name: str, ts: float, dur: float, cat: str = "cpu_op", dims: str | None = DIMS) -> dict[str, object]:
    return {"rank": 0, "tid": 1, "cat": cat, "name": name, "ts": ts, "dur": dur, "iteration": 1,
            "input_dims": dims if cat == "cpu_op" else None, "input_types": F if cat == "cpu_op" else None}


@pytest.fixture
def timeline() -> tuple[pl.DataFrame, pl.DataFrame]:
    cpu_ops = conform(pl.DataFrame([
        op("ProfilerStep#1", 0.0, 1000.0, "user_annotation"),
        op("vtrain/forward stage=0 mb=0", 10.0, 490.0, "user_annotation"),
        op("aten::mm", 20.0, 100.0),  # 20 us after the step starts
        op("aten::view", 130.0, 10.0),  # not placed: its time is gap
        op("c10d::allreduce_", 150.0, 20.0),  # issues the collective the thread then waits for until 300
        op("aten::add", 320.0, 20.0),  # gap 320 - 120 less the collective's 150..300: 50 us
        op("aten::copy_", 325.0, 5.0),  # nested in aten::add: a placed call of its own, no gap
        op("vtrain/backward stage=0 mb=0", 600.0, 300.0, "user_annotation"),
        op("aten::mm", 650.0, 50.0),  # between the passes: 650 - 340
    ]), "cpu_ops")
    collectives = conform(pl.DataFrame([{"rank": 0, "collective": "all_reduce", "ts": 160.0, "dur": 140.0,
                                         "iteration": 1, "bytes": 64, "device_type": "cpu"}]), "collectives")
    return cpu_ops, collectives


def test_gaps_count_idle_and_unplaced_time_but_not_collective_waits(timeline) -> None:
    cpu_ops, collectives = timeline
    events = placed_events(cpu_ops, empty_table("kernels"), collectives, PLACED).sort("dur", descending=True)
    by_op = {(name, dur): (gap, phase) for name, dur, gap, phase in events.select("op", "dur", "gap", "phase").iter_rows()}
    assert by_op[("aten::mm", 100.0)] == (pytest.approx(20.0), "forward")
    assert by_op[("aten::add", 20.0)] == (pytest.approx(50.0), "forward")
    assert by_op[("aten::copy_", 5.0)] == (0.0, "forward")
    assert by_op[("aten::mm", 50.0)] == (pytest.approx(310.0), "backward")


def test_gap_statistics_per_phase_and_over_all(timeline) -> None:
    cpu_ops, collectives = timeline
    stats = {row["phase"]: row for row in op_gaps(placed_events(cpu_ops, empty_table("kernels"), collectives,
                                                                PLACED)).iter_rows(named=True)}
    assert stats["forward"]["ops"] == 3 and stats["forward"]["mean_us"] == pytest.approx(70.0 / 3)
    assert stats["backward"]["mean_us"] == pytest.approx(310.0)
    assert stats[ALL]["gap_us"] == pytest.approx(380.0) and stats[ALL]["rank_iterations"] == 1


def test_an_overlapped_data_parallel_reduction_counts_once_its_issue_returned(timeline) -> None:
    """Gradient reductions completed within their pass run beside it in the simulator: the thread's time issuing
    one is host time."""
    cpu_ops, collectives = timeline
    cpu_ops = pl.concat([cpu_ops, conform(pl.DataFrame([
        op("vtrain/comm purpose=dp op=all_reduce stage=0 bucket=0", 145.0, 160.0, "user_annotation")]),
        "cpu_ops")])
    events = placed_events(cpu_ops, empty_table("kernels"), collectives, PLACED)
    add = events.filter(pl.col("op") == "aten::add")
    assert add["gap"].item() == pytest.approx(70.0)  # 320 - 120 less 170..300


def test_a_data_parallel_reduction_between_passes_is_waited_for(timeline) -> None:
    """Issued after the pass (no overlap), the reduction is on the simulator's critical path already."""
    cpu_ops, _ = timeline
    cpu_ops = pl.concat([cpu_ops, conform(pl.DataFrame([
        op("c10d::allreduce_", 520.0, 30.0), op("vtrain/comm purpose=dp op=all_reduce stage=0", 515.0, 100.0,
                                                  "user_annotation")]), "cpu_ops")])
    collectives = conform(pl.DataFrame([{"rank": 0, "collective": "all_reduce", "ts": 530.0, "dur": 10.0,
                                         "iteration": 1, "bytes": 64, "device_type": "cpu"}]), "collectives")
    events = placed_events(cpu_ops, empty_table("kernels"), collectives, PLACED)
    late = events.filter((pl.col("op") == "aten::mm") & (pl.col("phase") == "backward"))
    assert late["gap"].item() == pytest.approx(310.0 - 20.0)  # 520..540 waited for, though issued within 550


def test_the_mean_gap_is_that_of_a_typical_iteration() -> None:
    """Iterations with mean gaps 10, 12 and 500 us per op (a burst of other load in the last): 12 us."""
    rows = [{"rank": 0, "iteration": it, "device_type": "cpu", "phase": "forward", "op": "aten::mm",
             "input_dims": DIMS, "input_types": F, "dur": 1.0, "gap": gap, "host": None, "queued": None,
             "ahead": False, "graph": False}
            for it, gaps in ((1, (5.0, 15.0)), (2, (12.0, 12.0)), (3, (500.0, 500.0))) for gap in gaps]
    stats = op_gaps(pl.DataFrame(rows)).filter(pl.col("phase") == "forward").row(0, named=True)
    assert stats["mean_us"] == pytest.approx(12.0) and stats["gap_us"] == pytest.approx(1044.0)


def test_the_kernels_a_cuda_graph_launch_released_are_work_not_gap() -> None:
    """A graph's kernels carry its launch's correlation id and belong to no operator the model places (or, when the
    graph was launched outside any operator, to none at all): the device time they fill is not host gap. Known
    from the graph-launch table, not from kernels that happen to share an id."""
    cpu_ops = conform(pl.DataFrame([op("ProfilerStep#1", 0.0, 1000.0, "user_annotation"),
                                    op("aten::mm", 10.0, 5.0)]), "cpu_ops")
    kernel = {"rank": 0, "device": 0, "stream": 7, "kind": "kernel", "kernel_class": "computation", "iteration": 1}
    kernels = conform(pl.DataFrame([
        {**kernel, "name": "gemm", "ts": 20.0, "dur": 100.0, "correlation": 1, "external_id": 1, "cpu_op": "aten::mm",
         "input_dims": DIMS, "input_types": F},
        *({**kernel, "name": f"graph kernel {i}", "ts": 130.0 + 100.0 * i, "dur": 100.0, "correlation": 2}
          for i in range(5)),  # launched by a cudaGraphLaunch outside any operator
        {**kernel, "name": "gemm", "ts": 640.0, "dur": 10.0, "correlation": 3, "external_id": 3, "cpu_op": "aten::mm",
         "input_dims": DIMS, "input_types": F},
    ]), "kernels")
    launches = conform(pl.DataFrame([{"rank": 0, "tid": 1, "name": "cudaGraphLaunch", "ts": 125.0, "dur": 3.0,
                                      "correlation": 2, "kernels": 5, "iteration": 1}]), "graph_launches")
    collectives = empty_table("collectives")
    without = placed_events(cpu_ops, kernels, collectives, PLACED)
    with_graph = placed_events(cpu_ops, kernels, collectives, PLACED, launches)
    assert without["gap"].sum() == pytest.approx(20 + 520)  # the graph's 500 us counted as gap before the 2nd mm
    assert with_graph["gap"].sum() == pytest.approx(20 + 10 + 10)  # 10 before the graph, 10 after it
    assert with_graph.height == 3  # the two operators and the graph, one event


def _gpu_timeline(calls: list[tuple[float, float, float]],
                  iterations: int = 1) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One GPU rank's iterations, 10 ms apart: per call (host launch time, kernel start, kernel duration, from the
    iteration's start; ``iterations`` lists of them, or one), an ``aten::mm`` that launches one kernel."""
    per_iteration = [calls] if iterations == 1 else calls
    cpu_ops, kernels, index = [], [], 0
    for iteration, its_calls in enumerate(per_iteration, start=1):
        origin = 10_000.0 * (iteration - 1)
        cpu_ops.append({**op(f"ProfilerStep#{iteration}", origin, 10_000.0, "user_annotation"),
                        "iteration": iteration})
        for launch, start, dur in its_calls:
            index += 1
            cpu_ops.append({**op("aten::mm", origin + launch, 5.0), "external_id": index, "iteration": iteration})
            kernels.append({"rank": 0, "device": 0, "stream": 7, "kind": "kernel", "kernel_class": "computation",
                            "iteration": iteration, "name": "gemm", "ts": origin + start, "dur": dur,
                            "correlation": index, "external_id": index, "cpu_op": "aten::mm", "input_dims": DIMS,
                            "input_types": F})
    return conform(pl.DataFrame(cpu_ops), "cpu_ops"), conform(pl.DataFrame(kernels), "kernels")


def test_a_launch_bound_gpu_rank_shows_the_hosts_time_between_launches() -> None:
    """The host launches every 50 us; each kernel runs 10 us, 5 us after its launch: the device idles 40 us
    before each one, and the host's time per operator is the 50 us between launches."""
    cpu_ops, kernels = _gpu_timeline([(100.0 + 50 * i, 105.0 + 50 * i, 10.0) for i in range(6)])
    events = placed_events(cpu_ops, kernels, empty_table("collectives"), PLACED)
    assert events["host"].to_list() == [None, 50.0, 50.0, 50.0, 50.0, 50.0]
    assert events["queued"].to_list() == [0] * 6 and not events["ahead"].any()
    stats = op_gaps(events).filter(pl.col("phase") == ALL).row(0, named=True)
    assert stats["host_us"] == pytest.approx(50.0) and stats["host_calls"] == 5
    assert stats["mean_us"] == pytest.approx((105 + 5 * 40) / 6)


def test_a_device_bound_gpu_rank_shows_the_devices_own_time_between_operators() -> None:
    """The host launches every 20 us, far ahead of 100 us kernels that run 3 us apart: each launch is ahead of the
    device (its gap is the device's own, 3 us) and queues behind the kernels launched before it; the host's time
    is still the 20 us between launches."""
    cpu_ops, kernels = _gpu_timeline([(100.0 + 20 * i, 105.0 + 103 * i, 100.0) for i in range(6)])
    events = placed_events(cpu_ops, kernels, empty_table("collectives"), PLACED)
    assert events["ahead"].to_list() == [False] + [True] * 5
    assert events["queued"].to_list() == [0, 0, 1, 2, 3, 4]  # launched, not yet started (one running)
    stats = op_gaps(events).filter(pl.col("phase") == ALL).row(0, named=True)
    assert stats["host_us"] == pytest.approx(20.0) and stats["device_gap_us"] == pytest.approx(3.0)


def test_launches_that_keep_pace_with_the_device_say_nothing_of_the_host() -> None:
    """Every kernel starts at its launch, just as the one before ends (a synchronous host, or a timeline written
    so, like the simulator's own): the time between launches is the device's, so no host time is measured and the
    gaps (none) stand."""
    cpu_ops, kernels = _gpu_timeline([(100.0 + 30 * i, 100.0 + 30 * i, 30.0) for i in range(6)])
    events = placed_events(cpu_ops, kernels, empty_table("collectives"), PLACED)
    stats = op_gaps(events).filter(pl.col("phase") == ALL).row(0, named=True)
    assert stats["host_us"] is None and stats["host_calls"] == 0 and stats["gap_us"] == pytest.approx(100.0)


def test_the_hosts_time_is_that_of_a_typical_iteration() -> None:
    """A profile whose first profiled iteration is cold (the allocator, autotuning, lazy initialisation: the host
    takes 500 us between launches) and whose other two launch every 50 and 60 us: the host's time is the typical
    iteration's, 60 us (the median of the iterations' means), as the gaps' is, not the 200 us mean of every
    launch."""
    cold, warm, warmer = ([(100.0 + step * i, 105.0 + step * i, 10.0) for i in range(6)] for step in (500, 60, 50))
    cpu_ops, kernels = _gpu_timeline([cold, warm, warmer], iterations=3)
    events = placed_events(cpu_ops, kernels, empty_table("collectives"), PLACED)
    stats = op_gaps(events).filter(pl.col("phase") == ALL).row(0, named=True)
    assert stats["host_us"] == pytest.approx(60.0) and stats["host_calls"] == 15


def test_a_host_that_waited_for_a_launch_slot_between_two_launches_measured_nothing_of_its_own() -> None:
    """Between two placed launches that both found the queue nearly empty, the host launched 400 kernels of an
    operator the model does not place, faster than the device ran them: it waited for slots in the full launch
    queue, and the 4 ms between the placed launches were the device's, not the host's (in Megatron-core's
    24-layer H200 run one such stretch made 204 ms of an iteration's 694 the host's: +74 % predicted)."""
    cpu_ops, kernels = _gpu_timeline([(100.0, 105.0, 10.0), (4_200.0, 4_205.0, 10.0), (4_250.0, 4_255.0, 10.0)])
    unplaced_ops, unplaced = [], []
    for i in range(400):  # launched every 2 us from 120 us on, each kernel 10 us: the queue fills
        index = 1_000 + i
        unplaced_ops.append({**op("aten::sub", 120.0 + 2 * i, 1.0), "external_id": index})
        unplaced.append({"rank": 0, "device": 0, "stream": 7, "kind": "kernel", "kernel_class": "computation",
                         "iteration": 1, "name": "sub", "ts": 120.0 + 10 * i, "dur": 10.0, "correlation": index,
                         "external_id": index, "cpu_op": "aten::sub", "input_dims": DIMS, "input_types": F})
    cpu_ops = pl.concat([cpu_ops, conform(pl.DataFrame(unplaced_ops), "cpu_ops")])
    kernels = pl.concat([kernels, conform(pl.DataFrame(unplaced), "kernels")]).sort("ts")
    events = placed_events(cpu_ops, kernels, empty_table("collectives"), PLACED)
    assert events["host"].to_list() == [None, 4_100.0, 50.0]
    assert events["queued"][1] >= 256 and events["queued"][2] < 256  # the most queued since the launch before
    stats = op_gaps(events).filter(pl.col("phase") == ALL).row(0, named=True)
    assert stats["host_us"] == pytest.approx(50.0)  # the host's own: the stretch it waited in is left out
