"""3D-parallel layout and pipeline schedules: the one home for which rank is which (t, d, p) coordinate and in
which order a pipeline stage runs its passes. Record, graph, memory, simulate, replay and validate all use it.

**Layout** (Megatron-LM's): tensor-parallel rank fastest, then data-parallel, then pipeline::

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

**Schedules** return, for one stage, the list of its :class:`Pass` es (phase, model chunk, micro-batch):

* ``gpipe``: all forwards, then all backwards, in micro-batch order;
* ``1f1b`` (PipeDream-Flush, Megatron's non-interleaved): ``p − stage − 1`` warm-up forwards, then one forward
  and one backward alternately, then the cool-down backwards;
* ``interleaved`` with ``v`` model chunks per stage: Megatron's ``forward_backward_pipelining_with_interleaving``
  order; the k-th forward of a stage runs chunk ``(k // p) % v`` and the k-th backward chunk
  ``v − 1 − (k // p) % v``; virtual stage ``chunk * p + stage`` holds a contiguous block of layers. With one
  chunk it is 1F1B.

Each order is :func:`pass_table` in closed form. To add a schedule, give it a number in :data:`SCHEDULE_CODES`, a
branch in :func:`pass_table` and an order function in :data:`SCHEDULES`; the simulator, the plan's timeline, the
recorder and the memory model's micro-batches in flight (:func:`peak_in_flight`, read off the order itself)
follow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from vtrain.runconfig import RunConfig

FORWARD, BACKWARD = "forward", "backward"

#: pipeline channel kinds: activations flow to the next stage, gradients back
ACTIVATION, GRADIENT = "activation", "gradient"


@dataclass(frozen=True)
class Layout:
    """The tp x dp x pp grid of ranks."""

    tp: int
    pp: int
    dp: int

    @classmethod
    def of(cls, config: RunConfig) -> Layout:
        """The layout of a run config's parallelism."""
        p = config.parallelism
        return cls(tp=p.tp, pp=p.pp, dp=p.dp)

    @property
    def world_size(self) -> int:
        """Number of ranks, tp * pp * dp."""
        return self.tp * self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(pp_rank, dp_rank, tp_rank)`` of a global rank."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def rank(self, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
        """The global rank at grid position ``(pp_rank, dp_rank, tp_rank)``."""
        return pp_rank * self.dp * self.tp + dp_rank * self.tp + tp_rank

    def stage(self, rank: int) -> int:
        """The pipeline stage of a global rank."""
        return rank // (self.dp * self.tp)

    def tp_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s tensor-parallel group, in order."""
        p, d, _ = self.coords(rank)
        return [self.rank(p, d, t) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s data-parallel group, in order."""
        p, _, t = self.coords(rank)
        return [self.rank(p, d, t) for d in range(self.dp)]

    def pp_group(self, rank: int) -> list[int]:
        """The ranks of ``rank``'s pipeline (one per stage), in stage order."""
        _, d, t = self.coords(rank)
        return [self.rank(p, d, t) for p in range(self.pp)]

    def group_stride(self, purpose: str) -> tuple[int, int]:
        """Size and rank stride of a ``tp``, ``dp`` or ``pp`` (one send/receive pair) group: tp ranks are adjacent,
        dp ranks ``tp`` apart, pipeline neighbours ``tp * dp`` apart; an ``embedding`` group is the first and the
        last stage's ranks of the same tp and dp index (Megatron's, for tied embeddings)."""
        pipeline = self.tp * self.dp
        return {"tp": (self.tp, 1), "dp": (self.dp, self.tp), "pp": (2, pipeline),
                "embedding": (2, pipeline * max(self.pp - 1, 1))}[purpose]

    def channels(self, wrap_around: bool) -> list[tuple[int, int, str]]:
        """Every pipeline channel ``(src_stage, dst_stage, kind)``; ``wrap_around`` adds last -> first stage
        (interleaved schedules, where the last stage feeds the first stage's next model chunk)."""
        links = [(s, s + 1) for s in range(self.pp - 1)]
        if wrap_around and self.pp > 1:
            links.append((self.pp - 1, 0))
        return [(a, b, ACTIVATION) for a, b in links] + [(b, a, GRADIENT) for a, b in links]


class Pass(NamedTuple):
    """One step of a stage's schedule: the forward or backward pass of one micro-batch on one model chunk."""

    phase: str
    chunk: int
    micro_batch: int


#: each schedule's number, as :func:`pass_table` takes it
GPIPE, ONE_F_ONE_B, INTERLEAVED = 0, 1, 2
SCHEDULE_CODES = {"gpipe": GPIPE, "1f1b": ONE_F_ONE_B, "interleaved": INTERLEAVED}


@lru_cache(maxsize=2)
def pass_table(schedule: int, p: int, m: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every stage's order under the schedule numbered ``schedule`` (:data:`SCHEDULE_CODES`), in closed form: three
    ``(p, passes)`` integer arrays, row ``stage`` and column ``k`` the ``k``-th pass of that stage: 1 for a backward
    pass (else 0), its model chunk, its micro-batch. The graph builder, the plan's compiled timeline
    (:mod:`vtrain.plan.timeline`) and :func:`stage_order` all read these very orders. The last two tables are kept
    (read-only): a sweep times the plans of one pipeline shape one after another (recomputation, overlap, sequence
    parallelism and sharding change no order), and at p = 105 with 480 micro-batches a table takes 3 ms to make.

    * GPipe: all forwards, then all backwards, in micro-batch order;
    * 1F1B: ``min(p - stage - 1, m)`` warm-up forwards, forward and backward alternately, the cool-down backwards;
    * interleaved (``v`` > 1; with one chunk it is 1F1B): the same over the ``m * v`` chunk passes, Megatron's
      warm-up, the k-th forward step of a stage on chunk ``(k // p) % v``, the k-th backward on the mirrored one.
    """
    tables = _pass_table(schedule, p, m, v)
    for table in tables:
        table.setflags(write=False)
    return tables


def _pass_table(schedule: int, p: int, m: int, v: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pass_table`, made."""
    k = np.arange(passes_per_stage(schedule, m, v))[None, :]
    stage = np.arange(p)[:, None]
    zeros = np.zeros((p, k.size), dtype=np.int64)
    if schedule == GPIPE:
        backward = np.broadcast_to(k >= m, (p, k.size))
        return backward.astype(np.int64), zeros, np.where(backward, k - m, k)
    flat = schedule == ONE_F_ONE_B or v == 1
    steps = m if flat else m * v  # forward (and backward) steps of a stage
    if flat:
        warmup = np.minimum(p - stage - 1, m)
    else:
        warmup = np.full_like(stage, steps) if m == p else np.minimum((p - stage - 1) * 2 + (v - 1) * p, steps)
    j = k - warmup  # position in the steady phase
    warming, cooling = k < warmup, k >= 2 * steps - warmup
    backward = np.where(warming, 0, np.where(cooling, 1, j % 2))
    step = np.where(warming, k, np.where(cooling, k - steps, np.where(j % 2 == 0, warmup + j // 2, j // 2)))
    if flat:
        return backward, zeros, step
    chunk = (step % (p * v)) // p
    return backward, np.where(backward == 1, v - 1 - chunk, chunk), (step // (p * v)) * p + step % p


def passes_per_stage(schedule: int, m: int, v: int) -> int:
    """How many passes a stage's order holds: a forward and a backward per micro-batch and model chunk."""
    return 2 * m * (v if schedule == INTERLEAVED else 1)


def _order(schedule: int, p: int, m: int, stage: int, v: int) -> list[Pass]:
    phases = (FORWARD, BACKWARD)
    backward, chunk, mb = (column[stage].tolist() for column in pass_table(schedule, p, m, v))
    return [Pass(phases[b], c, i) for b, c, i in zip(backward, chunk, mb)]


def gpipe(p: int, m: int, stage: int, v: int = 1) -> list[Pass]:
    """All forwards, then all backwards, in micro-batch order."""
    return _order(GPIPE, p, m, stage, 1)


def one_f_one_b(p: int, m: int, stage: int, v: int = 1) -> list[Pass]:
    """PipeDream-Flush / Megatron's non-interleaved 1F1B."""
    return _order(ONE_F_ONE_B, p, m, stage, 1)


def interleaved(p: int, m: int, stage: int, v: int) -> list[Pass]:
    """Megatron's interleaved 1F1B over ``v`` model chunks per stage (``m`` divisible by ``p``); 1F1B when
    ``v`` is 1."""
    return _order(INTERLEAVED, p, m, stage, v)


#: every schedule by name: ``order(p, m, stage, v)``
SCHEDULES: dict[str, Callable[[int, int, int, int], list[Pass]]] = {
    "1f1b": one_f_one_b, "gpipe": gpipe, "interleaved": interleaved}


def stage_order(schedule: str, p: int, m: int, stage: int, v: int = 1) -> list[Pass]:
    """The order of one stage's passes under ``schedule`` (a name in :data:`SCHEDULES`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    return SCHEDULES[schedule](p, m, stage, v)


def peak_passes_in_flight(schedule: str, p: int, m: int, stage: int, v: int = 1) -> int:
    """The most forward passes (model-chunk passes, for interleaved) whose activations a stage holds at once under
    ``schedule``: the peak of forwards begun minus backwards done over the stage's order, in closed form (GPipe:
    every micro-batch; 1F1B: its warm-up + 1; interleaved: Megatron's warm-up count + 1). The tests walk every
    order to check it."""
    if schedule == "gpipe":
        return m
    if schedule == "interleaved" and v > 1:
        total = m * v
        warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
        return min(warmup + 1, total)
    return min(p - stage, m)


def peak_in_flight(schedule: str, p: int, m: int, stage: int, v: int = 1) -> int:
    """:func:`peak_passes_in_flight` in whole micro-batches (``v`` chunk passes make one)."""
    return math.ceil(peak_passes_in_flight(schedule, p, m, stage, v) / v)
