"""The measured terms a simulation added beside operator and collective latencies, for the report: the host gap
before each operator, the interference on operator medians and the straggler wait of collectives among
replicas (see :mod:`vtrain.simulate.latency` and :mod:`vtrain.simulate.collective_latency`).

Totals are per rank and iteration: the mean over pipeline stages of what each stage's compute stream and its
data-parallel reductions hold.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from vtrain.graph.work import BlockWork, CommWork, PhaseWork
from vtrain.simulate.latency import HOST_ISSUE, INTERFERENCE, OPERATOR, STRAGGLER_WAIT, Resolution


def simulated_terms(simulation: Any) -> dict[str, Any]:
    """``gap_ms``, ``interference_ms`` and ``straggler_wait_ms`` per rank and iteration, and per phase the mean
    gap before one operator (``gap_us``) and the interference factor on operator medians (``interference``),
    over all stages."""
    totals = {"gap_ms": 0.0, "interference_ms": 0.0, "straggler_wait_ms": 0.0}
    gaps: dict[str, list[float]] = defaultdict(list)
    issue: dict[str, float] = {}  # per phase, the host's time per operator a GPU rank issues at
    operator = defaultdict(float)
    interference = defaultdict(float)
    stages = max(simulation.graph.stages, 1)
    for task in simulation.graph.tasks:
        if isinstance(task.work, CommWork):
            if task.kind == "dp":
                totals["straggler_wait_ms"] += _part(task.work.resolution, STRAGGLER_WAIT) / 1e3 / stages
            continue
        blocks = task.work.blocks if isinstance(task.work, PhaseWork) else (task.work,)
        for block in blocks:
            assert isinstance(block, BlockWork)
            for step in block.steps:
                totals["gap_ms"] += step.gap_us / 1e3 / stages
                totals["interference_ms"] += _part(step.resolution, INTERFERENCE) / 1e3 / stages
                totals["straggler_wait_ms"] += _part(step.resolution, STRAGGLER_WAIT) / 1e3 / stages
                if step.gap is not None:
                    gaps[block.phase].append(step.gap.latency_us)
                    if step.gap.part_us(HOST_ISSUE):
                        issue[block.phase] = step.gap.part_us(HOST_ISSUE)
                operator[block.phase] += _part(step.resolution, OPERATOR)
                interference[block.phase] += _part(step.resolution, INTERFERENCE)
    factors = {phase: 1.0 + interference[phase] / operator[phase] for phase in operator if operator[phase] > 0}
    gap_us = {phase: sum(values) / len(values) for phase, values in gaps.items()}
    return {**totals, "gap_us": gap_us, "interference": factors, "host_issue_us": issue}


def term_notes(terms: dict[str, Any]) -> list[str]:
    """One line per term the simulation added, for the report."""
    notes = []
    if terms.get("host_issue_us"):
        rates = ", ".join(f"{phase} {us:.1f} us" for phase, us in sorted(terms["host_issue_us"].items()))
        notes.append(f"host issue (GPU; measured between launches of the operators the model places): {rates} per "
                     f"operator; the device idles {terms['gap_ms']:.3f} ms per rank and iteration before operators "
                     f"(modelled: waiting for the host, and its own time between operators)")
    elif terms["gap_us"]:
        per_op = ", ".join(f"{phase} {us:.1f} us" for phase, us in sorted(terms["gap_us"].items()))
        notes.append(f"host gaps (measured between the operators the model places, collective waits excluded): "
                     f"{terms['gap_ms']:.3f} ms per rank and iteration; per operator {per_op}")
    else:
        notes.append("host gaps: none measured (the profile has no timeline, or no call in it of an operator the "
                     "model places)")
    if terms["interference"]:
        factors = ", ".join(f"{phase} x{factor:.3f}" for phase, factor in sorted(terms["interference"].items()))
        notes.append(f"interference on operator medians (measured): +{terms['interference_ms']:.3f} ms per rank "
                     f"and iteration ({factors})")
    if terms["straggler_wait_ms"] > 0:
        notes.append(f"straggler waits of collectives among replicas (measured): "
                     f"{terms['straggler_wait_ms']:.3f} ms per rank and iteration")
    return notes


def _part(resolution: object, name: str) -> float:
    return resolution.part_us(name) if isinstance(resolution, Resolution) else 0.0
