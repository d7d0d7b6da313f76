"""Conformance of `vtrain ingest` on every real trace in the repository and on rewritten variants of them.

Two bars, on every trace: each device activity in the file is exactly one row of ``kernels`` (counted
independently from the raw JSON by :mod:`tests.rawcount`), and each rank's computation / communication / memory
time equals the raw JSON's (HTA's classification of the raw names). The variants are real traces rewritten the
way other PyTorch versions, accelerators and jobs write them: kernels launched through CUDA graphs, PyTorch 1.8
categories and arg keys, ROCm hex stream ids, MTIA categories, zero-length activities, pruned launches.
"""

from __future__ import annotations

import copy
import re
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import REPO, TRACES
from tests.rawcount import CLASSES, count_events, count_file, load_trace
from vtrain.devices.catalog import canonical_device_name
from vtrain.errors import InputError
from vtrain.ingest.pipeline import ingest_traces
from vtrain.replay.trace import read_rank_trace
from vtrain.tables.store import Profile, load_profile

#: every real GPU trace set, and one recorded CPU set: the CPU sets hold no device activity (their check is that
#: none is invented) and each takes ~15 s of plain-JSON parsing, so one stands for the eight
REAL_SETS = sorted([p for p in TRACES.glob("hta-*") if p.is_dir()] + [TRACES / "t1p2d1"]
                   + [p for p in (TRACES / "wild").iterdir() if p.is_dir()], key=lambda p: str(p))
#: the base of the rewritten variants: a real sm80 trace (2 ProfilerSteps, 1.2k device activities, NCCL)
BASE = TRACES / "hta-sm80-128rank-sampled" / "rank-0.json.gz"
#: a second base with sub-microsecond times and three ProfilerSteps
BASE_A100 = TRACES / "hta-a100-2rank-nccl" / "rank-0.json.gz"

Trace = dict[str, Any]


def _ingest(trace_dir: Path) -> tuple[Profile, list[str]]:
    warnings: list[str] = []
    return ingest_traces(trace_dir, warn=warnings.append), warnings


def assert_conforms(trace_dir: Path, profile: Profile, expected: dict[str, Any] | None = None) -> None:
    """Both bars, per rank file: kernel rows = raw device activities, class times = the raw JSON's."""
    kernels = profile["kernels"]
    assert profile.metadata["sources"], trace_dir
    for source in profile.metadata["sources"]:
        raw = expected[source["file"]] if expected else count_file(trace_dir / source["file"])
        mine = kernels.filter(pl.col("rank") == source["rank"])
        assert mine.height == raw.activities, (trace_dir.name, source["file"])
        assert source["kernel_rows"] == raw.activities
        times = dict(mine.group_by("kernel_class").agg(pl.col("dur").sum()).iter_rows())
        for kind in CLASSES:
            assert times.get(kind, 0.0) == pytest.approx(raw.time_us[kind], rel=1e-12, abs=1e-6), (
                trace_dir.name, source["file"], kind)
        if raw.activities:
            assert profile.metadata["device"]["type"] != "cpu"


@pytest.mark.parametrize("trace_dir", REAL_SETS, ids=lambda p: str(p.relative_to(TRACES)))
def test_every_real_trace_conforms(trace_dir: Path) -> None:
    profile, _ = _ingest(trace_dir)
    assert_conforms(trace_dir, profile)


# ---- rewriting a real trace ---------------------------------------------------------------------------------


def _write(trace: Trace, folder: Path, name: str = "rank-0.json") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(trace))
    return folder


def _events(trace: Trace, *categories: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in categories]


def _steps(trace: Trace) -> list[dict[str, Any]]:
    return sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                   and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])


def graph_launched(trace: Trace, *, keep_external_id: bool = True) -> Trace:
    """Each ProfilerStep's device work launched by one ``cudaGraphLaunch``: the step's first launching call is
    renamed, its other launching calls are removed (a graph replaces them), and every activity launched in the
    step carries the graph launch's correlation id (and External id, or none: older PyTorch)."""
    trace = copy.deepcopy(trace)
    launches = {e["args"]["correlation"]: e for e in _events(trace, "cuda_runtime")
                if "correlation" in (e.get("args") or {})}
    removed: set[int] = set()
    for step in _steps(trace):
        inside = [e for e in _events(trace, "kernel", "gpu_memcpy", "gpu_memset")
                  if (launch := launches.get(e["args"].get("correlation"))) is not None
                  and step["ts"] <= launch["ts"] < step["ts"] + step["dur"]]
        calls = sorted({e["args"]["correlation"] for e in inside}, key=lambda c: launches[c]["ts"])
        graph = launches[calls[0]]
        graph["name"] = "cudaGraphLaunch"
        for activity in inside:
            activity["args"]["correlation"] = graph["args"]["correlation"]
            if keep_external_id:
                activity["args"]["External id"] = graph["args"].get("External id")
            else:
                activity["args"].pop("External id", None)
        removed |= {id(launches[c]) for c in calls[1:]}
    if not keep_external_id:
        graph_ids = {e["args"]["correlation"] for e in _events(trace, "cuda_runtime") if e["name"] == "cudaGraphLaunch"}
        for call in _events(trace, "cuda_runtime"):
            if call["args"].get("correlation") in graph_ids:
                call["args"].pop("External id", None)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if id(e) not in removed]
    return trace


OLD_CATEGORIES = {"kernel": "Kernel", "cuda_runtime": "Runtime", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset",
                  "cpu_op": "Operator"}


def pytorch_18(trace: Trace) -> Trace:
    """Categories and arg keys as PyTorch 1.8-1.9 wrote them."""
    trace = copy.deepcopy(trace)
    for event in trace["traceEvents"]:
        event["cat"] = OLD_CATEGORIES.get(event.get("cat"), event.get("cat"))
        args = event.get("args") or {}
        if "External id" in args:
            args["external id"] = args.pop("External id")
        if "Input Dims" in args:
            args["Input dims"] = args.pop("Input Dims")
    return trace


def hex_streams(trace: Trace) -> Trace:
    """Every ``args.stream`` a hex string, as ROCm traces write some (``"0x17"``)."""
    trace = copy.deepcopy(trace)
    for event in trace["traceEvents"]:
        args = event.get("args") or {}
        if isinstance(args.get("stream"), int):
            args["stream"] = hex(args["stream"])
    return trace


def mtia(trace: Trace) -> Trace:
    """Device activities as MTIA writes them: ``mtia_ccp_events``, memory transfers as ``dma*`` activities,
    runtime calls as ``mtia_runtime``."""
    trace = copy.deepcopy(trace)
    for event in trace["traceEvents"]:
        cat = event.get("cat")
        if cat in ("gpu_memcpy", "gpu_memset"):
            event["name"] = "dma_" + event["name"].split()[0].lower() + "_" + cat
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            event["cat"] = "mtia_ccp_events"
        elif cat == "cuda_runtime":
            event["cat"] = "mtia_runtime"
    return trace


def zero_durations(trace: Trace) -> Trace:
    """Every fifth device activity lasts 0 µs."""
    trace = copy.deepcopy(trace)
    for activity in _events(trace, "kernel", "gpu_memcpy", "gpu_memset")[::5]:
        activity["dur"] = 0
    return trace


def pruned(trace: Trace) -> Trace:
    """Every second runtime call removed: their activities have no launch in the file."""
    trace = copy.deepcopy(trace)
    gone = {id(e) for e in _events(trace, "cuda_runtime")[::2]}
    trace["traceEvents"] = [e for e in trace["traceEvents"] if id(e) not in gone]
    return trace


VARIANTS: dict[str, Callable[[Trace], Trace]] = {
    "graph": graph_launched, "graph-no-external-id": lambda t: graph_launched(t, keep_external_id=False),
    "pytorch-1.8": pytorch_18, "rocm-hex-streams": hex_streams, "mtia": mtia, "zero-durations": zero_durations,
    "pruned": pruned,
}


@pytest.fixture(scope="module")
def base_traces() -> dict[str, Trace]:
    return {"sm80": load_trace(BASE), "a100": load_trace(BASE_A100)}


@pytest.mark.parametrize("base", ["sm80", "a100"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rewritten_traces_conform(variant: str, base: str, base_traces: dict[str, Trace], tmp_path: Path) -> None:
    trace = VARIANTS[variant](base_traces[base])
    folder = _write(trace, tmp_path / variant)
    profile, warnings = _ingest(folder)
    assert_conforms(folder, profile, {"rank-0.json": count_events(trace["traceEvents"])})
    original = count_events(base_traces[base]["traceEvents"])
    assert profile["kernels"].height == original.activities  # no variant adds or loses an activity
    unlaunched = [w for w in warnings if "no launching runtime call" in w]
    if variant == "pruned":
        assert unlaunched and profile.metadata["sources"][0]["unlaunched_activities"] > 0


@pytest.mark.parametrize("base", ["sm80", "a100"])
@pytest.mark.parametrize("keep_external_id", [True, False])
def test_graph_launch_is_one_row_per_launch_and_each_kernel_names_its_op(
        base: str, keep_external_id: bool, base_traces: dict[str, Trace], tmp_path: Path) -> None:
    trace = graph_launched(base_traces[base], keep_external_id=keep_external_id)
    profile, _ = _ingest(_write(trace, tmp_path / "graph"))
    raw = count_events(trace["traceEvents"])
    graphs = profile["graph_launches"]
    steps = _steps(trace)
    assert graphs.height == len(steps)
    assert sorted(graphs["iteration"].to_list()) == sorted(int(s["name"].split("#")[1]) for s in steps)
    kernels = profile["kernels"]
    for row in graphs.iter_rows(named=True):
        released = kernels.filter(pl.col("correlation") == row["correlation"])
        assert row["kernels"] == released.height == raw.correlations[row["correlation"]] > 1
        assert row["kernel_start"] == released["ts"].min()
        assert row["kernel_end"] == (released["ts"] + released["dur"]).max()
        assert row["kernel_us"] == pytest.approx(released["dur"].sum())
        # every kernel of the graph names the op that launched it
        assert released["cpu_op"].n_unique() == 1 and released["cpu_op"][0] == row["cpu_op"] is not None
        assert released["external_id"].n_unique() == 1
    assert profile.metadata["sources"][0]["graph_launches"] == len(steps)


def test_mtia_dma_activities_are_memory_copies(base_traces: dict[str, Trace], tmp_path: Path) -> None:
    profile, _ = _ingest(_write(mtia(base_traces["sm80"]), tmp_path / "mtia"))
    kernels = profile["kernels"]
    dma = kernels.filter(pl.col("name").str.starts_with("dma"))
    assert dma.height == 50 and (dma["kind"] == "memcpy").all() and (dma["kernel_class"] == "memory").all()
    assert (kernels.filter(~pl.col("name").str.starts_with("dma"))["kind"] == "kernel").all()
    assert kernels["cpu_op"].null_count() < kernels.height  # mtia_runtime calls link kernels to their ops
    assert profile.metadata["device"]["type"] == "mtia"


def test_the_accelerator_is_named() -> None:
    """The MI250 trace's driver names its GPU "AMD Radeon Graphics" (ROCm's generic name): its 104 compute units
    and 64 GB are one MI250 die."""
    rocm, _ = _ingest(TRACES / "wild" / "mi250-rocm")
    assert rocm.metadata["device"]["type"] == "rocm" and rocm.metadata["device"]["name"] == "AMD Instinct MI250"
    assert canonical_device_name(rocm.metadata["device"]["name"]) == "MI250"
    assert _ingest(TRACES / "hta-sm80-128rank-sampled")[0].metadata["device"]["type"] == "cuda"


def test_old_and_hex_variants_keep_streams_ops_and_shapes(base_traces: dict[str, Trace], tmp_path: Path) -> None:
    reference, _ = _ingest(_write(base_traces["sm80"], tmp_path / "base"))
    columns = ["stream", "external_id", "cpu_op", "input_dims", "iteration"]
    for name, rewrite in (("old", pytorch_18), ("hex", hex_streams)):
        profile, _ = _ingest(_write(rewrite(base_traces["sm80"]), tmp_path / name))
        assert profile["kernels"].select(columns).equals(reference["kernels"].select(columns)), name
        assert profile["op_latency"].height == reference["op_latency"].height > 0, name
        assert profile["cpu_ops"].select("cat", "name").equals(reference["cpu_ops"].select("cat", "name")), name


def test_a_kernel_without_an_external_id_names_the_op_its_launch_names(base_traces: dict[str, Trace],
                                                                         tmp_path: Path) -> None:
    """Device activities without an External id of their own and no flow events (as an older PyTorch wrote some):
    each names the op its launching runtime call names, as the kernel did, not the op enclosing the call (the
    A100 trace's NCCL kernels were credited to the ``nccl:all_reduce`` annotation inside ``record_param_comms``:
    an audit)."""
    reference, _ = _ingest(_write(base_traces["a100"], tmp_path / "base"))
    trace = copy.deepcopy(base_traces["a100"])
    trace["traceEvents"] = [event for event in trace["traceEvents"] if event.get("ph") not in ("s", "f")]
    for event in _events(trace, "kernel", "gpu_memcpy", "gpu_memset"):
        event["args"].pop("External id", None)
    profile, _ = _ingest(_write(trace, tmp_path / "no-ids"))
    columns = ["correlation", "external_id", "cpu_op"]
    nccl = reference["kernels"].filter(pl.col("name").str.starts_with("nccl"))
    assert nccl.height > 0 and nccl["cpu_op"].drop_nulls().len() == nccl.height
    assert profile["kernels"].select(columns).equals(reference["kernels"].select(columns))


def test_a_device_clock_offset_from_the_hosts_is_said_by_ingest_and_the_replay(base_traces: dict[str, Trace],
                                                                                tmp_path: Path) -> None:
    """Every device activity of the A100 trace moved 200 us earlier, as a device clock offset from the host's puts
    them (ROCm traces can be): they start before the calls that launched them, which no device can. `whatif` read
    the offset as wake-up delays it held fixed and predicted 0.25 ms for 0.20 (an audit), silently. Ingest and the
    replay say it alike; the trace as recorded has no such activity."""
    from vtrain.replay.trace import read_trace_set, trace_set_warnings

    shifted = copy.deepcopy(base_traces["a100"])
    activities = _events(shifted, "kernel", "gpu_memcpy", "gpu_memset")
    for activity in activities:
        activity["ts"] -= 200.0
    for name, trace, early in (("as-recorded", base_traces["a100"], False), ("offset", shifted, True)):
        folder = _write(trace, tmp_path / name)
        _, warnings = _ingest(folder)
        said = [line for line in warnings if "start before the runtime call that launched them" in line]
        replayed = [line for line in trace_set_warnings(folder, read_trace_set(folder), None)
                    if "start before the runtime call that launched them" in line]
        assert len(said) == len(replayed) == early, (said, replayed)
    assert said[0] == replayed[0]
    found = re.search(r": ([\d,]+) of ([\d,]+) device activities start before .* \(([\d.]+) us at the median\)",
                      said[0])
    early, launched, median = int(found[1].replace(",", "")), int(found[2].replace(",", "")), float(found[3])
    assert launched == len(activities) and early > 0.9 * launched  # queued longer than 200 us: no earlier than
    assert 100 < median < 200  # the offset, less the median time a kernel waited after its launch


def test_cuda_sync_records_are_not_kernel_rows() -> None:
    trace_dir = TRACES / "wild" / "a100-alexnet"
    syncs = [e for e in load_trace(trace_dir / "rank-0.json.gz")["traceEvents"] if e.get("cat") == "cuda_sync"]
    assert len(syncs) == 41
    profile, _ = _ingest(trace_dir)
    names = set(profile["kernels"]["name"])
    assert not names & {e["name"] for e in syncs}


def test_zero_duration_activities_are_kept(base_traces: dict[str, Trace], tmp_path: Path) -> None:
    profile, warnings = _ingest(_write(zero_durations(base_traces["sm80"]), tmp_path / "zero"))
    assert (profile["kernels"]["dur"] == 0).sum() >= 240
    assert not [w for w in warnings if "dropped" in w or "absurd" in w]


def test_missing_and_negative_durations_are_dropped_with_a_count(base_traces: dict[str, Trace],
                                                                 tmp_path: Path) -> None:
    trace = copy.deepcopy(base_traces["sm80"])
    activities = _events(trace, "kernel")
    del activities[0]["dur"]
    activities[1]["dur"] = -3
    profile, warnings = _ingest(_write(trace, tmp_path / "bad"))
    assert profile["kernels"].height == count_events(trace["traceEvents"]).activities
    assert profile.metadata["sources"][0]["dropped_activities"] == 2
    assert any("dropped 2 events with a missing or negative duration" in w for w in warnings)


@pytest.mark.parametrize("duration", [1e300, "span", "start 11 days later"])
def test_an_absurd_duration_is_left_out_and_counted(duration: Any, base_traces: dict[str, Trace],
                                                   tmp_path: Path) -> None:
    """A duration of 1e300 us or of three times the trace, or a start 10^12 us after its neighbours (a clock
    glitch: more than all the trace's device time after the host's last event)."""
    trace = copy.deepcopy(base_traces["sm80"])
    complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    span = max(e["ts"] + e["dur"] for e in complete) - min(e["ts"] for e in complete)
    victim = next(e for e in _events(trace, "kernel") if e["name"].startswith("void fbgemm"))
    measured = victim["dur"]
    if duration == "start 11 days later":
        victim["ts"] += 1e12
    else:
        victim["dur"] = 1e300 if duration == 1e300 else 3 * span
    profile, warnings = _ingest(_write(trace, tmp_path / "absurd"))
    raw = count_events(base_traces["sm80"]["traceEvents"])  # the absurd value would swamp a sum
    assert profile["kernels"].height == raw.activities - 1
    assert profile["kernels"]["dur"].max() < span
    computation = profile["kernels"].filter(pl.col("kernel_class") == "computation")["dur"].sum()
    assert computation == pytest.approx(raw.time_us["computation"] - measured, rel=1e-12)
    assert profile.metadata["sources"][0]["absurd_activities"] == 1
    assert any("1 device activities with an absurd time" in w for w in warnings)


def test_kernels_written_twice_are_counted_with_a_warning(base_traces: dict[str, Trace], tmp_path: Path) -> None:
    """Three exact copies of a kernel event (a trace appended to itself, in part): kept, said with their count."""
    trace = copy.deepcopy(base_traces["sm80"])
    victim = next(e for e in _events(trace, "kernel") if e["name"].startswith("void fbgemm"))
    trace["traceEvents"] += [copy.deepcopy(victim) for _ in range(3)]
    profile, warnings = _ingest(_write(trace, tmp_path / "twice"))
    assert profile["kernels"].height == count_events(base_traces["sm80"]["traceEvents"]).activities + 3
    assert any("3 device activities repeat another exactly" in w for w in warnings)
    plain, plain_warnings = _ingest(_write(copy.deepcopy(base_traces["sm80"]), tmp_path / "once"))
    assert not any("repeat another" in w for w in plain_warnings)


def _ingest_cli(folder: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(folder), "-o",
                           str(tmp_path / "profile")], capture_output=True, text=True, cwd=REPO, check=False)


@pytest.mark.parametrize("field", ["ph", "cat"])
def test_events_without_phase_or_category_are_never_an_empty_profile(field: str, base_traces: dict[str, Trace],
                                                                     tmp_path: Path) -> None:
    trace = copy.deepcopy(base_traces["sm80"])
    for event in trace["traceEvents"]:
        event.pop(field, None)
    folder = _write(trace, tmp_path / "none")
    done = _ingest_cli(folder, tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: {folder / 'rank-0.json'}: ")
    assert not (tmp_path / "profile").exists()

    some = copy.deepcopy(base_traces["sm80"])
    for activity in _events(some, "kernel")[:7]:
        activity.pop(field)
    profile, warnings = _ingest(_write(some, tmp_path / "some"))
    what = "no phase (ph)" if field == "ph" else "no category (cat)"
    assert any(f"7 have {what}" in w for w in warnings), warnings
    assert profile["kernels"].height == count_events(some["traceEvents"]).activities


def test_a_trace_without_events_is_said_and_a_folder_of_nothing_else_refused(base_traces: dict[str, Trace],
                                                                              tmp_path: Path) -> None:
    """An empty rank file beside others is said; alone, it was a profile of 0 rows (now one error)."""
    trace = {**base_traces["sm80"], "traceEvents": [], "distributedInfo": {"rank": 0, "world_size": 2}}
    with pytest.raises(InputError, match=r"no event in any of its 1 trace file\(s\)"):
        _ingest(_write(trace, tmp_path / "empty"))
    folder = _write(trace, tmp_path / "two")
    _write({**base_traces["sm80"], "distributedInfo": {"rank": 1, "world_size": 2}}, folder, "rank-1.json")
    profile, warnings = _ingest(folder)
    assert not profile["kernels"].is_empty()
    assert any("rank-0.json: the trace holds no events" in w for w in warnings), warnings


@pytest.mark.parametrize("rank", ["zero", "-1", -1, 2, 1.5, True, "١"])
def test_a_bad_rank_is_one_error_line(rank: Any, base_traces: dict[str, Trace], tmp_path: Path) -> None:
    """In `vtrain ingest` and in `vtrain validate`'s replay alike (one rule: vtrain/ingest/discover.py)."""
    trace = copy.deepcopy(base_traces["sm80"])
    trace["distributedInfo"] = {"rank": rank, "world_size": 2, "backend": "nccl"}
    folder = _write(trace, tmp_path / "rank", "trace.json")
    done = _ingest_cli(folder, tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "rank" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    with pytest.raises(InputError, match="rank"):
        read_rank_trace(folder / "trace.json")


def test_a_rank_written_as_digits_is_the_rank_in_ingest_and_validate(base_traces: dict[str, Trace],
                                                                      tmp_path: Path) -> None:
    """``"rank": "1"`` (a trace rewritten by a tool that writes numbers as strings) is rank 1 in both commands
    (ingest refused it while validate's replay read it)."""
    trace = copy.deepcopy(base_traces["sm80"])
    trace["distributedInfo"] = {"rank": "1", "world_size": "2", "backend": "nccl"}
    folder = _write(trace, tmp_path / "digits", "trace.json")
    profile, _ = _ingest(folder)
    assert set(profile["kernels"]["rank"]) == {1}
    replayed = read_rank_trace(folder / "trace.json")
    assert (replayed.rank, replayed.world_size) == (1, 2)


def test_the_old_join_would_multiply_graph_kernels(base_traces: dict[str, Trace]) -> None:
    """The rewrite really makes a graph launch: many activities share each launching correlation id (the
    condition that made the old joins give a kernel once per sibling)."""
    raw = count_events(graph_launched(base_traces["sm80"], keep_external_id=False)["traceEvents"])
    shared = [n for n in raw.correlations.values() if n > 1]
    assert len(shared) == 2 and sum(n * n for n in shared) > 10 * raw.activities


def test_ranks_are_counted_per_file_in_metadata() -> None:
    profile, _ = _ingest(TRACES / "hta-sm80-128rank-sampled")
    by_rank = defaultdict(int)
    for row in profile["kernels"].iter_rows(named=True):
        by_rank[row["rank"]] += 1
    for source in profile.metadata["sources"]:
        assert source["device_activities"] == source["kernel_rows"] == by_rank[source["rank"]]
        assert source["dropped_activities"] == source["absurd_activities"] == 0


def test_graph_launches_are_written_and_read_back(base_traces: dict[str, Trace], tmp_path: Path) -> None:
    folder = _write(graph_launched(base_traces["sm80"]), tmp_path / "graph")
    done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(folder), "-o",
                           str(tmp_path / "profile"), "--json"], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["tables"]["graph_launches"] == 2
    assert summary["ranks"]["0"]["kernels"] == count_events(graph_launched(base_traces["sm80"])["traceEvents"]).activities
    loaded = load_profile(tmp_path / "profile")
    assert loaded["graph_launches"]["kernels"].sum() == loaded["kernels"].filter(
        pl.col("correlation").is_in(loaded["graph_launches"]["correlation"].implode())).height


def test_kernels_launched_under_no_operator_but_the_step_are_no_operators_call() -> None:
    """compare-base launches element-wise kernels under no operator but its ProfilerStep#1009 and #1010 spans (their
    External id is the step's): op_latency had rows "ProfilerStep#1009" and "#1010", and calibrating the same
    traces with steps numbered otherwise reported two operators gone and two new (an audit). They are no
    operator's call; the kernels stay in the kernels table."""
    profile, _ = _ingest(TRACES / "wild" / "compare-base")
    under_steps = profile["kernels"].filter(pl.col("cpu_op").str.starts_with("ProfilerStep#"))
    assert under_steps.height > 0
    assert profile["op_latency"].filter(pl.col("op").str.starts_with("ProfilerStep#")).is_empty()
