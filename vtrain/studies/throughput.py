"""What a study needs from the simulator: a model's speed on a number of GPUs, with the plan that gives it.

The studies take this as a function (:data:`Throughput`), so their logic is tested with speeds whose answers are
known in closed form, and :mod:`vtrain.studies.predict` supplies vtrain's predictions (the best plan per GPU count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vtrain.runconfig import ModelConfig


@dataclass(frozen=True)
class Workload:
    """What is trained: a GPT model shape and the sequences per iteration."""

    model: ModelConfig
    global_batch: int


@dataclass(frozen=True)
class Prediction:
    """A workload's speed on some GPUs and the plan that achieves it (``plan``: the plan table's row, ``label``
    its short name such as ``t8 d12 p35 mb1 1f1b recompute``)."""

    tokens_per_s: float
    plan: dict[str, Any] = field(default_factory=dict)
    label: str = ""


#: (workload, GPUs) -> the best plan's speed, or None when no plan runs it on that many GPUs
Throughput = Callable[[Workload, int], Prediction | None]

