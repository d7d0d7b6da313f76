"""Where the recorder is in its schedule, and the ``record_function`` spans that say so.

The pipeline executor sets the current :class:`Position` (phase, stage, chunk, micro-batch) with :func:`at`;
model code reads it to name its spans with :func:`vtrain.naming.span_name`. Spans that must cover work done
by autograd (a layer's backward, a block's backward) are opened and closed by two identity
``autograd.Function`` nodes placed at the block's output and inputs (:func:`open_on_backward`,
:func:`close_on_backward`): backward reaches the output node first and the input nodes last.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.profiler import record_function

from vtrain.naming import span_name


@dataclass(frozen=True)
class Position:
    """The schedule step being run: phase, pipeline stage, model chunk (interleaved only) and micro-batch."""

    phase: str = "forward"
    stage: int = 0
    chunk: int | None = None
    mb: int | None = None

    def fields(self, **extra: Any) -> dict[str, Any]:
        """Span fields for this position plus ``extra`` (e.g. ``layer=3``)."""
        return {"phase": self.phase, "stage": self.stage, "chunk": self.chunk, "mb": self.mb, **extra}


_current = Position()


def current() -> Position:
    """The position set by the innermost :func:`at`."""
    return _current


@contextmanager
def at(**changes: Any) -> Iterator[Position]:
    """Run a block at a changed position, e.g. ``with at(phase="backward", mb=3): ...``."""
    global _current
    saved = _current
    _current = replace(saved, **changes)
    try:
        yield _current
    finally:
        _current = saved


def span(kind: str, **fields: Any) -> record_function:
    """A profiler span named in the vtrain scheme, e.g. ``span("optimizer", stage=0)``."""
    return record_function(span_name(kind, **fields))


class BackwardSpan:
    """A span over the backward of one block; opened once, closed when all its inputs have their gradients."""

    def __init__(self, name: str, inputs: int) -> None:
        self.name = name
        self.waiting = inputs
        self._span: record_function | None = None

    def open(self) -> None:
        self._span = record_function(self.name)
        self._span.__enter__()

    def input_done(self) -> None:
        self.waiting -= 1
        if self.waiting == 0 and self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None


class _OpenOnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tracker: BackwardSpan, x: torch.Tensor) -> torch.Tensor:
        ctx.tracker = tracker
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        ctx.tracker.open()
        return None, grad


class _CloseOnBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tracker: BackwardSpan, x: torch.Tensor) -> torch.Tensor:
        ctx.tracker = tracker
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        ctx.tracker.input_done()
        return None, grad


def backward_span(kind: str, inputs: int, **fields: Any) -> BackwardSpan | None:
    """A backward span for a block with ``inputs`` differentiable inputs; ``None`` when autograd is off."""
    if not torch.is_grad_enabled():
        return None
    return BackwardSpan(span_name(kind, **fields), inputs)


def close_on_backward(tracker: BackwardSpan | None, x: torch.Tensor) -> torch.Tensor:
    """Mark ``x`` as a block input: the block's backward span ends once the gradient of every input is out."""
    return x if tracker is None else _CloseOnBackward.apply(tracker, x)


def open_on_backward(tracker: BackwardSpan | None, x: torch.Tensor) -> torch.Tensor:
    """Mark ``x`` as the block output: the block's backward span starts when its gradient arrives."""
    return x if tracker is None else _OpenOnBackward.apply(tracker, x)
