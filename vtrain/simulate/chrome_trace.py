"""The predicted timeline as Kineto-compatible Chrome traces, one per simulated rank (tp rank 0, dp rank 0 of
each pipeline stage), that open in Perfetto and load in HTA's ``TraceAnalysis``.

Each trace has one ``ProfilerStep#N`` covering the iteration, the ``vtrain/...`` spans that ``vtrain record``
writes (same names, see :mod:`vtrain.naming`) and, per operator, a ``cpu_op`` event carrying its signature
(``Input Dims``, ``Input type``) and where its latency came from (``vtrain source``, ``vtrain detail``). On GPU
runs every operator also has a ``cudaLaunchKernel`` and its kernels (the measured kernel names when the profile
has them), linked by correlation ids and ``ac2g`` flows; collectives are NCCL kernels on their own streams,
named like real ones so HTA classifies them as communication. CPU runs have no device events: their timeline is
the ``cpu_op`` events.

Times are whole microseconds: HTA rounds fractional timestamps of every event inwards, which would shrink each
of thousands of short kernels; rounding the boundaries once keeps back-to-back kernels back to back.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from vtrain import kineto
from vtrain.graph.build import Task
from vtrain.graph.work import BlockWork, CommWork, PhaseWork
from vtrain.kineto import dtype_bytes
from vtrain.model.ops import PRECISION_DTYPE, Collective, Op
from vtrain.naming import ITERATION_PREFIX, rank_trace_file, span_name
from vtrain.outputs import TRACES, check_output, staged
from vtrain.runconfig import save_run_config
from vtrain.simulate.latency import Resolution
from vtrain.simulate.run import Simulation
from vtrain.simulate.summary import receives_posted
from vtrain.simulate.workload import ResolvedStep

ITERATION = 0
CPU_PID_BASE = 100000
CPU_THREAD, DP_THREAD = 1, 6
COMPUTE_STREAM, TP_STREAM, DP_STREAM = 7, 20, 25
#: (op, phase) of a pipeline transfer -> (CPU thread, GPU stream): transfers of one kind never overlap
PP_LANES = {("send", "forward"): (2, 21), ("send", "backward"): (3, 22), ("recv", "forward"): (4, 23),
            ("recv", "backward"): (5, 24)}
_NCCL_KERNEL = {
    "all_reduce": "ncclDevKernel_AllReduce_Sum_{dtype}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "all_gather": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_{dtype}_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "send": "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
    "recv": "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
}
_NCCL_DTYPE = {"float": "f32", "c10::Half": "f16", "c10::BFloat16": "bf16"}
_NCCL_COLLECTIVE = {"all_reduce": "allreduce", "all_gather": "_allgather_base",
                    "reduce_scatter": "_reduce_scatter_base", "send": "send", "recv": "recv"}


def write_chrome_traces(sim: Simulation, out_dir: str | Path, *, overwrite: bool = False,
                        keep: Callable[[Path, dict[str, Any], list[dict[str, Any]]], None] | None = None) -> list[Path]:
    """Write one trace per simulated rank and the run config (``run.yaml``) into ``out_dir``, atomically.

    ``keep``, if given, also gets each rank's file path, header and events as written (`vtrain validate` reads
    the prediction from them rather than reading the files back)."""
    target = check_output(out_dir, force=overwrite, command="simulate")
    with staged(target, TRACES, "simulate") as staging:
        names = []
        for stage in range(sim.graph.stages):
            rank = sim.stages[stage].rank
            header = {
                "schemaVersion": 1,
                "distributedInfo": {"backend": "nccl" if _on_gpu(sim) else "gloo", "rank": rank,
                                    "world_size": sim.config.parallelism.world_size},
                "deviceProperties": _device_properties(sim),
                "traceName": f"vtrain simulate: rank {rank} (pipeline stage {stage})",
                "displayTimeUnit": "ms",
            }
            kept: list[dict[str, Any]] | None = [] if keep is not None else None
            with gzip.open(staging / rank_trace_file(rank), "wb", compresslevel=1) as handle:
                with _EventWriter(handle, header, kept) as writer:
                    _RankTrace(sim, stage, writer).write()
            names.append(rank_trace_file(rank))
            if keep is not None and kept is not None:
                keep(target / rank_trace_file(rank), header, kept)
        save_run_config(sim.config, staging / "run.yaml")
    return [target / name for name in names]


class _EventWriter:
    """Writes Kineto's layout as events arrive: header keys one per line (``"rank": N`` on its own line is how
    HTA finds a file's rank), then one event per line, in batches so a rank's events are never all in memory."""

    BATCH = 20_000

    def __init__(self, handle: Any, header: dict[str, Any], kept: list[dict[str, Any]] | None = None) -> None:
        self.handle, self.header, self.kept = handle, header, kept
        self.pending: list[dict[str, Any]] = []
        self.first = True
        self.encode = msgspec.json.Encoder().encode

    def __enter__(self) -> _EventWriter:
        self.handle.write(b"{\n")
        for key, value in self.header.items():
            self.handle.write(f"  {json.dumps(key)}: {json.dumps(value)},\n".encode())
        self.handle.write(b'  "traceEvents": [\n')
        return self

    def append(self, event: dict[str, Any]) -> None:
        self.pending.append(event)
        if self.kept is not None:
            self.kept.append(event)
        if len(self.pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        if not self.first:
            self.handle.write(b",\n")
        self.handle.write(b",\n".join(self.encode(event) for event in self.pending))
        self.first = False
        self.pending.clear()

    def __exit__(self, *exc: object) -> None:
        self.flush()
        self.handle.write(b"\n  ]\n}\n")


def _on_gpu(sim: Simulation) -> bool:
    return sim.config.hardware.device.lower() != "cpu"


def _device_properties(sim: Simulation) -> list[dict[str, Any]]:
    if not _on_gpu(sim):
        return []
    memory = sim.device.memory_bytes or 0
    return [{"id": 0, "name": sim.device.name, "totalGlobalMem": memory}]


def _us(t: float) -> int:
    return int(round(t))


class _RankTrace:
    """The events of one simulated rank."""

    def __init__(self, sim: Simulation, stage: int, out: _EventWriter) -> None:
        self.sim, self.stage, self.out = sim, stage, out
        self.gpu = _on_gpu(sim)
        self.interleaved = sim.config.parallelism.virtual_stages > 1
        self.pp = sim.config.parallelism.pp
        self.dtype = PRECISION_DTYPE[sim.config.precision]
        self.next_id = 1
        self.pid = CPU_PID_BASE + sim.stages[stage].rank  # GPU events use pid 0 (device 0), as Kineto

    # ------------------------------------------------------------------ primitives
    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def span(self, name: str, start: float, end: float, tid: int = CPU_THREAD, stream: int | None = None,
             args: dict[str, Any] | None = None) -> None:
        """A ``record_function`` span on the CPU and, on GPUs, its projection on ``stream``."""
        ts, dur = _us(start), _us(end) - _us(start)
        self.out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid, "tid": tid,
                         "ts": ts, "dur": dur, "args": {"External id": self._id(), **(args or {})}})
        if self.gpu and stream is not None:
            self.out.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": stream,
                             "ts": ts, "dur": dur, "args": {"device": 0, "stream": stream}})

    def launch(self, cpu_name: str, cpu_args: dict[str, Any], kernels: list[tuple[str, dict[str, Any]]],
               start: float, end: float, tid: int, stream: int) -> None:
        """A CPU op and (on GPUs) its launch and kernels, all over [start, end]."""
        ts, dur = _us(start), _us(end) - _us(start)
        external = self._id()
        self.out.append({"ph": "X", "cat": "cpu_op", "name": cpu_name, "pid": self.pid, "tid": tid, "ts": ts,
                         "dur": dur, "args": {"External id": external, **cpu_args}})
        if not self.gpu or not kernels:
            return
        share = (end - start) / len(kernels)
        for k, (kernel, kernel_args) in enumerate(kernels):
            correlation = self._id()
            k_start, k_end = start + k * share, start + (k + 1) * share
            self.out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": self.pid,
                             "tid": tid, "ts": ts, "dur": 0,
                             "args": {"External id": external, "correlation": correlation}})
            self.out.append({"ph": "s", "id": correlation, "pid": self.pid, "tid": tid, "ts": ts,
                             "cat": "ac2g", "name": "ac2g"})
            self.out.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream,
                             "ts": _us(k_start), "dur": _us(k_end) - _us(k_start),
                             "args": {"External id": external, "device": 0, "stream": stream,
                                      "correlation": correlation, **kernel_args}})
            self.out.append({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": _us(k_start),
                             "cat": "ac2g", "name": "ac2g", "bp": "e"})

    def collective(self, op: str, nbytes: int, dtype: str, group: int, resolution: object, start: float,
                   end: float, tid: int, stream: int) -> None:
        """A collective as torch records it: a ``nccl:<op>`` (``gloo:<op>`` on CPU runs) annotation and, on
        GPUs, the ``record_param_comms`` op launching the NCCL kernel."""
        elements = nbytes // (dtype_bytes(dtype) or 4)  # the whole buffer: all-gather's output, reduce-scatter's input
        shard = elements // max(group, 1)
        sizes = {"Collective name": _NCCL_COLLECTIVE.get(op, op),
                 "In msg nelems": shard if op == "all_gather" else elements,
                 "Out msg nelems": shard if op == "reduce_scatter" else elements, "Group size": group, "dtype": dtype}
        source = {**_source_args(resolution), "vtrain bytes": nbytes}
        if not self.gpu:
            self.span(f"gloo:{op}", start, end, tid, args={**sizes, **source})
            return
        self.span(f"nccl:{op}", start, end, tid)
        kernel = _NCCL_KERNEL.get(op, _NCCL_KERNEL["all_reduce"]).format(dtype=_NCCL_DTYPE.get(dtype, "f32"))
        self.launch(kineto.RECORD_PARAM_COMMS, {**sizes, **source}, [(kernel, sizes)], start, end, tid, stream)

    # ------------------------------------------------------------------ tasks
    def write(self) -> None:
        """Every event of this rank: iteration, passes with their blocks and ops, transfers, all-reduces."""
        sim = self.sim
        self.out.append({"name": "process_name", "ph": "M", "pid": self.pid, "tid": 0,
                         "args": {"name": f"vtrain simulate rank {self.pid}"}})
        self.span(f"{ITERATION_PREFIX}{ITERATION}", 0.0, sim.iteration_us + 1.0)
        tasks, result = sim.graph.tasks, sim.schedule
        compute = [s for s, st in enumerate(sim.graph.streams) if st.name == "compute" and st.stage == self.stage]
        order = sim.graph.stream_order[compute[0]]
        self._compute(order)
        posted = receives_posted(sim.graph, result)
        for i, task in enumerate(tasks):
            if task.kind == "pp" and self.stage == task.stage:
                self._transfer(task, result.start_us[i], result.end_us[i])
            elif task.kind == "pp" and self.stage == task.peer:
                self._transfer(task, posted.get(i, result.start_us[i]), result.end_us[i])
            elif task.kind == "dp" and task.stage == self.stage:
                self._data_parallel(task, result.start_us[i], result.end_us[i])

    def _fields(self, task: Task, chunk: int | None = None) -> dict[str, Any]:
        return {"stage": self.stage, "chunk": (task.chunk if chunk is None else chunk) if self.interleaved else None,
                "mb": task.mb}

    def _compute(self, order: np.ndarray) -> None:
        """The stage's passes in stream order; a backward pass split per block is one group of tasks."""
        tasks, result = self.sim.graph.tasks, self.sim.schedule
        for _, group in itertools.groupby(order.tolist(), key=lambda i: (tasks[i].kind, tasks[i].chunk, tasks[i].mb)):
            ids = list(group)
            first = tasks[ids[0]]
            start, end = result.start_us[ids[0]], result.end_us[ids[-1]]
            if first.kind == "optimizer":
                self.span(span_name("optimizer", stage=self.stage), start, end, stream=COMPUTE_STREAM)
            else:
                self.span(span_name(first.kind, **self._fields(first)), start, end, stream=COMPUTE_STREAM)
            for i in ids:
                work = tasks[i].work
                blocks = work.blocks if isinstance(work, PhaseWork) else (work,)
                t = result.start_us[i]
                for block in blocks:
                    assert isinstance(block, BlockWork)
                    t = self._block(tasks[i], block, t)

    def _block(self, task: Task, block: BlockWork, t: float) -> float:
        end = t + block.duration_us
        fields = self._fields(task)
        if block.kind in ("layer", "attention"):  # attention: a layer's core, re-run by selective recomputation
            if block.phase == "recompute":
                self.span(span_name("recompute", **fields, layer=block.layer), t, end, stream=COMPUTE_STREAM)
            self.span(span_name("layer", phase=block.phase, **fields, layer=block.layer), t, end,
                      stream=COMPUTE_STREAM)
        elif block.kind in ("embedding", "head"):
            self.span(span_name(block.kind, phase=block.phase, **fields), t, end, stream=COMPUTE_STREAM)
        for resolved in block.steps:
            assert isinstance(resolved, ResolvedStep)
            t += resolved.gap_us  # the measured host gap before the operator (idle on the stream)
            step_end = t + resolved.latency_us
            if isinstance(resolved.step, Collective):
                name = span_name("comm", purpose="tp", op=resolved.step.op, phase=block.phase, **fields,
                                 layer=block.layer)
                self.span(name, t, step_end, stream=TP_STREAM)
                self.collective(resolved.step.op, resolved.step.bytes, resolved.step.dtype,
                                self.sim.config.parallelism.tp, resolved.resolution, t, step_end, CPU_THREAD,
                                TP_STREAM)
            else:
                self._op(resolved.step, resolved.resolution, t, step_end)
            t = step_end
        return end

    def _op(self, op: Op, resolution: Resolution, start: float, end: float) -> None:
        args = {"Input Dims": msgspec.json.decode(op.input_dims), "Input type": msgspec.json.decode(op.input_types),
                **_source_args(resolution)}
        names = list(resolution.kernels) or [f"{op.name} ({resolution.source})"]
        kernel_args = {"vtrain source": resolution.source}
        self.launch(op.name, args, [(name, kernel_args) for name in names], start, end, CPU_THREAD,
                    COMPUTE_STREAM)

    def _transfer(self, task: Task, start: float, end: float) -> None:
        comm = task.work
        assert isinstance(comm, CommWork)
        virtual = task.chunk * self.pp + task.stage
        if task.stage == self.stage:
            op, peer, chunk = "send", task.peer, task.chunk
        else:
            receiver = virtual + 1 if task.phase == "forward" else virtual - 1
            op, peer, chunk = "recv", task.stage, receiver // self.pp
        tid, stream = PP_LANES[(op, task.phase)]
        fields = self._fields(task, chunk)
        self.span(span_name("comm", purpose="pp", op=op, phase=task.phase, **fields, peer=peer), start, end,
                  tid=tid, stream=stream)
        self.collective(op, comm.bytes, self.dtype, 2, comm.resolution, start, end, tid, stream)

    def _data_parallel(self, task: Task, start: float, end: float) -> None:
        comm = task.work
        assert isinstance(comm, CommWork)
        name = span_name("comm", purpose="dp", op=comm.op, stage=self.stage,
                         chunk=task.chunk if self.interleaved else None, bucket=task.bucket)
        self.span(name, start, end, tid=DP_THREAD, stream=DP_STREAM)
        self.collective(comm.op, comm.bytes, self.dtype, comm.group_size, comm.resolution, start, end,
                        DP_THREAD, DP_STREAM)


def _source_args(resolution: object) -> dict[str, Any]:
    if not isinstance(resolution, Resolution):
        return {}
    return {"vtrain source": resolution.source, "vtrain detail": resolution.detail,
            "vtrain latency us": resolution.latency_us}
