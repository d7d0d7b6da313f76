"""Pipeline schedules: the order in which one stage runs its forward and backward passes.

Each schedule returns, for one stage, a list of ``(phase, chunk, micro_batch)`` with phase ``"forward"`` or
``"backward"``. The orders are Megatron's:

* GPipe: all forwards, then all backwards;
* 1F1B: ``p − stage − 1`` warm-up forwards, then alternate one forward and one backward, then the cool-down
  backwards;
* interleaved 1F1B with ``v`` chunks: Megatron's ``forward_backward_pipelining_with_interleaving`` order, where
  the k-th forward of a stage runs chunk ``(k // p) % v`` and the k-th backward runs chunk
  ``v − 1 − (k // p) % v``.
"""

from __future__ import annotations

FORWARD, BACKWARD = "forward", "backward"

Slot = tuple[str, int, int]  # (phase, chunk, micro-batch)


def gpipe(p: int, m: int, stage: int) -> list[Slot]:
    """All forwards, then all backwards, in micro-batch order."""
    return [(FORWARD, 0, i) for i in range(m)] + [(BACKWARD, 0, i) for i in range(m)]


def one_f_one_b(p: int, m: int, stage: int) -> list[Slot]:
    """PipeDream-flush / Megatron 1F1B."""
    warmup = min(p - stage - 1, m)
    order: list[Slot] = [(FORWARD, 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [(FORWARD, 0, warmup + i), (BACKWARD, 0, i)]
    order += [(BACKWARD, 0, i) for i in range(m - warmup, m)]
    return order


def interleaved(p: int, m: int, stage: int, v: int) -> list[Slot]:
    """Megatron's interleaved 1F1B over ``v`` model chunks per stage (``m`` divisible by ``p``)."""
    total = m * v
    if m == p:
        warmup = total
    else:
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)

    def slot(k: int, phase: str) -> Slot:
        chunk = (k % (p * v)) // p
        if phase == BACKWARD:
            chunk = v - 1 - chunk
        return (phase, chunk, (k // (p * v)) * p + k % p)

    order = [slot(k, FORWARD) for k in range(warmup)]
    for k in range(total - warmup):
        order += [slot(warmup + k, FORWARD), slot(k, BACKWARD)]
    order += [slot(k, BACKWARD) for k in range(total - warmup, total)]
    return order


def stage_order(schedule: str, p: int, m: int, stage: int, v: int = 1) -> list[Slot]:
    """The order of one stage's passes under ``schedule`` (gpipe, 1f1b or interleaved)."""
    if schedule == "gpipe":
        return gpipe(p, m, stage)
    if schedule == "1f1b" or v == 1:
        return one_f_one_b(p, m, stage)
    if schedule == "interleaved":
        return interleaved(p, m, stage, v)
    raise ValueError(f"unknown schedule {schedule!r}")
