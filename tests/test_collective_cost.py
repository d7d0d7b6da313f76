"""The collective cost arithmetic (vtrain/collective_cost.py) and the modules that use it: the nccl-tests importer,
the trace tables, the fitted α-β curves, the fitted device and the simulator must give one collective the same
bus factor and the same time."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import polars as pl
import pytest

from tests.conftest import REPO, TRACES
from vtrain.collective_cost import (
    INTER_NODE,
    INTRA_NODE,
    POINT_TO_POINT,
    STAND_INS,
    AlphaBeta,
    Link,
    bus_bandwidth_factor,
    link_name,
    nodes_spanned,
    ring_steps,
)
from vtrain.devices import DATASHEET_DEVICES
from vtrain.devices.fitted import FittedDevice
from vtrain.devices.model import DeviceModel
from vtrain.fit.alpha_beta import fit_collectives
from vtrain.importers import read_nccl_tests
from vtrain.ingest.pipeline import ingest_traces
from vtrain.parallel import Layout
from vtrain.simulate.collective_latency import CollectiveResolver
from vtrain.simulate.latency import MODELLED

NCCL = REPO / "tests" / "data" / "a100" / "vtrain-a100" / "nccl-tests-allreduce-a100"
A100 = DATASHEET_DEVICES["A100-80GB"]
GIB = 1 << 30


@pytest.mark.parametrize(("collective", "n", "factor"), [
    # nccl-tests' doc/PERFORMANCE.md: the factor that makes bus bandwidth comparable to the link's peak
    ("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 2, 1.0), ("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4),
    ("all_to_all", 16, 15 / 16), ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("send_recv", 2, 1.0),
    ("all_reduce", 1, 0.0), ("all_reduce", 0, 0.0), ("barrier", 8, 1.0),
])
def test_bus_factors_are_nccl_tests(collective: str, n: int, factor: float) -> None:
    assert bus_bandwidth_factor(collective, n) == pytest.approx(factor)


def test_ring_steps_and_link_choice() -> None:
    assert ring_steps("all_reduce", 8) == 14  # reduce-scatter then all-gather: 2(n-1)
    assert [ring_steps(c, 8) for c in ("all_gather", "reduce_scatter", "broadcast", "barrier")] == [7] * 4
    assert all(ring_steps(c, 64) == 1 for c in POINT_TO_POINT)
    # Megatron layout, 8 ranks a node: a tensor-parallel group of 8 (stride 1) stays in one node, a
    # data-parallel group of 4 spaced 2 apart (tp=2) too, one of 4 spaced 8 apart spans 4 nodes
    assert nodes_spanned(8, 1, 8) == 1 and nodes_spanned(4, 2, 8) == 1 and nodes_spanned(4, 8, 8) == 4
    assert nodes_spanned(9, 1, 8) == 2 and nodes_spanned(2, 8, 8) == 2 and nodes_spanned(4, 1, 0) == 4
    assert (link_name(1), link_name(None), link_name(0), link_name(2)) == (INTRA_NODE, INTRA_NODE, INTRA_NODE,
                                                                            INTER_NODE)


def test_the_importer_the_fitted_curve_the_device_and_the_simulator_agree_on_real_nccl_tests_rows() -> None:
    """nccl-tests' 8-GPU all-reduce on an A100 node: the bus bandwidth the importer computes, taken as a curve
    with no latency, as a fitted device's curve, as a link's bandwidth and through the simulator's resolver,
    gives back each row's measured time (all five use one factor, 2(n-1)/n)."""
    table = read_nccl_tests(NCCL / "allreduce_8gpu.csv")
    rows = table.filter(pl.col("bytes").is_in([1 << 20, 64 << 20, GIB])).sort("bytes")
    assert rows.height == 3
    for nbytes, median, algbw, busbw in rows.select("bytes", "median_us", "algbw_gbps", "busbw_gbps").iter_rows():
        assert busbw / algbw == pytest.approx(2 * 7 / 8)
        curve = AlphaBeta("all_reduce", 8, 1, alpha_us=0.0, bus_gbps=busbw, samples=1, mape_pct=0.0,
                          sources=("nccl-tests",))
        assert curve.time_us(nbytes) == pytest.approx(median)
        fitted = FittedDevice(**{**_fields(A100), "collectives": (curve,)})
        assert fitted.collective_us("all_reduce", 8, nbytes, nodes=1)[0] == pytest.approx(median)
        link = Link(alpha_us=0.0, bandwidth_gbps=busbw)
        assert link.collective_us("all_reduce", 8, nbytes) == (pytest.approx(median), "ring")
        for device in (fitted, _with_links(A100, link)):
            resolved = CollectiveResolver(None, device, "cuda", node_size=8).resolve("all_reduce", 8, nbytes, 1)
            assert (resolved.latency_us, resolved.source) == (pytest.approx(median), MODELLED)


def test_a_fitted_curve_reproduces_the_measured_bus_bandwidth() -> None:
    """The fit and the importer share the factor: on the bandwidth-bound sizes (256 MiB and up, where α is
    negligible) the fitted bus bandwidth is the files' busbw."""
    table = read_nccl_tests(NCCL / "allreduce_8gpu.csv")
    (fit,) = fit_collectives(table)
    large = table.filter(pl.col("bytes") >= 256 << 20)
    assert fit.bus_gbps == pytest.approx(large["busbw_gbps"].median(), rel=0.02)


def test_stand_ins_are_the_ratio_of_the_bus_factors() -> None:
    """Only an all-reduce measured: an all-gather over the same ranks takes what an all-gather curve with the same
    bus bandwidth gives (the stand-in ratio and the bus factors agree)."""
    reduce = AlphaBeta("all_reduce", 8, 1, alpha_us=0.0, bus_gbps=200.0, samples=2, mape_pct=0.0, sources=())
    device = FittedDevice(**{**_fields(A100), "collectives": (reduce,)})
    for collective in ("all_gather", "reduce_scatter"):
        assert STAND_INS[collective] == ("all_reduce", 0.5)
        own = AlphaBeta(collective, 8, 1, alpha_us=0.0, bus_gbps=200.0, samples=2, mape_pct=0.0, sources=())
        latency, detail = device.collective_us(collective, 8, GIB, nodes=1)
        assert latency == pytest.approx(own.time_us(GIB)) and "as 0.5x all_reduce" in detail


def test_trace_tables_use_the_same_factor_and_leave_unknown_groups_without_one() -> None:
    """Real traces: the A100 NCCL run's group sizes come from its metadata (all-reduce and broadcast over 2
    ranks), the 128-rank sample's all-reduces and all-to-alls have none (no bus bandwidth then)."""
    known = ingest_traces(TRACES / "hta-a100-2rank-nccl").nccl_latency
    assert known.height and known["group_size"].null_count() == 0
    for collective, n, algbw, busbw in known.select("collective", "group_size", "algbw_gbps",
                                                    "busbw_gbps").iter_rows():
        assert busbw == pytest.approx(algbw * bus_bandwidth_factor(collective, n))
    unknown = ingest_traces(TRACES / "hta-sm80-128rank-sampled").nccl_latency.filter(pl.col("group_size").is_null())
    assert unknown.height and unknown["busbw_gbps"].null_count() == unknown.height
    assert unknown["algbw_gbps"].null_count() == 0


def test_tree_wins_only_for_latency_bound_all_reduces() -> None:
    link = Link(alpha_us=5.0, bandwidth_gbps=100.0)
    for n in (4, 8, 64, 1024):
        for nbytes in (1 << 10, 1 << 20, GIB):
            ring = ring_steps("all_reduce", n) * 5.0 + nbytes * bus_bandwidth_factor("all_reduce", n) / 100e3
            tree = 2 * math.ceil(math.log2(n)) * 5.0 + 2 * nbytes / 100e3
            assert link.collective_us("all_reduce", n, nbytes) == (pytest.approx(min(ring, tree)),
                                                                   "tree" if tree < ring else "ring")
    assert link.collective_us("all_reduce", 2, 1 << 10)[1] == "ring"  # two ranks: no tree
    assert link.collective_us("all_gather", 64, 1 << 10)[1] == "ring"  # trees are for all-reduces only


def _fields(device: DeviceModel) -> dict[str, object]:
    names = ("name", "peak_flops", "memory_bandwidth", "launch_overhead_us", "gemm_efficiency", "memory_efficiency",
             "intra_node", "inter_node", "memory_bytes", "provenance")
    return {name: getattr(device, name) for name in names}


def _with_links(device: DeviceModel, link: Link) -> DeviceModel:
    return replace(device, intra_node=link, inter_node=link)


@pytest.mark.parametrize("node_size", [4, 6, 8])
def test_the_widest_group_of_every_layout_is_counted(node_size: int) -> None:
    """Against the groups themselves: for every layout of up to 64 ranks, the nodes spanned by the widest
    tensor-parallel group, data-parallel group and pair of neighbouring pipeline stages (6-GPU nodes included,
    where a t = 4 group straddles two nodes)."""
    def widest(groups: list[list[int]]) -> int:
        return max(len({rank // node_size for rank in group}) for group in groups)

    for tp, dp, pp in itertools.product([1, 2, 3, 4, 8], [1, 2, 3, 4], [1, 2, 3, 5]):
        layout = Layout(tp=tp, pp=pp, dp=dp)
        ranks = range(layout.world_size)
        pairs = [[rank, rank + tp * dp] for rank in ranks if layout.stage(rank) < pp - 1] or [[0]]
        for purpose, groups in (("tp", [layout.tp_group(r) for r in ranks]), ("dp", [layout.dp_group(r) for r in ranks]),
                                ("pp", pairs)):
            size, stride = layout.group_stride(purpose)
            if purpose == "pp" and pp == 1:
                continue
            spanned = nodes_spanned(size, stride, node_size, layout.world_size, neighbours=purpose == "pp")
            assert spanned == widest(groups), (purpose, tp, dp, pp)


def test_members_a_node_or_more_apart_span_one_node_each() -> None:
    assert nodes_spanned(2, 16, 8) == 2  # a pipeline pair 16 ranks apart on 8-GPU nodes
    assert nodes_spanned(4, 8, 8) == 4  # a data-parallel group at t = 8
    assert nodes_spanned(4, 2, 8) == 1  # t = 2, d = 4: ranks 0, 2, 4, 6
    assert nodes_spanned(4, 3, 8) == 2  # ranks 0, 3, 6, 9
    assert nodes_spanned(16, 1, 8) == 2  # t = 16
    assert nodes_spanned(1, 64, 8) == 1


def test_an_inter_node_group_gets_the_share_of_the_network_its_members_hold_on_a_node() -> None:
    """Nodes of eight A100s with 1,600 Gbit/s each (8 x 200 Gb/s HDR, one NIC per GPU): a data-parallel group at
    t = 8 (one GPU per node) reduces at one NIC's 25 GB/s, a group of all eight GPUs of two nodes at the node's
    200 GB/s, four per node at 100 GB/s. Before, every inter-node group got the node's whole 200 GB/s: a t = 8
    gradient all-reduce and every pipeline transfer between nodes 8x too fast."""
    from vtrain.devices.catalog import device_for_config
    from vtrain.runconfig import run_config_from_dict

    config = run_config_from_dict({
        "model": {"layers": 2, "hidden": 1024, "heads": 16, "seq": 1024},
        "parallelism": {"tp": 8, "dp": 2, "global_batch": 2},
        "hardware": {"device": "A100-80GB", "device_count": 16, "gpus_per_node": 8, "inter_node_gbps": 1600}})
    device = device_for_config(config)
    assert device.inter_node.bandwidth_gbps == 25.0  # a GPU's share of its node's network
    for size, nodes, bus in ((2, 2, 25.0), (8, 2, 100.0), (16, 2, 200.0), (12, 12, 25.0)):
        latency, detail = device.collective_us("all_reduce", size, GIB, nodes)
        assert detail.endswith(f"inter-node {bus:g} GB/s"), (size, nodes, detail)
        assert latency == device.inter_node_share(size, nodes).collective_us("all_reduce", size, GIB)[0]
    assert device.collective_us("send_recv", 2, GIB, 2)[1].endswith("inter-node 25 GB/s")
    assert device.collective_us("all_reduce", 8, GIB, 1)[1].endswith(f"intra-node {A100.intra_node.bandwidth_gbps:g} "
                                                                      "GB/s")  # NVLink: no share


def test_a_fitted_multi_node_curve_is_chosen_by_members_per_node_and_shares_a_given_rate() -> None:
    """vidur's two-node all-reduces (profiles/a100) ran at 5.9 GB/s of bus bandwidth with one GPU per node and 14.6
    with eight: a t = 8 data-parallel group of twelve, one GPU on each of twelve nodes, takes the one-per-node
    curve (before: the sixteen-rank curve, the nearest group size). With the run's network given (per node), the
    curve keeps its fitted latency and takes the group's share of it."""
    from vtrain.fit.device import device_from_profile, for_config
    from vtrain.runconfig import run_config_from_dict
    from vtrain.tables.store import load_profile

    fitted = device_from_profile(load_profile(REPO / "profiles" / "a100"))
    curve, ratio = fitted.collective_fit("all_reduce", 12, 12)
    assert (curve.group_size, curve.nodes, ratio) == (2, 2, 1.0)
    assert fitted.collective_fit("all_reduce", 64, 8)[0].group_size == 16  # eight per node: the 16 x 8 curve
    config = run_config_from_dict({
        "model": {"layers": 2, "hidden": 1024, "heads": 16, "seq": 1024},
        "parallelism": {"tp": 8, "dp": 12, "global_batch": 12},
        "hardware": {"device": "A100-40GB", "device_count": 96, "gpus_per_node": 8, "inter_node_gbps": 1600}})
    device = for_config(fitted, config)
    for size, nodes, bus in ((12, 12, 25.0), (64, 8, 200.0)):
        fit = device.collective_fit("all_reduce", size, nodes)[0]
        latency, detail = device.collective_us("all_reduce", size, GIB, nodes)
        assert latency == pytest.approx(fit.alpha_us + GIB * bus_bandwidth_factor("all_reduce", size) / (bus * 1e3))
        assert "--inter-node-gbps" in detail


def test_vtrain_configs_give_a_gpus_nic_rate_and_a_node_has_node_size_of_them(tmp_path) -> None:
    """vTrain's ``inter_node_bandwidth`` is a GPU's NIC (200 Gbit/s: one HDR port, as beside each A100 of a DGX
    node; its ``intra_node_bandwidth`` 300 is a GPU's NVLink GB/s): MT-NLG's config on 8-GPU nodes is 1,600
    Gbit/s per node, which a pipeline pair (one GPU per node) shares as one NIC's 25 GB/s."""
    import json

    from vtrain.runconfig import load_run_config

    config = load_run_config(REPO / "examples" / "mtnlg-530b.json")
    assert json.loads((REPO / "examples" / "mtnlg-530b.json").read_text())["inter_node_bandwidth"] == 200
    assert (config.hardware.inter_node_gbps, config.hardware.gpus_per_node) == (1600.0, 8)
    four = tmp_path / "four.json"
    four.write_text(json.dumps({**json.loads((REPO / "examples" / "mtnlg-530b.json").read_text()), "node_size": 4}))
    assert load_run_config(four).hardware.inter_node_gbps == 800.0


def test_a_group_spread_unevenly_is_paced_by_its_node_with_fewest_members() -> None:
    """Ranks 6, 8 and 10 of 8-GPU nodes (t = 2, d = 3): one member on the first node, two on the second; the first
    node's one NIC share sets the ring's pace."""
    from vtrain.collective_cost import members_per_node

    assert nodes_spanned(3, 2, 8, world_size=6 * 8) == 2
    assert members_per_node(3, 2) == 1 and members_per_node(16, 2) == 8 and members_per_node(12, 12) == 1
    assert members_per_node(1, 1) == 1 and members_per_node(5, 0) == 5
