"""Data-parallel gradient all-reduce, in buckets, after the backward pass or overlapped with it.

Parameters are grouped into buckets of about ``bucket_mb`` megabytes, in reverse order of definition (the
order backward produces their gradients), as PyTorch DDP and Megatron-LM do. Each bucket's gradients are
flattened, summed over the data-parallel group and divided by its size, in a
``vtrain/comm purpose=dp op=all_reduce stage=S [chunk=C] bucket=B`` span.

* not overlapped: :meth:`GradientBuckets.finish` all-reduces every bucket after the last backward;
* overlapped: :meth:`GradientBuckets.arm` before the last micro-batch's backward makes each bucket start an
  asynchronous all-reduce as soon as its last gradient is accumulated; :meth:`finish` waits for them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from vtrain.record.spans import span


class GradientBuckets:
    """The gradient all-reduce of one model chunk's parameters over its data-parallel group."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup, size: int, bucket_mb: float,
                 overlap: bool, stage: int, chunk: int | None = None) -> None:
        self.group, self.size, self.overlap = group, size, overlap
        self.stage, self.chunk = stage, chunk
        self.buckets = _split(list(reversed(params)), int(bucket_mb * 2**20))
        self._armed = False
        self._ready = [0] * len(self.buckets)
        self._pending: dict[int, tuple[dist.Work, torch.Tensor]] = {}
        if overlap:
            for index, bucket in enumerate(self.buckets):
                for param in bucket:
                    param.register_post_accumulate_grad_hook(lambda _p, i=index: self._grad_ready(i))

    def arm(self) -> None:
        """The next backward is this chunk's last of the iteration: start bucket all-reduces as grads land."""
        if self.overlap:
            self._armed = True
            self._ready = [0] * len(self.buckets)

    def finish(self) -> None:
        """All-reduce what has not been started, wait for everything and write the averaged gradients back."""
        for index in range(len(self.buckets)):
            if index not in self._pending:
                self._start(index, async_op=False)
        for index, (work, flat) in sorted(self._pending.items()):
            work.wait()
            flat.div_(self.size)
            offset = 0
            for param in self.buckets[index]:
                count = param.grad.numel()
                param.grad.copy_(flat[offset:offset + count].view_as(param.grad))
                offset += count
        self._pending.clear()
        self._armed = False

    def _grad_ready(self, index: int) -> None:
        if not self._armed:
            return
        self._ready[index] += 1
        if self._ready[index] == len(self.buckets[index]):
            self._start(index, async_op=True)

    def _start(self, index: int, async_op: bool) -> None:
        with span("comm", purpose="dp", op="all_reduce", stage=self.stage, chunk=self.chunk, bucket=index):
            flat = torch.cat([param.grad.reshape(-1) for param in self.buckets[index]])
            work = dist.all_reduce(flat, group=self.group, async_op=True)
            if not async_op:
                work.wait()
        self._pending[index] = (work, flat)


def _split(params: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """Consecutive groups of parameters, each closed once it holds at least ``bucket_bytes``."""
    buckets: list[list[nn.Parameter]] = [[]]
    filled = 0
    for param in params:
        buckets[-1].append(param)
        filled += param.numel() * param.element_size()
        if filled >= bucket_bytes:
            buckets.append([])
            filled = 0
    return [bucket for bucket in buckets if bucket]
