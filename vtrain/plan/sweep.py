"""The sweep: enumerate a design space, prune what is invalid or does not fit in memory, time the rest once each
in parallel, and price every timed plan.

Plans that share their operator shapes and stage shards (t, micro-batch, p, v) are timed together, in one
worker, through one :class:`~vtrain.simulate.run.SharedResolvers`: their per-layer latencies, calibration and
optimizer steps are resolved once. Groups run over ``workers`` processes, or as Ray tasks (``ray_address``):
the same function on the same groups, so the same numbers.
"""

from __future__ import annotations

import multiprocessing.pool
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import polars as pl

from vtrain.devices import DeviceModel
from vtrain.distributed import worker_pool
from vtrain.errors import InputError
from vtrain.fit.device import device_for_run
from vtrain.model.memory import GIB, MEASURED_ERROR_PCT, measured_miss, peak_stage_memory
from vtrain.model.ops import PRECISION_DTYPE
from vtrain.plan.cost import Pricing, plan_cost
from vtrain.plan.evaluate import time_plan
from vtrain.plan.pareto import pareto_frontier
from vtrain.plan.space import Candidate, candidates, invalid_reason
from vtrain.runconfig import RunConfig
from vtrain.simulate.latency import SOURCES
from vtrain.simulate.run import SharedResolvers
from vtrain.tables.store import Profile

#: a plan's status in the table (``skipped``: valid and fits, but the sweep's ``select`` did not pick it)
SIMULATED, INVALID, OUT_OF_MEMORY, SKIPPED = "simulated", "invalid", "out_of_memory", "skipped"

Progress = Callable[[int, int], None]  # (plans timed so far, plans to time)
Within = Callable[[Candidate], bool]  # which grid points a sweep enumerates
Select = Callable[[list[Candidate]], list[Candidate]]  # which of the plans that fit a sweep times


@dataclass
class PlanTable:
    """Every enumerated plan of a sweep (one row each, pruned ones included) and what it was swept with."""

    plans: pl.DataFrame
    base: RunConfig
    pricing: Pricing
    device_memory_gib: float
    device: str
    max_iteration_s: float | None = None
    budget_usd: float | None = None
    reference: dict[str, Any] | None = None  # the base config's own plan, timed the same way
    profile: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def counts(self) -> dict[str, int]:
        """Plans enumerated, pruned as invalid, pruned as out of memory, simulated."""
        status = self.plans["status"]
        return {"enumerated": self.plans.height, "invalid": int((status == INVALID).sum()),
                "out_of_memory": int((status == OUT_OF_MEMORY).sum()),
                "simulated": int((status == SIMULATED).sum())}

    def simulated(self) -> pl.DataFrame:
        """The timed plans (they fit in device memory)."""
        return self.plans.filter(pl.col("status") == SIMULATED)

    def frontier(self) -> pl.DataFrame:
        """The time-versus-cost Pareto frontier of the timed plans, fastest first."""
        return pareto_frontier(self.simulated())

    def best(self) -> dict[str, Any] | None:
        """The cheapest timed plan within the iteration-time limit and the budget (fastest among equally
        cheap), or ``None`` when none is."""
        limits = self.simulated().filter(pl.col("meets_limits")).sort(["usd", "days"])
        return limits.row(0, named=True) if limits.height else None

    def limits(self) -> str:
        """The limits the best plan is chosen within, in words (``iteration <= 30 s, cost <= $1,000``)."""
        return ", ".join(part for part in (
            f"iteration <= {self.max_iteration_s:g} s" if self.max_iteration_s is not None else "",
            f"cost <= ${self.budget_usd:,.0f}" if self.budget_usd is not None else "") if part) or "no limits"

    def no_best_reason(self) -> str | None:
        """Why :meth:`best` is ``None`` (None when there is a best plan): no plan was timed (with the least memory a
        plan needed and the commonest reason a plan was invalid), or none of those timed is within the limits (with
        what each limit alone leaves: the cheapest plan within the time, the fastest within the budget)."""
        timed = self.simulated()
        if timed.is_empty():
            return "no plan was simulated: " + self._why_none_ran()
        if self.best() is not None:
            return None
        said = []
        if self.max_iteration_s is not None:
            quick = timed.filter(pl.col("iteration_ms") <= self.max_iteration_s * 1e3)
            said.append(f"the cheapest within {self.max_iteration_s:g} s costs ${quick['usd'].min():,.0f}"
                        if quick.height else f"none takes {self.max_iteration_s:g} s or less (the fastest "
                        f"{timed['iteration_ms'].min() / 1e3:.3g} s)")
        if self.budget_usd is not None:
            cheap = timed.filter(pl.col("usd") <= self.budget_usd)
            said.append(f"the fastest within ${self.budget_usd:,.0f} takes {cheap['iteration_ms'].min() / 1e3:.3g} s"
                        if cheap.height else f"none costs ${self.budget_usd:,.0f} or less (the cheapest "
                        f"${timed['usd'].min():,.0f})")
        return f"no simulated plan is within the limits ({self.limits()}): {'; '.join(said)}"

    def _why_none_ran(self) -> str:
        """Why no plan was timed: the least memory a valid plan needs against the device's, else the commonest
        reason the 1F1B plans are invalid (the other schedules add reasons of their own to every layout)."""
        over = self.plans.filter(pl.col("status") == OUT_OF_MEMORY)
        if over.height:  # as plans are pruned: as measured peaks would be (a need under the device's was said)
            least = self.device_memory_gib + over["memory_over_gib"].min()
            return (f"the valid plans need {least:,.1f} GiB or more as measured peaks would be (memory model: "
                    f"{over['memory_gib'].min():,.1f} GiB or more), the device has {self.device_memory_gib:g} GiB")
        invalid = self.plans.filter(pl.col("status") == INVALID)
        if invalid.is_empty():
            return "no plan was enumerated"
        plain = invalid.filter(pl.col("schedule") == "1f1b")
        reason, count = ((plain if plain.height else invalid).group_by("reason").len()
                         .sort(["len", "reason"], descending=[True, False]).row(0))
        return f"every plan is invalid, {count:,} of the {plain.height or invalid.height:,} 1F1B ones as {reason}"


def sweep(base: RunConfig, gpus: Iterable[int], profile: Profile | None = None, *, divisible: bool = False,
          device_memory_gib: float | None = None, pricing: Pricing | None = None, max_micro_batch: int = 8,
          distributed_optimizer: bool = False, max_iteration_s: float | None = None,
          budget_usd: float | None = None, workers: int = 1,
          ray_address: str | None = None, progress: Progress | None = None, within: Within | None = None,
          select: Select | None = None, shared: SharedResolvers | None = None,
          time_reference: bool = True) -> PlanTable:
    """Sweep the design space of ``base``'s model and global batch over ``gpus`` GPU counts.

    Every grid point (:func:`vtrain.plan.space.candidates`) gets a row: invalid ones say why, those whose
    largest stage exceeds ``device_memory_gib`` (default: the device's memory) say by how much, the rest are
    timed with ``profile`` exactly as `vtrain simulate` would time them and priced with ``pricing``. Plans over
    ``max_iteration_s`` or ``budget_usd`` stay in the table with ``meets_limits`` false. ``divisible``: enumerate
    only the divisible points (:func:`vtrain.plan.space.candidates`), as for every GPU count up to N;
    ``distributed_optimizer``: each plan with d > 1 with and without Megatron's distributed optimizer. ``base``
    itself (its own parallelism) is timed too, as :attr:`PlanTable.reference`, unless ``time_reference`` is false
    (a model given by its shape alone has no plan of its own). ``ray_address`` ("local" for a local
    instance) runs the timing as Ray tasks instead of ``workers`` processes. Worker processes are spawned, so a
    script calling this with ``workers > 1`` needs the usual ``if __name__ == "__main__":`` guard.

    A part of the design space: ``within`` keeps the grid points it is true for (the others are not in the
    table); ``select`` picks, from the valid plans that fit (in enumeration order), those to time (the others are
    ``skipped``). ``shared``: the latency resolvers (and their device) to time with in this process, as a caller
    that sweeps many times with one profile keeps them (worker processes and Ray tasks make their own).
    """
    pricing = pricing or Pricing()
    device = shared.device if shared is not None else device_for_run(base, profile)
    memory_gib = device_memory_gib if device_memory_gib is not None else _device_memory_gib(device)
    with _worker_pool(workers if ray_address is None else 1, base, profile, device) as pool:
        rows, to_time = _prune_all(pool, base, list(gpus), memory_gib, max_micro_batch, divisible, within,
                                   distributed_optimizer)
        if select is not None:
            to_time = _selected(rows, to_time, select)
        timings = _time_all(base, profile, device, to_time, pool, ray_address, progress, shared)
    peak = device.peak_for(PRECISION_DTYPE[base.precision])
    for index, timing in timings.items():
        rows[index].update(_priced(base, rows[index], timing, pricing, peak, max_iteration_s, budget_usd))
    plans = pl.DataFrame(rows, schema=_SCHEMA)
    reference = (_reference(base, profile, device, memory_gib, pricing, peak, max_iteration_s, budget_usd, shared)
                 if time_reference else None)
    return PlanTable(plans=plans, base=base, pricing=pricing, device_memory_gib=memory_gib, device=device.name,
                     max_iteration_s=max_iteration_s, budget_usd=budget_usd, reference=reference,
                     profile=str(profile.path) if profile is not None and profile.path is not None else None,
                     settings={"max_micro_batch": max_micro_batch, "distributed_optimizer": distributed_optimizer,
                               "workers": workers, "ray": ray_address})


def best_plan(base: RunConfig, gpus: Iterable[int], profile: Profile | None = None,
              **options: Any) -> dict[str, Any] | None:
    """The cheapest plan of :func:`sweep` (same arguments) within its limits, as a row of the plan table."""
    return sweep(base, gpus, profile, **options).best()


_SCHEMA = {
    "gpus": pl.Int64, "tp": pl.Int64, "dp": pl.Int64, "pp": pl.Int64, "micro_batch": pl.Int64,
    "schedule": pl.String, "virtual_stages": pl.Int64, "recompute": pl.String, "dp_overlap": pl.Boolean,
    "sequence_parallel": pl.Boolean, "distributed_optimizer": pl.Boolean, "stage_layers": pl.String,
    "status": pl.String, "reason": pl.String,
    "fits": pl.Boolean,
    "memory_gib": pl.Float64, "memory_over_gib": pl.Float64, "micro_batches": pl.Int64, "iteration_ms": pl.Float64,
    "idle_ms": pl.Float64,
    "tokens_per_s": pl.Float64, "mfu": pl.Float64, "days": pl.Float64, "usd": pl.Float64,
    "measured": pl.Float64, "interpolated": pl.Float64, "modelled": pl.Float64, "meets_limits": pl.Boolean,
}


def _device_memory_gib(device: DeviceModel) -> float:
    if device.memory_bytes is None:
        raise InputError(f"the device model {device.name} has no memory size: give --device-memory")
    return device.memory_bytes / GIB


def _prune_all(pool: multiprocessing.pool.Pool | None, base: RunConfig, gpus: list[int], memory_gib: float,
               max_micro_batch: int, divisible: bool, within: Within | None,
               distributed: bool) -> tuple[list[dict[str, Any]], list[tuple[int, Candidate]]]:
    """:func:`_prune` over every GPU count, one count per task over the worker processes when there are some."""
    if pool is None:
        return _prune(base, gpus, memory_gib, max_micro_batch, divisible, within, distributed)
    pending = [pool.apply_async(_prune, (base, [count], memory_gib, max_micro_batch, divisible, within,
                                         distributed)) for count in gpus]
    rows: list[dict[str, Any]] = []
    to_time: list[tuple[int, Candidate]] = []
    for each in pending:  # in the order of the counts
        count_rows, count_to_time = each.get()
        to_time += [(len(rows) + index, candidate) for index, candidate in count_to_time]
        rows += count_rows
    return rows, to_time


def _prune(base: RunConfig, gpus: Iterable[int], memory_gib: float, max_micro_batch: int, divisible: bool,
           within: Within | None = None,
           distributed: bool = False) -> tuple[list[dict[str, Any]], list[tuple[int, Candidate]]]:
    """A row per grid point (``within`` the part swept), and the points left to time (row index, point)."""
    rows: list[dict[str, Any]] = []
    to_time: list[tuple[int, Candidate]] = []
    needs: dict[tuple[object, ...], float] = {}  # GiB of the largest stage, by what it depends on
    reasons: dict[tuple[object, ...], str | None] = {}
    for count in gpus:
        for candidate in candidates(base, count, max_micro_batch, divisible, distributed):
            if within is not None and not within(candidate):
                continue
            row: dict[str, Any] = candidate.as_row(base)
            validity = (candidate.tp, candidate.pp, candidate.dp, candidate.micro_batch, candidate.schedule,
                        candidate.virtual_stages, candidate.sequence_parallel,
                        candidate.distributed_optimizer)  # what the constraints read
            if validity not in reasons:
                reasons[validity] = invalid_reason(candidate, base)
            reason = reasons[validity]
            if reason is not None:
                row.update(status=INVALID, reason=reason, fits=None)
            else:
                micro_batches = base.parallelism.global_batch // (candidate.dp * candidate.micro_batch)
                shards = candidate.dp if candidate.distributed_optimizer else 1  # the optimizer states' split
                key = (candidate.tp, candidate.pp, candidate.virtual_stages, candidate.schedule, candidate.recompute,
                       candidate.micro_batch, micro_batches, candidate.dp > 1, candidate.sequence_parallel, shards)
                if key not in needs:
                    needs[key] = peak_stage_memory(candidate.config(base)).total_bytes / GIB
                need = needs[key]
                fits, over = measured_miss(need, memory_gib)
                row.update(fits=fits, memory_gib=need, memory_over_gib=over, micro_batches=micro_batches)
                if fits:
                    row["status"] = SIMULATED
                    to_time.append((len(rows), candidate))
                else:
                    row.update(status=OUT_OF_MEMORY, reason=_memory_reason(need, over, memory_gib))
            rows.append(row)
    return rows, to_time


def _memory_reason(need: float, over: float, memory_gib: float) -> str:
    """Why a plan is out of memory: the lowest measured peak its modelled need stands for, over the device's memory
    (the need alone, to a tenth, read "needs 67.2 GiB of 67.2222 GiB" for a plan pruned: an audit)."""
    return (f"needs {memory_gib + over:.2f} GiB or more of {memory_gib:g} GiB as measured peaks would be (the memory "
            f"model's {need:.2f} GiB is {-MEASURED_ERROR_PCT[1]:g} % or more under them)")


def _selected(rows: list[dict[str, Any]], to_time: list[tuple[int, Candidate]],
              select: Select) -> list[tuple[int, Candidate]]:
    """The plans ``select`` picks to time; the others that fit are marked skipped."""
    picked = {id(candidate) for candidate in select([candidate for _, candidate in to_time])}
    for index, candidate in to_time:
        if id(candidate) not in picked:
            rows[index].update(status=SKIPPED, reason="not selected")
    return [(index, candidate) for index, candidate in to_time if id(candidate) in picked]


def _group_key(candidate: Candidate) -> tuple[int, int, int, int, int]:
    """Plans with the same operator shapes and stage shards share their resolved latencies."""
    return (candidate.gpus, candidate.tp, candidate.micro_batch, candidate.pp, candidate.virtual_stages)


def _groups(to_time: list[tuple[int, Candidate]]) -> list[list[tuple[int, Candidate]]]:
    ordered = sorted(to_time, key=lambda item: _group_key(item[1]))
    return [list(group) for _, group in groupby(ordered, key=lambda item: _group_key(item[1]))]


def time_group(base: RunConfig, profile: Profile | None, device: DeviceModel,
               group: list[tuple[int, Candidate]], shared: SharedResolvers | None = None,
               ) -> list[tuple[int, dict[str, Any]]]:
    """Time a group of plans through one set of shared resolvers (what a worker or a Ray task runs): ``shared``,
    else this process's for ``profile`` and ``device``."""
    shared = shared or _shared_resolvers(profile, device)
    results = []
    for index, candidate in group:
        timing = time_plan(candidate.config(base), shared)
        results.append((index, {"iteration_us": timing.iteration_us, "idle_us": timing.idle_us,
                                **timing.coverage}))
    return results


#: the resolvers of this process's last sweep (a worker times many groups with the same profile and device)
_RESOLVERS: list[SharedResolvers] = []


def _shared_resolvers(profile: Profile | None, device: DeviceModel) -> SharedResolvers:
    if not _RESOLVERS or _RESOLVERS[0].profile is not profile or _RESOLVERS[0].device is not device:
        _RESOLVERS[:] = [SharedResolvers(profile, device)]
    return _RESOLVERS[0]


def _time_all(base: RunConfig, profile: Profile | None, device: DeviceModel, to_time: list[tuple[int, Candidate]],
              pool: multiprocessing.pool.Pool | None, ray_address: str | None, progress: Progress | None,
              shared: SharedResolvers | None = None) -> dict[int, dict[str, Any]]:
    groups = _groups(to_time)
    if ray_address is not None:
        from vtrain.distributed import run_on_ray

        finished = run_on_ray(ray_address, time_group, base, profile, device, groups)
    elif pool is not None and len(groups) > 1:
        finished = _run_in_processes(pool, groups)
    else:
        finished = (time_group(base, profile, device, group, shared) for group in groups)
    timings: dict[int, dict[str, Any]] = {}
    for results in finished:
        timings.update(results)
        if progress is not None:
            progress(len(timings), len(to_time))
    return timings


#: what a worker process times with (set once by its initializer, so nothing large is sent per task). Workers
#: are spawned, not forked: polars' thread pool does not survive a fork.
_WORKER_STATE: dict[str, Any] = {}


@contextmanager
def _worker_pool(workers: int, base: RunConfig, profile: Profile | None,
                 device: DeviceModel) -> Iterator[multiprocessing.pool.Pool | None]:
    """``workers`` processes holding ``base``, ``profile`` and ``device`` (``None`` for one worker: this
    process)."""
    if workers <= 1:
        yield None
        return
    with worker_pool(workers, _init_worker, (base, profile, device)) as pool:
        yield pool


def _run_in_processes(pool: multiprocessing.pool.Pool,
                      groups: list[list[tuple[int, Candidate]]]) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    yield from pool.imap_unordered(_time_group_in_worker, sorted(groups, key=len, reverse=True))


def _init_worker(base: RunConfig, profile: Profile | None, device: DeviceModel) -> None:
    _WORKER_STATE.update(base=base, profile=profile, device=device)


def _time_group_in_worker(group: list[tuple[int, Candidate]]) -> list[tuple[int, dict[str, Any]]]:
    state = _WORKER_STATE
    return time_group(state["base"], state["profile"], state["device"], group)


def _priced(base: RunConfig, row: dict[str, Any], timing: dict[str, Any], pricing: Pricing, peak: float,
            max_iteration_s: float | None, budget_usd: float | None) -> dict[str, Any]:
    iteration_ms = timing["iteration_us"] / 1e3
    iteration_s = iteration_ms / 1e3  # the table's own figure in seconds: a limit set to it admits the plan
    cost = plan_cost(iteration_s, row["gpus"], base.model, base.parallelism.global_batch, pricing, peak)
    meets = (max_iteration_s is None or iteration_s <= max_iteration_s) and \
        (budget_usd is None or cost.usd <= budget_usd)
    return {"iteration_ms": iteration_ms, "idle_ms": timing["idle_us"] / 1e3,
            "tokens_per_s": cost.tokens_per_s, "mfu": cost.mfu, "days": cost.days, "usd": cost.usd,
            **{source: timing[source] for source in SOURCES}, "meets_limits": meets}


def _reference(base: RunConfig, profile: Profile | None, device: DeviceModel, memory_gib: float,
               pricing: Pricing, peak: float, max_iteration_s: float | None,
               budget_usd: float | None, shared: SharedResolvers | None = None) -> dict[str, Any] | None:
    """The base config's own plan, timed and priced like the others (``None`` when it is not consistent); timed even
    when it does not fit, and then meets no limits (a plan that cannot run meets none: it read ``fits: false`` and
    ``meets_limits: true`` at once)."""
    par = base.parallelism
    if base.constraint_errors():
        return None
    candidate = Candidate(par.world_size, par.tp, par.pp, par.dp, par.micro_batch, par.schedule,
                          par.virtual_stages, par.recompute, par.dp_overlap, par.sequence_parallel,
                          par.distributed_optimizer)
    row: dict[str, Any] = candidate.as_row(base)
    need = peak_stage_memory(base).total_bytes / GIB
    fits, over = measured_miss(need, memory_gib)
    row.update(fits=fits, memory_gib=need, memory_over_gib=over, micro_batches=par.micro_batches)
    [(_, timing)] = time_group(base, profile, device, [(0, candidate)], shared)
    row.update(_priced(base, row, timing, pricing, peak, max_iteration_s, budget_usd))
    row["meets_limits"] = row["meets_limits"] and fits
    return row
