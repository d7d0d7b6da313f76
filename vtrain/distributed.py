"""Running tasks as Ray tasks (``pip install vtrain[ray]``), on an existing cluster or a local instance: `vtrain
plan`'s groups of plans and `vtrain ingest`'s rank files go through the same function as their process pools, so
the numbers are the same."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from vtrain.errors import InputError


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
