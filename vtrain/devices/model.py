"""The analytical device model: a plain record of parameters that turns FLOPs and bytes into time.

Every parameter carries its provenance (``datasheet``, ``assumed``, ``measured`` or ``fitted``) in
:attr:`DeviceModel.provenance`, so a fitted model from calibration can replace the hand-typed datasheet values
with :func:`dataclasses.replace` and still say where each number came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vtrain.model.ops import Op, first_dtype
from vtrain.tables.schema import bus_bandwidth_factor

#: ring steps (each costing one link latency alpha) of each collective over n ranks
_RING_STEPS = {
    "all_reduce": lambda n: 2 * (n - 1), "all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
    "all_to_all": lambda n: n - 1, "broadcast": lambda n: n - 1, "reduce": lambda n: n - 1,
    "send": lambda n: 1, "recv": lambda n: 1, "send_recv": lambda n: 1,
}


@dataclass(frozen=True)
class Link:
    """One class of link between two ranks: per-step latency and per-GPU, per-direction bandwidth."""

    alpha_us: float  # latency of one step of a collective
    bandwidth_gbps: float  # GB/s (1e9 bytes/s) per GPU per direction

    def collective_us(self, collective: str, group_size: int, nbytes: float) -> tuple[float, str]:
        """α-β time of one collective over ``group_size`` ranks and the algorithm (ring or tree) it assumes.

        Ring: steps·α + bytes·busbw_factor/β. All-reduces may instead use a tree: 2·⌈log2 n⌉·α + 2·bytes/β,
        whichever is faster (as NCCL's tuner picks).
        """
        n = group_size
        if n <= 1 and collective not in ("send", "recv", "send_recv"):
            return 0.0, "none"
        steps = _RING_STEPS.get(collective, lambda k: k - 1)(n)
        bandwidth = self.bandwidth_gbps * 1e3  # bytes per microsecond
        factor = bus_bandwidth_factor(collective, n) if collective in _RING_STEPS else 1.0
        ring = steps * self.alpha_us + nbytes * factor / bandwidth
        if collective == "all_reduce" and n > 2:
            tree = 2 * math.ceil(math.log2(n)) * self.alpha_us + 2.0 * nbytes / bandwidth
            if tree < ring:
                return tree, "tree"
        return ring, "ring"


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
    provenance: dict[str, str] = field(default_factory=dict)  # parameter -> datasheet|assumed|measured|fitted

    def peak_for(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype; types without their own entry use the fp32 peak."""
        return self.peak_flops.get(dtype, self.peak_flops["float"])

    def op_latency(self, op: Op) -> tuple[float, str]:
        """Modelled latency of one operator and where it came from (this model: the datasheet rates)."""
        return DeviceModel.op_latency_us(self, op), f"datasheet device model {self.name}"

    def op_latency_us(self, op: Op) -> float:
        """Modelled latency of one operator: launch overhead plus its FLOPs (GEMMs) or bytes at the device's
        achieved rates."""
        dtype = first_dtype(op.input_types)
        if op.is_gemm and op.flops > 0:
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
        """Modelled time of one collective and how it was obtained: the α-β model of the intra-node link when
        the group fits in one node, else of the inter-node link."""
        link = self.intra_node if nodes <= 1 else self.inter_node
        latency, algorithm = link.collective_us(collective, group_size, nbytes)
        where = "intra-node" if nodes <= 1 else "inter-node"
        return latency, f"alpha-beta {algorithm} {where} {link.bandwidth_gbps:g} GB/s"

    def describe(self) -> str:
        """One line naming the device and where its numbers come from."""
        sources = sorted(set(self.provenance.values())) or ["unspecified"]
        return f"{self.name} ({', '.join(sources)})"
