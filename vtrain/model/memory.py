"""Parameter, gradient, optimizer-state and activation bytes of one pipeline stage on one GPU.

Activations follow the reference layer (no dropout): a layer keeps its input and LayerNorm inputs ([b,s,h]),
q, k, v and the attention context ([b,s,h/t] each), the softmax output ([b·a/t, s, s]) and the GELU input and
output ([b,s,4h/t] each); with full recomputation it keeps only its input. The number of micro-batches in flight
is the schedule's peak (all m for GPipe, p − stage for 1F1B, Megatron's warm-up count + 1 for interleaved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vtrain.model.gpt import GptShape, embedding_parameters, head_parameters, layer_parameters
from vtrain.model.partition import Chunk
from vtrain.runconfig import RunConfig


@dataclass(frozen=True)
class StageMemory:
    """Bytes held by one GPU of a pipeline stage at its peak."""

    stage: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int  # Adam's two moments
    activation_bytes: int  # stored activations of all micro-batches in flight
    in_flight: int  # micro-batches whose activations are held at the peak

    @property
    def total_bytes(self) -> int:
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes + self.activation_bytes


def stage_parameters(shape: GptShape, chunks: list[Chunk]) -> list[tuple[int, ...]]:
    """Parameter shapes of a stage (all its chunks), in registration order."""
    params: list[tuple[int, ...]] = []
    for chunk in chunks:
        params += block_parameters(shape, chunk)
    return params


def block_parameters(shape: GptShape, chunk: Chunk) -> list[tuple[int, ...]]:
    """Parameter shapes of one chunk, in registration order."""
    params: list[tuple[int, ...]] = []
    for kind, _ in chunk.forward_blocks():
        params += {"embedding": embedding_parameters, "layer": layer_parameters, "head": head_parameters}[kind](shape)
    return params


def layer_activation_elements(shape: GptShape, recompute: bool) -> int:
    """Elements one layer keeps for its backward, for one micro-batch."""
    b, s, h, t = shape.b, shape.s, shape.h, shape.t
    if recompute:
        return b * s * h
    full = 3 * b * s * h  # layer input, LayerNorm 1 input is the same tensor; LayerNorm 2 input, fc1 input
    sharded = 4 * b * s * h // t + 2 * b * s * shape.ffn  # q, k, v, context; GELU input and output
    return full + sharded + (b * shape.a // t) * s * s  # softmax output


def in_flight_micro_batches(config: RunConfig, stage: int) -> int:
    """Peak number of micro-batches whose activations a stage holds."""
    p, m, v = config.parallelism.pp, config.parallelism.micro_batches, config.parallelism.virtual_stages
    schedule = config.parallelism.schedule
    if schedule == "gpipe":
        return m
    if p == 1:
        return 1
    if schedule == "interleaved":
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, m * v)
        return math.ceil((warmup + 1) / v)
    return min(p - stage, m)


def stage_memory(config: RunConfig, shape: GptShape, chunks: list[Chunk]) -> StageMemory:
    """Peak memory of one GPU of the stage holding ``chunks``."""
    params = sum(math.prod(p) for p in stage_parameters(shape, chunks))
    element = shape.element_bytes
    recompute = config.parallelism.recompute == "full"
    per_mb = 0
    for chunk in chunks:
        per_mb += chunk.layers * layer_activation_elements(shape, recompute)
        if chunk.has_head:
            per_mb += shape.tokens * (shape.h + shape.vocab_per_rank)  # final norm input, softmax
    in_flight = in_flight_micro_batches(config, chunks[0].stage)
    return StageMemory(
        stage=chunks[0].stage, parameter_bytes=params * element, gradient_bytes=params * element,
        optimizer_bytes=2 * params * element, activation_bytes=per_mb * element * in_flight, in_flight=in_flight,
    )
