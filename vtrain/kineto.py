"""The vocabulary of Kineto (PyTorch profiler) trace events, across PyTorch generations and accelerators.

The one place that says what an event's category means; ingest and replay both look categories up here.

- Category names are compared case-insensitively: PyTorch 1.8–1.9 wrote ``Kernel``, ``Runtime``, ``Memcpy``,
  ``Memset``, ``Operator``; later versions write ``kernel``, ``cuda_runtime``, ``gpu_memcpy``, ...
- Device activities are kernels, memory copies and memory sets of any accelerator: CUDA and ROCm (HIP traces use
  the same categories), MTIA (``mtia_ccp_events``; its DMA activities are memory copies, by name, as HTA reads
  them).
- CUPTI ``cuda_sync`` records (Stream Sync, Context Sync, Event Sync, Stream Wait Event) are dependencies, not
  device work: the replay keeps them, kernel times leave them out.
- Arg keys likewise vary (``External id`` / ``external id``): :func:`arg_key` folds them.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_right
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from vtrain.limits import FITTED_COUNTS, MAX_TRACE_US, shown, shown_count

#: what an event is: a device activity, a CPU operator or annotation, a runtime/driver call, a CUPTI sync record
DEVICE, CPU, RUNTIME, SYNC = "device", "cpu", "runtime", "sync"

#: device category (lower case) -> the activity's kind in the ``kernels`` table
DEVICE_CATEGORIES: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "memcpy": "memcpy",  # PyTorch 1.8-1.9
    "memset": "memset",  # PyTorch 1.8-1.9
    "mtia_ccp_events": "kernel",  # MTIA compute and DMA activities (DMA: a memcpy by name, see device_kind)
}
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation", "operator"})  # "Operator": PyTorch 1.8-1.9
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver", "mtia_runtime",
                                "hip_runtime", "xpu_runtime", "privateuse1_runtime", "privateuse1_driver"})
SYNC_CATEGORIES = frozenset({"cuda_sync"})


def event_kind(category: str) -> str | None:
    """:data:`DEVICE`, :data:`CPU`, :data:`RUNTIME`, :data:`SYNC` or ``None`` for a category in any case."""
    cat = category.lower()
    if cat in DEVICE_CATEGORIES:
        return DEVICE
    if cat in CPU_CATEGORIES:
        return CPU
    if cat in RUNTIME_CATEGORIES:
        return RUNTIME
    if cat in SYNC_CATEGORIES:
        return SYNC
    return None


def device_kind(category: str, name: str) -> str:
    """``kernel``, ``memcpy`` or ``memset`` for a device activity (MTIA DMA activities are memory copies)."""
    kind = DEVICE_CATEGORIES[category.lower()]
    if kind == "kernel" and name.lower().startswith("dma"):
        return "memcpy"
    return kind


def arg_key(key: str) -> str:
    """An arg key folded to one spelling: lower case, spaces and dashes as underscores (``External id`` and
    ``external id`` -> ``external_id``)."""
    return key.strip().lower().replace(" ", "_").replace("-", "_")


#: the range of an id, stream or count in a trace: 64-bit in every writer and in vtrain's tables
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_stream(value: object) -> int | None:
    """A stream (or other) id as an integer: Kineto writes integers, ROCm traces sometimes hex strings (``"0x0"``);
    ``None`` for anything else, and for a number outside 64 bits (no writer's id; it would not fit a table)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        text = value.strip()
        try:
            value = int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return None
    return value if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX else None


def group_ranks(value: object) -> tuple[int, ...] | None:
    """The ranks of a process group as a trace gives them (``distributedInfo.pg_config``'s ``ranks``, a call's
    ``Process Group Ranks`` once parsed): a non-empty list of whole numbers >= 0 (integers, or texts and floats
    holding one), as a sorted tuple; anything else (a text, a number, a list holding an object or a bool) is no
    group."""
    if not isinstance(value, list) or not value:
        return None
    ranks = [_whole_number(r) for r in value]
    return tuple(sorted(ranks)) if all(r is not None for r in ranks) else None  # type: ignore[type-var]


def process_groups(pg_config: object, world_size: int | None) -> list[tuple[dict[str, Any], tuple[int, ...]]]:
    """The process groups of a trace's ``distributedInfo.pg_config``, with their ranks, as ingest and replay both
    read them: its objects whose ``ranks`` are a list of whole numbers (:func:`group_ranks`) that a job of
    ``world_size`` ranks (None where the trace does not say it) can have (:func:`_beyond_the_job`). A group is the
    ranks it lists, whatever its ``pg_size`` says. Anything else in it is no group (:func:`process_groups_problem`
    says what)."""
    if not isinstance(pg_config, list):
        return []
    found = [(pg, group_ranks(pg.get("ranks"))) for pg in pg_config
             if isinstance(pg, dict) and not _beyond_the_job(pg, world_size)]
    return [(pg, ranks) for pg, ranks in found if ranks is not None]


def only_group(rank: int, pg_config: object,
               world_size: int | None = None) -> tuple[str | None, tuple[int, ...]] | None:
    """The name and ranks of the one process group of more than one rank that holds ``rank`` (its collectives
    that name no group are among those ranks), if there is exactly one (:func:`process_groups` of a job of
    ``world_size`` ranks); where several hold it with the same members (a job's default NCCL group and a gloo group
    of every rank for its CPU-side collectives), their ranks, and a name only when they share one. A job of two
    ranks that lists no group: ranks 0 and 1."""
    groups = [(pg, ranks) for pg, ranks in process_groups(pg_config, world_size) if rank in ranks and len(ranks) > 1]
    members = {ranks for _, ranks in groups}
    if not members and world_size == 2 and rank in (0, 1):
        return None, (0, 1)
    if len(members) != 1:
        return None
    names = {str(pg.get("pg_name", "")) for pg, _ in groups}
    return (names.pop() if len(names) == 1 else None), members.pop()


def process_groups_problem(pg_config: object, world_size: int | None) -> str | None:
    """What is wrong with a trace's ``distributedInfo.pg_config`` (None when nothing is, or there is none), on one
    line, as ingest and replay say it: no list at all; entries that are no process group (a number, a text, ranks
    that are not a list of whole numbers) or groups beyond the job (:func:`_beyond_the_job`), which are left out of
    the collectives' groups; groups whose ``pg_size`` is not the number of ranks they list (they are those ranks)."""
    if pg_config is None:
        return None
    if not isinstance(pg_config, list):
        return "distributedInfo.pg_config is no list of process groups: left out"
    groups = process_groups(pg_config, world_size)
    left_out = _left_out_entries(pg_config, len(groups), world_size)
    problems = [f"{'; '.join(left_out)}: left out of the collectives' groups"] if left_out else []
    if sizes := _sizes_unlike_ranks(groups):
        problems.append(sizes)
    return "; ".join(problems) or None


def _left_out_entries(pg_config: list[Any], groups: int, world_size: int | None) -> list[str]:
    """The clauses of :func:`process_groups_problem` for the entries of ``pg_config`` that are none of its
    ``groups`` process groups of a job of ``world_size`` ranks."""
    beyond = [(pg, why) for pg in pg_config if (why := _beyond_the_job(pg, world_size))]
    unread = len(pg_config) - len(beyond) - groups
    clauses = [f"{unread} entries of distributedInfo.pg_config are no process group (an object with a list of "
               f"integer ranks)"] if unread else []
    if beyond:
        groups_hold = "process group holds" if len(beyond) == 1 else "process groups hold"
        clauses.append(f"{len(beyond)} {groups_hold} ranks the job cannot have in distributedInfo.pg_config "
                       f"({_named(beyond)})")
    return clauses


def _sizes_unlike_ranks(groups: list[tuple[dict[str, Any], tuple[int, ...]]]) -> str | None:
    """The clause of :func:`process_groups_problem` for the process groups whose ``pg_size`` (a whole number, read
    as ranks are) is not the number of ranks they list; None where there are none."""
    unlike = [(pg, f"pg_size {shown_count(size)}, {shown_count(len(ranks))} ranks listed") for pg, ranks in groups
              if (size := _whole_number(pg.get("pg_size"))) is not None and size != len(ranks)]
    if not unlike:
        return None
    groups_say = "process group says" if len(unlike) == 1 else "process groups say"
    return (f"{len(unlike)} {groups_say} another pg_size than the ranks listed in distributedInfo.pg_config "
            f"({_named(unlike)}): the ranks listed are the group")


def _named(groups: list[tuple[dict[str, Any], str]]) -> str:
    """Process groups, each with what is said of it, for a warning line: the first three by name, then how many
    more."""
    named = "; ".join(f"pg {shown(pg.get('pg_name'), 20)}: {why}" for pg, why in groups[:3])
    return named + (f"; {len(groups) - 3} more" if len(groups) > 3 else "")


def _beyond_the_job(pg: object, world_size: int | None) -> str | None:
    """Why the ``pg_config`` entry ``pg`` is a process group no job has (None where it is not, or is no group):
    it lists more ranks than the job has, or a rank outside it. The job's ranks are ``world_size`` where the trace
    says it, else the most any job has (``FITTED_COUNTS['group_size']``). The ranks are counted before they are
    read, so that a list of millions is not."""
    ranks = pg.get("ranks") if isinstance(pg, dict) else None
    if not isinstance(ranks, list):
        return None
    most = world_size or FITTED_COUNTS["group_size"][1]
    job = f"in a world of {shown_count(world_size)}" if world_size else f"beyond the {shown_count(most)} of any job"
    if len(ranks) > most:
        return f"{shown_count(len(ranks))} ranks {job}"
    read = group_ranks(ranks)
    return f"rank {shown_count(read[-1])} {job}" if read and read[-1] >= most else None


def _whole_number(value: object) -> int | None:
    """A rank, or a count, as a trace gives it: a whole number >= 0 (an integer, or a text or float holding one);
    None for anything else."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if type(value) is int and 0 <= value <= INT64_MAX else None


#: the FlashAttention operators PyTorch's ``scaled_dot_product_attention`` runs for a causal attention, forward and
#: backward, by device type (on GPUs in fp16 and bf16 only)
FLASH_OPS = {"cpu": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                     "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
             "cuda": ("aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_flash_attention_backward")}
#: the fused attention operators the model places (their cost: :func:`vtrain.model.ops.attention_gemms`)
ATTENTION_OPS = frozenset(name for pair in FLASH_OPS.values() for name in pair)
#: any fused attention operator by its name: PyTorch's (flash, memory-efficient, cuDNN), the flash-attn package's,
#: xFormers' and Transformer Engine's (``fmha``), ``nn.MultiheadAttention``'s
FUSED_ATTENTION = re.compile(r"(scaled_dot_product|flash_attention|efficient_attention|_cudnn_attention|"
                             r"flash_attn|fmha|multi_head_attention)", re.IGNORECASE)
#: PyTorch's attention entry (``aten::scaled_dot_product_attention``: whichever kernel it picks runs inside it) and
#: its math fallback (``aten::_scaled_dot_product_attention_math``: the scores computed by matmul and softmax), which
#: :data:`FUSED_ATTENTION` names but which fuse nothing of their own
UNFUSED_ATTENTION = re.compile(r"^aten::scaled_dot_product_attention$|_attention_math")


def fused_attention_signature(dims: str, types: str) -> tuple[str, str]:
    """A fused attention call's input dims and types (JSON texts) as the model places it: its [b, heads, s, d]
    tensors only (queries, keys, values, the output and its gradient). The other arguments (dropout, causal, scale,
    the dropout's seed and offset, cumulative lengths, the rows' log-sum-exp, which some kernels pad to a multiple
    of their tile) are written differently by each PyTorch version and device (a number, a 0-d or a 2-element
    tensor, nothing, a padded length) and follow from those tensors; texts that are no lists are returned as they
    are."""
    try:
        dim_list, type_list = json.loads(dims), json.loads(types)
    except ValueError:
        return dims, types
    if not isinstance(dim_list, list) or not isinstance(type_list, list):
        return dims, types
    kept = [(d, t) for d, t in zip(dim_list, type_list) if _heads_tensor(d)]
    return json.dumps([d for d, _ in kept]), json.dumps([t for _, t in kept])


def fused_attention_dims(dims: str) -> str:
    """The input dims of :func:`fused_attention_signature` alone (a timeline that kept no types)."""
    try:
        dim_list = json.loads(dims)
    except ValueError:
        return dims
    return json.dumps([d for d in dim_list if _heads_tensor(d)]) if isinstance(dim_list, list) else dims


def _heads_tensor(dims: object) -> bool:
    """Whether an argument's dims are a [b, heads, s, d] tensor's."""
    return isinstance(dims, list) and len(dims) == 4


#: CPU operators of c10d (``c10d::allreduce_``, ``c10d::send``): each issues one collective
C10D_OP_PREFIX = "c10d::"
#: the CPU operator that launches a collective's NCCL kernel and carries its sizes and process group
RECORD_PARAM_COMMS = "record_param_comms"
#: CPU operators that issue a collective
ISSUING_OP_PREFIXES = (C10D_OP_PREFIX, RECORD_PARAM_COMMS)
#: CPU annotations the c10d backends write around a collective (``gloo:all_reduce``, ``nccl:send``, ...)
BACKEND_ANNOTATION_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:")
#: CPU operators that wait for a collective's result: functional collectives' (DTensor, tensor parallelism,
#: compiled code; ``c10d_functional::`` before PyTorch 2.3). On a CPU rank the wait blocks the thread for as long
#: as the collective takes: communication, not an operator's work
COLLECTIVE_WAIT_OPS = ("_c10d_functional::wait_tensor", "c10d_functional::wait_tensor")
#: every CPU event that is communication: the issuing operators, the backends' annotations and the waits for them
COMMUNICATION_OP_PREFIXES = ISSUING_OP_PREFIXES + BACKEND_ANNOTATION_PREFIXES + COLLECTIVE_WAIT_OPS

#: runtime / driver calls that launch a whole captured graph: one call, many device activities sharing its
#: correlation id (CUDA runtime and driver, HIP); version suffixes (``cudaGraphLaunch_v10000``, ``_ptsz``) aside
GRAPH_LAUNCH_NAMES = frozenset({"cudagraphlaunch", "cugraphlaunch", "hipgraphlaunch"})


def is_graph_launch(name: str) -> bool:
    """Whether a runtime or driver call launches a captured graph (``cudaGraphLaunch``, ``cuGraphLaunch``,
    ``hipGraphLaunch``, in any case and with any version suffix such as ``_v10000`` or ``_ptsz``)."""
    return name.lower().split("_", 1)[0] in GRAPH_LAUNCH_NAMES


def is_kernel_launch(name: str) -> bool:
    """Whether a runtime or driver call launches device work: a kernel (``cudaLaunchKernel``, ``cuLaunchKernel``,
    ``hipLaunchKernel``, ``hipExtModuleLaunchKernel``, ``cudaLaunchCooperativeKernel``, with any version suffix)
    or a captured graph (:func:`is_graph_launch`)."""
    lowered = name.lower()
    return ("launch" in lowered and "kernel" in lowered) or is_graph_launch(name)


def unanswered_launches(names: Iterable[str], correlations: Iterable[int | None],
                        device_correlations: Iterable[int | None]) -> tuple[int, int]:
    """Of the runtime calls (``names`` and correlation ids) that launch device work (:func:`is_kernel_launch`),
    how many have no device activity with their correlation id, and how many there are. In a whole trace every
    launch has its activity: the device's events were not recorded, were pruned, or have a category vtrain does
    not read."""
    answered = set(device_correlations)
    launches = [correlation for name, correlation in zip(names, correlations)
                if correlation is not None and is_kernel_launch(name)]
    return sum(1 for correlation in launches if correlation not in answered), len(launches)


def unanswered_launches_warning(path: object, missing: int, launches: int) -> str:
    """The warning line, in ingest, validate and what-if alike, for launches :func:`unanswered_launches` found
    without their device activity."""
    return (f"{path}: {missing} of {launches} kernel launches have no device activity in the file (device events "
            f"not recorded or pruned, or written with a category vtrain does not read): their device time is not "
            f"counted")


#: how long before its launching runtime call began a device activity may start and still be read on one clock
#: (CUPTI converts the device's timestamps to the host's): more is a device clock offset from the host's
EARLY_TOLERANCE_US = 1.0


class EarlyActivities(NamedTuple):
    """Device activities that start before the runtime call that launched them began (:func:`early_activities`)."""

    early: int  # more than EARLY_TOLERANCE_US before
    launched: int  # of the activities whose launch is in the file
    median_us: float  # how early, at the median of the early ones


def early_activities(activity_ts: np.ndarray, launch_ts: np.ndarray) -> EarlyActivities:
    """The device activities (start ``activity_ts``) that start more than :data:`EARLY_TOLERANCE_US` before their
    launching runtime call began (``launch_ts``, NaN where none is in the file)."""
    lead = launch_ts - activity_ts
    launched = lead[np.isfinite(lead)]
    early = launched[launched > EARLY_TOLERANCE_US]
    return EarlyActivities(int(early.size), int(launched.size), float(np.median(early)) if early.size else 0.0)


def early_activities_warning(path: object, found: EarlyActivities) -> str | None:
    """The warning line, in ingest, validate and what-if alike, for device activities :func:`early_activities`
    found starting before their launch; ``None`` when none does."""
    if not found.early:
        return None
    return (f"{path}: {found.early:,} of {found.launched:,} device activities start before the runtime call that "
            f"launched them began ({found.median_us:,.1f} us at the median), which no device can: its clock is "
            f"offset from the host's (ROCm traces can be). Times read across the two (launch to start, a kernel's "
            f"wait) are off by as much")


#: the spellings of the arg that links an event to the CPU op it belongs to, newest first
EXTERNAL_ID_KEYS = ("External id", "external id")
#: the spellings of the arg holding a CPU op's input shapes, newest first (PyTorch 1.8 wrote ``Input dims``)
INPUT_DIMS_KEYS = ("Input Dims", "Input dims")

#: bytes per element of each dtype, by its name in lower case: as the profiler writes it (C++ type names in ``Input
#: type``: ``float``, ``c10::BFloat16``, ``short int``, ``long unsigned int`` ...; ScalarType names in
#: ``record_param_comms``' ``dtype``: ``Float``, ``BFloat16``, ``UInt32`` ...) and as other tools spell it
#: (``float32``, ``uint8`` ...).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "c10::float": 4, "double": 8, "float64": 8,
    "half": 2, "float16": 2, "c10::half": 2, "bfloat16": 2, "c10::bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "long int": 8, "long long int": 8, "short": 2, "int16": 2,
    "short int": 2, "unsigned short": 2, "short unsigned int": 2, "uint16": 2, "unsigned int": 4, "uint32": 4,
    "long unsigned int": 8, "long long unsigned int": 8, "uint64": 8,
    "char": 1, "int8": 1, "byte": 1, "uint8": 1, "unsigned char": 1, "signed char": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "c10::complex<c10::half>": 4, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "complexhalf": 4, "complexfloat": 8, "complexdouble": 16,
}


@lru_cache(maxsize=1024)
def dtype_bytes(dtype: str | None) -> int | None:
    """Bytes per element of a dtype as the profiler (or another tool) spells it, in any case
    (:data:`DTYPE_BYTES`); ``None`` for no dtype or one not known (``Scalar``, ``TensorList``, ``""``)."""
    if not dtype:
        return None
    return DTYPE_BYTES.get(dtype.strip().lower())


@lru_cache(maxsize=65536)
def first_dtype(types_json: str | None, default: str | None = None) -> str | None:
    """The first tensor dtype in an ``Input type`` JSON text (``Scalar``, ``TensorList`` and empty names skipped),
    ``default`` when it has none or is not a JSON list."""
    try:
        types = json.loads(types_json) if types_json else None
    except json.JSONDecodeError:
        return default
    if not isinstance(types, list):
        return default
    return next((t for t in types if isinstance(t, str) and t and t not in ("Scalar", "TensorList")), default)


#: categories of older PyTorch versions (lower case) -> today's name
_CURRENT_NAMES = {"operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy",
                  "memset": "gpu_memset"}


def canonical_category(category: str) -> str:
    """A category as today's PyTorch writes it (``Operator`` -> ``cpu_op``, ``Kernel`` -> ``kernel``,
    ``Memcpy`` -> ``gpu_memcpy``); categories it does not know are lower-cased."""
    cat = category.lower()
    return _CURRENT_NAMES.get(cat, cat)


def accelerator(device_categories: Iterable[str], runtime_names: Iterable[str]) -> str:
    """The accelerator a trace's device activities ran on: ``mtia`` (MTIA categories), ``rocm`` (HIP runtime
    calls: ROCm traces use the CUDA categories) or ``cuda``."""
    if any(category.lower().startswith("mtia") for category in device_categories):
        return "mtia"
    if any(name.lower().startswith("hip") for name in runtime_names):
        return "rocm"
    return "cuda"


def absurd_host_events(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Which host events (CPU ops, runtime calls, annotations; start ``ts``, duration ``dur``, µs) cannot be
    measurements: a time that is not finite, a duration longer than any profile (:data:`~vtrain.limits.MAX_TRACE_US`),
    or a start that far from the median start of the trace's host events (a clock glitch). Device activities are
    judged by :func:`absurd_activities`, against the span of the host events that are not absurd."""
    finite = np.isfinite(ts) & np.isfinite(dur)
    if not finite.any():
        return ~finite
    middle = float(np.median(ts[finite]))
    return ~finite | (dur > MAX_TRACE_US) | (np.abs(ts - middle) > MAX_TRACE_US)


def absurd_host_warning(path: object, count: int) -> str:
    """The warning line, in ingest and validate alike, for ``count`` host events :func:`absurd_host_events` left out."""
    return (f"{path}: left out {count} CPU ops or runtime calls with an absurd time (not finite, longer than any "
            f"profile, or starting that far from the others)")


#: a ``ts`` above this cannot be microseconds since 1970 (it would be the year 5138): nanoseconds since 1970 are
#: about 1.7e18
NANOSECOND_EPOCH_TS = 1e17
#: no training step's kernels last a millisecond at the median (real traces: 2-50 µs); in nanoseconds they would
NANOSECOND_MEDIAN_KERNEL_US = 1000.0


def nanoseconds_warning(path: object, ts: np.ndarray, kernel_dur: np.ndarray) -> str | None:
    """The warning for a trace whose times look like nanoseconds (Kineto writes microseconds, whatever its
    ``displayTimeUnit`` says): a start beyond :data:`NANOSECOND_EPOCH_TS`, or device activities (durations
    ``kernel_dur``) whose median lasts :data:`NANOSECOND_MEDIAN_KERNEL_US` or more. ``None`` when neither holds."""
    finite = ts[np.isfinite(ts)]
    if finite.size and float(finite.max()) > NANOSECOND_EPOCH_TS:
        evidence = f"its times reach {float(finite.max()):.3g}, the year 5000 and beyond in microseconds"
    elif kernel_dur.size and (median := float(np.median(kernel_dur))) >= NANOSECOND_MEDIAN_KERNEL_US:
        evidence = f"its device activities last {median:,.0f} µs at the median (a training step's: 2-50 µs)"
    else:
        return None
    return (f"{path}: {evidence}: were its times written in nanoseconds? Kineto writes microseconds and they are "
            f"read as such: every time and duration of this rank would be 1,000x too long")


def absurd_activities(host_start: float | None, host_end: float | None, ts: np.ndarray,
                      dur: np.ndarray) -> np.ndarray:
    """Which device activities (start ``ts``, duration ``dur``, µs) cannot be measurements, given the span of the
    trace's host events (``None`` when it has none): a time that is not finite; a duration longer than the whole
    trace (host span, stretched to the last device start); or a start where no queue of the trace's own device
    work could put it: a device runs an activity no later than the host's last event plus all the other device
    time of the trace (everything queued before it), and no earlier than the host's first event minus that time
    (launched before profiling began). Without host events only a time that is not finite is absurd."""
    finite = np.isfinite(ts) & np.isfinite(dur)
    if host_start is None or host_end is None or not len(ts):
        return ~finite
    last = max(host_end, float(np.max(ts, where=finite, initial=host_end)))
    long = finite & (dur > last - min(host_start, float(np.min(ts, where=finite, initial=host_start))))
    plausible = finite & ~long
    other = float(dur[plausible].sum()) - np.where(plausible, dur, 0.0)  # the device time queued besides each
    misplaced = finite & ((ts > host_end + other) | (ts < host_start - other))
    return ~finite | long | misplaced


#: AMD's compute units a GPU -> its part, for ROCm drivers that name every Instinct GPU "AMD Radeon Graphics"
_AMD_COMPUTE_UNITS = {104: "MI250", 110: "MI250X", 304: "MI300X"}


def traced_gpu_name(properties: dict[str, Any]) -> str | None:
    """The GPU a trace's ``deviceProperties`` entry names: its ``name`` on one line (a line break or terminal escape
    in it would print as a line of its own), except where a ROCm driver wrote the generic ``AMD Radeon Graphics``
    (HTA's MI250 trace): then the Instinct part its compute units (``numSms``) and memory make, and the generic
    name where they make none."""
    name = properties.get("name")
    name = " ".join("".join(c if c.isprintable() else " " for c in name).split()) if isinstance(name, str) else None
    if not name:
        return None
    if name.lower().replace(" ", "") != "amdradeongraphics":
        return name
    part = _AMD_COMPUTE_UNITS.get(properties.get("numSms"))  # type: ignore[arg-type]
    memory = properties.get("totalGlobalMem")
    if part == "MI300X" and isinstance(memory, (int, float)) and memory > 200 * 2**30:
        part = "MI325X"
    return f"AMD Instinct {part}" if part else name


#: the category of the ``ProfilerStep#N`` spans made from a rank's optimizer steps (:func:`optimizer_iterations`): an
#: annotation as the profiler's own are, told apart from them (a rank of a set whose other ranks have the profiler's
#: keeps none)
OPTIMIZER_ITERATION = "vtrain_optimizer_iteration"
#: the span ``torch.optim`` writes around an optimizer's step (``Optimizer.step#AdamW.step``; apex's, DeepSpeed's and
#: Transformer Engine's fused optimizers are ``torch.optim`` optimizers)
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#.+\.step$")
#: the operators of a backward pass: autograd's engine runs each under a span of this name
BACKWARD_OP_PREFIX = "autograd::engine::evaluate_function"
#: a step run compiled (``torch.compile``: TorchDynamo's region, AOTAutograd's function, Inductor's graph call): its
#: operators are fused kernels that record none of the layers' shapes
COMPILED_REGION = re.compile(r"^Torch-Compiled Region|^CompiledFunction|^## Call CompiledFxGraph")


def compiled_markers(names: Iterable[str | None]) -> list[str]:
    """The ``torch.compile`` regions among operator ``names`` (TorchDynamo's, AOTAutograd's, Inductor's), by kind
    (a kernel launched by no operator has no name: none)."""
    return sorted({found.group(0) for name in names if name and (found := COMPILED_REGION.search(name))})


def optimizer_iterations(steps: Iterable[tuple[float, float, int]], first_ts: float,
                         backward: Iterable[float] = ()) -> list[tuple[int, float, float]]:
    """Iteration spans for a rank whose trace has no ``ProfilerStep#N`` span (a profile taken without ``step()``)
    from its optimizer steps (``(start, end, thread)`` of each :data:`OPTIMIZER_STEP` span): ``(thread, start,
    duration)``, iteration k running from the end of optimizer step k - 1 (the first from ``first_ts``, the rank's
    first host event) to the end of step k. A step nested in another (a wrapper's around its inner optimizer's)
    counts once, and so do steps with no backward operator between them (``backward``: their start times; several
    optimizers stepped one after the other, as a run with AdamW for some parameters and another optimizer for the
    rest does). Fewer than two steps make no iteration (one span would be the whole trace)."""
    passes = sorted(backward)
    outer: list[tuple[float, float, int]] = []
    for start, end, thread in sorted(steps):
        if not (math.isfinite(start) and math.isfinite(end)) or (outer and start < outer[-1][1]):
            continue
        if outer and passes and bisect_right(passes, start) == bisect_right(passes, outer[-1][1]):
            outer[-1] = (outer[-1][0], end, outer[-1][2])  # no backward since the last step: the same iteration's
            continue
        outer.append((start, end, thread))
    if len(outer) < 2:
        return []
    spans, begin = [], min(first_ts, outer[0][0])
    for _, end, thread in outer:
        spans.append((thread, begin, end - begin))
        begin = end
    return spans


def empty_steps_text(steps: int, longest_us: float) -> str:
    """What a rank's ``ProfilerStep#N`` spans that hold none of its events are (spans written without their
    length), for ingest's warning and validate's error."""
    return f"its {steps} ProfilerStep#N spans hold none of its events (the longest lasts {longest_us:g} us)"


def optimizer_iterations_warning(path: object, made: int, others_marked: bool = False) -> str:
    """The warning for a rank whose iterations were made from its optimizer steps (:func:`optimizer_iterations`),
    or, ``others_marked``, were not: other ranks of its set have the profiler's spans, whose numbers its own
    cannot match."""
    if others_marked:
        return (f"{path}: no ProfilerStep#N spans where the other ranks have them: its optimizer's steps are not "
                f"taken for its iterations (their numbers cannot be the profiler's)")
    return (f"{path}: no ProfilerStep#N spans (a profile taken without step()): its {made} iterations are taken to "
            f"end where its optimizer's steps end (Optimizer.step#...), the first from the trace's start")
