"""Collective cost arithmetic, in one place: what one collective over n ranks costs on a link, and how nccl-tests'
bus bandwidth relates a message size to a time. The simulator, the device models, the fitted α-β curves, the
trace tables and the benchmark importers all take their numbers from here.

The rule:

- **Bus bandwidth factor** (nccl-tests' PERFORMANCE.md): bus bandwidth = algorithm bandwidth (bytes / time) x
  2(n-1)/n for an all-reduce, (n-1)/n for an all-gather, reduce-scatter or all-to-all, and 1 for everything
  else (broadcast, reduce, point-to-point, a collective it does not name). A group of fewer than one rank counts
  as one. ``bytes`` is nccl-tests' size column: the whole buffer (for an all-gather the output, as traces say).
- **Ring** (α-β): ``steps·α + bytes·factor/β`` with β the link's per-GPU, per-direction bandwidth. Steps: 2(n-1)
  for an all-reduce (reduce-scatter then all-gather), 1 for a point-to-point transfer (send, recv, send_recv),
  n-1 for every other collective, unknown ones included.
- **Tree**: an all-reduce over more than two ranks may instead run as a tree, ``2·⌈log2 n⌉·α + 2·bytes/β``;
  the faster of ring and tree is taken, as NCCL's tuner picks.
- **No peers**: a collective over one rank costs nothing; a point-to-point transfer always costs its step.
- **Link**: ranks are laid out as Megatron lays them out (tensor-parallel ranks adjacent, then data-parallel, then
  pipeline stages, ``node_size`` consecutive ranks per node), so a group of n ranks spaced ``stride`` apart spans
  ⌈stride·n / node_size⌉ nodes; a group inside one node (or whose node count is unknown) uses the intra-node
  link, any other the inter-node link.
- **A node's network is shared by its GPUs** (one NIC each on DGX/HGX nodes; a rate given per node is split
  evenly among them): every group of one kind runs its collective at the same moment (all data-parallel groups
  reduce together, all pipeline pairs send together), so an inter-node group gets the share of the GPUs it has
  on a node, ``members per node`` times a GPU's. A data-parallel group at t = 8 (one GPU per node) reduces at one
  NIC's rate, a group of all eight GPUs of each node at the node's.
- **Fitted curve** (:class:`AlphaBeta`): ``α + bytes·factor(n)/bus bandwidth`` per collective, group size and
  node count, so its bus bandwidth reads like nccl-tests' busbw column; over another group size it keeps its α
  and bus bandwidth.
- **Stand-ins**: where only an all-reduce was measured, an all-gather, reduce-scatter, broadcast or reduce takes
  half its time (half the ring steps and half the bus factor); a send or a recv takes a send_recv's time.

Which number times a collective (the first that applies):

1. the profile's measured ``nccl_latency`` curve of the collective and group size on as many nodes (trace rows,
   which carry no node count, stand for any), interpolated in message size, unless the run's config replaces
   that link's rate; a pipeline transfer takes a ``send``, else ``send_recv``, else ``recv`` curve
   (:mod:`vtrain.simulate.collective_latency`);
2. the fitted device's :class:`AlphaBeta` curve of the collective on as many nodes (the most nodes measured when
   the group spans more), the same group size else the nearest, else the curve of its stand-in
   (:meth:`vtrain.devices.fitted.FittedDevice.collective_fit`);
3. the α-β model of the link (:meth:`Link.collective_us`): datasheet values, or the run config's link rates.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

#: point-to-point transfers: one step, bus factor 1, never free
POINT_TO_POINT = ("send", "recv", "send_recv")
#: the two classes of link a device model has (its field names)
INTRA_NODE, INTER_NODE = "intra_node", "inter_node"
#: collectives that stand in for another when only that one was measured, with the time ratio
STAND_INS = {"all_gather": ("all_reduce", 0.5), "reduce_scatter": ("all_reduce", 0.5),
             "broadcast": ("all_reduce", 0.5), "reduce": ("all_reduce", 0.5),
             "send": ("send_recv", 1.0), "recv": ("send_recv", 1.0)}
#: bytes per microsecond in one GB/s (1e9 bytes/s)
_BYTES_PER_US_PER_GBPS = 1e3


def bus_bandwidth_factor(collective: str, group_size: int) -> float:
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth."""
    n = max(group_size, 1)
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def ring_steps(collective: str, group_size: int) -> int:
    """Steps of a ring collective over ``group_size`` ranks (each costs one link latency α)."""
    if collective in POINT_TO_POINT:
        return 1
    if collective == "all_reduce":
        return 2 * (group_size - 1)
    return group_size - 1


def has_no_peers(collective: str, group_size: int) -> bool:
    """True when the collective moves nothing: one rank, and not a point-to-point transfer."""
    return group_size <= 1 and collective not in POINT_TO_POINT


def transfer_us(collective: str, group_size: int, nbytes: float, bus_gbps: float) -> float:
    """The bandwidth term: ``bytes·factor / bus bandwidth`` in microseconds (``bus_gbps`` in GB/s)."""
    return nbytes * bus_bandwidth_factor(collective, group_size) / (bus_gbps * _BYTES_PER_US_PER_GBPS)


def nodes_spanned(group_size: int, rank_stride: int, node_size: int, world_size: int | None = None,
                  neighbours: bool = False) -> int:
    """Nodes the widest group of ``group_size`` ranks spaced ``rank_stride`` apart spans, ``node_size`` ranks per
    node, in a run of ``world_size`` ranks (unknown: as many as make every start occur). Every group takes part in
    the same collective at the same time, so the widest one sets its link.

    Groups (tensor- and data-parallel) tile the ranks in blocks of ``group_size · rank_stride`` (Megatron's layout:
    member ``j`` of group ``i < stride`` of block ``b`` is rank ``b·n·stride + i + j·stride``), so a group starts
    wherever such a rank falls in a node, not always at a node's start: on 8-GPU nodes the data-parallel groups of
    t = 2, d = 3 start at ranks 0, 1, 6, 7, ... and the one of ranks 6, 8, 10 spans two nodes. Pipeline
    ``neighbours`` (pairs) do not tile: a pair starts at every rank but the last stage's, so the pairs of a run on
    more than one node cross a node boundary somewhere. Members a node or more apart each have a node of their own.
    """
    node_size = max(node_size, 1)
    if group_size <= 1:
        return 1
    if rank_stride >= node_size:
        return group_size
    world = world_size if world_size is not None else group_size * rank_stride * node_size
    if neighbours:  # a pair starts at each rank below the last stage
        offsets = set(range(min(max(world - rank_stride, 1), node_size)))
    else:  # where in a node the groups of each block start
        block = group_size * rank_stride
        offsets = {(b * block + i) % node_size for b in range(max(min(world // block, node_size), 1))
                   for i in range(rank_stride)}
    return max((offset + (group_size - 1) * rank_stride) // node_size + 1 for offset in offsets)


def members_per_node(group_size: int, nodes: int) -> int:
    """The members a group of ``group_size`` ranks has on the node where it has fewest, of the ``nodes`` nodes it
    spans, its ranks spread as evenly as they can be: that node's share of the network sets the group's pace (ranks
    6, 8 and 10 of 8-GPU nodes: one on the first node)."""
    return max(group_size // max(nodes, 1), 1)


def link_name(nodes: int | None) -> str:
    """The link a group on ``nodes`` nodes uses: :data:`INTRA_NODE` within one node (or an unknown count), else
    :data:`INTER_NODE`."""
    return INTER_NODE if nodes is not None and nodes > 1 else INTRA_NODE


@dataclass(frozen=True)
class Link:
    """One class of link between two ranks: per-step latency and per-GPU, per-direction bandwidth (inter-node: the
    GPU's share of its node's network, so that a group's bus bandwidth is that times its members per node)."""

    alpha_us: float  # latency of one step of a collective
    bandwidth_gbps: float  # GB/s (1e9 bytes/s) per GPU per direction

    def collective_us(self, collective: str, group_size: int, nbytes: float) -> tuple[float, str]:
        """α-β time of one collective over ``group_size`` ranks and the algorithm (ring or tree) it assumes
        (``none`` when it has no peers)."""
        n = group_size
        if has_no_peers(collective, n):
            return 0.0, "none"
        ring = ring_steps(collective, n) * self.alpha_us + transfer_us(collective, n, nbytes, self.bandwidth_gbps)
        if collective == "all_reduce" and n > 2:
            bandwidth = self.bandwidth_gbps * _BYTES_PER_US_PER_GBPS
            tree = 2 * math.ceil(math.log2(n)) * self.alpha_us + 2.0 * nbytes / bandwidth
            if tree < ring:
                return tree, "tree"
        return ring, "ring"


@dataclass(frozen=True)
class AlphaBeta:
    """Fitted latency and bus bandwidth of one collective over ``group_size`` ranks on ``nodes`` nodes (fitted by
    :func:`vtrain.fit.alpha_beta.fit_collectives`)."""

    collective: str
    group_size: int
    nodes: int
    alpha_us: float
    bus_gbps: float  # GB/s (1e9 bytes/s), nccl-tests' bus bandwidth
    samples: int
    mape_pct: float
    sources: tuple[str, ...]

    def time_us(self, nbytes: float, group_size: int | None = None, bus_gbps: float | None = None) -> float:
        """Predicted time of one call moving ``nbytes`` (the message size nccl-tests reports), over this curve's
        group size or, extrapolating with the same latency and bus bandwidth, over ``group_size`` ranks; at
        ``bus_gbps`` instead of the fitted bus bandwidth where given."""
        return self.alpha_us + transfer_us(self.collective, group_size or self.group_size, nbytes,
                                           bus_gbps or self.bus_gbps)

    def to_dict(self) -> dict[str, Any]:
        """The curve as plain data (profile metadata)."""
        return {**asdict(self), "sources": list(self.sources)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AlphaBeta:
        """Read :meth:`to_dict`'s form; raises ``TypeError`` when a field is missing or unknown."""
        return cls(**{**data, "sources": tuple(data.get("sources", ()))})


def with_bandwidths(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (``collective``, ``group_size``, ``bytes``, ``median_us``) with ``algbw_gbps`` (bytes / median
    time, 1e9 B/s; null for a median of 0, which a trace in whole microseconds gives a small collective: no rate)
    and ``busbw_gbps`` (algbw x :func:`bus_bandwidth_factor`; null where the group size is)."""
    import polars as pl

    factors = [None if size is None else bus_bandwidth_factor(name, size)
               for name, size in zip(frame["collective"], frame["group_size"], strict=True)]
    rate = pl.when(pl.col("median_us") > 0).then(pl.col("bytes") / pl.col("median_us") / 1e3)
    return frame.with_columns(algbw_gbps=rate).with_columns(
        busbw_gbps=pl.col("algbw_gbps") * pl.Series(factors, dtype=pl.Float64))
