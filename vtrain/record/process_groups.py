"""torch.distributed process groups for 3D parallelism, on the rank layout of :mod:`vtrain.parallel`.

Pipeline traffic runs over one two-rank group per *channel* (sending stage, receiving stage, activation or
gradient). Each channel then carries its messages in one order on both ends, which keeps NCCL's in-order
point-to-point streams from deadlocking when a stage sends activations and receives gradients at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from vtrain.parallel import Layout


@dataclass(frozen=True)
class TensorParallel:
    """This rank's tensor-parallel group (``group`` is ``None`` when tp == 1)."""

    size: int = 1
    rank: int = 0
    group: dist.ProcessGroup | None = None


@dataclass
class Groups:
    """This rank's place in the grid and the process groups it belongs to."""

    layout: Layout
    rank: int
    pp_rank: int
    dp_rank: int
    tp: TensorParallel
    dp_group: dist.ProcessGroup | None
    channels: dict[tuple[int, int, str], dist.ProcessGroup] = field(default_factory=dict)

    def stage_rank(self, stage: int) -> int:
        """Global rank of the given pipeline stage in this rank's (dp, tp) column."""
        return self.layout.rank(stage, self.dp_rank, self.tp.rank)


def build_groups(layout: Layout, rank: int, wrap_around: bool = False) -> Groups:
    """Create every tp, dp and pipeline-channel group (all ranks call this, in the same order)."""
    pp_rank, dp_rank, tp_rank = layout.coords(rank)
    tp_group = dp_group = None
    if layout.tp > 1:
        for p in range(layout.pp):
            for d in range(layout.dp):
                group = dist.new_group([layout.rank(p, d, t) for t in range(layout.tp)])
                if (p, d) == (pp_rank, dp_rank):
                    tp_group = group
    if layout.dp > 1:
        for p in range(layout.pp):
            for t in range(layout.tp):
                group = dist.new_group([layout.rank(p, d, t) for d in range(layout.dp)])
                if (p, t) == (pp_rank, tp_rank):
                    dp_group = group
    channels: dict[tuple[int, int, str], dist.ProcessGroup] = {}
    for d in range(layout.dp):
        for t in range(layout.tp):
            for src, dst, kind in layout.channels(wrap_around):
                group = dist.new_group(sorted({layout.rank(src, d, t), layout.rank(dst, d, t)}))
                if (d, t) == (dp_rank, tp_rank) and pp_rank in (src, dst):
                    channels[(src, dst, kind)] = group
    return Groups(layout=layout, rank=rank, pp_rank=pp_rank, dp_rank=dp_rank,
                  tp=TensorParallel(layout.tp, tp_rank, tp_group), dp_group=dp_group, channels=channels)
