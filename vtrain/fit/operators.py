"""The fitted kernel models applied to operators: the shape a kernel model (:mod:`vtrain.fit.kernel_model`) sees
of one operator, and :class:`OperatorKernelModel`, the form a fitted device
(:class:`vtrain.devices.fitted.FittedDevice`) holds them in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vtrain.fit.kernel_model import GEMM, KernelModel, KernelShape, memory_kind, summary
from vtrain.kineto import dtype_bytes, first_dtype
from vtrain.model.ops import Op, gemm_dims, largest_elements, row_length


@dataclass(frozen=True)
class OperatorKernelModel:
    """A fitted kernel model that times operators (the device's :class:`~vtrain.devices.fitted.KernelLatency`)."""

    model: KernelModel

    @property
    def sources(self) -> tuple[str, ...]:
        """Where the model's measured kernels came from."""
        return self.model.sources

    def op_latency(self, op: Op, peak_flops: float | None = None) -> tuple[float, str]:
        """Device time of one operator and where it came from: its shape inside the measured ones
        (interpolated) or outside (extrapolated). ``peak_flops``: the peak of the operator's precision when it
        is not the measured kernels' half precision (the measured efficiency is taken at that peak)."""
        latency, where = self.model.time_us(kernel_shape(op), peak_flops)
        scaled = f", at the {peak_flops / 1e12:g} TFLOP/s peak of its precision" if peak_flops else ""
        return latency, f"fitted kernel model, {where}: {self.model.describe()}{scaled}"

    def summary(self) -> dict[str, Any]:
        """The model's settings as plain data (for profile metadata and reports)."""
        return summary(self.model)


def kernel_shape(op: Op) -> KernelShape:
    """The shape the kernel model sees of one operator."""
    if op.is_gemm and op.flops > 0:
        batch, m, k, n = gemm_dims(op)
        element = dtype_bytes(first_dtype(op.input_types)) or 2  # operands and output, as the benchmarks count
        return KernelShape(flops=op.flops, bytes=element * batch * (m * k + k * n + m * n), batch=batch, m=m, k=k,
                           n=n, kind=GEMM)
    kind = memory_kind(op.name)
    row = row_length(op) if kind in ("layernorm", "softmax") else 1.0
    elements = op.elements if op.elements is not None else largest_elements(op)
    return KernelShape(flops=0.0, bytes=op.bytes, elements=elements, row=row, kind=kind)
