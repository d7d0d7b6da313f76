"""``vtrain record --cuda-graphs``: each transformer layer's forward and backward replayed from CUDA graphs.

Frameworks capture layers in CUDA graphs (Megatron-LM's ``--enable-cuda-graph``, ``torch.compile``'s
"reduce-overhead") to save the launch cost of their many small kernels. A trace of such a run holds one
``cudaGraphLaunch`` per layer pass where an eager run holds one launch per kernel, with every kernel of the graph
released by that one call: the traces that ingest and validate must read right.

Each layer's :meth:`~vtrain.record.model.TransformerLayer.block` (attention and MLP, no spans) is captured with
``torch.cuda.make_graphed_callables``: a forward graph and a backward graph, replayed by an autograd function, so
gradients reach the parameters as in an eager run. The layer's spans stay outside the graphs (``vtrain/layer
phase=forward`` around the forward replay, ``phase=backward`` opened and closed by autograd hooks around the
backward replay), so the traces carry the same span names as an eager recording.

A graph's saved activations live in its own static memory: a layer's forward may not be replayed again before
its backward has run. That holds for one GPU without pipeline parallelism and 1F1B (each micro-batch's backward
follows its forward); :func:`check_graphable` refuses the rest.
"""

from __future__ import annotations

import torch
from torch import nn

from vtrain.errors import InputError
from vtrain.runconfig import RunConfig


class _LayerBlock(nn.Module):
    """A layer's parameters and its span-free :meth:`block`, the module a CUDA graph captures."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.block(x)


def check_graphable(config: RunConfig, device: str) -> None:
    """Raise :class:`InputError` for a run whose layers cannot be replayed from CUDA graphs (the module
    docstring): graphs need a GPU, one rank, the 1F1B order and no recomputation."""
    p = config.parallelism
    if device != "cuda":
        raise InputError("--cuda-graphs needs a CUDA device (--device cuda)")
    if p.world_size != 1:
        raise InputError(f"--cuda-graphs records one GPU (tp = pp = dp = 1; got tp={p.tp} pp={p.pp} dp={p.dp})")
    if p.schedule != "1f1b":
        raise InputError(f"--cuda-graphs needs the 1f1b schedule (got {p.schedule}): a graphed layer's forward "
                         f"may not run again before its backward")
    if p.recompute != "none":
        raise InputError(f"--cuda-graphs records no recomputation (got recompute {p.recompute})")


def graph_layers(chunks: list[nn.Module], activation_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> int:
    """Capture every layer of ``chunks`` in a forward and a backward CUDA graph (after torch's three warm-up
    passes on a side stream); the layers replay them from then on. Returns the number of layers graphed."""
    graphed = 0
    for chunk in chunks:
        for layer in chunk.layers:
            sample = torch.randn(activation_shape, dtype=dtype, device=device, requires_grad=True)
            block = torch.cuda.make_graphed_callables(_LayerBlock(layer), (sample,))
            layer.graphed = block.forward  # a function, not a submodule: the layer stays the parameters' owner
            graphed += 1
    torch.cuda.synchronize(device)
    return graphed
