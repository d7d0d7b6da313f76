"""A device model whose numbers were fitted to measurements (``vtrain fit``), not typed from a datasheet.

It keeps the datasheet model's fields (peaks, memory size, links for anything not measured) and adds:

- ``gemm`` / ``memory_bound``: :class:`KernelLatency`, an operator's device time from the shape of its kernel,
  interpolated between measured kernels and bounded by the roofline floor (fitted by :mod:`vtrain.fit.kernel_model`,
  applied to operators by :mod:`vtrain.fit.operators`);
- ``collectives``: :class:`~vtrain.collective_cost.AlphaBeta` fits per collective, group size and node count
  (nccl-tests, vidur, traces), with the stand-ins and fallbacks of :mod:`vtrain.collective_cost`;
- ``host``: :class:`HostOverhead`, the CPU time that framework, dispatcher and launch add to every operator and
  collective, and the arrival jitter of a collective's ranks (fitted to measured iteration times; zero when
  nothing was fitted).

Each fitted number keeps where it came from in ``provenance`` (``fitted:<sources>``). This module holds the
stored model; fitting it is :mod:`vtrain.fit`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from vtrain.collective_cost import INTER_NODE, STAND_INS, AlphaBeta, has_no_peers, members_per_node
from vtrain.devices.model import DeviceModel
from vtrain.kineto import first_dtype
from vtrain.model.ops import HALF_DTYPES, Op, attention_gemms


class KernelLatency(Protocol):
    """A fitted model of operators' device time (:class:`vtrain.fit.operators.OperatorKernelModel`)."""

    def op_latency(self, op: Op, peak_flops: float | None = None) -> tuple[float, str]:
        """Device time of one operator and where it came from (a GEMM's at ``peak_flops`` when its precision
        is not the measured kernels')."""
        ...

    def summary(self) -> dict[str, Any]:
        """The model's settings as plain data."""
        ...


@dataclass(frozen=True)
class HostOverhead:
    """Host time per operator and per collective call, and the spread of the times at which a collective's ranks
    arrive, fitted to measured iteration times.

    A collective starts when its last rank arrives. With every rank's arrival jittered independently by a spread
    σ (``jitter_us``), the last of n arrives about σ·√(2 ln n) after the typical one (the expected maximum of n
    normal variables), so the synchronisation term grows slowly with the group and is 0 for one rank.
    """

    op_us: float = 0.0
    collective_us: float = 0.0
    jitter_us: float = 0.0

    def sync_us(self, group_size: int) -> float:
        """Expected wait for the last of ``group_size`` ranks."""
        return self.jitter_us * math.sqrt(2.0 * math.log(group_size)) if group_size > 1 else 0.0

    def to_dict(self) -> dict[str, float]:
        return {"op_us": self.op_us, "collective_us": self.collective_us, "jitter_us": self.jitter_us}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostOverhead:
        """Read :meth:`to_dict`'s form; raises ``KeyError``/``TypeError`` when a field is missing or not a number."""
        return cls(float(data["op_us"]), float(data["collective_us"]), float(data["jitter_us"]))


@dataclass(frozen=True)
class FittedDevice(DeviceModel):
    """A :class:`DeviceModel` with fitted kernel models, collective α-β curves and host overheads."""

    gemm: KernelLatency | None = None
    memory_bound: KernelLatency | None = None
    collectives: tuple[AlphaBeta, ...] = ()
    host: HostOverhead = field(default_factory=HostOverhead)

    def op_latency_us(self, op: Op) -> float:
        """Device time of one operator from the fitted kernel models (datasheet model where none was fitted)."""
        return self.op_latency(op)[0]

    def op_latency(self, op: Op) -> tuple[float, str]:
        """Device time of one operator and where it came from: the fitted kernel model, its shape inside the
        measured ones (interpolated) or outside (extrapolated), else the datasheet model. A fused attention call is
        the fitted GEMM model's time of the GEMMs it fuses, on the score tiles it computes
        (:func:`~vtrain.model.ops.attention_gemms`)."""
        if op.is_attention:  # compute-bound: never priced by its bytes
            return self._attention_latency(op) if self.gemm is not None else super().op_latency(op)
        model = self.gemm if op.is_gemm and op.flops > 0 else None if op.is_gemm else self.memory_bound
        if model is None:
            return super().op_latency(op)
        dtype = first_dtype(op.input_types, "float")
        if model is self.gemm and dtype not in HALF_DTYPES:  # measured at half precision (the importers' dtype)
            return model.op_latency(op, self.peak_for(dtype))
        return model.op_latency(op)

    def _attention_latency(self, op: Op) -> tuple[float, str]:
        gemms, share = attention_gemms(op)
        if not gemms:
            return super().op_latency(op)
        latency = share * sum(self.op_latency(gemm)[0] for gemm in gemms)
        return latency, (f"fitted GEMM model at the {len(gemms)} GEMMs the fused attention does, x {share:.2f} of "
                         f"their score tiles (causal)")

    def host_op_us(self) -> float:
        return self.host.op_us

    def host_collective_us(self, group_size: int) -> float:
        return self.host.collective_us + self.host.sync_us(group_size)

    def collective_fit(self, collective: str, group_size: int, nodes: int) -> tuple[AlphaBeta, float] | None:
        """The fitted curve for a collective (or the one that stands in for it, with its time ratio): the same
        group size and node count, else, on as many nodes (on the most nodes measured when the group spans more),
        the curve measured with the nearest number of members per node, then the nearest group size: a group's
        share of its nodes' network follows its members per node (vidur's two-node all-reduces: 5.9 GB/s of bus
        bandwidth with one GPU per node, 20.2 with four), so a data-parallel group of one GPU per node on twelve
        nodes is timed like two ranks on two nodes, not like sixteen."""
        wanted = [(collective, 1.0)]
        if collective in STAND_INS:
            wanted.append(STAND_INS[collective])
        for name, ratio in wanted:
            same = [f for f in self.collectives if f.collective == name and f.nodes == nodes]
            if not same and nodes > 1:  # more nodes than measured: the curves of the most nodes measured
                spans = [f for f in self.collectives if f.collective == name and f.nodes > 1]
                most = max((f.nodes for f in spans), default=0)
                same = [f for f in spans if f.nodes == most]
            if not same:
                continue
            exact = [f for f in same if f.group_size == group_size]
            members = members_per_node(group_size, nodes)
            best = exact[0] if exact else min(same, key=lambda f: (abs(members_per_node(f.group_size, f.nodes)
                                                                       - members), abs(f.group_size - group_size),
                                                                   -f.group_size))
            return best, ratio
        return None

    def collective_us(self, collective: str, group_size: int, nbytes: float, nodes: int) -> tuple[float, str]:
        """The fitted α-β curve of this collective (or its stand-in) on as many nodes, else the links' model. A
        multi-node curve whose rate the run's config replaced (``--inter-node-gbps``, per node) keeps its latency
        and takes the group's share of that rate (:meth:`~vtrain.devices.model.DeviceModel.inter_node_share`)."""
        if has_no_peers(collective, group_size):
            return 0.0, "no peers"
        found = self.collective_fit(collective, group_size, nodes)
        if found is None:
            return super().collective_us(collective, group_size, nbytes, nodes)
        fit, ratio = found
        replaced = fit.nodes > 1 and self.provenance.get(f"{INTER_NODE}.bandwidth_gbps") == "config"
        share = self.inter_node_share(group_size, nodes).bandwidth_gbps if replaced else None
        latency = ratio * fit.time_us(nbytes, group_size, share)
        stand_in = "" if fit.collective == collective else f" as {ratio:g}x {fit.collective}"
        return latency, (f"fitted alpha-beta {fit.collective} n={fit.group_size} nodes={fit.nodes}{stand_in} "
                         f"({', '.join(fit.sources)})")

    def describe_network(self, gpus_per_node: int) -> str:
        """:meth:`DeviceModel.describe_network`, led by the profile's multi-node collective curves where they time
        the run's groups over nodes (the line had said only the assumed 1,600 Gbit/s a node while vidur's 2-node
        curves, 5.9 to 20 GB/s of bus bandwidth, timed a 124-node gradient all-reduce: an audit)."""
        spanning = self._inter_node_curves()
        if not spanning:
            return super().describe_network(gpus_per_node)
        rates = sorted(fit.bus_gbps for fit in spanning)
        return (f"inter-node collectives timed by the profile's curves "
                f"{_fitted_on(spanning, f'bus bandwidth {rates[0]:.3g} to {rates[-1]:.3g} GB/s')}, a group over more "
                f"nodes as on the most measured: --inter-node-gbps gives your network; where no curve fits, "
                f"{self.links_line(gpus_per_node, ask=False)}")

    def unmeasured_nodes(self, nodes: int) -> str | None:
        """What a run over ``nodes`` nodes takes from curves measured on fewer (their rate is another cluster's
        network, stretched), or ``None`` when the curves span as many nodes, none was fitted over nodes, or the
        run gives its network's rate (``--inter-node-gbps``)."""
        spanning = self._inter_node_curves()
        most = max((fit.nodes for fit in spanning), default=nodes)
        if most >= nodes:
            return None
        return (f"its collectives over nodes (up to {nodes}) are timed by the profile's curves {_fitted_on(spanning)}"
                f", as on {most}: their rate is that cluster's network (--inter-node-gbps gives yours)")

    def _inter_node_curves(self) -> list[AlphaBeta]:
        """The fitted curves over several nodes, unless the run's config gives the network's rate (which then
        replaces theirs)."""
        if self.provenance.get(f"{INTER_NODE}.bandwidth_gbps") == "config":
            return []
        return [fit for fit in self.collectives if fit.nodes > 1]

    def fitted_summary(self) -> dict[str, Any]:
        """The fitted parameters as plain data (for profile metadata and reports)."""
        return {
            "gemm": self.gemm.summary() if self.gemm else None,
            "memory_bound": self.memory_bound.summary() if self.memory_bound else None,
            "collectives": [c.to_dict() for c in self.collectives],
            "host": self.host.to_dict(),
        }


def _fitted_on(curves: list[AlphaBeta], detail: str = "") -> str:
    """``fitted on 2 nodes (vidur)``: the node counts and sources of curves over nodes (and ``detail`` after the
    sources)."""
    nodes = sorted({fit.nodes for fit in curves})
    counts = f"{nodes[0]}" if len(nodes) == 1 else f"{nodes[0]} to {nodes[-1]}"
    sources = ", ".join(sorted({source for fit in curves for source in fit.sources}))
    return f"fitted on {counts} nodes ({sources}{'; ' + detail if detail else ''})"
