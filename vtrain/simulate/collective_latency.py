"""Collective latencies: the profile's ``nccl_latency`` table interpolated in message size per group size, else
the device's model (its fitted α-β curves, else the α-β model of its links: ring or tree, intra- or inter-node;
the arithmetic and its fallbacks are :mod:`vtrain.collective_cost`'s).

A table row gives the mean time of one call (its median when the source has no mean: a step's expected time is
what adds up over an iteration). Rows measured in traces and matched across ranks hold the transfer alone, from
the last member's arrival; for collectives among replicas (all but point-to-point transfers) the simulated
latency adds the measured mean time a member waited for the last one (``wait_us``): the simulator runs one
representative rank per stage, and replicas that drift apart by a little every step (scheduling noise, uneven
work) wait for each other at each collective. Pipeline transfers get no such term: waiting for the other stage
is what the schedule simulates.

A chain of collectives issued without waiting for each other (the gradient buckets of a data-parallel
reduction) is different: replicas that lag behind by a persistent amount make the early ones wait at *every*
call, yet the chain ends only that lag later. :func:`wait_once` gives such a chain its largest wait once, on its
last call.

A group spans the nodes :func:`~vtrain.collective_cost.nodes_spanned` says (Megatron's rank layout) and uses the
link :func:`~vtrain.collective_cost.link_name` picks. A measured curve stands only for groups spanning as many
nodes as it was measured on (rows without a node count, from traces, stand for any), and not for links whose rate
the run's config replaces (the device's provenance says ``config``): then the device's fitted or datasheet model
applies. Rows without a node count stand for no replaced link either: they were measured on some link of the
traced job, not on the one the config gives (a trace's 2-rank all-reduce, its waits included, had timed every
2-GPU group 8-12 times slower than the measured curves, whatever link rate the run gave).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace

from vtrain import cache
from vtrain.collective_cost import INTER_NODE, INTRA_NODE, link_name, nodes_spanned
from vtrain.devices.model import DeviceModel
from vtrain.errors import warn_input
from vtrain.simulate.latency import (
    INTERPOLATED,
    MEASURED,
    MODELLED,
    STRAGGLER_WAIT,
    TRANSFER,
    Resolution,
)
from vtrain.tables.digest import ProfileDigest
from vtrain.tables.store import Profile

#: which rows of the table stand for a pipeline send (first present wins)
_P2P_NAMES = ("send", "send_recv", "recv")


@dataclass(frozen=True)
class _SourceCurve:
    """One source's measured latency (and straggler wait) against message bytes, for one collective, group size
    and node count (a size it gives more than once: the mean of its rows)."""

    source: str
    sizes: list[int]
    latencies: list[float]
    waits: list[float]

    def distance(self, nbytes: int) -> int:
        """How far ``nbytes`` lies outside the measured sizes (0: inside)."""
        return max(self.sizes[0] - nbytes, nbytes - self.sizes[-1], 0)

    def at(self, nbytes: int) -> tuple[float, float, str]:
        """Latency and wait at ``nbytes`` and whether they were measured or interpolated (the latency piecewise
        linear inside the measured range, the smallest size's below it, the last segment's bandwidth above it;
        the wait of the nearest measured size outside the range)."""
        sizes, lats, waits = self.sizes, self.latencies, self.waits
        i = bisect.bisect_left(sizes, nbytes)
        if i < len(sizes) and sizes[i] == nbytes:
            return lats[i], waits[i], MEASURED
        if i == 0:
            return lats[0], waits[0], INTERPOLATED
        if i == len(sizes):
            if len(sizes) >= 2 and sizes[-1] > sizes[-2] and lats[-1] > lats[-2]:
                slope = (lats[-1] - lats[-2]) / (sizes[-1] - sizes[-2])
            else:
                slope = lats[-1] / sizes[-1] if sizes[-1] > 0 else 0.0
            return lats[-1] + slope * (nbytes - sizes[-1]), waits[-1], INTERPOLATED
        x0, x1 = sizes[i - 1], sizes[i]
        share = (nbytes - x0) / (x1 - x0)
        return (lats[i - 1] + (lats[i] - lats[i - 1]) * share, waits[i - 1] + (waits[i] - waits[i - 1]) * share,
                INTERPOLATED)


@dataclass(frozen=True)
class _Curve:
    """Measured latency (and straggler wait) against message bytes for one collective, group size and node count,
    from every source that measured it (nccl-tests, vidur, a trace), each source one curve.

    Where several sources measured a size, the latency is the mean of their curves there, one voice each: their
    points merged into one curve zigzag between testbeds (vidur's torch-level timings of an 8-GPU all-reduce lie
    about 17 % above nccl-tests' from 1 to 64 MiB, its sizes every 32 KiB between nccl-tests' ones), and a size both
    give was whichever row came last. Outside every source's range, the nearest source extrapolates."""

    sources: tuple[_SourceCurve, ...]

    def at(self, nbytes: int) -> tuple[float, float, str, str]:
        """Latency and wait at ``nbytes``, whether measured (by every source covering it) or interpolated, and
        which sources gave it."""
        covering = [curve for curve in self.sources if curve.distance(nbytes) == 0]
        if not covering:
            covering = [min(self.sources, key=lambda curve: curve.distance(nbytes))]
        points = [curve.at(nbytes) for curve in covering]
        kind = MEASURED if all(point[2] == MEASURED for point in points) else INTERPOLATED
        named = [curve.source for curve in covering if curve.source]
        said = "" if not named else f" ({named[0]})" if len(named) == 1 else f" (mean of {', '.join(named)})"
        return (sum(point[0] for point in points) / len(points), sum(point[1] for point in points) / len(points),
                kind, said)


class CollectiveResolver:
    """Resolves collective latencies for one run: profile curves first, then the device's α-β links."""

    def __init__(self, profile: Profile | None, device: DeviceModel, device_type: str, node_size: int) -> None:
        self.device = device
        self.node_size = max(node_size, 1)
        self._curves: dict[tuple[str, int, int | None], _Curve] = {}
        self._cache: dict[tuple[str, int, int, int, int | None], Resolution] = {}
        self._on_host = ""
        self._replaced: frozenset[str] = frozenset()  # the links whose rate the run's config gives
        if profile is not None:
            self._index(profile, device_type)

    def _index(self, profile: Profile, device_type: str) -> None:
        replaced = frozenset(key for key in (INTRA_NODE, INTER_NODE)
                             if self.device.provenance.get(f"{key}.bandwidth_gbps") == "config")
        digest = profile.digest
        if device_type == "cuda" and not digest.nccl_rows("cuda") and digest.op_rows("cuda"):
            # a GPU job none of whose collectives ran on its GPUs: its backend moved them through the host (gloo)
            device_type = "cpu"
            self._on_host = " on the host (the recording's collectives ran on none of its GPUs: gloo)"
        self._replaced = replaced
        self._curves, unsized = _curves(profile, device_type, replaced)
        if unsized:
            warn_input(f"{unsized} measured collective latency row(s) (nccl_latency) have no group size: no "
                       f"prediction can use them, and their collectives are modelled (traces that list no process "
                       f"group for their calls, of one rank of a larger job, say none)", profile.source)
        if digest.waits_included:
            warn_input(f"{digest.waits_included} measured point-to-point latency row(s) (nccl_latency) are timed with "
                       f"their waits for a peer the traces do not hold (raw: no other rank's call matched them, as in "
                       f"one stage of a pipeline): they time the other stage's work, not the transfer, so none is "
                       f"used and the pipeline's transfers are modelled", profile.source)

    def resolve(self, collective: str, group_size: int, nbytes: int, rank_stride: int,
                world_size: int | None = None) -> Resolution:
        """Latency of one collective over ``group_size`` ranks spaced ``rank_stride`` apart, in a run of
        ``world_size`` ranks (:func:`~vtrain.collective_cost.nodes_spanned`: which nodes its groups span)."""
        key = (collective, group_size, nbytes, rank_stride, world_size)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._resolve(collective, group_size, nbytes, rank_stride, world_size)
        return cached

    def resolved(self) -> list[Resolution]:
        """Every distinct resolution made so far."""
        return list(self._cache.values())

    def _resolve(self, collective: str, group_size: int, nbytes: int, rank_stride: int,
                 world_size: int | None) -> Resolution:
        names = _P2P_NAMES if collective in _P2P_NAMES else (collective,)
        nodes = nodes_spanned(group_size, rank_stride, self.node_size, world_size, neighbours=collective in _P2P_NAMES)
        anywhere = link_name(nodes) not in self._replaced  # rows of no node count stand for this group's link
        for name in names:
            curve = self._curves.get((name, group_size, nodes)) or (
                self._curves.get((name, group_size, None)) if anywhere else None)
            if curve is not None:
                latency, wait, source, sources = curve.at(nbytes)
                detail = f"nccl_latency {name} n={group_size}{sources}{self._on_host}"
                if wait <= 0:
                    return Resolution(latency, source, detail)
                detail += f": {source} transfer {latency:.1f} us + {source} straggler wait {wait:.1f} us"
                return Resolution(latency + wait, source, detail, parts=((TRANSFER, latency), (STRAGGLER_WAIT, wait)))
        latency, detail = self.device.collective_us(collective, group_size, nbytes, nodes)
        return Resolution(latency, MODELLED, detail)


Curves = dict[tuple[str, int, int | None], _Curve]
_CURVES: dict[tuple[int, str], tuple[ProfileDigest, Curves, int]] = {}


def _curves(profile: Profile, device_type: str, replaced: frozenset[str]) -> tuple[Curves, int]:
    """The measured curves of a profile's ``nccl_latency`` rows by (collective, group size, nodes), leaving out
    those on the ``replaced`` links, and how many rows with a latency and a size had no group size (left out).
    Built once per profile and kept in vtrain's cache (:func:`vtrain.cache.derived`): building them from the rows
    of ``profiles/a100`` (16,122) took longer than a simulation; and once per process (a table of measurements is
    predicted row after row)."""
    digest = profile.digest
    cached = _CURVES.get((id(digest), device_type))
    if cached is None or cached[0] is not digest:
        curves, unsized = cache.derived(profile.content_key(), f"nccl-curves-{device_type}",
                                        lambda: _measured_curves(digest, device_type))
        if len(_CURVES) > 8:
            _CURVES.clear()
        cached = _CURVES[(id(digest), device_type)] = (digest, curves, unsized)
    _, curves, unsized = cached
    return {what: curve for what, curve in curves.items()
            if what[2] is None or link_name(what[2]) not in replaced}, unsized


def _measured_curves(digest: ProfileDigest, device_type: str) -> tuple[Curves, int]:
    """Every measured curve of the digest's ``nccl_latency`` rows of ``device_type``, and how many rows with a
    latency and a size had no group size."""
    points: dict[tuple[str, int, int | None], dict[str, dict[int, list[tuple[float, float]]]]] = {}
    unsized = 0
    for _, collective, group_size, nodes, nbytes, mean, median, wait, source in digest.nccl_rows(device_type):
        latency = mean if mean is not None else median
        unsized += latency is not None and nbytes is not None and group_size is None
        if latency is None or nbytes is None or group_size is None:
            continue
        waited = wait if wait is not None and collective not in _P2P_NAMES else 0.0
        by_source = points.setdefault((collective, group_size, nodes), {})
        by_source.setdefault(source or "", {}).setdefault(int(nbytes), []).append((float(latency), float(waited)))
    curves = {what: _Curve(tuple(_source_curve(source, by_source[source]) for source in sorted(by_source)))
              for what, by_source in points.items()}
    return curves, unsized


def _source_curve(source: str, by_size: dict[int, list[tuple[float, float]]]) -> _SourceCurve:
    """One source's curve from its rows by size (the mean of a size's rows)."""
    sizes = sorted(by_size)
    return _SourceCurve(source, sizes, [sum(lat for lat, _ in by_size[size]) / len(by_size[size]) for size in sizes],
                        [sum(wait for _, wait in by_size[size]) / len(by_size[size]) for size in sizes])


def wait_once(chain: list[Resolution]) -> list[Resolution]:
    """The resolutions of a chain of collectives issued back to back (each may start once the previous one is
    done, none waits for the others' completion): transfers only, and the largest straggler wait of the chain on
    its last call."""
    if not chain:
        return chain
    largest = max(r.part_us(STRAGGLER_WAIT) for r in chain)
    transfers = [_without_wait(r) for r in chain]
    if largest <= 0:
        return transfers
    last = transfers[-1]
    detail = f"{last.detail} + straggler wait {largest:.1f} us (the largest of its chain of {len(chain)}, once)"
    return [*transfers[:-1], replace(last, latency_us=last.latency_us + largest, detail=detail,
                                     parts=((TRANSFER, last.latency_us), (STRAGGLER_WAIT, largest)))]


def _without_wait(resolution: Resolution) -> Resolution:
    wait = resolution.part_us(STRAGGLER_WAIT)
    if wait <= 0:
        return resolution
    transfer = resolution.latency_us - wait
    detail = resolution.detail.split(" + ")[0]
    return replace(resolution, latency_us=transfer, detail=detail, parts=((TRANSFER, transfer),))
