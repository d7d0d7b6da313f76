"""Collective latencies: the profile's ``nccl_latency`` table interpolated in message size per group size, else
the α-β model of the device's links (ring or tree, intra- or inter-node).

Ranks are laid out as Megatron lays them out: tensor-parallel ranks adjacent, then data-parallel, then pipeline
stages, ``node_size`` consecutive ranks per node. A group whose members fit in one node uses the intra-node link.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from vtrain.devices.model import DeviceModel
from vtrain.simulate.latency import INTERPOLATED, MEASURED, MODELLED, Resolution
from vtrain.tables.store import Profile

#: which rows of the table stand for a pipeline send (first present wins)
_P2P_NAMES = ("send", "send_recv", "recv")


@dataclass(frozen=True)
class _Curve:
    """Measured median latency against message bytes for one collective and group size."""

    sizes: list[int]
    latencies: list[float]
    algorithm: str

    def at(self, nbytes: int) -> tuple[float, str]:
        """Latency at ``nbytes`` and whether it was measured or interpolated (piecewise linear inside the
        measured range; the smallest size's latency below it; the last segment's bandwidth above it)."""
        sizes, lats = self.sizes, self.latencies
        i = bisect.bisect_left(sizes, nbytes)
        if i < len(sizes) and sizes[i] == nbytes:
            return lats[i], MEASURED
        if i == 0:
            return lats[0], INTERPOLATED
        if i == len(sizes):
            if len(sizes) >= 2 and sizes[-1] > sizes[-2] and lats[-1] > lats[-2]:
                slope = (lats[-1] - lats[-2]) / (sizes[-1] - sizes[-2])
            else:
                slope = lats[-1] / sizes[-1] if sizes[-1] > 0 else 0.0
            return lats[-1] + slope * (nbytes - sizes[-1]), INTERPOLATED
        x0, x1, y0, y1 = sizes[i - 1], sizes[i], lats[i - 1], lats[i]
        return y0 + (y1 - y0) * (nbytes - x0) / (x1 - x0), INTERPOLATED


class CollectiveResolver:
    """Resolves collective latencies for one run: profile curves first, then the device's α-β links."""

    def __init__(self, profile: Profile | None, device: DeviceModel, device_type: str, node_size: int) -> None:
        self.device = device
        self.node_size = max(node_size, 1)
        self._curves: dict[tuple[str, int], _Curve] = {}
        self._cache: dict[tuple[str, int, int, int], Resolution] = {}
        if profile is not None:
            self._index(profile, device_type)

    def _index(self, profile: Profile, device_type: str) -> None:
        table = profile.nccl_latency
        rows = table.filter(table["device_type"] == device_type).select(
            "collective", "group_size", "bytes", "median_us", "algorithm").sort("bytes").rows()
        points: dict[tuple[str, int], dict[int, float]] = {}
        algorithms: dict[tuple[str, int], str] = {}
        for collective, group_size, nbytes, median, algorithm in rows:
            if median is None or nbytes is None or group_size is None:
                continue
            points.setdefault((collective, group_size), {})[int(nbytes)] = float(median)
            algorithms.setdefault((collective, group_size), algorithm or "")
        for key, by_size in points.items():
            sizes = sorted(by_size)
            self._curves[key] = _Curve(sizes, [by_size[s] for s in sizes], algorithms[key])

    def resolve(self, collective: str, group_size: int, nbytes: int, rank_stride: int) -> Resolution:
        """Latency of one collective over ``group_size`` ranks spaced ``rank_stride`` apart."""
        key = (collective, group_size, nbytes, rank_stride)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._resolve(collective, group_size, nbytes, rank_stride)
        return cached

    def resolved(self) -> list[Resolution]:
        """Every distinct resolution made so far."""
        return list(self._cache.values())

    def _resolve(self, collective: str, group_size: int, nbytes: int, rank_stride: int) -> Resolution:
        names = _P2P_NAMES if collective in _P2P_NAMES else (collective,)
        for name in names:
            curve = self._curves.get((name, group_size))
            if curve is not None:
                latency, source = curve.at(nbytes)
                return Resolution(latency, source, f"nccl_latency {name} n={group_size}")
        nodes = -(-rank_stride * group_size // self.node_size)
        latency, detail = self.device.collective_us(collective, group_size, nbytes, nodes)
        return Resolution(latency, MODELLED, detail)
