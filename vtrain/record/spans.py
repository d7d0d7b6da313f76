"""Where the recorder is in its schedule, and the ``record_function`` spans that say so.

The pipeline executor sets the current :class:`Position` (phase, stage, chunk, micro-batch) with :func:`at`;
model code reads it to name its spans with :func:`vtrain.naming.span_name`. Spans that must cover work done
by autograd (a block's backward) are opened by a pre-hook on the node that produced the block's output
(:func:`open_on_backward`) and closed by hooks on the block's inputs (:func:`close_on_backward`): backward
reaches the output first and the inputs last. Hooks add no operators to the trace.
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
    """A span over the backward of one block: opened when the gradient of the block's output is ready, closed
    when the gradients of all its inputs are."""

    def __init__(self, name: str, inputs: int) -> None:
        self.name = name
        self.waiting = inputs
        self._span: record_function | None = None

    def open(self) -> None:
        """Start the span (the block's output gradient is ready)."""
        self._span = record_function(self.name)
        self._span.__enter__()

    def input_done(self) -> None:
        """One input's gradient is computed; the span ends with the last one."""
        self.waiting -= 1
        if self.waiting == 0 and self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None


def backward_span(kind: str, inputs: int, **fields: Any) -> BackwardSpan | None:
    """A backward span for a block with ``inputs`` differentiable inputs; ``None`` when autograd is off."""
    if not torch.is_grad_enabled():
        return None
    return BackwardSpan(span_name(kind, **fields), inputs)


def close_on_backward(tracker: BackwardSpan | None, x: torch.Tensor) -> torch.Tensor:
    """Mark ``x`` as a block input: the block's backward span ends once every input's gradient is computed.

    A tensor hook runs before the node that produced ``x`` (the previous block) starts its backward."""
    if tracker is not None and x.requires_grad:
        def done(_grad: torch.Tensor) -> None:
            handle.remove()
            tracker.input_done()

        handle = x.register_hook(done)
    return x


def open_on_backward(tracker: BackwardSpan | None, y: torch.Tensor) -> torch.Tensor:
    """Mark ``y`` as the block output: the block's backward span starts when the node that produced ``y`` is
    about to run (a node pre-hook, which autograd runs after the tensor hooks that close the next block)."""
    if tracker is not None and y.grad_fn is not None:
        y.grad_fn.register_prehook(lambda _grads: tracker.open())
    return y
