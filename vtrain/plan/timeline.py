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
    virtual = p * v
    split_last = par.dp_overlap and par.dp > 1 and bool(inputs.dp_buckets)
    transfer = inputs.pp_transfer.latency_us if inputs.pp_transfer is not None else None
    forward_in = [0.0] * (virtual * m)  # arrival of the input of forward (k, mb) at its stage
    backward_in = [0.0] * (virtual * m)
    forward_ready = [virtual > 1 and k > 0 for k in range(virtual)]  # has an input to wait for
    arrived = [[False] * (virtual * m), [False] * (virtual * m)]
    for mb in range(m):
        arrived[0][mb] = True  # virtual stage 0 reads the data
    orders = [stage_order(par.schedule, p, m, stage, v) for stage in range(p)]
    position = [0] * p
    stream_free = [0.0] * p
    send_free = [[0.0, 0.0] for _ in range(p)]  # per sending stage: forward and backward transfer streams
    busy = [0.0] * p
    bucket_ready: list[list[tuple[float, int, int, float]]] = [[] for _ in range(p)]
    forward_us = {key: work.duration_us for key, work in inputs.forward.items()}
    backward_us = {key: work.duration_us for key, work in inputs.backward.items()}
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for stage in range(p):
            order, i = orders[stage], position[stage]
            free = stream_free[stage]
            while i < len(order):
                phase, chunk, mb = order[i]
                k = chunk * p + stage
                slot = k * m + mb
                if phase == FORWARD:
                    if forward_ready[k] and not arrived[0][slot]:
                        break
                    start = max(free, forward_in[slot]) if forward_ready[k] else free
                    free = start + forward_us[(stage, chunk)]
                    busy[stage] += free - start
                    if k + 1 < virtual:
                        _deliver(forward_in, arrived[0], (k + 1) * m + mb, free, transfer, send_free[stage], 0)
                    else:
                        backward_in[slot] = free
                        arrived[1][slot] = True
                else:
                    if not arrived[1][slot]:
                        break
                    start = max(free, backward_in[slot])
                    work = inputs.backward[(stage, chunk, mb > 0)]
                    if split_last and mb == m - 1:
                        free = start
                        for index, block in enumerate(work.blocks):
                            free += block.duration_us
                            for number, bucket in enumerate(inputs.dp_buckets[(stage, chunk)]):
                                if bucket.after_block == index:
                                    bucket_ready[stage].append((free, chunk, number, bucket.comm.latency_us))
                    else:
                        free = start + backward_us[(stage, chunk, mb > 0)]
                    busy[stage] += free - start
                    if k > 0:
                        _deliver(backward_in, arrived[1], (k - 1) * m + mb, free, transfer, send_free[stage], 1)
                i += 1
                remaining -= 1
                progressed = True
            position[stage], stream_free[stage] = i, free
        if not progressed:
            raise ValueError("pipeline schedule deadlocks: a stage waits for a pass that never runs")
    end = 0.0
    for stage in range(p):
        last = stream_free[stage]
        reduced = _reduce_buckets(stage, last, split_last, inputs, bucket_ready[stage])
        optimizer = inputs.optimizer[stage].duration_us
        finish = max(last, reduced) + optimizer
        busy[stage] += optimizer
        end = max(end, finish, reduced, max(send_free[stage]))
    return Timeline(iteration_us=end, busy_us=busy)


def _deliver(arrival: list[float], arrived: list[bool], slot: int, sent: float, transfer: float | None,
             streams: list[float], direction: int) -> None:
    """The input of ``slot`` arrives after a transfer on the sender's stream (``transfer`` None: same GPU)."""
    if transfer is None:
        arrival[slot] = sent
    else:
        start = max(sent, streams[direction])
        streams[direction] = arrival[slot] = start + transfer
    arrived[slot] = True


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
