"""Physical bounds on the numbers that describe a training run: one home for every limit that input is checked
against (run configs, suites, CLI values).

The bounds are generous for real jobs and tight enough that a typo or a hostile file cannot make a command run
for hours or exhaust memory (``layers: 1000000`` made `vtrain simulate` grow past 1.7 GB):

- the deepest transformers trained are about 1,000 layers deep (DeepNet, 2022); GPT-3 has 96, Megatron's 1T model
  128; the simulator's time and memory grow with layers (1,000 layers: 11 s, 430 MB on a 2-core machine);
- the largest hidden sizes are about 25,600 (Megatron 1T), vocabularies about 256 k, contexts about 1 M tokens;
- the largest clusters hold about 10^5 GPUs; tensor parallelism spans one NVLink domain (8, up to 72 on
  NVL72 racks), pipelines a few dozen stages;
- a replica runs at most a few thousand micro-batches per iteration (Megatron's 1T run: 512).
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

#: field -> (smallest, largest) allowed value, inclusive
INTEGER_BOUNDS: dict[str, tuple[int, int]] = {
    "layers": (1, 1024),
    "hidden": (1, 1 << 18),
    "heads": (1, 1024),
    "kv_heads": (1, 1024),
    "ffn_hidden": (1, 1 << 20),
    "seq": (1, 1 << 21),
    "vocab": (1, 1 << 22),
    "tp": (1, 1024),
    "pp": (1, 1024),
    "dp": (1, 1 << 20),
    "micro_batch": (1, 1 << 16),
    "global_batch": (1, 1 << 24),
    "virtual_stages": (1, 1024),
    "device_count": (1, 1 << 20),
    "gpus_per_node": (1, 1024),
    "cores": (1, 1 << 16),
}

#: field -> (exclusive lower bound, inclusive upper bound) of positive real values
REAL_BOUNDS: dict[str, tuple[float, float]] = {
    "dp_bucket_mb": (0.0, 1e6),           # MB; PyTorch's default bucket is 25
    "intra_node_gbps": (1e-3, 1e5),       # GB/s; NVLink 5 is 900 per direction; 1 MB/s, no real link is slower
    "inter_node_gbps": (1e-3, 1e6),       # Gbit/s per node; 8 x 400 Gbit/s NICs is 3200; 1e-300 overflowed the schedule
}

#: ranks a traced job may have (a trace's rank, its file name's, its world size): as many as a run's GPUs
MAX_RANKS = INTEGER_BOUNDS["device_count"][1]

#: micro-batches per replica and iteration (global_batch / (dp * micro_batch))
MAX_MICRO_BATCHES = 4096

#: largest micro-batch a plan search tries (`vtrain plan`, `cluster`, `size` ``--max-micro-batch``): every size up to
#: it is a grid point, so 10^8 enumerated for hours; real runs use 1 to 16
MAX_MICRO_BATCH_TRIED = 64

#: most tokens a plan is priced for: the largest runs train on about 1.5e13 (Llama 3, 15 T); infinity made every
#: plan's cost infinite and the cost chart fail
MAX_TOKENS = 1e16

#: highest price per GPU-hour (USD): cloud GPUs cost a few dollars an hour
MAX_PRICE_PER_GPU_HOUR = 1e4

#: most GiB per GPU a plan may be given (`--device-memory`): GPUs hold up to a few hundred; infinity let every plan
#: fit
MAX_DEVICE_MEMORY_GIB = 1e5

#: largest config file (run config, suite) read, in bytes: real ones are under 2 KB
MAX_CONFIG_BYTES = 1 << 20

#: deepest nesting of a config file's mappings and lists: real ones nest 3 deep
MAX_CONFIG_DEPTH = 32

#: most trace sets in one validation suite (each is a whole validation)
MAX_SUITE_SETS = 1000

#: largest profile ``metadata.json`` read, in bytes: a fitted profile's is about 11 KB
MAX_METADATA_BYTES = 64 << 20
#: most warning lines a profile's metadata keeps from its ingest (`vtrain tables` says them again): one per rank
#: of a job of thousands would make the metadata large and the terminal useless
MAX_KEPT_WARNINGS = 200


def shown(value: Any, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters, for messages about values that may be huge."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def integer_problem(name: str, value: Any, bounds: dict[str, tuple[int, int]] = INTEGER_BOUNDS) -> str | None:
    """What is wrong with ``value`` as the integer field ``name`` of ``bounds`` (None when it is fine)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{name} must be a whole number (got {shown(value)})"
    low, high = bounds[name]
    if not low <= value <= high:
        return f"{name} must be between {low} and {high:,} (got {shown_count(value)})"
    return None


def string_problem(name: str, value: Any) -> str:
    """The sentence for a field that must be a string and is not; a YAML 1.1 boolean (an unquoted ``no``, ``off``,
    ``yes``, ``on``) is named as the word YAML read it from."""
    problem = f"{name} must be a string (got {shown(value)})"
    if isinstance(value, bool):
        problem += ": YAML reads an unquoted yes, no, on or off as true or false; quote the word"
    return problem


def shown_count(value: int) -> str:
    """A whole number with thousands separators, or in scientific notation beyond 15 digits (a config's 1e300
    would print 301 of them)."""
    return f"{value:,}" if abs(value) < 10**15 else f"{Decimal(value):.3e}"  # a float overflows past 1.8e308


def real_problem(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` as the positive real field ``name`` (None when it is fine)."""
    if not _is_number(value):
        return f"{name} must be a number (got {shown(value)})"
    low, high = REAL_BOUNDS[name]
    if not _within(value, low, high):
        return f"{name} must be a finite number above {low:g} and at most {high:g} (got {shown(value)})"
    return None


#: a fitted device model's numbers (``metadata.json`` ``fitted``): name -> (exclusive lower, inclusive upper)
#: bound. Rates are per device: 10^18 FLOP/s is a thousand times an H100's dense FP16 peak, 10^14 B/s thirty times
#: its memory bandwidth; fixed and host times above a second per operator are not a GPU's.
FITTED_BOUNDS: dict[str, tuple[float, float]] = {
    "flops_per_s": (0.0, 1e18),
    "bytes_per_s": (0.0, 1e14),
    "fixed_us": (-1e-9, 1e6),
    "alpha_us": (-1e-9, 1e6),
    "bus_gbps": (1e-3, 1e5),  # 1 MB/s: no real link is slower; 1e-300 overflowed the schedule
    "op_us": (-1e-9, 1e6),
    "collective_us": (-1e-9, 1e6),
    "sync_us_per_rank": (-1e-9, 1e6),
    "jitter_us": (-1e-9, 1e6),
    "non_gemm_scale": (0.0, 100.0),
}

#: a fitted collective curve's group (``metadata.json`` ``fitted.collectives``): name -> (smallest, largest) count
FITTED_COUNTS: dict[str, tuple[int, int]] = {"group_size": (1, INTEGER_BOUNDS["device_count"][1]),
                                             "nodes": (1, INTEGER_BOUNDS["device_count"][1])}


def fitted_problem(name: str, value: Any) -> str | None:
    """What is wrong with ``value`` as the fitted parameter ``name`` (None when it is fine or not bounded)."""
    if name in FITTED_COUNTS:
        return integer_problem(name, value, FITTED_COUNTS)
    if name not in FITTED_BOUNDS or value is None and name == "flops_per_s":  # memory-bound: no FLOP rate
        return None
    if not _is_number(value):
        return f"{name} must be a number (got {shown(value)})"
    low, high = FITTED_BOUNDS[name]
    if not _within(value, low, high):
        return f"{name} = {shown(value)} is outside ({max(low, 0):g}, {high:g}]"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _within(value: float, low: float, high: float) -> bool:
    """``value`` is finite, above ``low`` and at most ``high``."""
    return math.isfinite(value) and low < value <= high

#: most a gzip trace may expand (bytes out per byte in), checked once :data:`GZIP_RATIO_FROM_BYTES` are out: Kineto
#: traces expand 14-17 times (the shipped ones), pretty-printed JSON about 30; deflate cannot pass about 1,032 (long
#: runs of one byte), which is what a file made to fill memory or disk (a "gzip bomb") does
MAX_GZIP_RATIO = 200
GZIP_RATIO_FROM_BYTES = 64 << 20

#: most text a measurement table or training log may hold (decompressed): a Megatron log of a long run at one line
#: an iteration is tens of MB; a gzip of blank lines that expands 1000x to 200 MiB took 3.7 GB and 3.5 minutes to
#: read (an audit), and a 1 GiB core dump beside the tables was read whole to be told apart from them
MAX_TABLE_TEXT_BYTES = 256 << 20

#: longest span a profiled trace can cover, in µs: profiles cover seconds to minutes (a few iterations); a week is
#: no profile, so a host event longer than this, or starting this far from the others, is a corrupt time
MAX_TRACE_US = 7 * 24 * 3600 * 1e6

#: largest factor a what-if may scale a duration by: a device or library change makes an operator a few times,
#: at most hundreds of times, faster or slower; 1e308 overflowed the replay's times to infinity
MAX_SCALE_FACTOR = 1e6

#: latest arrival and longest deadline of a cluster's job, in hours (`vtrain cluster`, ``arrival_h`` and
#: ``deadline_h``): ten years. A study's jobs arrive over days to months; 1732665600 is a Unix timestamp in seconds,
#: not hours, and at such a clock a short job's end was lost in the float rounding of the time (the simulation
#: never finished). Ten years of hours keep the clock's rounding about 10^-11 h.
MAX_JOB_HOURS = 10 * 365.25 * 24

#: most rows a printed table shows (`vtrain tables --top`): a profile holds thousands of signatures; 10^20
#: overflowed the table's row count to a traceback
MAX_TABLE_ROWS = 1_000_000

#: most profiled iterations of a recording (`vtrain record --steps`): profilers record a few (HTA's traces 1 to 10);
#: every rank's trace grows with each, and 10^8 ran without end
MAX_RECORD_STEPS = 100

#: most warm-up iterations of a recording (`vtrain record --warmup`): one or two settle the allocator and the
#: kernels' autotuning; 10^8 ran without end
MAX_RECORD_WARMUP = 100

#: most intra-op threads a recording's rank may run (`vtrain record --threads`): the largest hosts have a few
#: hundred cores; 100,000 threads exhausted the process limit ("Resource temporarily unavailable")
MAX_RECORD_THREADS = 1024

#: the largest message a collective can move, in bytes (and so in elements): 2^48 B = 256 TiB, a thousand times the
#: memory of the largest GPU. A larger size is no measurement, and 2^62 elements overflowed the 64-bit byte count.
MAX_MESSAGE_BYTES = 1 << 48

#: the shortest measured iteration a table of measurements may hold, in ms: 1 µs (a kernel launch takes longer; a
#: time of 1e-300 ms gave a MAPE of 3e304 %)
MIN_ITERATION_MS = 1e-3
#: the longest: a day (published runs take about a minute an iteration; 1e300 s, or a throughput of 1e-300, was
#: scored at -100 % and pulled the MAPE towards 100 %)
MAX_ITERATION_MS = 24 * 3600 * 1e3
