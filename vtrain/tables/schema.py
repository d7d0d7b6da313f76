"""Schemas of the tables in a profile folder (one Parquet file each). Times are microseconds, bytes are bytes.

``kernels``       one row per device activity (GPU kernel, memcpy, memset)
``cpu_ops``       one row per CPU operator or user annotation (record_function span)
``collectives``   one row per collective call (from the NCCL kernel, or the CPU op for gloo/CPU runs)
``op_latency``    one row per operator signature (op + input dims + dtypes + device type)
``nccl_latency``  one row per collective x group size x message bytes (x nodes, when known)
``graph_launches`` one row per graph launch call (``cudaGraphLaunch``, ``cuGraphLaunch``, ``hipGraphLaunch``): the
                  op that launched it and the device activities it released (they are rows of ``kernels``)
``op_benchmarks`` one row per device operation measured outside a trace (imported GEMM / elementwise / attention
                  benchmarks such as LLMCompass or vidur tables), keyed by its shape rather than an aten signature

Input dims and dtypes are kept as their JSON text (``"[[8, 64], [64, 192]]"``), which is also the signature key.
``device_type`` is ``"cuda"`` when the latency comes from device kernels and ``"cpu"`` when the trace has no
device activity (CPU runs), where an operator's latency is its own CPU duration.
"""

from __future__ import annotations

import polars as pl

KERNELS = {
    "rank": pl.Int32, "device": pl.Int32, "stream": pl.Int64, "name": pl.String,
    "kind": pl.String,  # kernel | memcpy | memset
    "memory_kind": pl.String,  # e.g. "DtoD (Device -> Device)" for memcpy, "Device" for memset, else null
    "kernel_class": pl.String,  # HTA's classification (vtrain.ingest.classify): one of KERNEL_CLASSES
    "ts": pl.Float64, "dur": pl.Float64, "correlation": pl.Int64, "external_id": pl.Int64,
    "cpu_op": pl.String, "input_dims": pl.String, "input_types": pl.String,
    "iteration": pl.Int64,
}

#: ``kernels.kernel_class``: what a device activity does, by its name (HTA's rule: :mod:`vtrain.ingest.classify`)
COMPUTATION, COMMUNICATION, MEMORY, OTHER = "computation", "communication", "memory", "other"
KERNEL_CLASSES = (COMPUTATION, COMMUNICATION, MEMORY, OTHER)

CPU_OPS = {
    "rank": pl.Int32, "tid": pl.Int64, "cat": pl.String, "name": pl.String,
    "ts": pl.Float64, "dur": pl.Float64, "external_id": pl.Int64,
    "input_dims": pl.String, "input_types": pl.String, "iteration": pl.Int64,
}

COLLECTIVES = {
    "rank": pl.Int32,
    "collective": pl.String,  # all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | send | recv | send_recv | barrier
    "process_group": pl.String, "group_ranks": pl.String, "group_size": pl.Int32,
    "dtype": pl.String, "elements": pl.Int64, "bytes": pl.Int64,
    "algorithm": pl.String, "protocol": pl.String,  # from the NCCL kernel name (RING/TREE, LL/LL128/SIMPLE)
    "device_type": pl.String, "stream": pl.Int64, "ts": pl.Float64, "dur": pl.Float64,
    "metadata_source": pl.String,  # kernel_args | record_param_comms | annotation
    "iteration": pl.Int64,
}

GRAPH_LAUNCHES = {
    "rank": pl.Int32, "tid": pl.Int64, "name": pl.String,  # the runtime call, e.g. cudaGraphLaunch
    "ts": pl.Float64, "dur": pl.Float64,  # of the call itself, on the host
    "correlation": pl.Int64,  # the id the call's kernels all carry
    "external_id": pl.Int64, "cpu_op": pl.String,  # the op that launched the graph (as on its kernels)
    "kernels": pl.Int64,  # device activities released (0 where the trace holds none of them)
    "kernel_start": pl.Float64, "kernel_end": pl.Float64,  # first start, last end of those activities
    "kernel_us": pl.Float64,  # their summed duration
    "iteration": pl.Int64,  # of the launch call
}

OP_LATENCY = {
    "op": pl.String, "input_dims": pl.String, "input_types": pl.String, "device_type": pl.String,
    "kernels": pl.String,  # the kernel names launched by one call, in order, joined by " ; "
    "n_kernels": pl.Int32, "count": pl.Int64,
    "median_us": pl.Float64, "p10_us": pl.Float64, "p90_us": pl.Float64, "mean_us": pl.Float64,
}

NCCL_LATENCY = {
    "collective": pl.String, "group_size": pl.Int32, "bytes": pl.Int64, "device_type": pl.String,
    "count": pl.Int64, "median_us": pl.Float64, "p10_us": pl.Float64, "p90_us": pl.Float64,
    "algorithm": pl.String,
    "algbw_gbps": pl.Float64,  # bytes / time, GB/s (1e9), as nccl-tests
    "busbw_gbps": pl.Float64,  # algbw x nccl-tests' bus factor (vtrain.collective_cost.bus_bandwidth_factor)
    "nodes": pl.Int32,  # nodes the group spans (1 = intra-node); null when the source does not say
    "source": pl.String,  # where the row was measured: "trace", "nccl-tests", "vidur", ...
    "mean_us": pl.Float64,  # mean time (the expectation of a sum of calls; traces: of a typical iteration, the
    #                         median over iterations of each one's mean); null when the source gives none
    "wait_us": pl.Float64,  # traces: mean time a member waited for the last one to arrive (matched calls), as mean_us
    "group_size_source": pl.String,  # traces: metadata | point-to-point | matched across ranks
    "duration_source": pl.String,  # traces: "transfer: end - last arrival" | "raw: waits included"
}

OP_BENCHMARKS = {
    "source": pl.String,  # e.g. "llmcompass", "vidur", "trace"
    "op_class": pl.String,  # gemm | attention | softmax | layernorm | gelu | elementwise | embedding | other
    "label": pl.String,  # the source's own name for the op, e.g. "mlp_up_proj" or "QKV GEMM"
    "batch": pl.Int64, "m": pl.Int64, "k": pl.Int64, "n": pl.Int64,  # GEMM: batch x (m x k) @ (k x n)
    "elements": pl.Int64,  # elements of the op's main tensor (memory-bound ops)
    "flops": pl.Float64, "bytes": pl.Float64,  # work of one call
    "dtype": pl.String,  # trace dtype string, e.g. "c10::Half"
    "device": pl.String,  # e.g. "A100-80GB"
    "tp": pl.Int32,  # tensor-parallel degree the shape was sharded for, when the source says
    "count": pl.Int64, "median_us": pl.Float64, "p10_us": pl.Float64, "p90_us": pl.Float64,
}

TABLES = {
    "kernels": KERNELS, "cpu_ops": CPU_OPS, "collectives": COLLECTIVES, "graph_launches": GRAPH_LAUNCHES,
    "op_latency": OP_LATENCY, "nccl_latency": NCCL_LATENCY, "op_benchmarks": OP_BENCHMARKS,
}

#: the ``source`` of the latency rows a trace measured (every other source is a benchmark run outside traces)
TRACE_SOURCE = "trace"
#: tables a profile may lack (written by older vtrain versions); they load as empty tables
OPTIONAL_TABLES = ("op_benchmarks", "graph_launches")

