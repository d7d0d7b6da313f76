"""The host's time per operator measured in GPU traces, as a fitted device's host term (``vtrain fit --profile``).

A profile fitted to kernel measurements knows each kernel's time but not how fast the host issues kernels: on its
own it predicts a launch-bound run as if the host were free (an H200 GPT-3 350M with one sequence per
micro-batch: -80 %). The time a host takes per operator belongs to the host and the framework, not to the run
(the gaps between kernels do not carry from a device-bound run to a launch-bound one; the issue rate does,
``tests/test_gpu_recordings.py``). So a profile from `vtrain ingest` of a GPU recording that says which run it
recorded gives the fit its host's time per operator: the host's time between launches that found the launch queue
free, per operator the model places in that run, over every phase
(:class:`~vtrain.simulate.latency.IssueRate`, the rate `vtrain simulate` issues a GPU rank's operators at when
the profile has the timeline itself). A collective is one more call the host issues: the same time. One GPU's
recording says nothing of the spread of ranks' arrivals: no jitter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vtrain.devices.fitted import HostOverhead
from vtrain.devices.catalog import canonical_device_name
from vtrain.devices.model import DeviceModel
from vtrain.errors import warn_input
from vtrain.simulate.run import SharedResolvers
from vtrain.naming import ALL
from vtrain.tables.store import Profile


@dataclass(frozen=True)
class TracedHost:
    """The host term measured in one ingested recording."""

    op_us: float
    source: Path

    def describe(self) -> str:
        return f"measured: {self.op_us:.1f} us per operator issued, in the timeline of {self.source}"


def traced_host(profile: Profile, device: DeviceModel, source: Path) -> TracedHost | None:
    """The host's time per operator in ``profile``'s GPU timeline, when the profile says which run it recorded
    and its host issued operators on its own (a CPU recording, or one without a timeline or run: ``None``; a GPU
    timeline without its run, or one that replays CUDA graphs, is said in a warning line: the fit then has no host
    time from it)."""
    run = profile.traced_run()
    if run is None and not profile.tables["kernels"].is_empty():
        warn_input("its GPU timeline does not say which run it recorded (no run.yaml beside the traces when they "
                   "were ingested), so the host's time per operator cannot be measured in it: the fitted profile "
                   "gets none from it", source)
    if run is None or run.hardware.device.lower() == "cpu":
        return None
    if run.cuda_graphs or not profile.tables["graph_launches"].is_empty():
        warn_input("it replays CUDA graphs: the few operators its host still issues one by one (the optimizer's, "
                   "the embedding's) do not tell its time per operator in an eager run, so none is taken from it",
                   source)
        return None
    if (canonical_device_name(run.hardware.device) or run.hardware.device) != (canonical_device_name(device.name)
                                                                               or device.name):
        warn_input(f"its run was recorded on {run.hardware.device} and the profile is for {device.name}: the host's "
                   f"time per operator measured in it is that machine's", source)
    shared = SharedResolvers(profile, device)
    traced = shared.traced_run()
    if traced is None:
        return None
    signatures, per_iteration = traced
    _, gaps = shared.ops(run, signatures, None, per_iteration)
    rate = gaps.issue(ALL)
    return TracedHost(rate.host.latency_us, source) if rate is not None else None


def host_overhead(measured: list[TracedHost]) -> HostOverhead:
    """The host term of several recordings: the mean of their times per operator, for operators and collectives."""
    op_us = sum(each.op_us for each in measured) / len(measured)
    return HostOverhead(op_us=op_us, collective_us=op_us, jitter_us=0.0)
