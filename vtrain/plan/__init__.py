"""Design-space exploration: which (t, d, p, micro-batch, schedule, recomputation, overlap) to train with, what
it needs in memory, how long it takes and what it costs.

The Python API (what `vtrain plan` runs)::

    from vtrain.plan import Pricing, best_plan, sweep
    table = sweep(base_config, [3360], profile, device_memory_gib=80, workers=2)   # -> PlanTable
    table.plans          # polars DataFrame, one row per enumerated plan (pruned ones included)
    table.frontier()     # the time-versus-cost Pareto frontier
    table.best()         # the cheapest plan within max_iteration_s / budget_usd
    best_plan(base_config, [1024, 2048], profile, max_iteration_s=30.0)            # -> row dict or None

Modules: :mod:`~vtrain.plan.space` (enumeration and validity), :mod:`vtrain.model.memory` (the memory model),
:mod:`~vtrain.plan.timeline` and :mod:`~vtrain.plan.evaluate` (timing one plan), :mod:`~vtrain.plan.cost`
(pricing), :mod:`~vtrain.plan.pareto` (the frontier), :mod:`~vtrain.plan.sweep` (the runner, processes or Ray
via :mod:`~vtrain.distributed`), :mod:`~vtrain.plan.report` (the plan folder).
"""

from vtrain.plan.cost import Pricing
from vtrain.plan.sweep import PlanTable, best_plan, sweep

__all__ = ["PlanTable", "Pricing", "best_plan", "sweep"]
