"""Timing one plan: its work resolved through the sweep's shared resolvers, its iteration from the pipeline
timeline (the iteration time :func:`vtrain.simulate.simulate` gives, without building the graph), and the share
of its predicted device time whose latencies were measured, interpolated or modelled."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vtrain.graph.work import CommWork, GraphInputs, PhaseWork
from vtrain.plan.timeline import iteration_timeline
from vtrain.runconfig import RunConfig
from vtrain.simulate.latency import SOURCES
from vtrain.simulate.run import SharedResolvers, resolve_work


@dataclass(frozen=True)
class Timing:
    """The predicted iteration of one plan."""

    iteration_us: float
    idle_us: float  # mean per stage: pipeline bubble and exposed pp / dp communication
    coverage: dict[str, float]  # share of predicted device time by latency source


def time_plan(config: RunConfig, shared: SharedResolvers) -> Timing:
    """Predict one iteration of a consistent ``config``."""
    inputs, coverage = _work(config, shared)
    timeline = iteration_timeline(config.parallelism, inputs)
    return Timing(timeline.iteration_us, timeline.idle_us, coverage)


def _work(config: RunConfig, shared: SharedResolvers) -> tuple[GraphInputs, dict[str, float]]:
    """The resolved work of a plan and its coverage; the last plan's again when the two differ only in the order
    of their passes (1F1B or GPipe) or in whether the gradient all-reduce overlaps, which change neither a pass,
    a transfer nor a bucket (a sweep times such plans one after the other)."""
    par = config.parallelism
    same_work = replace(config, parallelism=replace(par, schedule="1f1b" if par.virtual_stages == 1 else par.schedule,
                                                    dp_overlap=False))
    last = shared.work.get(_LAST_WORK)
    if last is None or last[0] != same_work:
        _, inputs, _, _ = resolve_work(config, shared.profile, shared.device, shared, by_shape=True)
        last = shared.work[_LAST_WORK] = (same_work, inputs, _coverage(config, inputs))
    return last[1], last[2]  # type: ignore[index]


#: the key of the last plan's work in :attr:`SharedResolvers.work`
_LAST_WORK = ("plan", "last work")


def _coverage(config: RunConfig, inputs: GraphInputs) -> dict[str, float]:
    """Predicted device time by source over every pass, transfer, bucket and optimizer step of the
    representative GPUs (as :func:`vtrain.simulate.summary.coverage` counts the graph's tasks): each step's
    latency times its uses, added up per source in the order of the uses (a sequential cumulative sum makes the
    additions a loop over the steps would)."""
    uses = _uses(config, inputs)
    distinct: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # by identity: chunks of one shape share their work
    blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # and blocks of one kind their steps
    for work, _ in uses:
        if id(work) not in distinct:
            distinct[id(work)] = _steps(work, blocks)
    steps = [distinct[id(work)] for work, _ in uses]
    sources = np.concatenate([source for source, _ in steps])
    used = np.concatenate([latency for _, latency in steps]) * np.repeat(
        np.array([count for _, count in uses], dtype=np.int64), [len(source) for source, _ in steps])
    totals = {key: float(np.cumsum(np.concatenate(([0.0], used[sources == index])))[-1])
              for index, key in enumerate(SOURCES)}
    total = sum(totals.values())
    return {key: value / total if total > 0 else 0.0 for key, value in totals.items()}


def _uses(config: RunConfig, inputs: GraphInputs) -> list[tuple[PhaseWork | CommWork, int]]:
    """Every work of an iteration with how many times the representative GPUs run it."""
    par = config.parallelism
    m, transfers = par.micro_batches, 2 * par.micro_batches * (par.pp * par.virtual_stages - 1)
    uses: list[tuple[PhaseWork | CommWork, int]] = [(work, m) for work in inputs.forward.values()]
    uses += [(work, m - 1 if accumulate else 1) for (_, _, accumulate), work in inputs.backward.items()]
    uses += [(work, 1) for work in inputs.optimizer.values()]
    uses += [(bucket.comm, 1) for buckets in inputs.dp_buckets.values() for bucket in buckets]
    uses += [(bucket.gather, 1) for buckets in inputs.dp_buckets.values() for bucket in buckets
             if bucket.gather is not None]  # the distributed optimizer's parameter all-gathers
    if inputs.pp_transfer is not None:
        uses.append((inputs.pp_transfer, transfers))
    return uses


def _steps(work: PhaseWork | CommWork, blocks: dict[int, tuple[np.ndarray, np.ndarray]]
           ) -> tuple[np.ndarray, np.ndarray]:
    """The source (an index into :data:`SOURCES`) and latency of each step of ``work``, in order; ``blocks``: those
    of the blocks' steps already read, by the identity of their steps."""
    if isinstance(work, CommWork):
        return _arrays([work.resolution])
    for block in work.blocks:
        if id(block.steps) not in blocks:
            blocks[id(block.steps)] = _arrays([step.resolution for step in block.steps])
    parts = [blocks[id(block.steps)] for block in work.blocks]
    return np.concatenate([part[0] for part in parts]), np.concatenate([part[1] for part in parts])


def _arrays(resolutions: list) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([SOURCES.index(r.source) for r in resolutions], dtype=np.int64),
            np.array([r.latency_us for r in resolutions], dtype=np.float64))
