"""The model-driven prediction: ``vtrain simulate`` of the described run, from latency tables that did not see
the iterations under test.

Unless ``--profile`` is given, the profile is built from the same traces, from every other steady iteration
only; the iterations in between are what the prediction is compared with. Interleaving (rather than first half
against second half) keeps a slow drift of the machine's speed over the recording, which no profile can
follow, out of the comparison: both sides sample the same stretch of time. The simulation runs before anything
is written; its predicted timeline is then written as Chrome traces (one per pipeline stage, in the report), and
the same events, kept in memory as they are written, are read by the replay's rules like measured traces, so both
sides are measured with the same rulers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from vtrain.errors import InputError
from vtrain.replay.trace import RankTrace, rank_trace_of_events
from vtrain.runconfig import RunConfig
from vtrain.tables.latency import cpu_op_calls, gpu_op_calls, nccl_latency, op_latency
from vtrain.tables.store import Profile, empty_table, load_profile
from vtrain.validate.terms import simulated_terms

_CALL_COLUMNS = ["op", "input_dims", "input_types", "device_type", "kernels", "n_kernels", "dur"]


@dataclass
class Split:
    """Which steady iterations build the profile and which are under test."""

    profile: list[int]
    test: list[int]
    held_out: bool

    def describe(self) -> str:
        if not self.held_out:
            return (f"profile and test share iterations {self.test} (too few steady iterations to hold any out)")
        return f"profile from iterations {self.profile}, tested on iterations {self.test}"


def split_iterations(steady: list[int]) -> Split:
    """Every other steady iteration for the profile (the 2nd, 4th, ...), the ones in between under test (at
    least one each when there are two or more; the first is always tested)."""
    if len(steady) < 2:
        return Split(profile=list(steady), test=list(steady), held_out=False)
    return Split(profile=steady[1::2], test=steady[0::2], held_out=True)


def held_out_profile(profile: Profile, iterations: list[int]) -> Profile:
    """The latency tables of ``profile`` rebuilt from the given iterations only (as `vtrain ingest` builds them)."""
    keep = pl.col("iteration").is_in(iterations)
    kernels = profile["kernels"].filter(keep)
    cpu_ops = profile["cpu_ops"].filter(keep)
    collectives = profile["collectives"].filter(keep)
    graph_launches = profile.tables.get("graph_launches", empty_table("graph_launches")).filter(keep)
    gpu_ranks = kernels["rank"].unique().to_list()
    cpu_only = cpu_ops.filter(~pl.col("rank").is_in(gpu_ranks))
    calls = pl.concat([gpu_op_calls(kernels).select(_CALL_COLUMNS), cpu_op_calls(cpu_only).select(_CALL_COLUMNS)])
    metadata = {**profile.metadata, "iterations": sorted(iterations),
                "parent": f"{profile.metadata.get('source_dir')} (iterations {sorted(iterations)})"}
    return Profile(tables={"kernels": kernels, "cpu_ops": cpu_ops, "collectives": collectives,
                           "graph_launches": graph_launches, "op_latency": op_latency(calls),
                           "nccl_latency": nccl_latency(profile["collectives"], profile["cpu_ops"], iterations)},
                   metadata=metadata, path=profile.path)


@dataclass
class ModelPrediction:
    """What the simulator predicted and from which latencies; ``simulation`` is kept until its traces are
    written (:func:`write_prediction`)."""

    iteration_ms: float
    breakdown_ms: dict[str, float]
    coverage: dict[str, float]
    profile_source: str
    terms: dict[str, Any]  # the measured terms beside latencies (:func:`vtrain.validate.terms.simulated_terms`)
    simulation: Any  # vtrain.simulate.run.Simulation (imported only when a run is described)


def predict(config: RunConfig, profile: Profile, profile_source: str, config_source: str | Path) -> ModelPrediction:
    """Simulate ``config`` from ``profile`` (in memory: nothing is written)."""
    from vtrain.simulate import (
        simulate,  # imports the model (and torch): only when a run is described
    )

    simulation = simulate(config, profile, source=str(config_source))
    summary = simulation.to_dict()
    return ModelPrediction(iteration_ms=summary["iteration_time_ms"], breakdown_ms=summary["breakdown_ms"],
                           coverage=summary["coverage"], profile_source=profile_source,
                           terms=simulated_terms(simulation), simulation=simulation)


def write_prediction(prediction: ModelPrediction, out_dir: Path) -> list[RankTrace]:
    """The predicted timeline as Chrome traces in ``out_dir`` (one per simulated rank, as `vtrain simulate`
    writes them), and the same events as the replay reads them, taken in memory as they are written."""
    from vtrain.simulate.chrome_trace import write_chrome_traces

    traces: list[RankTrace] = []
    write_chrome_traces(prediction.simulation, out_dir, overwrite=True,
                        keep=lambda path, header, events: traces.append(rank_trace_of_events(path, header, events)))
    return sorted(traces, key=lambda trace: trace.rank)


def load_given_profile(path: Path) -> Profile:
    """``--profile``: a profile folder from `vtrain ingest`, `vtrain fit` or `vtrain calibrate`: one with operator
    latencies or kernel measurements (a fitted profile may hold only the latter, as `vtrain simulate` reads it)."""
    profile = load_profile(path)
    if profile["op_latency"].is_empty() and profile["op_benchmarks"].is_empty():
        raise InputError("the profile has no operator latencies and no kernel measurements", path)
    return profile
