"""`vtrain record`: train a GPT with real 3D parallelism under the torch profiler, one Kineto trace per rank.

Modules, in the order a rank uses them:

* :mod:`~vtrain.record.launcher` — checks the request, starts the ranks, publishes the trace folder atomically;
* :mod:`~vtrain.record.worker` — one rank: process groups, model, schedule, optimizer, profiled iterations;
* :mod:`~vtrain.record.process_groups` — torch.distributed process groups on :mod:`vtrain.parallel`'s rank layout;
* :mod:`~vtrain.record.model` — the GPT decoder (Megatron layout) split by tp and pp;
* :mod:`~vtrain.record.tensor_parallel` — Megatron's TP communication and vocabulary-parallel pieces;
* :mod:`~vtrain.record.recompute` — full activation recomputation, one checkpoint per layer;
* :mod:`~vtrain.parallel` (the schedules) / :mod:`~vtrain.record.pipeline` — GPipe, 1F1B, interleaved 1F1B and
  their executor with point-to-point transfers;
* :mod:`~vtrain.record.dataparallel` — bucketed gradient all-reduce, after or overlapped with backward;
* :mod:`~vtrain.record.data` — synthetic token batches, identical for every split of a run;
* :mod:`~vtrain.record.spans` / :mod:`~vtrain.record.profiling` — span names and the profiler setup.

The span naming scheme the traces follow is documented in ``vtrain/record/README.md``.
"""
