"""Pipeline schedules: the order in which one pipeline stage runs forward and backward passes.

A schedule is a plain list of :class:`Action` (forward or backward of one micro-batch on one model chunk).
The executor (:mod:`vtrain.record.pipeline`) runs it, receiving inputs just before they are needed and
sending outputs as soon as they exist.

* ``gpipe`` — all forwards, then all backwards (micro-batches in order).
* ``1f1b`` — Megatron-LM's non-interleaved one-forward-one-backward: ``pp - stage - 1`` warm-up forwards,
  a steady phase alternating forward and backward, then the remaining backwards.
* ``interleaved`` — Megatron-LM's interleaved 1F1B over ``virtual_stages`` model chunks per stage; virtual
  stage ``chunk * pp + stage`` holds a contiguous block of layers.
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD = "forward"
BACKWARD = "backward"


@dataclass(frozen=True)
class Action:
    """One step of a schedule: a forward or backward pass of micro-batch ``mb`` on model chunk ``chunk``."""

    kind: str
    chunk: int
    mb: int


def gpipe(micro_batches: int) -> list[Action]:
    """GPipe: every forward, then every backward."""
    return ([Action(FORWARD, 0, mb) for mb in range(micro_batches)]
            + [Action(BACKWARD, 0, mb) for mb in range(micro_batches)])


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Action]:
    """Non-interleaved 1F1B (PipeDream-Flush) for one stage."""
    warmup = min(stages - stage - 1, micro_batches)
    actions = [Action(FORWARD, 0, mb) for mb in range(warmup)]
    for i in range(micro_batches - warmup):
        actions += [Action(FORWARD, 0, warmup + i), Action(BACKWARD, 0, i)]
    actions += [Action(BACKWARD, 0, mb) for mb in range(micro_batches - warmup, micro_batches)]
    return actions


def interleaved(stage: int, stages: int, chunks: int, micro_batches: int) -> list[Action]:
    """Interleaved 1F1B for one stage holding ``chunks`` model chunks (``micro_batches`` divisible by stages)."""
    total = micro_batches * chunks
    group = stages * chunks

    def chunk_of(k: int, forward: bool) -> int:
        chunk = (k % group) // stages
        return chunk if forward else chunks - 1 - chunk

    def mb_of(k: int) -> int:
        return (k // group) * stages + k % stages

    if micro_batches == stages:
        warmup = total
    else:
        warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    actions = [Action(FORWARD, chunk_of(k, True), mb_of(k)) for k in range(warmup)]
    for k in range(total - warmup):
        actions.append(Action(FORWARD, chunk_of(warmup + k, True), mb_of(warmup + k)))
        actions.append(Action(BACKWARD, chunk_of(k, False), mb_of(k)))
    actions += [Action(BACKWARD, chunk_of(k, False), mb_of(k)) for k in range(total - warmup, total)]
    return actions


def build_schedule(name: str, stage: int, stages: int, chunks: int, micro_batches: int) -> list[Action]:
    """The schedule ``name`` (``gpipe``, ``1f1b`` or ``interleaved``) for one pipeline stage."""
    if name == "gpipe":
        return gpipe(micro_batches)
    if name == "1f1b":
        return one_f_one_b(stage, stages, micro_batches)
    if name == "interleaved":
        return interleaved(stage, stages, chunks, micro_batches)
    raise ValueError(f"unknown pipeline schedule {name!r}")
