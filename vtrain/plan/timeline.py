"""The iteration time of a run straight from its resolved work, without building the execution graph.

This is the schedule :func:`vtrain.simulate.list_scheduler.schedule` computes for the graph
:func:`vtrain.graph.build.build_graph` builds, computed on the pipeline's own structure: each stage's compute
stream runs its passes in the schedule's order (:func:`vtrain.parallel.pass_table`), a pass starts once the previous
one on its stream is done and its input has arrived; a pipeline transfer starts once its pass is done and the
previous transfer on the sender's stream is done (a sender's transfers become ready in the order of its passes,
so first come, first served is that order); gradient buckets are reduced first come, first served (ties in the
graph's task order); the optimizer runs after the last backward pass and every bucket of the stage, and with the
distributed optimizer the buckets' all-gathers after it, one after the other.
``tests/test_plan_timeline.py`` checks that it gives :func:`vtrain.simulate.simulate`'s iteration time for every
schedule, with and without overlap and recomputation.

A sweep times hundreds of plans of up to 2·p·v·m = 400,000 passes each, so the walk over the passes
(:func:`_walk`) is compiled with numba: it does per pass what the graph's scheduler does per task, the same
additions and comparisons in the same order, so the same numbers, about a hundred times faster than in Python.
Plan with p = 105 then take no longer than those with p = 35: their time is resolving the work, not the walk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from vtrain.graph.work import GraphInputs
from vtrain.parallel import SCHEDULE_CODES, pass_table
from vtrain.runconfig import ParallelConfig



@dataclass(frozen=True)
class Timeline:
    """When an iteration ends, and how busy each stage's compute stream was."""

    iteration_us: float
    busy_us: list[float]  # per stage: time its compute stream ran passes and the optimizer

    @property
    def idle_us(self) -> float:
        """Mean time per stage its compute stream waited (pipeline bubble, exposed pp and dp communication)."""
        return self.iteration_us - sum(self.busy_us) / len(self.busy_us)


def iteration_timeline(par: ParallelConfig, inputs: GraphInputs) -> Timeline:
    """The timeline of one iteration of ``par`` from its resolved work."""
    p, v, m = par.pp, par.virtual_stages, par.micro_batches
    split_last = par.dp_overlap and par.dp > 1 and bool(inputs.dp_buckets)
    work = _Work.of(inputs, p, v, m, split_last)
    transfer = inputs.pp_transfer.latency_us if inputs.pp_transfer is not None else 0.0
    end, busy = _walk(*pass_table(SCHEDULE_CODES[par.schedule], p, m, v), p, m, v, inputs.pp_transfer is None,
                      split_last, transfer, work.forward, work.backward, work.optimizer, work.block_us,
                      work.block_first, work.bucket_block, work.bucket_us, work.bucket_first, work.gather_us)
    if end < 0.0:
        raise ValueError("pipeline schedule deadlocks: a stage waits for a pass that never runs")
    return Timeline(iteration_us=float(end), busy_us=busy.tolist())


@dataclass(frozen=True)
class _Work:
    """The durations the walk reads, as arrays: passes per (stage, chunk[, accumulating]), the optimizer per
    stage, and per (stage, chunk) (row ``stage * v + chunk``, from ``*_first[row]`` to ``*_first[row + 1]``) the
    blocks of the last backward pass when it is split and the gradient buckets (the block after which each is
    ready, its all-reduce, the all-gather of its parameters after the optimizer step: 0 without)."""

    forward: np.ndarray  # (p, v)
    backward: np.ndarray  # (p, v, 2): first micro-batch, accumulating
    optimizer: np.ndarray  # (p,)
    block_us: np.ndarray
    block_first: np.ndarray
    bucket_block: np.ndarray
    bucket_us: np.ndarray
    bucket_first: np.ndarray
    gather_us: np.ndarray

    @classmethod
    def of(cls, inputs: GraphInputs, p: int, v: int, m: int, split_last: bool) -> _Work:
        keys = [(stage, chunk) for stage in range(p) for chunk in range(v)]
        blocks = [inputs.backward[(*key, m > 1)].blocks if split_last else () for key in keys]
        buckets = [inputs.dp_buckets.get(key, []) for key in keys]
        return cls(
            forward=np.array([inputs.forward[key].duration_us for key in keys]).reshape(p, v),
            backward=np.array([inputs.backward[(*key, accumulate)].duration_us for key in keys
                               for accumulate in (False, True)]).reshape(p, v, 2),
            optimizer=np.array([inputs.optimizer[stage].duration_us for stage in range(p)]),
            block_us=np.array([block.duration_us for each in blocks for block in each], dtype=np.float64),
            block_first=np.cumsum([0] + [len(each) for each in blocks]),
            bucket_block=np.array([bucket.after_block for each in buckets for bucket in each], dtype=np.int64),
            bucket_us=np.array([bucket.comm.latency_us for each in buckets for bucket in each], dtype=np.float64),
            bucket_first=np.cumsum([0] + [len(each) for each in buckets]),
            gather_us=np.array([bucket.gather.latency_us if bucket.gather is not None else 0.0
                                for each in buckets for bucket in each], dtype=np.float64))


@njit(cache=True)
def _walk(order_backward: np.ndarray, order_chunk: np.ndarray, order_mb: np.ndarray, p: int, m: int, v: int,
          local: bool, split_last: bool, transfer: float,
          forward: np.ndarray, backward: np.ndarray, optimizer: np.ndarray, block_us: np.ndarray,
          block_first: np.ndarray, bucket_block: np.ndarray, bucket_us: np.ndarray,
          bucket_first: np.ndarray, gather_us: np.ndarray) -> tuple[float, np.ndarray]:  # pragma: no cover - compiled
    """When the iteration ends (-1: the order deadlocks) and each stage's busy time.

    Stages are walked in turn, each as far as the inputs of its next passes have arrived. A pass reads the
    arrival slot of its (phase, virtual stage, micro-batch) and writes that of the pass it feeds: directly on the
    same stage, else through the sender's forward or backward transfer stream."""
    virtual = p * v
    backward_base = virtual * m
    arrival = np.full(2 * backward_base, -1.0)
    arrival[:m] = 0.0  # virtual stage 0 reads the data
    total = order_backward.shape[1]
    position = np.zeros(p, np.int64)
    stream_free = np.zeros(p)
    send_free = np.zeros(2 * p)
    busy = np.zeros(p)
    ready_at = np.zeros(len(bucket_us))  # a split pass's buckets: when each is ready
    remaining = p * total
    while remaining:
        progressed = False
        for stage in range(p):
            i, free, done = position[stage], stream_free[stage], 0
            while i < total:
                backward_pass, chunk, mb = order_backward[stage, i], order_chunk[stage, i], order_mb[stage, i]
                k = chunk * p + stage
                if backward_pass:
                    slot = backward_base + k * m + mb
                    target = backward_base + (k - 1) * m + mb if k > 0 else -1
                    direction = -1 if local else 1
                else:
                    slot = k * m + mb
                    target = (k + 1) * m + mb if k + 1 < virtual else backward_base + k * m + mb
                    direction = -1 if local or k + 1 == virtual else 0
                ready = arrival[slot]
                if ready < 0.0:
                    break
                start = free if free > ready else ready  # noqa: FURB136 - as the scheduler compares
                if backward_pass and split_last and mb == m - 1:  # block by block: each bucket ready after its own
                    row = stage * v + chunk
                    free = start
                    for index in range(block_first[row + 1] - block_first[row]):
                        free += block_us[block_first[row] + index]
                        for bucket in range(bucket_first[row], bucket_first[row + 1]):
                            if bucket_block[bucket] == index:
                                ready_at[bucket] = free
                elif backward_pass:
                    free = start + backward[stage, chunk, 1 if mb > 0 else 0]
                else:
                    free = start + forward[stage, chunk]
                busy[stage] += free - start
                if target >= 0:
                    if direction < 0:  # the next pass runs on this stage: no transfer
                        arrival[target] = free
                    else:
                        stream = 2 * stage + direction
                        begin = free if free > send_free[stream] else send_free[stream]  # noqa: FURB136
                        send_free[stream] = begin + transfer
                        arrival[target] = send_free[stream]
                i += 1
                done += 1
            if done:
                position[stage], stream_free[stage] = i, free
                remaining -= done
                progressed = True
        if not progressed:
            return -1.0, busy
    end = 0.0
    for stream in range(2 * p):
        end = max(end, send_free[stream])
    for stage in range(p):
        last = stream_free[stage]
        reduced = _reduce_buckets(stage, v, last, split_last, ready_at, bucket_us, bucket_first)
        busy[stage] += optimizer[stage]
        stepped = max(last, reduced) + optimizer[stage]
        for bucket in range(bucket_first[stage * v], bucket_first[stage * v + v]):
            stepped += gather_us[bucket]  # the distributed optimizer's all-gathers (0 without), in task order
        end = max(end, stepped, reduced)
    return end, busy


@njit(cache=True)
def _reduce_buckets(stage: int, v: int, last_pass_end: float, split_last: bool, ready_at: np.ndarray,
                    bucket_us: np.ndarray, bucket_first: np.ndarray) -> float:  # pragma: no cover - compiled
    """When the stage's last gradient bucket is reduced: first come, first served, ties in the graph's order
    (chunk, then bucket); without overlap every bucket is ready when the stage's last pass ends."""
    first, last = bucket_first[stage * v], bucket_first[stage * v + v]
    order = np.arange(first, last)
    if split_last:  # a stable sort by ready time keeps (chunk, bucket) order among ties
        order = order[np.argsort(ready_at[first:last], kind="mergesort")]
    free = 0.0
    for bucket in order:
        at = ready_at[bucket] if split_last else last_pass_end
        free = max(free, at) + bucket_us[bucket]
    return free
