"""The analytical device model: a plain record of parameters that turns FLOPs and bytes into time.

Every parameter carries its provenance (``datasheet``, ``assumed``, ``measured`` or ``fitted``) in
:attr:`DeviceModel.provenance`, so a fitted model from calibration can replace the hand-typed datasheet values
with :func:`dataclasses.replace` and still say where each number came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vtrain.collective_cost import INTER_NODE, Link, link_name, members_per_node
from vtrain.kineto import first_dtype
from vtrain.model.ops import Op


@dataclass(frozen=True)
class DeviceModel:
    """Peak rates and efficiencies of one accelerator (or the host CPU) and its links."""

    name: str
    peak_flops: dict[str, float]  # trace dtype string -> dense FLOP/s
    memory_bandwidth: float  # bytes/s
    launch_overhead_us: float  # fixed cost of one operator (kernel launch or dispatch)
    gemm_efficiency: float  # achieved / peak FLOP/s for GEMMs
    memory_efficiency: float  # achieved / peak bandwidth for memory-bound operators
    intra_node: Link
    inter_node: Link
    memory_bytes: int | None = None
    sm_count: int | None = None  # streaming multiprocessors (what a GEMM's output tiles are spread over)
    provenance: dict[str, str] = field(default_factory=dict)  # parameter -> datasheet|assumed|measured|fitted

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; types without their own entry use the fp32 peak."""
        return self.peak_flops.get(dtype, self.peak_flops["float"])

    def op_latency(self, op: Op) -> tuple[float, str]:
        """Modelled latency of one operator and where it came from (this model: the datasheet rates)."""
        return DeviceModel.op_latency_us(self, op), f"datasheet device model {self.name}"

    def op_latency_us(self, op: Op) -> float:
        """Modelled latency of one operator: launch overhead plus its FLOPs (GEMMs, fused attention) or bytes at
        the device's achieved rates."""
        dtype = first_dtype(op.input_types, "float")
        if op.flops > 0:
            work = op.flops / (self.peak_for(dtype) * self.gemm_efficiency)
        else:
            work = op.bytes / (self.memory_bandwidth * self.memory_efficiency)
        return self.launch_overhead_us + work * 1e6

    def host_op_us(self) -> float:
        """Host time to issue one operator, overlapping device work (0 here: this model folds the launch cost
        into :meth:`op_latency_us`; fitted models separate the two)."""
        return 0.0

    def host_collective_us(self, group_size: int) -> float:
        """Host (and synchronisation) time to issue one collective over ``group_size`` ranks (0 here)."""
        return 0.0

    def collective_us(self, collective: str, group_size: int, nbytes: float, nodes: int) -> tuple[float, str]:
        """Modelled time of one collective and how it was obtained: the α-β model
        (:mod:`vtrain.collective_cost`) of the intra-node link when the group fits in one node, else of the
        inter-node link at the group's share of its nodes' network (:meth:`inter_node_share`)."""
        name = link_name(nodes)
        link: Link = self.inter_node_share(group_size, nodes) if name == INTER_NODE else self.intra_node
        latency, algorithm = link.collective_us(collective, group_size, nbytes)
        return latency, f"alpha-beta {algorithm} {name.replace('_', '-')} {link.bandwidth_gbps:g} GB/s"

    def inter_node_share(self, group_size: int, nodes: int) -> Link:
        """The inter-node link as a group of ``group_size`` ranks on ``nodes`` nodes has it: its members on a node
        share their GPUs' part of the node's network (:func:`~vtrain.collective_cost.members_per_node` times a
        GPU's bandwidth)."""
        members = members_per_node(group_size, nodes)
        return replace(self.inter_node, bandwidth_gbps=self.inter_node.bandwidth_gbps * members)

    def describe(self) -> str:
        """One line naming the device and where each of its numbers comes from (parameters grouped by source)."""
        by_source: dict[str, list[str]] = {}
        for parameter, source in self.provenance.items():
            by_source.setdefault(source, []).append(parameter)
        said = "; ".join(f"{', '.join(parameters)}: {source}" for source, parameters in by_source.items())
        return f"{self.name} ({said or 'sources unspecified'})"

    def describe_network(self, gpus_per_node: int) -> str:
        """One line with the links' rates and latencies and where each comes from: what a run over several nodes
        depends on most (a node's network from 100 to 1,600 Gbit/s moves GPT-3 175B on 128 GPUs by 21 %)."""
        return self.links_line(gpus_per_node, ask=True)

    def unmeasured_nodes(self, nodes: int) -> str | None:
        """What a run over ``nodes`` nodes takes from collectives measured on fewer nodes (a fitted model's), or
        ``None``: a datasheet model's links are its rates, which :meth:`describe_network` says."""
        return None

    def links_line(self, gpus_per_node: int, ask: bool) -> str:
        """The links' rates and latencies and where each comes from; ``ask``: an assumed network's rate says that
        ``--inter-node-gbps`` gives the user's."""
        def source(parameter: str) -> str:
            said = self.provenance.get(parameter, "unspecified")
            asked = ask and parameter == "inter_node.bandwidth_gbps" and said == "assumed"
            return f"{said}: --inter-node-gbps gives yours" if asked else said

        inter, intra = self.inter_node, self.intra_node
        return (f"inter-node {inter.bandwidth_gbps * 8 * gpus_per_node:,.0f} Gbit/s per node of {gpus_per_node} GPUs "
                f"({source('inter_node.bandwidth_gbps')}), step latency {inter.alpha_us:g} us "
                f"({source('inter_node.alpha_us')}); intra-node {intra.bandwidth_gbps:g} GB/s per GPU "
                f"({source('intra_node.bandwidth_gbps')})")
