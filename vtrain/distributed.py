"""Running work in parallel: as worker processes on this machine (how many: :func:`workers_within_cores`), or as Ray
tasks (``pip install vtrain[ray]``) on an existing cluster or a local instance: `vtrain plan`'s groups of plans and
`vtrain ingest`'s rank files go through the same function as their process pools, so the numbers are the same."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from vtrain.errors import InputError


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers_within_cores(requested: int, warn: Callable[[str], None]) -> int:
    """``--workers``, at most one process per usable core (``warn`` says so when that is fewer): the work is CPU-
    bound, so more processes than cores add only memory (each holds its own copy of the profile and the
    libraries: 10,000 asked for would exhaust any machine's memory)."""
    cores = usable_cores()
    if requested > cores:
        warn(f"--workers {requested}: this process may use {cores} CPU core(s); using {cores} worker processes")
        return cores
    return requested


def run_on_ray(address: str, function: Callable[..., Any], base: Any, profile: Any, device: Any,
               groups: list[Any]) -> Iterator[Any]:
    """Yield ``function(base, profile, device, group)`` for every group, each run as one Ray task, as they
    finish. ``address``: a cluster's address (``ray://host:10001``, ``auto``), or ``local``: the cluster named
    by ``RAY_ADDRESS`` if set, else a new local instance.
    The shared arguments are put in Ray's object store once."""
    try:
        import ray
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'vtrain[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - Ray raises bare exceptions when a node does not start
            raise InputError(f"--ray: could not start or reach Ray at {address!r}: {exc}") from None
    try:
        remote = ray.remote(function)
        shared = [ray.put(value) for value in (base, profile, device)]
        pending = [remote.remote(*shared, group) for group in groups]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        if started:
            ray.shutdown()
