"""The cluster simulation's event logic on tiny clusters whose schedules are known in closed form.

Speeds are given in tokens per hour per allocation; a job of T tokens on a speed of r tokens/h runs T/r hours."""

from __future__ import annotations

import pytest

from vtrain.runconfig import ModelConfig
from vtrain.studies.cluster import Job, Speeds, simulate_cluster
from vtrain.studies.throughput import Prediction, Workload

WORKLOAD = Workload(ModelConfig(layers=2, hidden=64, heads=2, seq=16), global_batch=4)


def speeds(per_hour: dict[int, float]) -> Speeds:
    """Every job runs at ``per_hour[g]`` tokens per hour on g GPUs (no plan on other sizes)."""
    def throughput(workload: Workload, gpus: int) -> Prediction | None:
        rate = per_hour.get(gpus)
        return None if rate is None else Prediction(rate / 3600, label=f"{gpus} GPUs")
    return Speeds(throughput, sorted(per_hour))


LINEAR = {1: 1.0, 2: 2.0}


def job(name: str, tokens: float, arrival_h: float = 0.0, gpus: int | None = 2,
        deadline_h: float | None = None) -> Job:
    return Job(name, WORKLOAD, tokens, arrival_h, deadline_h, gpus)


def by_name(schedule) -> dict:
    return {j.name: j for j in schedule.jobs}


def test_baseline_is_first_come_first_served_with_the_asked_gpus():
    # B (4 tokens) is listed and arrives first: it runs 0..2 on 2 GPUs, A (2 tokens) 2..3
    jobs = [job("B", 4), job("A", 2)]
    s = simulate_cluster(jobs, 2, speeds(LINEAR), "baseline")
    j = by_name(s)
    assert (j["B"].start_h, j["B"].end_h) == (0, 2)
    assert (j["A"].start_h, j["A"].end_h) == (2, 3)
    assert s.makespan_h == 3 and s.mean_jct_h == 2.5 and s.utilization == 1.0


def test_vtrain_runs_the_shortest_remaining_job_first_under_linear_speedup():
    jobs = [job("B", 4), job("A", 2)]
    s = simulate_cluster(jobs, 2, speeds(LINEAR), "vtrain")
    j = by_name(s)
    assert (j["A"].start_h, j["A"].end_h, j["A"].segments[0].gpus) == (0, 1, 2)
    assert (j["B"].start_h, j["B"].end_h) == (1, 3)
    assert s.makespan_h == 3 and s.mean_jct_h == 2.0


def test_baseline_leaves_gpus_idle_when_jobs_ask_for_too_few():
    jobs = [job("A", 2, gpus=1), job("B", 4, gpus=1)]
    s = simulate_cluster(jobs, 2, speeds(LINEAR), "baseline")
    assert [(j.start_h, j.end_h) for j in s.jobs] == [(0, 2), (0, 4)]
    assert s.makespan_h == 4 and s.mean_jct_h == 3 and s.utilization == pytest.approx(6 / 8)


def test_baseline_waits_in_arrival_order_even_when_a_later_job_would_fit():
    # A holds 1 of 2 GPUs until 4; B asks 2 and waits; C asks 1 and must not overtake B
    jobs = [job("A", 4, gpus=1), job("B", 2, arrival_h=1, gpus=2), job("C", 1, arrival_h=2, gpus=1)]
    j = by_name(simulate_cluster(jobs, 2, speeds(LINEAR), "baseline"))
    assert (j["B"].start_h, j["B"].end_h) == (4, 5)
    assert (j["C"].start_h, j["C"].end_h) == (5, 6)


def test_vtrain_spreads_gpus_when_speedup_is_sublinear_and_grows_a_job_when_another_ends():
    # 2 GPUs run at 1.2x one: A (2) and B (5) get one each; at 2 A ends and B grows to 2 GPUs: 3 / 1.2 = 2.5 h
    jobs = [job("A", 2), job("B", 5)]
    s = simulate_cluster(jobs, 2, speeds({1: 1.0, 2: 1.2}), "vtrain")
    j = by_name(s)
    assert j["A"].end_h == pytest.approx(2)
    assert [(seg.start_h, seg.end_h, seg.gpus) for seg in j["B"].segments] == [(0, 2, 1), (2, pytest.approx(4.5), 2)]
    assert s.makespan_h == pytest.approx(4.5) and s.utilization == pytest.approx(1.0)


def test_a_resize_costs_the_restart_overhead_at_the_new_speed():
    jobs = [job("A", 2), job("B", 5)]
    s = simulate_cluster(jobs, 2, speeds({1: 1.0, 2: 1.2}), "vtrain", resize_overhead_h=0.25)
    j = by_name(s)
    assert j["A"].end_h == pytest.approx(2)  # never resized: no overhead
    assert j["B"].end_h == pytest.approx(4.75)


def test_a_job_near_its_end_is_not_resized_for_less_than_its_restart_costs():
    """B has 0.2 tokens left when A ends: on 1 GPU it ends 0.2 h later, grown to 2 after a 0.25 h restart 0.42 h
    later. The policy grew it (and the makespan with it: an audit of examples/cluster, 30.95 h for 30.92 h); it
    counts the restart now, and still grows a job whose gain outweighs it."""
    jobs = [job("A", 2), job("B", 2.2)]
    kept = by_name(simulate_cluster(jobs, 2, speeds({1: 1.0, 2: 1.2}), "vtrain", resize_overhead_h=0.25))
    assert [(seg.start_h, seg.end_h, seg.gpus) for seg in kept["B"].segments] == [(0, pytest.approx(2.2), 1)]
    grown = by_name(simulate_cluster(jobs, 2, speeds({1: 1.0, 2: 1.2}), "vtrain"))  # no restart to pay
    assert [seg.gpus for seg in grown["B"].segments] == [1, 2] and grown["B"].end_h == pytest.approx(2 + 0.2 / 1.2)


def test_a_later_short_job_preempts_and_the_long_one_resumes():
    # A (4) runs alone on 2 GPUs; B (1) arrives at 1 and takes both (gain 1/1 per GPU beats A's 1/2),
    # ends at 1.5; A resumes with 2 tokens left and ends at 2.5 (+ the overhead at 2 tokens/h)
    jobs = [job("A", 4), job("B", 1, arrival_h=1)]
    for overhead, a_end in ((0.0, 2.5), (0.5, 3.0)):
        s = simulate_cluster(jobs, 2, speeds(LINEAR), "vtrain", resize_overhead_h=overhead)
        j = by_name(s)
        assert (j["B"].start_h, j["B"].end_h) == (1, 1.5)
        assert [(seg.start_h, seg.end_h) for seg in j["A"].segments] == [(0, 1), (1.5, pytest.approx(a_end))]
        assert s.mean_jct_h == pytest.approx((a_end + 0.5) / 2)


def test_baseline_with_a_later_arrival():
    jobs = [job("A", 4), job("B", 1, arrival_h=1)]
    s = simulate_cluster(jobs, 2, speeds(LINEAR), "baseline")
    j = by_name(s)
    assert (j["B"].start_h, j["B"].end_h) == (2, 2.5)
    assert s.mean_jct_h == pytest.approx((2 + 1.5) / 2) and s.makespan_h == 2.5


def test_idle_cluster_until_the_first_arrival_is_not_in_the_makespan():
    jobs = [job("A", 2, arrival_h=10)]
    for policy in ("baseline", "vtrain"):
        s = simulate_cluster(jobs, 2, speeds(LINEAR), policy)
        assert s.jobs[0].start_h == 10 and s.makespan_h == 1 and s.utilization == 1.0


def test_vtrain_gives_no_gpu_that_buys_no_speed():
    # 2 GPUs are no faster than 1: the second GPU stays idle
    s = simulate_cluster([job("A", 2)], 2, speeds({1: 1.0, 2: 1.0}), "vtrain")
    assert s.jobs[0].segments[0].gpus == 1 and s.utilization == 0.5


def test_deadlines_are_reported():
    jobs = [job("B", 4, deadline_h=2), job("A", 2, deadline_h=2)]
    s = simulate_cluster(jobs, 2, speeds(LINEAR), "baseline")
    assert [j.met_deadline for j in s.jobs] == [True, False]
    assert s.to_dict()["deadlines_met"] == 1


def test_a_job_that_fits_no_allocation_is_an_error_not_a_hang():
    with pytest.raises(ValueError, match="can never run"):
        simulate_cluster([job("A", 2, gpus=4)], 2, speeds(LINEAR), "baseline")


def test_each_job_and_size_is_predicted_once():
    calls = []

    def throughput(workload, gpus):
        calls.append(gpus)
        return Prediction(gpus / 3600)

    jobs = [job("A", 2), job("B", 4), job("C", 1, arrival_h=0.5)]
    simulate_cluster(jobs, 2, Speeds(throughput, [1, 2]), "vtrain")
    assert sorted(calls) == [1, 2]  # all three share one workload


def test_allocation_sizes_are_powers_of_two_the_cluster_and_what_jobs_asked_for():
    from vtrain.studies.cluster import allocation_sizes

    assert allocation_sizes(48, [24, 64]) == [1, 2, 4, 8, 16, 24, 32, 48]
