"""Operator latencies from a profile, in a fixed order of preference, each tagged with where it came from.

1. ``measured``: the exact signature (op, input dims, input dtypes, device type) is in ``op_latency``;
2. ``interpolated``: the same op with the same dtypes was measured at other shapes: GEMMs are scaled by FLOPs
   at the efficiency (FLOP/s) of the nearest measured shapes, other ops by bytes at their effective bandwidth;
3. ``modelled``: the device model: a fitted one (``vtrain fit``: kernel models interpolated between measured
   kernels, :mod:`vtrain.fit.kernel_model`), else the datasheet one (peak FLOP/s and memory bandwidth). With a
   fitted device, a shape outside the range of the profile's measured signatures of that op goes to the fitted
   model rather than to one neighbour's rate carried beyond it; with the datasheet one, the nearest signature's
   time less the device's launch overhead is scaled by cost and the overhead added back, when most of its time is
   work; a kernel whose time is mostly its launch says nothing of a larger shape's rate, and the device model
   answers (its whole time scaled made a [2, 2048, 51200] subtraction on an H200 take 45 ms from a 1.3 us
   [2048, 2] one: ``traces/gpu/h200-mcore-*``).

A measured signature's latency is its median times the profile's *interference factor* of the op's phase: the time
of the calls the model places in that phase, as the profile's timeline has them, over the sum of their signatures'
medians (:meth:`OpLatencyResolver.calibrate`). An iteration is a sum of thousands of calls and its expected time the sum
of their means, but on a shared host a call is now and then slowed by something unrelated to it (preemption,
frequency changes): the median of the signature misses that time, and the signature's own mean over a few calls
is dominated by whichever of its calls happened to be hit. The factor keeps the profile's total and spreads the
interference over the ops in proportion to their time, the chance of being hit; per phase, because what runs
beside a phase differs (collectives overlapping the backward pass compete for the same cores or SMs). Without a
timeline (imported tables) there is no factor.

:class:`HostGapResolver` adds the time a run spends between the operators (host overhead, launch gaps), measured
in the profile's own timeline (:mod:`vtrain.tables.gaps`): on CPU ranks as the gaps themselves, on GPU ranks as the
rate the host issued operators at (:class:`IssueRate`), which the workload turns into each block's gaps.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vtrain.devices.fitted import FittedDevice
from vtrain.devices.model import DeviceModel
from vtrain.model.ops import Op, op_cost
from vtrain.naming import ALL
from vtrain.tables.store import Profile

if TYPE_CHECKING:
    import polars as pl

MEASURED, INTERPOLATED, MODELLED = "measured", "interpolated", "modelled"
SOURCES = (MEASURED, INTERPOLATED, MODELLED)
#: names of the terms in :attr:`Resolution.parts`
OPERATOR, INTERFERENCE, TRANSFER, STRAGGLER_WAIT = "operator", "interference", "transfer", "straggler wait"
#: the terms of a gap modelled from a GPU rank's issue rate (:class:`IssueRate`)
HOST_ISSUE, DEVICE_GAP = "host issue", "device gap"


@dataclass(frozen=True)
class Resolution:
    """The latency of one step and its provenance."""

    latency_us: float
    source: str  # measured | interpolated | modelled
    detail: str  # how it was obtained, for reports
    kernels: tuple[str, ...] = ()  # kernel names the measured op launched (for the predicted trace)
    parts: tuple[tuple[str, float], ...] = ()  # the latency split into named terms, when it has several

    def part_us(self, name: str) -> float:
        """The time of the term ``name`` (:data:`INTERFERENCE`, :data:`STRAGGLER_WAIT`, ...), 0 without it."""
        return sum(us for key, us in self.parts if key == name)


@dataclass(frozen=True)
class _Sample:
    """One measured signature of an op: its cost (FLOPs or bytes) and median latency."""

    cost: float
    latency_us: float
    dims: str
    kernels: tuple[str, ...]


def _found_share(row: dict[str, Any], traced_ops: float | None) -> tuple[float, str]:
    """The placed calls found per rank-iteration in the timeline (:func:`~vtrain.tables.gaps.op_gaps`' row) over
    the operators the model places there in the traced run, and how that reads; 1 where the latter is unknown. A
    gap is measured between the calls found: spread over the model's operators, an iteration keeps the measured
    total."""
    if not traced_ops:
        return 1.0, ""
    found = row["op_calls"] / row["rank_iterations"]
    return found / traced_ops, (f", x {found:.0f} calls found / {traced_ops:.0f} operators the model places per "
                                f"iteration")


def _mean_gap(row: dict[str, Any], where: str, traced_ops: float | None) -> Resolution:
    """The gap before one operator of a CPU rank's phase from :func:`~vtrain.tables.gaps.op_gaps`' row: the mean
    gap before a placed call, spread over the operators the model places (:func:`_found_share`; a LLaMA-style
    script's trace held 34 of the 120 operators Megatron's layers place, and its gaps, each holding the time of the
    script's own operators between them, made 11.2 ms of an iteration of 7.1)."""
    share, spread = _found_share(row, traced_ops)
    detail = (f"mean gap before an op ({where}): {row['ops']} ops over {row['rank_iterations']} rank-iterations, "
              f"median {row['median_us']:.1f} us, p90 {row['p90_us']:.1f} us{spread}")
    return Resolution(row["mean_us"] * share, MEASURED, detail)


def _issue_rate(row: dict[str, Any], where: str, traced_ops: float | None) -> IssueRate:
    """The issue rate of one phase from :func:`~vtrain.tables.gaps.op_gaps`' row: the mean host time between
    launches and the device's mean time between operators, each times the placed calls found per rank-iteration
    over the operators the model places there (both were measured between the calls found: spread over the
    model's operators, an iteration keeps the measured total; per operator of a Megatron-core run whose trace
    has 218 of the 736 the model places, the device's gap held three operators' and made 371 ms of an iteration
    of 252)."""
    share, spread = _found_share(row, traced_ops)
    detail = (f"host time per operator ({where}): {row['host_us']:.1f} us between launches over "
              f"{row['host_calls']} launches that found the queue free{spread}")
    graph = (Resolution(row["graph_host_us"], MEASURED, f"host time per CUDA graph replay ({where}): "
                                                         f"{row['graph_host_us']:.1f} us between launches")
             if row["graph_host_us"] is not None else None)
    return IssueRate(Resolution(row["host_us"] * share, MEASURED, detail), (row["device_gap_us"] or 0.0) * share,
                     graph)


class OpLatencyResolver:
    """Resolves :class:`~vtrain.model.ops.Op` latencies against one profile and one device model."""

    def __init__(self, profile: Profile | None, device: DeviceModel, device_type: str) -> None:
        self.device = device
        self.device_type = device_type
        self.profile = profile
        self.interference: dict[tuple[int | None, str], float] = {}  # (stage or None for all, phase) -> factor
        self._exact: dict[tuple[str, str, str], tuple[float, tuple[str, ...]]] = {}
        self._by_op: dict[tuple[str, str, bool], list[_Sample]] = {}
        self._cache: dict[tuple[str, str, str], Resolution] = {}
        self._scaled: dict[tuple[str, str, str, str, int | None], Resolution] = {}
        if profile is not None:
            self._index(profile)

    def _index(self, profile: Profile) -> None:
        groups: dict[tuple[str, str, bool], list[_Sample]] = {}
        for _, name, dims, types, latency, kernels in profile.digest.op_rows(self.device_type):
            if latency is None:
                continue
            names = tuple(k for k in (kernels or "").split(" ; ") if k)
            self._exact[(name, dims, types)] = (float(latency), names)
            try:
                flops, nbytes = op_cost(name, json.loads(dims), json.loads(types))
            except (ValueError, TypeError):
                continue
            is_gemm = flops > 0
            groups.setdefault((name, types, is_gemm), []).append(
                _Sample(flops if is_gemm else nbytes, float(latency), dims, names))
        for key, samples in groups.items():
            self._by_op[key] = sorted((s for s in samples if s.cost > 0), key=lambda s: s.cost)

    def calibrate(self, events: pl.DataFrame | None, stage_of: dict[int, int] | None = None) -> None:
        """Set the interference factor of each phase from the placed calls of the profile's timeline (``events``
        of :func:`vtrain.tables.gaps.placed_events`): per iteration, their total time over the sum of their
        signatures' medians (phase ``all``: every call); the median over iterations, so that a burst of slow
        iterations does not move it. With ``stage_of`` (the profile's rank -> pipeline stage, when it is the
        simulated run's own layout) each stage also gets its own factors. Must come before the first
        :meth:`resolve`. ``None``: the profile has no timeline (no factor)."""
        if self._cache:
            raise RuntimeError("calibrate() after resolve()")
        if events is None:
            return
        import polars as pl

        columns = ("rank", "phase", "iteration", "op", "input_dims", "input_types", "dur")
        # in one order whatever order the timeline's rows came in: float sums depend on it
        calls = events.filter(pl.col("device_type") == self.device_type).select(columns).sort(
            columns, nulls_last=True).rows()
        sums: dict[tuple[int | None, str], dict[int, list[float]]] = {}
        for rank, phase, iteration, name, dims, types, dur in calls:
            exact = self._exact.get((name, dims, types))
            if exact is None or exact[0] <= 0:
                continue
            stages = (None,) if stage_of is None or rank not in stage_of else (None, stage_of[rank])
            for key in ((stage, p) for stage in stages for p in (phase, ALL)):
                total = sums.setdefault(key, {}).setdefault(iteration, [0.0, 0.0])
                total[0] += dur
                total[1] += exact[0]
        self.interference = {key: statistics.median(measured / expected for measured, expected in per.values())
                             for key, per in sums.items()}

    def resolve(self, op: Op, phase: str = ALL, stage: int | None = None) -> Resolution:
        """The latency of one call of ``op`` in ``phase`` on pipeline stage ``stage`` (cached per signature,
        phase and stage)."""
        key = (*op.signature, phase, stage)
        cached = self._scaled.get(key)
        if cached is None:
            base = self._cache.get(op.signature)
            if base is None:
                base = self._cache[op.signature] = self._resolve(op)
            cached = self._scaled[key] = self._interfered(base, phase, stage)
        return cached

    def resolved(self) -> list[Resolution]:
        """Every distinct resolution made so far (one per signature)."""
        return list(self._cache.values())

    def _interfered(self, base: Resolution, phase: str, stage: int | None) -> Resolution:
        """A measured or interpolated latency times the interference factor of ``phase`` on ``stage`` (the
        phase's over all stages, or phase ``all``'s, when the profile has none for it)."""
        where = next((key for key in ((stage, phase), (None, phase), (None, ALL)) if key in self.interference), None)
        if where is None or base.source == MODELLED:
            return base
        factor = self.interference[where]
        extra = base.latency_us * (factor - 1.0)
        label = where[1] if where[0] is None else f"{where[1]}, stage {where[0]}"
        return Resolution(base.latency_us + extra, base.source,
                          f"{base.detail}, x {factor:.3f} (measured interference, {label})", base.kernels,
                          ((OPERATOR, base.latency_us), (INTERFERENCE, extra)))

    def _resolve(self, op: Op) -> Resolution:
        exact = self._exact.get(op.signature)
        if exact is not None:
            return Resolution(exact[0], MEASURED, "exact signature: median", exact[1])
        is_gemm = op.flops > 0  # GEMMs and fused attention: scaled by FLOPs
        samples = self._by_op.get((op.name, op.input_types, is_gemm))
        cost = op.flops if is_gemm else op.bytes
        if samples and cost > 0 and (samples[0].cost <= cost <= samples[-1].cost
                                     or not isinstance(self.device, FittedDevice)
                                     and _is_work(_nearest(samples, cost), self.device.launch_overhead_us)):
            return self._scale(op, samples, cost, is_gemm, self.device.launch_overhead_us)
        modelled, detail = self.device.op_latency(op)
        return Resolution(modelled, MODELLED, detail)

    @staticmethod
    def _scale(op: Op, samples: list[_Sample], cost: float, is_gemm: bool, overhead_us: float) -> Resolution:
        """Scale by cost at the rate (cost per µs) of the nearest measured shapes, interpolating the rate in
        log(cost) between the two neighbours that bracket ``cost``; beyond them, the nearest one's work (its time
        less the device's launch overhead ``overhead_us``) scaled, plus the overhead."""
        costs = [s.cost for s in samples]
        unit = "FLOPs" if is_gemm else "bytes"
        if not costs[0] <= cost <= costs[-1]:
            nearest = _nearest(samples, cost)
            return Resolution(overhead_us + (nearest.latency_us - overhead_us) * cost / nearest.cost, INTERPOLATED,
                              f"scaled by {unit} from {op.name} {nearest.dims} beyond the measured shapes (its time "
                              f"less {overhead_us:g} us of launch)", nearest.kernels)
        i = bisect.bisect_left(costs, cost)  # costs[i - 1] < cost <= costs[i], or cost == costs[0]
        lo, hi = samples[max(i - 1, 0)], samples[i]
        weight = (math.log(cost) - math.log(lo.cost)) / (math.log(hi.cost) - math.log(lo.cost)) \
            if hi.cost > lo.cost else 0.0
        nearest = lo if weight < 0.5 else hi
        rate_lo, rate_hi = _rate(lo), _rate(hi)
        rate = rate_lo + weight * (rate_hi - rate_lo) if math.isfinite(rate_lo + rate_hi) else _rate(nearest)
        latency = cost / rate if rate > 0 else 0.0
        return Resolution(latency, INTERPOLATED, f"scaled by {unit} from {op.name} {nearest.dims}", nearest.kernels)


def _nearest(samples: list[_Sample], cost: float) -> _Sample:
    """The measured shape at the end of the measured range nearest ``cost``."""
    return samples[0] if cost < samples[0].cost else samples[-1]


def _is_work(sample: _Sample, overhead_us: float) -> bool:
    """Whether most of a measured kernel's time is work rather than its launch: only then does its rate say
    anything of a shape beyond it."""
    return sample.latency_us >= 2 * overhead_us


def _rate(sample: _Sample) -> float:
    """Cost per microsecond (FLOPs/µs or bytes/µs); a zero-latency sample has an unbounded rate."""
    return sample.cost / sample.latency_us if sample.latency_us > 0 else math.inf


@dataclass(frozen=True)
class IssueRate:
    """How a GPU rank's host issued the operators of a phase, measured in the profile's timeline: the host's time
    per operator the model places (``host``), to replay a CUDA graph (``graph_launch``, where the profile's run
    replayed any) and the device's own time between operators when the host was ahead of it (``device_gap_us``:
    kernels of operators the model does not place, launch latency)."""

    host: Resolution
    device_gap_us: float
    graph_launch: Resolution | None = None


class HostGapResolver:
    """The measured time between operators (host overhead, launch gaps), per phase.

    The gap is measured in the profile's timeline between the operators the workload places
    (:func:`vtrain.tables.gaps.op_gaps`), so it holds the time of operators the model leaves out as well, and it is
    spread over every operator the model places in the traced run (``traced_ops``: the trace shows some of them
    under other signatures, and an iteration keeps its measured total); a phase the profile has no spans for takes
    the gap over all phases. Profiles without a timeline (imported tables), or
    whose timeline holds no call of a placed operator, give no gap (the device model's host time per operator
    applies instead), and the validation report says so.

    On GPU ranks the host and the device run apart, so a gap measured in one run is not the next run's: where the
    device is slower than the host it hides the host's time, and where it is faster it waits for it. There the
    resolver gives the rate the host issued operators at (:meth:`issue`): the host's time between consecutive
    launches of placed operators (those that did not wait for a slot in the launch queue), spread the same way,
    and the device's own time between operators when the host was ahead of it.
    """

    def __init__(self, profile: Profile | None, device_type: str) -> None:
        self.profile = profile
        self.device_type = device_type
        self.events: pl.DataFrame | None = None  # the placed calls of the timeline (:meth:`fit`), if it has one
        self._by_phase: dict[tuple[int | None, str], Resolution] | None = None
        self._issue: dict[tuple[int | None, str], IssueRate] = {}

    def fit(self, placed: set[tuple[str, str, str]], stage_of: dict[int, int] | None = None,
            traced_ops: dict[str, float] | None = None) -> None:
        """Find the calls of the operators with the signatures the model places in the profile's timeline
        (:attr:`events`) and measure the gaps before them, over all ranks and, with ``stage_of`` (the profile's
        rank -> pipeline stage, when it is the simulated run's own layout), per stage. ``traced_ops``: the
        operators per rank and iteration, by phase, the model places in the traced run (for the issue rate)."""
        self._by_phase, self._issue = {}, {}
        if self.profile is None or not self.profile.digest.has_timeline:
            return
        import polars as pl

        from vtrain.tables.gaps import op_gaps, placed_events

        tables = self.profile.tables
        self.events = placed_events(tables["cpu_ops"], tables["kernels"], tables["collectives"], placed,
                                    tables.get("graph_launches"))
        subsets = [(None, self.events)]
        if stage_of:
            staged = self.events.with_columns(
                stage=pl.col("rank").replace_strict(stage_of, default=None, return_dtype=pl.Int64))
            subsets += [(stage, group.drop("stage")) for (stage,), group in staged.group_by("stage")
                        if stage is not None]
        for stage, events in subsets:
            gaps = op_gaps(events).filter(pl.col("device_type") == self.device_type)
            for row in gaps.iter_rows(named=True):
                where = row["phase"] if stage is None else f"{row['phase']}, stage {stage}"
                self._by_phase[(stage, row["phase"])] = _mean_gap(row, where, (traced_ops or {}).get(row["phase"]))
                if self.device_type == "cuda" and row["host_us"] is not None and row["op_calls"]:
                    self._issue[(stage, row["phase"])] = _issue_rate(row, where, (traced_ops or {}).get(row["phase"]))

    def issue(self, phase: str, stage: int | None = None) -> IssueRate | None:
        """How the host issued ``phase``'s operators on ``stage`` (else over all stages, else over all phases) of
        a GPU profile; ``None`` on CPU ranks and without a timeline."""
        return next((self._issue[key] for key in ((stage, phase), (None, phase), (None, ALL)) if key in self._issue),
                    None)

    def resolve(self, phase: str, stage: int | None = None) -> Resolution | None:
        """The gap before one operator of ``phase`` on ``stage`` (else of the phase over all stages, else of any
        phase); ``None`` when the profile has no timeline."""
        if self._by_phase is None:
            raise RuntimeError("HostGapResolver.fit() must come first")
        return next((self._by_phase[key] for key in ((stage, phase), (None, phase), (None, ALL))
                     if key in self._by_phase), None)
