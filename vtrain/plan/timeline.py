"""The iteration time of a run straight from its resolved work, without building the execution graph.

This is the schedule :func:`vtrain.simulate.scheduler.schedule` computes for the graph
:func:`vtrain.graph.build.build_graph` builds, computed on the pipeline's own structure: each stage's compute
stream runs its passes in the schedule's order (:func:`vtrain.parallel.stage_order`), a pass starts once
the previous one on its stream is done and its input has arrived; a pipeline transfer starts once its pass is
done and the previous transfer on the sender's stream is done (a sender's transfers become ready in the order of
its passes, so first come, first served is that order); gradient buckets are reduced first come, first served
(ties in the graph's task order); the optimizer runs after the last backward pass and every bucket of the stage.
``tests/test_plan_timeline.py`` checks that it gives :func:`vtrain.simulate.simulate`'s iteration time for every
schedule, with and without overlap and recomputation. It allocates one float per pass instead of a task object
and a graph node, so a sweep can time thousands of runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vtrain.graph.work import GraphInputs
from vtrain.parallel import FORWARD, stage_order
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
    transfer = inputs.pp_transfer.latency_us if inputs.pp_transfer is not None else 0.0
    arrival = [-1.0] * (2 * p * v * m)  # input of (phase, virtual stage, mb) arrived at; -1: not yet
    for mb in range(m):
        arrival[mb] = 0.0  # virtual stage 0 reads the data
    local = inputs.pp_transfer is None
    passes = [_stage_passes(par.schedule, p, m, v, stage, local, split_last) for stage in range(p)]
    durations = [_stage_durations(inputs, stage, v) for stage in range(p)]
    position = [0] * p
    stream_free = [0.0] * p
    send_free = [0.0] * (2 * p)  # per sending stage: forward and backward transfer streams
    busy = [0.0] * p
    bucket_ready: list[list[tuple[float, int, int, float]]] = [[] for _ in range(p)]
    remaining = sum(len(stage_passes) for stage_passes in passes)
    while remaining:
        progressed = False
        for stage in range(p):
            stage_passes, i, free = passes[stage], position[stage], stream_free[stage]
            total, done, sent, stage_durations = len(stage_passes), 0, 2 * stage, durations[stage]
            while i < total:
                slot, kind, target, direction = stage_passes[i]
                ready = arrival[slot]
                if ready < 0.0:
                    break
                start = free if free > ready else ready
                if kind < 0:  # the last micro-batch's backward of chunk -kind-1, split per block for its buckets
                    free = _split_backward(inputs, (stage, -kind - 1, m > 1), start, bucket_ready[stage])
                else:
                    free = start + stage_durations[kind]
                busy[stage] += free - start
                if target >= 0:
                    if direction < 0:  # the next pass runs on this stage: no transfer
                        arrival[target] = free
                    else:
                        stream = sent + direction
                        begin = free if free > send_free[stream] else send_free[stream]
                        send_free[stream] = arrival[target] = begin + transfer
                i += 1
                done += 1
            if done:
                position[stage], stream_free[stage] = i, free
                remaining -= done
                progressed = True
        if not progressed:
            raise ValueError("pipeline schedule deadlocks: a stage waits for a pass that never runs")
    end = max(send_free, default=0.0)
    for stage in range(p):
        last = stream_free[stage]
        reduced = _reduce_buckets(stage, last, split_last, inputs, bucket_ready[stage])
        optimizer = inputs.optimizer[stage].duration_us
        busy[stage] += optimizer
        end = max(end, max(last, reduced) + optimizer, reduced)
    return Timeline(iteration_us=end, busy_us=busy)


Pass = tuple[int, int, int, int]  # (input slot, kind, output slot or -1, direction)


def _stage_durations(inputs: GraphInputs, stage: int, v: int) -> list[float]:
    """A stage's pass durations by kind: forward of chunk c is kind c, backward of chunk c is v + 2c (first
    micro-batch) or v + 2c + 1 (accumulating)."""
    forward = [inputs.forward[(stage, chunk)].duration_us for chunk in range(v)]
    backward = [inputs.backward[(stage, chunk, accumulate)].duration_us for chunk in range(v)
                for accumulate in (False, True)]
    return forward + backward


@lru_cache(maxsize=512)
def _stage_passes(schedule: str, p: int, m: int, v: int, stage: int, local: bool, split_last: bool) -> list[Pass]:
    """One stage's passes in its schedule's order, each with the arrival slot it waits for, its kind (see
    :func:`_stage_durations`; -c-1: the split last backward of chunk c), and the slot its output feeds
    (direction 0/1: over the forward/backward transfer stream, -1: on this stage, ``local``: no transfers).
    Plans that differ only in durations share it."""
    virtual = p * v
    backward_base = virtual * m
    passes: list[Pass] = []
    append = passes.append
    for phase, chunk, mb in stage_order(schedule, p, m, stage, v):
        k = chunk * p + stage
        if phase == FORWARD:
            if k + 1 < virtual:
                append((k * m + mb, chunk, (k + 1) * m + mb, -1 if local else 0))
            else:
                append((k * m + mb, chunk, backward_base + k * m + mb, -1))
        else:
            kind = -chunk - 1 if split_last and mb == m - 1 else v + 2 * chunk + (mb > 0)
            target = backward_base + (k - 1) * m + mb if k > 0 else -1
            append((backward_base + k * m + mb, kind, target, -1 if local else 1))
    return passes


def _split_backward(inputs: GraphInputs, key: tuple[int, int, bool], start: float,
                    ready: list[tuple[float, int, int, float]]) -> float:
    """Run the last backward pass (``key``: stage, chunk, accumulate) block by block; each bucket is ready when
    its block is done. Returns the end."""
    free = start
    stage, chunk, _ = key
    buckets = inputs.dp_buckets[(stage, chunk)]
    for index, block in enumerate(inputs.backward[key].blocks):
        free += block.duration_us
        ready.extend((free, chunk, number, bucket.comm.latency_us)
                     for number, bucket in enumerate(buckets) if bucket.after_block == index)
    return free
def _reduce_buckets(stage: int, last_pass_end: float, split_last: bool, inputs: GraphInputs,
                    ready: list[tuple[float, int, int, float]]) -> float:
    """When the stage's last gradient bucket is reduced (first come, first served; ties in graph order)."""
    if not split_last:
        ready = [(last_pass_end, chunk, number, bucket.comm.latency_us)
                 for (bucket_stage, chunk), buckets in sorted(inputs.dp_buckets.items()) if bucket_stage == stage
                 for number, bucket in enumerate(buckets)]
    free = 0.0
    for at, _, _, latency in sorted(ready):
        free = max(free, at) + latency
    return free
