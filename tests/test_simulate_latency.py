"""Latency resolution: exact signature, then the same op at other shapes scaled, then the device model; and
collectives from the NCCL table or the α-β model."""

from __future__ import annotations

import polars as pl
import pytest

from vtrain.devices import DATASHEET_DEVICES, Link
from vtrain.model.ops import Collective, make_op
from vtrain.simulate.collective_latency import CollectiveResolver, wait_once
from vtrain.simulate.latency import (
    HOST_ISSUE,
    INTERFERENCE,
    INTERPOLATED,
    MEASURED,
    MODELLED,
    OPERATOR,
    STRAGGLER_WAIT,
    TRANSFER,
    HostGapResolver,
    IssueRate,
    OpLatencyResolver,
    Resolution,
)
from vtrain.simulate.workload import ResolvedStep, issued
from vtrain.tables.store import Profile, conform, empty_table

A100 = DATASHEET_DEVICES["A100-40GB"]
F = "float"


def profile(op_rows: list[dict[str, object]], nccl_rows: list[dict[str, object]] | None = None) -> Profile:
    tables = {name: empty_table(name) for name in ("kernels", "cpu_ops", "collectives")}
    tables["op_latency"] = conform(pl.DataFrame(op_rows), "op_latency")
    tables["nccl_latency"] = conform(pl.DataFrame(nccl_rows), "nccl_latency") if nccl_rows else \
        empty_table("nccl_latency")
    return Profile(tables=tables)


def mm(m: int, k: int, n: int, dtype: str = F):
    return make_op("aten::mm", [[m, k], [k, n]], [dtype, dtype])


def gelu(n: int):
    return make_op("aten::gelu", [[n], []], [F, ""])


def row(op, median: float, device_type: str = "cuda", kernels: str = "k") -> dict[str, object]:
    return {"op": op.name, "input_dims": op.input_dims, "input_types": op.input_types,
            "device_type": device_type, "median_us": median, "kernels": kernels}


def test_exact_signature_is_measured_with_its_kernels() -> None:
    op = mm(256, 64, 192)
    resolver = OpLatencyResolver(profile([row(op, 12.5, kernels="ampere_sgemm ; splitK")]), A100, "cuda")
    resolution = resolver.resolve(op)
    assert (resolution.latency_us, resolution.source) == (12.5, MEASURED)
    assert resolution.kernels == ("ampere_sgemm", "splitK")


def test_device_type_must_match() -> None:
    op = mm(256, 64, 192)
    resolver = OpLatencyResolver(profile([row(op, 12.5, device_type="cpu")]), A100, "cuda")
    assert resolver.resolve(op).source == MODELLED


def test_gemm_is_scaled_by_flops_at_the_nearest_measured_efficiency() -> None:
    small, large = mm(128, 128, 128), mm(1024, 1024, 1024)
    resolver = OpLatencyResolver(profile([row(small, 10.0), row(large, 1000.0)]), A100, "cuda")
    # beyond the largest: the largest shape's work (its time less the launch) scaled by FLOPs, one launch added
    bigger = mm(2048, 1024, 1024)
    assert resolver.resolve(bigger).latency_us == pytest.approx(A100.launch_overhead_us
                                                                + 2 * (1000.0 - A100.launch_overhead_us))
    assert resolver.resolve(bigger).source == INTERPOLATED
    # between: the rate interpolated in log(FLOPs) between the neighbours
    middle = mm(512, 512, 512)  # 2^28 FLOPs; neighbours at 2^22 and 2^31 FLOPs
    rate_small, rate_large = small.flops / 10.0, large.flops / 1000.0
    weight = (28 - 22) / (31 - 22)
    expected = middle.flops / (rate_small + weight * (rate_large - rate_small))
    assert resolver.resolve(middle).latency_us == pytest.approx(expected)


def test_memory_bound_op_is_scaled_by_bytes() -> None:
    resolver = OpLatencyResolver(profile([row(gelu(1 << 20), 50.0)]), A100, "cuda")
    resolution = resolver.resolve(gelu(1 << 22))
    assert resolution.source == INTERPOLATED
    assert resolution.latency_us == pytest.approx(A100.launch_overhead_us + 4 * (50.0 - A100.launch_overhead_us))


def test_a_launch_bound_neighbour_says_nothing_of_a_larger_shape() -> None:
    """A 1 us kernel is its launch: its bytes per us carried to 4,096 times the bytes gave 4 ms. A kernel whose time
    is mostly its launch gives no rate beyond the measured shapes: the device model answers."""
    small, large = gelu(1 << 10), gelu(1 << 22)
    resolver = OpLatencyResolver(profile([row(small, 1.0)]), A100, "cuda")
    resolution = resolver.resolve(large)
    assert resolution.source == MODELLED
    assert resolution.latency_us == pytest.approx(A100.op_latency_us(large))
    # below the smallest measured shape: at least the launch, not a vanishing share of the neighbour's time
    resolver = OpLatencyResolver(profile([row(large, 300.0)]), A100, "cuda")
    assert resolver.resolve(small).latency_us >= A100.launch_overhead_us


def test_other_dtypes_do_not_count_as_the_same_op() -> None:
    resolver = OpLatencyResolver(profile([row(mm(128, 128, 128), 10.0)]), A100, "cuda")
    half = mm(128, 128, 128, "c10::Half")
    resolution = resolver.resolve(half)
    assert resolution.source == MODELLED
    expected = A100.launch_overhead_us + half.flops / (312e12 * A100.gemm_efficiency) * 1e6
    assert resolution.latency_us == pytest.approx(expected)


def test_no_profile_means_modelled() -> None:
    resolver = OpLatencyResolver(None, A100, "cuda")
    op = gelu(1 << 20)
    resolution = resolver.resolve(op)
    assert resolution.source == MODELLED
    assert resolution.latency_us == pytest.approx(
        A100.launch_overhead_us + op.bytes / (A100.memory_bandwidth * A100.memory_efficiency) * 1e6)


def nccl(collective: str, group: int, nbytes: int, median: float) -> dict[str, object]:
    return {"collective": collective, "group_size": group, "bytes": nbytes, "device_type": "cuda",
            "median_us": median}


def test_collectives_interpolate_in_size_per_group_size() -> None:
    rows = [nccl("all_reduce", 8, 1 << 20, 100.0), nccl("all_reduce", 8, 1 << 22, 250.0),
            nccl("all_reduce", 2, 1 << 20, 40.0)]
    resolver = CollectiveResolver(profile([row(mm(1, 1, 1), 1.0)], rows), A100, "cuda", node_size=8)
    assert resolver.resolve("all_reduce", 8, 1 << 20, 1).source == MEASURED
    middle = resolver.resolve("all_reduce", 8, (1 << 20) + (3 << 20) // 2, 1)
    assert (middle.source, middle.latency_us) == (INTERPOLATED, pytest.approx(175.0))
    beyond = resolver.resolve("all_reduce", 8, 1 << 23, 1)
    assert beyond.latency_us == pytest.approx(250.0 + 150.0 / (3 << 20) * (1 << 22))
    assert resolver.resolve("all_reduce", 2, 1 << 21, 1).source == INTERPOLATED
    assert resolver.resolve("all_reduce", 4, 1 << 20, 1).source == MODELLED  # no curve for 4 ranks


def test_two_sources_of_one_curve_are_averaged_not_interleaved() -> None:
    """nccl-tests and vidur both time the 8-GPU all-reduce of an A100 node, vidur every 32 KiB and about 17 %
    slower: merged into one curve the latency zigzagged between the two testbeds from one size to the next, and a
    size both give was whichever row came last. Each source is a curve; where both measured, their mean."""
    mib = 1 << 20
    fast = [{**nccl("all_reduce", 8, size * mib, 100.0 * size), "source": "nccl-tests"} for size in (1, 2, 4, 8)]
    slow = [{**nccl("all_reduce", 8, size * mib // 2, 60.0 * size), "source": "vidur"} for size in range(1, 9)]
    for rows in (fast + slow, slow + fast, slow[::-1] + fast[::-1]):
        resolver = CollectiveResolver(profile([row(mm(1, 1, 1), 1.0)], rows), A100, "cuda", node_size=8)
        both = resolver.resolve("all_reduce", 8, 2 * mib, 1)  # 200 us by nccl-tests, 240 by vidur
        assert (both.source, both.latency_us) == (MEASURED, pytest.approx(220.0))
        assert "mean of nccl-tests, vidur" in both.detail
        between = [resolver.resolve("all_reduce", 8, size, 1).latency_us for size in (3 * mib // 2, 5 * mib // 2)]
        assert between == [pytest.approx((150.0 + 180.0) / 2), pytest.approx((250.0 + 300.0) / 2)]
        assert resolver.resolve("all_reduce", 8, mib // 4, 1).latency_us == pytest.approx(60.0)  # vidur alone
        beyond = resolver.resolve("all_reduce", 8, 6 * mib, 1)  # nccl-tests alone above vidur's 4 MiB
        assert (beyond.latency_us, beyond.detail.endswith("(nccl-tests)")) == (pytest.approx(600.0), True)


def test_alpha_beta_uses_intra_node_links_for_groups_inside_a_node() -> None:
    resolver = CollectiveResolver(None, A100, "cuda", node_size=8)
    nbytes = 64 << 20
    intra = resolver.resolve("all_reduce", 8, nbytes, rank_stride=1)
    inter = resolver.resolve("all_reduce", 8, nbytes, rank_stride=8)
    assert intra.source == inter.source == MODELLED
    assert intra.latency_us == pytest.approx(A100.intra_node.collective_us("all_reduce", 8, nbytes)[0])
    assert inter.latency_us == pytest.approx(A100.inter_node.collective_us("all_reduce", 8, nbytes)[0])
    assert inter.latency_us > intra.latency_us


def test_ring_and_tree_alpha_beta() -> None:
    link = Link(alpha_us=5.0, bandwidth_gbps=100.0)
    ring, algorithm = link.collective_us("all_reduce", 4, 1e9)
    assert algorithm == "ring"
    assert ring == pytest.approx(2 * 3 * 5.0 + 1e9 * 1.5 / 100e3)
    small, algorithm = link.collective_us("all_reduce", 64, 1024)
    assert algorithm == "tree"  # latency-bound: log steps beat 2(n-1) steps
    assert small == pytest.approx(2 * 6 * 5.0 + 2 * 1024 / 100e3)
    assert link.collective_us("all_gather", 4, 1e9)[0] == pytest.approx(3 * 5.0 + 1e9 * 0.75 / 100e3)
    assert link.collective_us("send", 2, 1e6)[0] == pytest.approx(5.0 + 1e6 / 100e3)
    assert link.collective_us("all_reduce", 1, 1e6)[0] == 0.0


def test_collectives_take_the_mean_transfer_and_add_the_straggler_wait_among_replicas() -> None:
    rows = [{**nccl("all_reduce", 2, 1 << 20, 100.0), "mean_us": 120.0, "wait_us": 30.0},
            {**nccl("send", 2, 1 << 20, 50.0), "mean_us": 60.0, "wait_us": 500.0}]
    resolver = CollectiveResolver(profile([row(mm(1, 1, 1), 1.0)], rows), A100, "cuda", node_size=8)
    reduce = resolver.resolve("all_reduce", 2, 1 << 20, 1)
    assert reduce.latency_us == pytest.approx(150.0)
    assert (reduce.part_us(TRANSFER), reduce.part_us(STRAGGLER_WAIT)) == (120.0, 30.0)
    send = resolver.resolve("send", 2, 1 << 20, 1)  # waiting for the other stage is the schedule's business
    assert (send.latency_us, send.part_us(STRAGGLER_WAIT)) == (60.0, 0.0)


def test_a_chain_of_reductions_waits_for_its_stragglers_once() -> None:
    """Gradient buckets issued back to back: a replica lagging 30 us makes the others wait at every bucket, but
    the chain ends only those 30 us later."""
    rows = [{**nccl("all_reduce", 2, size, 100.0), "mean_us": 100.0, "wait_us": wait}
            for size, wait in ((1 << 20, 30.0), (2 << 20, 20.0))]
    resolver = CollectiveResolver(profile([row(mm(1, 1, 1), 1.0)], rows), A100, "cuda", node_size=8)
    chain = wait_once([resolver.resolve("all_reduce", 2, size, 1) for size in (1 << 20, 2 << 20, 1 << 20)])
    assert [r.latency_us for r in chain] == [100.0, 100.0, 130.0]
    assert [r.part_us(STRAGGLER_WAIT) for r in chain] == [0.0, 0.0, 30.0]
    assert [r.part_us(TRANSFER) for r in chain] == [100.0, 100.0, 100.0]


def events(rows: list[tuple[str, object, float]]) -> pl.DataFrame:
    """Placed calls (phase, op, duration) as :func:`vtrain.tables.gaps.placed_events` gives them."""
    return pl.DataFrame([{"rank": 0, "iteration": 1, "device_type": "cuda", "phase": phase, "op": op.name,
                          "input_dims": op.input_dims, "input_types": op.input_types, "dur": dur, "gap": 0.0}
                         for phase, op, dur in rows])


def test_interference_scales_op_medians_per_phase() -> None:
    op, other = mm(128, 128, 128), gelu(1 << 20)
    resolver = OpLatencyResolver(profile([row(op, 10.0), row(other, 50.0)]), A100, "cuda")
    resolver.calibrate(events([("forward", op, 10.0), ("forward", op, 30.0), ("backward", other, 50.0)]))
    forward = resolver.resolve(op, "forward")
    assert forward.latency_us == pytest.approx(20.0) and forward.source == MEASURED
    assert (forward.part_us(OPERATOR), forward.part_us(INTERFERENCE)) == (pytest.approx(10.0), pytest.approx(10.0))
    assert resolver.resolve(op, "backward").latency_us == pytest.approx(10.0)
    assert resolver.resolve(op, "optimizer").latency_us == pytest.approx(10.0 * 90.0 / 70.0)  # all phases
    assert resolver.resolve(gelu(1 << 22), "backward").source == INTERPOLATED


def test_interference_per_stage_when_the_profile_is_the_runs_own() -> None:
    """Rank 1 (stage 1) ran its forward ops 3x their median, rank 0 (stage 0) at it."""
    op = mm(128, 128, 128)
    resolver = OpLatencyResolver(profile([row(op, 10.0)]), A100, "cuda")
    calls = pl.concat([events([("forward", op, 10.0)]), events([("forward", op, 30.0)]).with_columns(rank=pl.lit(1, dtype=pl.Int64))])
    resolver.calibrate(calls, stage_of={0: 0, 1: 1})
    assert resolver.resolve(op, "forward", 0).latency_us == pytest.approx(10.0)
    assert resolver.resolve(op, "forward", 1).latency_us == pytest.approx(30.0)
    assert resolver.resolve(op, "forward").latency_us == pytest.approx(20.0)  # over all stages
    assert resolver.resolve(op, "forward", 2).latency_us == pytest.approx(20.0)  # a stage it did not measure


def test_calibration_must_come_before_resolving() -> None:
    resolver = OpLatencyResolver(profile([row(mm(8, 8, 8), 1.0)]), A100, "cuda")
    resolver.resolve(mm(8, 8, 8))
    with pytest.raises(RuntimeError):
        resolver.calibrate(events([]))


def test_host_gaps_come_from_the_profiles_timeline_per_phase() -> None:
    from tests.test_tables_gaps import PLACED
    from tests.test_tables_gaps import op as cpu_op

    tables = {"kernels": empty_table("kernels"), "collectives": empty_table("collectives"),
              "op_latency": empty_table("op_latency"), "nccl_latency": empty_table("nccl_latency"),
              "cpu_ops": conform(pl.DataFrame([
                  cpu_op("ProfilerStep#1", 0.0, 1000.0, "user_annotation"),
                  cpu_op("vtrain/forward stage=0 mb=0", 0.0, 500.0, "user_annotation"),
                  cpu_op("aten::mm", 20.0, 100.0), cpu_op("aten::mm", 160.0, 100.0)]), "cpu_ops")}
    gaps = HostGapResolver(Profile(tables=tables), "cpu")
    gaps.fit(PLACED)
    forward = gaps.resolve("forward")
    assert forward is not None and forward.latency_us == pytest.approx(30.0) and forward.source == MEASURED
    assert gaps.resolve("backward").latency_us == pytest.approx(30.0)  # no backward spans: every phase
    without = HostGapResolver(None, "cpu")
    without.fit(PLACED)
    assert without.resolve("forward") is None


def _steps(latencies: list[float], collective_at: int | None = None) -> tuple:
    steps = []
    for index, latency in enumerate(latencies):
        step = (Collective("tp", "all_reduce", 1024, "c10::BFloat16") if index == collective_at
                else make_op("aten::mm", [[4, 4], [4, 4]], ["float", "float"]))
        steps.append(ResolvedStep(step, Resolution(latency, MEASURED, "test")))
    return tuple(steps)


def _rate(host_us: float, device_gap_us: float) -> IssueRate:
    return IssueRate(Resolution(host_us, MEASURED, "test"), device_gap_us)


def test_a_block_issued_by_a_slower_host_takes_the_hosts_time() -> None:
    """Ten 10 us operators, the host issuing one every 50 us: among blocks like it the device waits 40 us before
    each (the host's 50 us less the 10 us it ran), so the block takes the host's 500 us."""
    block = issued(_steps([10.0] * 10), _rate(50.0, 2.0), "forward")
    assert [step.gap_us for step in block] == pytest.approx([40.0] * 10)
    assert sum(s.latency_us + s.gap_us for s in block) == pytest.approx(500.0)
    assert block[0].gap.source == MODELLED and block[0].gap.part_us(HOST_ISSUE) == 50.0


def test_a_block_issued_by_a_faster_host_takes_the_devices_time() -> None:
    """Ten 100 us operators, the host issuing one every 20 us: the device runs them back to back but for its own
    2 us between operators; a collective gets no device gap and costs the host nothing."""
    block = issued(_steps([100.0] * 10, collective_at=4), _rate(20.0, 2.0), "backward")
    assert [step.gap_us for step in block] == pytest.approx([2.0] * 4 + [0.0] + [2.0] * 5)
    assert sum(s.latency_us + s.gap_us for s in block) == pytest.approx(1018.0)


def test_a_block_replayed_from_a_cuda_graph_is_issued_once() -> None:
    """The same ten 10 us operators replayed from a CUDA graph: the host's 50 us once, at the launch, so the
    device sets the pace, with its own 2 us between kernels: 120 us a block (500 us issued one by one)."""
    block = issued(_steps([10.0] * 10), _rate(50.0, 2.0), "forward", graph_launch=0)
    assert [step.gap_us for step in block] == pytest.approx([2.0] * 10)
    assert sum(s.latency_us + s.gap_us for s in block) == pytest.approx(120.0)
