"""Which blocks each pipeline stage (and, for interleaved 1F1B, each model chunk) holds.

Layers are split evenly. Virtual stage ``k = chunk·p + stage`` holds layers ``[k·L/(p·v), (k+1)·L/(p·v))``, as in
Megatron's interleaved schedule; the embedding sits on virtual stage 0 and the head on the last one. A run that split
its layers unevenly over its stages (one chunk each) says how in ``parallelism.stage_layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from vtrain.runconfig import RunConfig


@dataclass(frozen=True)
class Chunk:
    """The blocks of one model chunk on one pipeline stage."""

    stage: int
    chunk: int
    first_layer: int
    layers: int
    has_embedding: bool
    has_head: bool

    @property
    def shape(self) -> tuple[int, bool, bool]:
        """What the chunk holds, not which layers: (layers, embedding?, head?)."""
        return self.layers, self.has_embedding, self.has_head

    @property
    def layer_ids(self) -> range:
        return range(self.first_layer, self.first_layer + self.layers)

    def forward_blocks(self) -> list[tuple[str, int | None]]:
        """Blocks in forward order: ``("embedding", None)``, ``("layer", i)`` ..., ``("head", None)``."""
        blocks: list[tuple[str, int | None]] = [("embedding", None)] if self.has_embedding else []
        blocks += [("layer", i) for i in self.layer_ids]
        if self.has_head:
            blocks.append(("head", None))
        return blocks


def partition(config: RunConfig) -> list[list[Chunk]]:
    """``chunks[stage][chunk]`` for a consistent config."""
    p, v = config.parallelism.pp, config.parallelism.virtual_stages
    counts = config.parallelism.stage_layers or (config.model.layers // (p * v),) * (p * v)  # by virtual stage
    firsts = [0, *accumulate(counts)][:-1]
    last = p * v - 1
    return [
        [Chunk(stage=stage, chunk=chunk, first_layer=firsts[chunk * p + stage], layers=counts[chunk * p + stage],
               has_embedding=chunk * p + stage == 0, has_head=chunk * p + stage == last)
         for chunk in range(v)]
        for stage in range(p)
    ]
