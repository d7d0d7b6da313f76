"""Synthetic training data: the same token stream for every parallel split of a run.

Iteration ``step`` draws one global batch of ``global_batch`` sequences of ``seq + 1`` uniform token ids from a
generator seeded by ``(seed, step)``. Data-parallel replica ``r`` takes sequences
``[r * G/dp, (r + 1) * G/dp)`` and cuts them into micro-batches; inputs are tokens ``[:-1]``, labels ``[1:]``.
"""

from __future__ import annotations

import torch

from vtrain.record.pipeline import MicroBatch


def global_batch(seed: int, step: int, sequences: int, seq: int, vocab: int) -> torch.Tensor:
    """Token ids ``[sequences, seq + 1]`` for iteration ``step``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (sequences, seq + 1), generator=generator)


def replica_micro_batches(tokens: torch.Tensor, dp_rank: int, dp: int, micro_batch: int,
                          device: torch.device) -> list[MicroBatch]:
    """This data-parallel replica's share of a global batch, as micro-batches on ``device``."""
    share = tokens.size(0) // dp
    mine = tokens[dp_rank * share:(dp_rank + 1) * share].to(device)
    return [MicroBatch(inputs=chunk[:, :-1].contiguous(), labels=chunk[:, 1:].contiguous())
            for chunk in mine.split(micro_batch)]
