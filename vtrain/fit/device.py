"""Fitting a device model to whatever a profile holds, and storing it in (and reading it back from) the profile.

- GEMM kernel model: ``op_benchmarks`` GEMM rows plus the GEMM operators measured in the profile's own traces;
- memory-bound kernel model: ``op_benchmarks`` rows of normalisation, softmax, element-wise and embedding kernels
  (both :mod:`vtrain.fit.kernel_model`; rebuilt from the profile's tables when it is loaded, or read back from
  vtrain's cache when these tables were loaded before: :mod:`vtrain.cache`);
- collectives: every ``nccl_latency`` row with a group size (nccl-tests, vidur, traces);
- host overheads: only when measured iteration times are given (:mod:`vtrain.fit.iterations`).

What could not be fitted (too few samples) keeps the datasheet value, and the provenance says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from vtrain import cache
from vtrain.collective_cost import INTER_NODE, INTRA_NODE, AlphaBeta, link_name
from vtrain.devices.catalog import (DATASHEET_DEVICES, canonical_device_name, device_for_config, device_model,
                                    same_die)
from vtrain.devices.fitted import FittedDevice, HostOverhead
from vtrain.devices.model import DeviceModel
from vtrain.errors import InputError, warn_input
from vtrain.fit.kernel_model import GEMM, MEMORY, fit_kernel_model
from vtrain.fit.operators import OperatorKernelModel
from vtrain.kineto import first_dtype
from vtrain.model.ops import GEMM_OPS, HALF_DTYPES, gemm_dims, make_op
from vtrain.runconfig import RunConfig
from vtrain.tables.store import Profile, empty_table

if TYPE_CHECKING:
    import polars as pl

MEMORY_BOUND_CLASSES = ("layernorm", "softmax", "gelu", "elementwise", "embedding")


def fit_device(profile: Profile, device_name: str) -> FittedDevice:
    """A :class:`FittedDevice` for ``device_name`` (a datasheet device) with every part the profile can fit."""
    import polars as pl

    from vtrain.fit.alpha_beta import fit_collectives

    base = device_model(device_name)
    gemm, memory = fit_kernels(profile, base)
    provenance = dict(base.provenance)
    for key, fit in (("gemm", gemm), ("memory_bound", memory)):
        provenance[key] = f"fitted: {', '.join(fit.sources)}" if fit else "not fitted: too few samples"
    collectives = tuple(fit_collectives(profile.nccl_latency.filter(pl.col("device_type") == "cuda")))
    provenance["collectives"] = (f"fitted: {len(collectives)} curves" if collectives
                                 else "not fitted: no collective measurements")
    return _fitted(base, provenance=provenance, gemm=gemm, memory_bound=memory, collectives=collectives)


def traced_gemms(profile: Profile) -> pl.DataFrame:
    """The half-precision GEMM operators of the profile's own GPU traces as ``op_benchmarks`` rows (source
    ``trace``). The kernel model learns half-precision efficiencies (an fp32 GEMM takes them at the fp32 peak): an
    fp32 GEMM among its samples, against the half-precision floor, would teach it that those shapes run 10x slow."""
    import polars as pl

    from vtrain.tables.schema import TRACE_SOURCE  # with polars: a profile read from the cache imports neither

    table = profile.op_latency.filter((pl.col("device_type") == "cuda") & pl.col("op").is_in(list(GEMM_OPS)))
    rows: list[dict[str, Any]] = []
    for name, dims, types, count, median in table.select(
            "op", "input_dims", "input_types", "count", "median_us").iter_rows():
        try:
            op = make_op(name, json.loads(dims), json.loads(types))
            batch, m, k, n = gemm_dims(op)
        except (ValueError, TypeError):
            continue
        if op.flops > 0 and median and first_dtype(types) in HALF_DTYPES:
            rows.append({"source": TRACE_SOURCE, "op_class": "gemm", "label": f"{name} {dims}", "batch": batch,
                         "m": m, "k": k, "n": n, "flops": op.flops, "bytes": op.bytes, "count": count,
                         "median_us": median})
    return pl.DataFrame(rows) if rows else pl.DataFrame(schema={"source": pl.String, "op_class": pl.String})


def kernel_samples(benchmarks: pl.DataFrame, kind: str) -> pl.DataFrame:
    """The ``op_benchmarks`` rows of one kernel class (GEMM or memory-bound)."""
    import polars as pl

    if kind == GEMM:
        return benchmarks.filter(pl.col("op_class") == "gemm")
    return benchmarks.filter(pl.col("op_class").is_in(MEMORY_BOUND_CLASSES))


def fit_kernels(profile: Profile, base: DeviceModel) -> tuple[OperatorKernelModel | None, OperatorKernelModel | None]:
    """The GEMM and memory-bound kernel models of the profile's benchmarks and traced GEMMs (None: too few)."""
    import polars as pl

    imported = profile.tables.get("op_benchmarks", empty_table("op_benchmarks"))  # absent in a fresh ingest
    benchmarks = pl.concat([imported, traced_gemms(profile)], how="diagonal_relaxed")
    return (_try_fit(kernel_samples(benchmarks, GEMM), GEMM, base),
            _try_fit(kernel_samples(benchmarks, MEMORY), MEMORY, base))


def _try_fit(samples: pl.DataFrame, kind: str, base: DeviceModel) -> OperatorKernelModel | None:
    try:
        return OperatorKernelModel(fit_kernel_model(samples, kind, base.peak_for("c10::Half"), base.memory_bandwidth,
                                                    base.sm_count))
    except ValueError:
        return None


_BASE_FIELDS = ("name", "peak_flops", "memory_bandwidth", "launch_overhead_us", "gemm_efficiency",
                "memory_efficiency", "intra_node", "inter_node", "memory_bytes", "sm_count")


def _fitted(base: DeviceModel, **fitted: Any) -> FittedDevice:
    """A fitted device that keeps ``base``'s datasheet fields."""
    return FittedDevice(**{f: getattr(base, f) for f in _BASE_FIELDS}, **fitted)


def device_metadata(device: FittedDevice, base_name: str) -> dict[str, Any]:
    """The fitted device as plain data for ``metadata.json`` (``fitted`` section)."""
    return {"device": base_name, "provenance": device.provenance, **device.fitted_summary()}


def device_from_profile(profile: Profile, source: str | None = None) -> FittedDevice:
    """Rebuild the device stored by :func:`device_metadata` in ``profile.metadata["fitted"]``: the kernel models
    from the profile's own tables (deterministically), collectives and host terms from the metadata. Raises
    :class:`InputError` when the metadata is malformed (a profile from an older vtrain included)."""
    fitted = profile.metadata.get("fitted") or {}
    try:
        base = device_model(fitted["device"], source)
        collectives = tuple(AlphaBeta.from_dict(c) for c in fitted.get("collectives", []))
        host = HostOverhead.from_dict(fitted["host"]) if fitted.get("host") else HostOverhead()
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"malformed fitted device in metadata.json (refit it with `vtrain fit`): {exc}",
                         source) from None
    gemm, memory = cache.derived(profile.content_key(), f"kernel-models-{base.name}",
                                 lambda: fit_kernels(profile, base))
    provenance = {**fitted.get("provenance", {}), "memory_bytes": base.provenance.get("memory_bytes", "datasheet")}
    for key, model in (("gemm", gemm), ("memory_bound", memory)):
        if model is None and str(provenance.get(key, "")).startswith("fitted"):
            where = profile.path / "op_benchmarks.parquet" if profile.path else source
            raise InputError(f"metadata.json says the {key.replace('_', '-')} kernel model was "
                             f"{provenance[key]}, but the profile's kernel measurements have too few usable rows "
                             f"to rebuild it (a table replaced or cut?)", where)
    return _fitted(base, provenance=provenance, gemm=gemm, memory_bound=memory, collectives=collectives, host=host)


def with_inter_node_rate(device: FittedDevice, gbps: float, gpus_per_node: int) -> FittedDevice:
    """The device on a cluster whose nodes have ``gbps`` Gbit/s of network each, shared by their
    ``gpus_per_node`` GPUs: the inter-node link runs at a GPU's share (GB/s = Gbit/s / 8 / GPUs per node), and
    multi-node collective curves keep their fitted latency and take, per group, the share of the GPUs it has on
    a node (:meth:`~vtrain.devices.fitted.FittedDevice.collective_us`)."""
    per_gpu = gbps / 8.0 / max(gpus_per_node, 1)
    curves = tuple(replace(c, bus_gbps=per_gpu, sources=(*c.sources, "--inter-node-gbps"))
                   if link_name(c.nodes) == INTER_NODE else c for c in device.collectives)
    provenance = {**device.provenance, "inter_node.bandwidth_gbps": "config"}
    inter = replace(device.inter_node, bandwidth_gbps=per_gpu)
    return replace(device, collectives=curves, inter_node=inter, provenance=provenance)


def refit(profile: Profile, base_metadata: dict[str, Any]) -> dict[str, Any] | None:
    """The device model refitted to a freshly ingested profile (``vtrain calibrate``), as metadata.

    The device is the profile's own (its trace's device name), else the base profile's fitted device. Host
    overheads cannot be fitted from traces alone and are carried over from the base's fit, marked as such.
    Returns None when neither profile names a device vtrain knows.
    """
    base_fit = base_metadata.get("fitted") or {}
    name = canonical_device_name((profile.metadata.get("device") or {}).get("name") or "") or base_fit.get("device")
    if name is None or name == "cpu":
        return None
    device = fit_device(profile, name)
    if base_fit.get("host"):
        device = replace(device, host=HostOverhead.from_dict(base_fit["host"]),
                         provenance={**device.provenance, "host": "carried over from the parent profile"})
    return device_metadata(device, name)


def with_intra_node_rate(device: FittedDevice, gbps: float, given_by: str = "--intra-node-gbps") -> FittedDevice:
    """The device on nodes whose GPU-to-GPU links run at ``gbps`` GB/s instead of the datasheet's (``given_by``:
    the flag or config key, or the GPU whose link it is): single-node collective curves keep their latency and
    scale their bus bandwidth by the ratio; the link's provenance is ``config``, so no measured curve of the
    profile's own links times it (:mod:`vtrain.simulate.collective_latency`)."""
    ratio = gbps / device.intra_node.bandwidth_gbps
    curves = tuple(replace(c, bus_gbps=c.bus_gbps * ratio, sources=(*c.sources, given_by))
                   if link_name(c.nodes) == INTRA_NODE else c for c in device.collectives)
    provenance = {**device.provenance, "intra_node.bandwidth_gbps": "config"}
    return replace(device, collectives=curves, intra_node=replace(device.intra_node, bandwidth_gbps=gbps),
                   provenance=provenance)


def for_config(device: FittedDevice, config: RunConfig) -> FittedDevice:
    """The fitted device on the hardware a run config describes: its inter-node network (Gbit/s per node, shared
    by the node's GPUs) and GPU-to-GPU link rate (GB/s), where given, replace the fitted ones. A link rate that is
    the device's own (vTrain's config JSON states the A100's 300 GB/s) changes nothing: the profile's curves measured
    on that link keep timing it, as when the rate is not given (they were set aside, and MT-NLG predicted 0.18 %
    slower through `simulate` than through a table row of the same run)."""
    hardware = config.hardware
    if hardware.inter_node_gbps is not None:
        device = with_inter_node_rate(device, float(hardware.inter_node_gbps), hardware.gpus_per_node)
    if hardware.intra_node_gbps is not None and not math.isclose(float(hardware.intra_node_gbps),
                                                                 device.intra_node.bandwidth_gbps):
        device = with_intra_node_rate(device, float(hardware.intra_node_gbps))
    return device


def on_run_hardware(device: FittedDevice, config: RunConfig) -> FittedDevice:
    """The fitted ``device`` on the hardware of a run on its GPU family: on the run's variant of the GPU
    (:func:`on_gpu`, where the run names another one) and on the run's links (:func:`for_config`)."""
    wanted = canonical_device_name(config.hardware.device) or ""
    if wanted != canonical_device_name(device.name) and wanted in DATASHEET_DEVICES:
        device = on_gpu(device, DATASHEET_DEVICES[wanted])
    return for_config(device, config)


def profile_gpu(profile: Profile) -> str | None:
    """The GPU whose timings ``profile`` holds: the device it was fitted for, else its traces' device where vtrain
    knows it as a GPU (its catalog name); ``None`` for a CPU recording or a device vtrain does not know."""
    fitted = (profile.metadata.get("fitted") or {}).get("device")
    if fitted:
        return str(fitted)
    traced = canonical_device_name(str((profile.metadata.get("device") or {}).get("name") or ""))
    return traced if traced in DATASHEET_DEVICES else None


#: how far apart (a ratio) two variants' datasheet tensor peaks may be for latencies measured on one to time the other
_ALIKE = 1.05


def latencies_apply(profile: Profile | None, device_name: str) -> bool:
    """Whether ``profile``'s measured latencies (operators, collectives, host gaps) time a run on the device
    ``device_name``: they do on a variant of the GPU they were measured on with its tensor peaks (the 40 and 80 GB
    A100s, the H100, H200 and H800), and not on another GPU (an A100's kernels and NVLink are not an H100's) nor on
    a variant cut down (an H20 has a seventh of an H100's tensor peak, an H100-PCIe 0.76 of it: the profile's
    fitted device, moved onto the variant's roofline, times those). A profile of no GPU vtrain knows (a CPU
    recording, an unknown GPU) or a run on a device that is not a known GPU keeps them: the device type then
    decides which rows apply."""
    gpu = profile_gpu(profile) if profile is not None else None
    run_gpu = canonical_device_name(device_name)
    return gpu is None or run_gpu is None or (same_die(run_gpu, gpu) and _alike(run_gpu, gpu))


def _alike(one: str, other: str) -> bool:
    """Whether two known GPUs have the same datasheet tensor peaks (within :data:`_ALIKE`)."""
    first, second = DATASHEET_DEVICES.get(one), DATASHEET_DEVICES.get(canonical_device_name(other) or other)
    if first is None or second is None:
        return True
    peaks = [(first.peak_flops.get(dtype, 0.0), second.peak_flops.get(dtype, 0.0)) for dtype in first.peak_flops]
    return all(a > 0 and b > 0 and max(a, b) <= _ALIKE * min(a, b) for a, b in peaks)


def device_problem(name: str, device: FittedDevice) -> str | None:
    """Why runs on the GPU ``name`` cannot be predicted with the profile's fitted ``device`` (None when they can:
    it is a variant of the profile's GPU, whose kernel efficiencies move onto its roofline)."""
    wanted = canonical_device_name(name)
    if wanted is None:
        return f"device {name!r} is no GPU vtrain knows (vtrain/devices/catalog.py lists them)"
    if not same_die(wanted, device.name):
        return (f"device {wanted} is not a variant of the profile's {device.name}: score runs on it with a profile "
                f"fitted for it")
    return None


def device_for_run(config: RunConfig, profile: Profile | None, source: str | None = None) -> DeviceModel:
    """The one device model every prediction uses: the profile's fitted device when it has one for the run's
    GPU family (on the run's links, :func:`for_config`; on the run's variant of the GPU, :func:`on_gpu`), else the
    datasheet model of the run's device."""
    fitted = (profile.metadata.get("fitted") or {}) if profile is not None else {}
    wanted = canonical_device_name(config.hardware.device) or ""
    if fitted.get("device") and same_die(wanted, str(fitted["device"])):
        _say_variant_unlike(profile, wanted, source)
        return on_run_hardware(_loaded(profile, source), config)
    if fitted.get("device") and wanted and _first_time_unused(profile, wanted):  # an unknown one is refused below
        warn_input(f"the profile {profile.path or ''} was fitted for {fitted['device']} and the run is on "
                   f"{config.hardware.device}: neither its device model nor its measured latencies (another GPU's) "
                   f"are used, the run is modelled from its datasheet (give the run the profile's device, e.g. "
                   f"simulate --device {fitted['device']}, to predict it there)", source)
    elif profile is not None and not fitted.get("device"):
        _say_traced_elsewhere(profile, config, source)
    return device_for_config(config, source)


def _say_variant_unlike(profile: Profile, wanted: str, source: str | None) -> None:
    """Say, once per profile and device, that a variant of the profile's GPU with other tensor peaks (an H20 or
    H100-PCIe run with an H100 profile) is timed by the profile's fitted device on its roofline, without the
    latencies measured on the profile's GPU (:func:`latencies_apply`)."""
    gpu = profile_gpu(profile)
    if gpu is None or latencies_apply(profile, wanted) or not _first_time_unused(profile, wanted):
        return
    ours, theirs = DATASHEET_DEVICES.get(wanted), DATASHEET_DEVICES.get(canonical_device_name(gpu) or gpu)
    if ours is None or theirs is None:
        return
    warn_input(f"the profile {profile.path or ''} was measured on {gpu} and the run is on {wanted}, a variant with "
               f"{ours.peak_for('c10::Half') / theirs.peak_for('c10::Half'):.2g}x its tensor peak: its measured "
               f"latencies are not used; its fitted device model, on {wanted}'s roofline, times the run", source)


def _say_traced_elsewhere(profile: Profile, config: RunConfig, source: str | None) -> None:
    """Say, once per profile and device, where a profile traced on one device (its metadata's) is asked for a run
    on another (on the CPU for a GPU's run, the reverse, or on another GPU): none of its latencies applies
    (:func:`latencies_apply`), and the run is modelled."""
    traced = (profile.metadata.get("device") or {}) if isinstance(profile.metadata.get("device"), dict) else {}
    on_cpu, run_on_cpu = traced.get("type") == "cpu", config.hardware.device.lower() == "cpu"
    name = str(traced.get("name") or "")
    if on_cpu == run_on_cpu and (on_cpu or not name or same_die(config.hardware.device, name)):
        return
    if not on_cpu and name and canonical_device_name(name) is None:  # a GPU vtrain does not know: where a model
        return  # goes on it is said where the run is read (vtrain/run_argument.py)
    if not _first_time_unused(profile, canonical_device_name(config.hardware.device) or config.hardware.device):
        return
    where = "the CPU" if on_cpu else name or "a GPU"
    warn_input(f"the profile {profile.path or ''} was traced on {where} and the run is on {config.hardware.device}: "
               f"none of its latencies applies, the run is modelled (give the run the profile's device to predict it "
               f"there)", source)


#: id(profile) -> (the last profile, the devices it was already said to be unused for) (:func:`device_for_run`)
_SAID_UNUSED: dict[int, tuple[Profile, set[str]]] = {}


def _first_time_unused(profile: Profile, device: str) -> bool:
    """Whether ``profile`` was not yet said to be unused for ``device``: once per profile and device, not once per
    plan of a sweep (the identity check keeps a new profile at a reused id from passing for an old one)."""
    said = _SAID_UNUSED.get(id(profile))
    if said is None or said[0] is not profile:
        _SAID_UNUSED.clear()  # the last profile only, as :func:`_loaded` keeps it
        said = _SAID_UNUSED[id(profile)] = (profile, set())
    if device in said[1]:
        return False
    said[1].add(device)
    return True


def on_gpu(device: FittedDevice, gpu: DeviceModel) -> FittedDevice:
    """The fitted device on another variant of its GPU (an A100-80GB run with an A100-40GB profile): the kernel
    models keep the efficiencies they learnt and take ``gpu``'s roofline (its peaks: a memory-bound kernel moves
    its bytes at its bandwidth; its SM count: a GEMM's waves), and ``gpu``'s datasheet (memory size included);
    host terms stay the profile's, and so do collectives, but on a variant whose GPUs are linked otherwise (a PCIe
    card of an NVLink profile): there its GPU-to-GPU link is the card's, as ``--intra-node-gbps`` makes it
    (:func:`with_intra_node_rate`: the profile's curves measured on NVLink no longer time its collectives)."""
    def retarget(model: OperatorKernelModel | None) -> OperatorKernelModel | None:
        if model is None:
            return None
        return OperatorKernelModel(replace(model.model, peak_flops=gpu.peak_for("c10::Half"),
                                           peak_bytes_per_s=gpu.memory_bandwidth, sm_count=gpu.sm_count or
                                           model.model.sm_count, _cache={}))

    provenance = {**device.provenance, "gpu": f"{gpu.name} (datasheet; the profile's {device.name} fits on it)",
                  "memory_bytes": gpu.provenance.get("memory_bytes", "datasheet")}
    moved = replace(device, name=gpu.name, peak_flops=gpu.peak_flops, memory_bandwidth=gpu.memory_bandwidth,
                    memory_bytes=gpu.memory_bytes, sm_count=gpu.sm_count, gemm=retarget(device.gemm),
                    memory_bound=retarget(device.memory_bound), provenance=provenance)
    own = DATASHEET_DEVICES.get(canonical_device_name(device.name) or "")
    if own is not None and gpu.intra_node.bandwidth_gbps != own.intra_node.bandwidth_gbps:  # PCIe, not NVLink
        return with_intra_node_rate(moved, gpu.intra_node.bandwidth_gbps, f"{gpu.name}'s links (datasheet)")
    return moved


_LOADED: dict[int, tuple[Profile, FittedDevice]] = {}


def _loaded(profile: Profile, source: str | None) -> FittedDevice:
    """:func:`device_from_profile`, once per profile object (its kernel models are rebuilt from its tables, or read
    from vtrain's cache)."""
    cached = _LOADED.get(id(profile))
    if cached is None or cached[0] is not profile:
        _LOADED.clear()
        cached = _LOADED[id(profile)] = (profile, device_from_profile(profile, source))
    return cached[1]
