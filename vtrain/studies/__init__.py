"""The vTrain paper's case studies as commands: cost-optimal parallelisation (an example of `vtrain plan`,
``examples/``), multi-tenant cluster scheduling (:mod:`vtrain.studies.cluster`, `vtrain cluster`) and
compute-optimal model sizing (:mod:`vtrain.studies.sizing`, `vtrain size`).

The studies take a job's speed on a number of GPUs as an injected function (:data:`Throughput`);
:mod:`vtrain.studies.predict` is the one place that gets it from `vtrain plan`'s best plan.
"""
