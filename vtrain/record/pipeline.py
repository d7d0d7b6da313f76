"""Runs one pipeline stage's schedule for one training iteration, with the point-to-point traffic.

Inputs are received just before the forward (activations) or backward (gradients) that needs them; outputs
are sent without waiting (``isend``) as soon as they exist, and all sends are waited for at the end of the
iteration. Every transfer runs in a ``vtrain/comm purpose=pp op=send|recv ... peer=STAGE`` span; every pass in a
``vtrain/forward|backward stage=S [chunk=C] mb=M`` span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from vtrain.parallel import ACTIVATION, BACKWARD, FORWARD, GRADIENT, Pass
from vtrain.record.dataparallel import GradientBuckets
from vtrain.record.process_groups import Groups
from vtrain.record.spans import at, span


@dataclass(frozen=True)
class MicroBatch:
    """Token ids and next-token labels, ``[micro_batch, seq]`` each."""

    inputs: torch.Tensor
    labels: torch.Tensor


class PipelineStage:
    """One rank's model chunks, schedule and pipeline links."""

    def __init__(self, chunks: list[nn.Module], schedule: list[Pass], groups: Groups,
                 activation_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                 buckets: list[GradientBuckets] | None = None) -> None:
        self.chunks, self.schedule, self.groups = chunks, schedule, groups
        self.activation_shape, self.dtype, self.device = activation_shape, dtype, device
        self.buckets = buckets or []
        self.stage, self.stages = groups.pp_rank, groups.layout.pp
        self.last_virtual = self.stages * len(chunks) - 1
        self.interleaved = len(chunks) > 1
        last_backward: dict[int, int] = {}
        for index, action in enumerate(schedule):
            if action.phase == BACKWARD:
                last_backward[action.chunk] = index
        self._last_backward = set(last_backward.values())

    def run(self, micro_batches: list[MicroBatch]) -> list[torch.Tensor]:
        """Forward and backward every micro-batch per the schedule; the per-micro-batch losses (detached
        scalars) on the last stage, empty elsewhere. Gradients are left accumulated in the parameters."""
        inputs: dict[tuple[int, int], torch.Tensor] = {}
        outputs: dict[tuple[int, int], torch.Tensor] = {}
        losses: dict[int, torch.Tensor] = {}
        sends: list[tuple[dist.Work, torch.Tensor]] = []
        scale = 1.0 / len(micro_batches)
        for index, action in enumerate(self.schedule):
            chunk, mb = action.chunk, action.micro_batch
            virtual = chunk * self.stages + self.stage
            key = (chunk, mb)
            where = {"stage": self.stage, "chunk": chunk if self.interleaved else None, "mb": mb}
            if action.phase == FORWARD:
                with at(phase=FORWARD, **where):
                    if virtual == 0:
                        x = micro_batches[mb].inputs
                    else:
                        x = self._recv(virtual - 1, ACTIVATION, mb, where).requires_grad_()
                        inputs[key] = x
                    last = virtual == self.last_virtual
                    with span("forward", **where):
                        out = self.chunks[chunk](x, micro_batches[mb].labels if last else None)
                        if last:
                            losses[mb] = out.detach()
                            out = out * scale
                    outputs[key] = out
                    if not last:
                        sends.append(self._send(out, virtual + 1, ACTIVATION, mb, where))
            else:
                with at(phase=BACKWARD, **where):
                    out = outputs.pop(key)
                    grad = None
                    if virtual != self.last_virtual:
                        grad = self._recv(virtual + 1, GRADIENT, mb, where)
                    if index in self._last_backward and self.buckets:
                        self.buckets[chunk].arm()
                    with span("backward", **where):
                        torch.autograd.backward(out, grad)
                    if virtual != 0:
                        sends.append(self._send(inputs.pop(key).grad, virtual - 1, GRADIENT, mb, where))
        for work, _tensor in sends:
            work.wait()
        return [losses[mb] for mb in sorted(losses)]

    def _recv(self, peer_virtual: int, kind: str, mb: int, where: dict[str, int | None]) -> torch.Tensor:
        peer = peer_virtual % self.stages
        group = self.groups.channels[(peer, self.stage, kind)]
        buffer = torch.empty(self.activation_shape, dtype=self.dtype, device=self.device)
        with span("comm", purpose="pp", op="recv", phase=_phase(kind), peer=peer, **where):
            dist.recv(buffer, src=self.groups.stage_rank(peer), group=group, tag=mb)
        return buffer

    def _send(self, tensor: torch.Tensor, peer_virtual: int, kind: str, mb: int,
              where: dict[str, int | None]) -> tuple[dist.Work, torch.Tensor]:
        peer = peer_virtual % self.stages
        group = self.groups.channels[(self.stage, peer, kind)]
        payload = tensor.detach()
        with span("comm", purpose="pp", op="send", phase=_phase(kind), peer=peer, **where):
            work = dist.isend(payload, dst=self.groups.stage_rank(peer), group=group, tag=mb)
        return work, payload


def _phase(kind: str) -> str:
    return FORWARD if kind == ACTIVATION else BACKWARD
