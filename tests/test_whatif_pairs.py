"""`vtrain whatif A --durations-from B` on the shipped pairs (traces/whatif/: one job recorded at two operator
speeds, --threads 1 and 2) predicts B's measured iteration time within 3 %, in both directions, and the report
names the operators that moved the critical path."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, TRACES
from vtrain.runconfig import load_run_config
from vtrain.whatif.changes import parse_scale
from vtrain.whatif.report import moved_ops
from vtrain.whatif.retime import TraceSet, load_trace_set, predict, what_if

PAIRS_DIR = TRACES / "whatif"
JOBS = sorted(p.name.removesuffix("-threads1") for p in PAIRS_DIR.glob("*-threads1"))


@pytest.fixture(scope="module")
def loaded() -> Callable[[Path], TraceSet]:
    """Each recording loaded once for the module (every one is used in both directions), freed after it."""
    sets: dict[Path, TraceSet] = {}

    def load(path: Path) -> TraceSet:
        if path not in sets:
            sets[path] = load_trace_set(path)
        return sets[path]

    return load


def test_the_pairs_cover_pipeline_data_and_3d_parallel_jobs() -> None:
    layouts = set()
    for job in JOBS:
        one, two = (load_run_config(PAIRS_DIR / f"{job}-threads{n}" / "run.yaml") for n in (1, 2))
        assert (one.model, one.parallelism) == (two.model, two.parallelism)  # the same job
        assert (one.recording["threads"], two.recording["threads"]) == (1, 2)
        p = one.parallelism
        layouts.add("pipeline" if p.pp > 1 and p.tp == p.dp == 1 else "data" if p.dp > 1 and p.tp == p.pp == 1
                    else "3d" if min(p.tp, p.pp, p.dp) > 1 else "other")
    assert {"pipeline", "data", "3d"} <= layouts


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("direction", ["1->2", "2->1"])
def test_durations_from_the_other_recording_predict_it_within_3_percent(job: str, direction: str,
                                                                       loaded: Callable[[Path], TraceSet]) -> None:
    base_threads, other_threads = direction.split("->")
    base = loaded(PAIRS_DIR / f"{job}-threads{base_threads}")
    other = loaded(PAIRS_DIR / f"{job}-threads{other_threads}")
    result = predict(base, [], other)
    summary = result.summary()
    assert abs(summary["error_pct"]) < 3.0, summary
    assert abs(summary["change_pct"]) > 10.0  # the two speeds differ: the test is not a replay of itself
    moved = moved_ops(result)[1]
    assert moved and any(row[1] == "gemm" for row in moved[:5])


def test_two_profiler_cycles_of_one_gpu_run_are_paired_in_order(tmp_path: Path) -> None:
    """A real H100 run profiled with ``schedule(repeat=2)`` and ``tensorboard_trace_handler`` (traces/gpu/
    h100-user-amp-ddp: one file per cycle, ProfilerStep #2, #3 and #6, #7): each cycle as a recording of the same
    job. Their iterations are paired in order (by number none would match, and the other cycle's measured time
    was None), and the second cycle re-timed with the first's durations is the first's measured time."""
    cycles = sorted((TRACES / "gpu" / "h100-user-amp-ddp").glob("*.pt.trace.json.gz"))
    folders = []
    for n, trace in enumerate(cycles):
        (tmp_path / f"cycle{n}").mkdir()
        (tmp_path / f"cycle{n}" / trace.name).symlink_to(trace)
        folders.append(tmp_path / f"cycle{n}")
    result = predict(load_trace_set(folders[1]), [], load_trace_set(folders[0]))
    summary, notes = result.summary(), result.replay.notes
    assert summary["other_measured_ms"] is not None and abs(summary["error_pct"]) < 1.0, summary
    assert any("paired in order" in line and "#2, #3" in line and "#6, #7" in line for line in notes), notes


def test_a_trace_without_profiler_steps_is_one_iteration(tmp_path: Path) -> None:
    """A profiler used without ``step()`` writes no ProfilerStep#N: with no optimizer step either, validate takes
    the whole trace as one iteration and says so; whatif did not run at all ("a what-if compares iterations") and
    now does as validate does."""
    trace = json.loads(gzip.decompress((REPO / "traces/gpu/h100-user-ckpt-accum/rank-0.json.gz").read_bytes()))
    trace["traceEvents"] = [e for e in trace["traceEvents"]
                            if not str(e.get("name", "")).startswith(("ProfilerStep#", "Optimizer.step#"))]
    (tmp_path / "rank-0.json").write_text(json.dumps(trace))
    notes: list[str] = []
    result = what_if(tmp_path, [parse_scale("host=0.5")], warn=notes.append)
    assert any("no ProfilerStep#N spans; the whole trace is taken as one iteration" in note for note in notes)
    assert result.iterations == [0] and result.predicted_us[0] < result.replayed_us[0]


def test_a_trace_without_profiler_steps_has_its_optimizer_steps_for_iterations(tmp_path: Path) -> None:
    """The same trace with its three ``Optimizer.step#AdamW.step`` spans (and their copies on the GPU's timeline,
    ``gpu_user_annotation``, which are not the host's steps): three iterations, each ending where a step ends, said
    in one line; the first, from the trace's start, is not steady."""
    trace = json.loads(gzip.decompress((REPO / "traces/gpu/h100-user-ckpt-accum/rank-0.json.gz").read_bytes()))
    trace["traceEvents"] = [e for e in trace["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    (tmp_path / "rank-0.json").write_text(json.dumps(trace))
    notes: list[str] = []
    result = what_if(tmp_path, [parse_scale("host=0.5")], warn=notes.append)
    assert [note for note in notes if "its 3 iterations are taken to end where its optimizer's steps end" in note]
    assert result.iterations == [1, 2, 3] and result.steady == [2, 3]


def test_durations_from_a_recording_of_another_job_is_said() -> None:
    """Two recordings without run.yaml cannot be told apart by their configs: where almost none of the base's
    operator time finds a partner in the other (a small GPT's eager run against a torch.compile'd one), the
    what-if says they may be other jobs; the shipped pairs of one job (a thread count, a GPU, CUDA graphs changed)
    stay silent (each above 50 %)."""
    notes: list[str] = []
    what_if(REPO / "traces/gpu/h200-small-eager", [], REPO / "traces/gpu/h200-compiled-gpt", warn=notes.append)
    assert any("are they recordings of the same job?" in note for note in notes), notes
    notes.clear()
    what_if(REPO / "traces/gpu/h200-small-graphs", [], REPO / "traces/gpu/h200-small-eager", warn=notes.append)
    assert not any("are they recordings of the same job?" in note for note in notes), notes
