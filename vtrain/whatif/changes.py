"""What a what-if changes: duration multipliers per operator class (``--scale CLASS=FACTOR``) and per name
pattern (``--scale-kernel REGEX=FACTOR``).

The classes are the validation's operator classes (:mod:`vtrain.validate.opclass`): an event is classed by
the CPU operator that ran or launched it, a collective by its type. On GPU ranks the rules change device
activities only (the CPU operator that launched a GEMM is not the GEMM); on CPU-only ranks the operators. A pattern is searched in the event's own
name (the kernel's on GPU ranks; on CPU-only ranks the operators are the kernels). ``host`` scales the host
stretches (a thread's time between operators). An event matched by several rules gets the product of their
factors.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from vtrain.errors import InputError
from vtrain.limits import MAX_SCALE_FACTOR
from vtrain.validate.opclass import ATTENTION, CONVOLUTION, ELEMENTWISE, GEMM, MEMORY, OTHER, comm_class

#: the class of host stretches (a thread's time between operators: Python, the framework)
HOST = "host"

#: what ``--scale`` accepts -> the operator classes it scales
SCALE_CLASSES: dict[str, tuple[str, ...]] = {
    "gemm": (GEMM,), "attention": (ATTENTION,), "elementwise/norm": (ELEMENTWISE,), "elementwise": (ELEMENTWISE,),
    "norm": (ELEMENTWISE,), "convolution": (CONVOLUTION,), "memory": (MEMORY,), "other": (OTHER,),
    **{kind: (comm_class(kind),) for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                              "broadcast", "reduce", "gather", "scatter", "barrier", "send",
                                              "recv")},
    "send/recv": (comm_class("send"), comm_class("recv"), comm_class("send_recv")),
    "comm": (),  # every collective (handled by prefix)
    HOST: (HOST,),
}


#: the names of one class that read as one of its halves -> what --scale-kernel would pick out
_ONE_CLASS_OF_TWO = {"norm": "normalisation kernels", "elementwise": "element-wise kernels"}


@dataclass(frozen=True)
class Scale:
    """Multiply the own time of every event of ``classes`` (or whose name matches ``pattern``) by ``factor``."""

    label: str  # as the user wrote it
    factor: float
    classes: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    every_collective: bool = False

    def applies(self, op_class: str | None, name: str | None) -> bool:
        """Whether the rule scales a holder of this class and name (host stretches have no name; a holder no
        rule may scale has neither)."""
        if op_class is None:
            return False
        if self.pattern is not None:
            return name is not None and self.pattern.search(name) is not None
        if self.every_collective:
            return op_class.startswith("comm:")
        return op_class in self.classes


def parse_scale(text: str) -> Scale:
    """``CLASS=FACTOR`` (``gemm=0.5``, ``all_reduce=1.3``, ``send/recv=2``)."""
    key, factor = _split(text, "--scale")
    if key not in SCALE_CLASSES:
        raise InputError(f"--scale {text}: unknown class {key!r}; one of {', '.join(SCALE_CLASSES)}")
    return Scale(label=key, factor=factor, classes=SCALE_CLASSES[key], every_collective=key == "comm")


def half_a_class(rule: Scale) -> str | None:
    """What to say of a rule named for half of its class (``--scale norm=0.5`` scales every element-wise kernel
    too); None for any other rule."""
    if rule.pattern is not None or rule.label not in _ONE_CLASS_OF_TWO:
        return None
    return (f"--scale {rule.label}: the class elementwise/norm, every element-wise and normalisation kernel alike "
            f"(--scale-kernel REGEX=F scales {_ONE_CLASS_OF_TWO[rule.label]} alone)")


def parse_scale_kernel(text: str) -> Scale:
    """``REGEX=FACTOR`` (``'^aten::addmm$=0.5'``); the last ``=`` separates the factor."""
    key, factor = _split(text, "--scale-kernel")
    try:
        pattern = re.compile(key)
    except re.error as exc:
        raise InputError(f"--scale-kernel {text}: not a regular expression ({exc})") from None
    return Scale(label=f"/{key}/", factor=factor, pattern=pattern)


def _split(text: str, flag: str) -> tuple[str, float]:
    key, sep, value = text.rpartition("=")
    if not sep or not key:
        raise InputError(f"{flag} {text}: expected NAME=FACTOR")
    try:
        factor = float(value)
    except ValueError:
        raise InputError(f"{flag} {text}: the factor {value!r} is not a number") from None
    if not math.isfinite(factor) or not 0 <= factor <= MAX_SCALE_FACTOR:
        raise InputError(f"{flag} {text}: the factor must be a number from 0 to {MAX_SCALE_FACTOR:g}")
    return key.strip(), factor


def scale_factors(scales: list[Scale], op_classes: list[str | None], names: list[str | None],
                  counted: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    """Per holder (event or host stretch), the product of the factors of every rule that applies; and how many
    of the ``counted`` holders (those that hold time) each rule hit."""
    factors = np.ones(len(names), dtype=np.float64)
    hits: dict[str, int] = {}
    for scale in scales:
        mask = np.fromiter((scale.applies(c, n) for c, n in zip(op_classes, names)), dtype=bool, count=len(names))
        factors[mask] *= scale.factor
        hits[scale.label] = int((mask & counted).sum())
    return factors, hits
