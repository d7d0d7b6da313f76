"""A device model whose numbers were fitted to measurements (``vtrain fit``), not typed from a datasheet.

It keeps the datasheet model's fields (peaks, memory size, links for anything not measured) and adds:

- ``gemm`` / ``memory_bound``: :class:`~vtrain.fit.kernels.Roofline` rates fitted to measured kernels;
- ``collectives``: α-β fits per collective, group size and node count (nccl-tests, vidur, traces);
- ``host``: :class:`HostOverhead`, the CPU time that framework, dispatcher and launch add to every operator and
  collective (fitted to measured iteration times; zero when nothing was fitted);
- ``non_gemm_scale``: how much more (or less) time a real framework's element-wise/normalisation work takes than
  the reference op sequence's bytes at the fitted bandwidth (kernel fusion, dropout); fitted with ``host``.

Each fitted number keeps where it came from in ``provenance`` (``fitted:<sources>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vtrain.devices.model import DeviceModel
from vtrain.fit.collectives import AlphaBeta
from vtrain.fit.kernels import Roofline
from vtrain.model.ops import Op

#: collectives that can stand in for one another when only one was measured, with the time ratio
_STAND_INS = {"all_gather": ("all_reduce", 0.5), "reduce_scatter": ("all_reduce", 0.5),
              "broadcast": ("all_reduce", 0.5), "reduce": ("all_reduce", 0.5),
              "send": ("send_recv", 1.0), "recv": ("send_recv", 1.0)}


@dataclass(frozen=True)
class HostOverhead:
    """Host time per operator and per collective call, and the extra synchronisation a collective costs per
    additional rank in its group (slower ranks arriving late), fitted to measured iteration times."""

    op_us: float = 0.0
    collective_us: float = 0.0
    sync_us_per_rank: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return {"op_us": self.op_us, "collective_us": self.collective_us,
                "sync_us_per_rank": self.sync_us_per_rank}


@dataclass(frozen=True)
class FittedDevice(DeviceModel):
    """A :class:`DeviceModel` with fitted kernel rooflines, collective α-β curves and host overheads."""

    gemm: Roofline | None = None
    memory_bound: Roofline | None = None
    collectives: tuple[AlphaBeta, ...] = ()
    host: HostOverhead = field(default_factory=HostOverhead)
    non_gemm_scale: float = 1.0

    def op_latency_us(self, op: Op) -> float:
        """Device time of one operator from the fitted rooflines (datasheet model where none was fitted)."""
        if op.is_gemm and op.flops > 0 and self.gemm is not None:
            return self.gemm.time_us(op.flops, op.bytes)
        if not op.is_gemm and self.memory_bound is not None:
            return self.non_gemm_scale * self.memory_bound.time_us(0.0, op.bytes)
        return super().op_latency_us(op)

    def host_op_us(self) -> float:
        return self.host.op_us

    def host_collective_us(self, group_size: int) -> float:
        return self.host.collective_us + self.host.sync_us_per_rank * max(group_size - 1, 0) ** 2

    def collective_fit(self, collective: str, group_size: int, nodes: int) -> tuple[AlphaBeta, float] | None:
        """The fitted curve for a collective (or the one that stands in for it, with its time ratio): the same
        group size and node count, else the nearest measured group size on as many nodes (on the most nodes
        measured when the group spans more)."""
        wanted = [(collective, 1.0)]
        if collective in _STAND_INS:
            wanted.append(_STAND_INS[collective])
        for name, ratio in wanted:
            same = [f for f in self.collectives if f.collective == name and f.nodes == nodes]
            if not same and nodes > 1:  # more nodes than measured: the curves of the most nodes measured
                spans = [f for f in self.collectives if f.collective == name and f.nodes > 1]
                most = max((f.nodes for f in spans), default=0)
                same = [f for f in spans if f.nodes == most]
            if not same:
                continue
            exact = [f for f in same if f.group_size == group_size]
            best = exact[0] if exact else min(same, key=lambda f: (abs(f.group_size - group_size), -f.group_size))
            return best, ratio
        return None

    def collective_us(self, collective: str, group_size: int, nbytes: float, nodes: int) -> tuple[float, str]:
        """The fitted α-β curve of this collective (or its stand-in) on as many nodes, else the links' model."""
        if group_size <= 1 and collective not in ("send", "recv", "send_recv"):
            return 0.0, "no peers"
        found = self.collective_fit(collective, group_size, nodes)
        if found is None:
            return super().collective_us(collective, group_size, nbytes, nodes)
        fit, ratio = found
        latency = ratio * fit.time_us(nbytes, group_size)
        stand_in = "" if fit.collective == collective else f" as {ratio:g}x {fit.collective}"
        return latency, (f"fitted alpha-beta {fit.collective} n={fit.group_size} nodes={fit.nodes}{stand_in} "
                         f"({', '.join(fit.sources)})")

    def fitted_summary(self) -> dict[str, Any]:
        """The fitted parameters as plain data (for profile metadata and reports)."""
        return {
            "gemm": self.gemm.to_dict() if self.gemm else None,
            "memory_bound": self.memory_bound.to_dict() if self.memory_bound else None,
            "collectives": [c.to_dict() for c in self.collectives],
            "host": self.host.to_dict(),
            "non_gemm_scale": self.non_gemm_scale,
        }
