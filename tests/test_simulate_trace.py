"""The predicted timeline as Chrome traces: HTA loads them, its busy time matches the simulator's, spans follow
the naming scheme and every operator says where its latency came from."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest

from vtrain.errors import InputError
from vtrain.naming import parse_span_name
from vtrain.runconfig import RunConfig, load_run_config, run_config_from_dict
from vtrain.simulate import simulate
from vtrain.simulate.chrome_trace import write_chrome_traces
from vtrain.simulate.latency import SOURCES


def gpu_config(**parallelism: object) -> RunConfig:
    par = {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 16, "recompute": "full",
           "dp_overlap": True, "dp_bucket_mb": 8.0, **parallelism}
    gpus = int(par["tp"]) * int(par["pp"]) * int(par["dp"])  # type: ignore[call-overload]
    return run_config_from_dict({
        "model": {"layers": 8, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 32000},
        "parallelism": par, "precision": "bf16",
        "hardware": {"device": "H100", "device_count": gpus, "gpus_per_node": 4},
    })


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def interleaved_traces(tmp_path_factory: pytest.TempPathFactory):
    cfg = gpu_config(schedule="interleaved", virtual_stages=2, global_batch=32)
    sim = simulate(cfg)
    out = tmp_path_factory.mktemp("pred") / "traces"
    return sim, out, write_chrome_traces(sim, out)


def test_one_trace_per_stage_and_the_run_config(interleaved_traces) -> None:
    sim, out, files = interleaved_traces
    assert [f.name for f in files] == ["rank-0.json.gz", "rank-4.json.gz"]  # tp rank 0, dp rank 0 of each stage
    assert load_run_config(out / "run.yaml") == sim.config
    doc = load(files[1])
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 4, "world_size": 8}
    steps = [e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 1 and steps[0]["dur"] >= round(sim.iteration_us)


def test_hta_busy_time_matches_the_simulated_busy_time(interleaved_traces) -> None:
    from vtrain.validate.hta import hta_analysis

    sim, out, _ = interleaved_traces
    logging.disable(logging.WARNING)
    try:
        breakdown = hta_analysis(out).get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert sorted(breakdown["rank"]) == [0, 4]
    for stage in sim.stages:
        row = breakdown[breakdown["rank"] == stage.rank].iloc[0]
        hta_busy = row["compute_time(us)"] + row["non_compute_time(us)"]
        assert hta_busy == pytest.approx(stage.busy_us, rel=0.01)
        assert row["non_compute_time(us)"] >= 0


def test_spans_follow_the_naming_scheme(interleaved_traces) -> None:
    sim, _, files = interleaved_traces
    events = load(files[0])["traceEvents"]
    spans = [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("vtrain/")]
    parsed = [parse_span_name(name) for name in spans]
    assert all(p is not None for p in parsed)
    kinds = {kind for kind, _ in parsed}  # type: ignore[misc]
    # stage 0 holds virtual stages 0 (with the embedding) and 2; the head is on virtual stage 3 (stage 1)
    assert kinds == {"forward", "backward", "recompute", "embedding", "layer", "comm", "optimizer"}
    m, v = sim.config.parallelism.micro_batches, 2
    assert spans.count("vtrain/forward stage=0 chunk=1 mb=3") == 1
    assert sum(1 for n in spans if n.startswith("vtrain/forward ")) == m * v
    layers = [f for k, f in parsed if k == "layer" and f["phase"] == "forward"]  # type: ignore[misc]
    assert sorted({int(f["layer"]) for f in layers}) == [0, 1, 4, 5]  # chunk 0: layers 0-1, chunk 1: 4-5
    comms = {(f["purpose"], f["op"]) for k, f in parsed if k == "comm"}  # type: ignore[misc]
    assert comms == {("tp", "all_reduce"), ("pp", "send"), ("pp", "recv"), ("dp", "all_reduce")}


def test_every_op_carries_its_signature_and_latency_source(interleaved_traces) -> None:
    _, _, files = interleaved_traces
    events = load(files[1])["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("aten::")]
    assert ops
    for event in ops:
        assert isinstance(event["args"]["Input Dims"], list)
        assert isinstance(event["args"]["Input type"], list)
        assert event["args"]["vtrain source"] in SOURCES
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if e["name"].startswith("ncclDevKernel_")]
    assert nccl and all(e["args"]["Collective name"] in ("allreduce", "send", "recv") for e in nccl)
    correlations = {e["args"]["correlation"] for e in events if e.get("cat") == "cuda_runtime"}
    assert {e["args"]["correlation"] for e in kernels} <= correlations


def test_cpu_runs_have_no_device_events(tmp_path: Path) -> None:
    cfg = run_config_from_dict({"model": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 512},
                                "parallelism": {"tp": 2, "micro_batch": 2, "global_batch": 4},
                                "hardware": {"device": "cpu", "device_count": 2}})
    files = write_chrome_traces(simulate(cfg), tmp_path / "cpu")
    events = load(files[0])["traceEvents"]
    assert not [e for e in events if e.get("cat") in ("kernel", "cuda_runtime", "gpu_user_annotation")]
    reduces = [e for e in events if e.get("name") == "gloo:all_reduce"]
    assert reduces and all(e["args"]["Group size"] == 2 and e["args"]["vtrain source"] == "modelled"
                           for e in reduces)
    assert load(files[0])["distributedInfo"]["backend"] == "gloo"


def test_output_folder_is_not_overwritten_by_accident(tmp_path: Path) -> None:
    cfg = gpu_config(pp=1, dp=1, global_batch=4, dp_overlap=False)
    sim = simulate(cfg)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="not written by vtrain"):
        write_chrome_traces(sim, out)
    assert (out / "keep.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no staging left behind
    with pytest.raises(InputError, match="not written by vtrain"):  # --force replaces only vtrain's own output
        write_chrome_traces(sim, out, overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"
    ours = tmp_path / "ours"
    write_chrome_traces(sim, ours)
    write_chrome_traces(sim, ours, overwrite=True)
    assert sorted(p.name for p in ours.iterdir()) == [".vtrain-output", "rank-0.json.gz", "run.yaml"]
