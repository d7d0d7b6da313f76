"""`vtrain record` end to end: a tiny 2-rank recording through the real command, and its failure modes."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vtrain.cli.main import app
from vtrain.naming import SPAN_KINDS, parse_span_name
from vtrain.record.launcher import RankFailure, _spawn
from vtrain.record.worker import RankJob
from vtrain.runconfig import ModelConfig, ParallelConfig, RunConfig, load_run_config

VTRAIN = Path(sys.executable).with_name("vtrain")
TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq", "16", "--vocab", "128",
        "--micro-batch", "2", "--global-batch", "4"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The CI recording: 2 ranks (tp=2), 2 profiled steps, through the installed `vtrain` script."""
    out = tmp_path_factory.mktemp("cli") / "t2"
    done = subprocess.run([str(VTRAIN), "record", *TINY, "--tp", "2", "--steps", "2", "-o", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return out, done


def test_record_writes_one_trace_per_rank_and_run_yaml(recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, done = recorded
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [".vtrain-output", "rank-0.json.gz", "rank-1.json.gz", "run.yaml"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")], "staging folder left behind"
    assert done.stdout.startswith(f"{out}: 2 rank(s) on cpu")

    config = load_run_config(out / "run.yaml")
    assert config.model == ModelConfig(layers=2, hidden=32, heads=4, seq=16, vocab=128)
    assert (config.parallelism.tp, config.parallelism.pp, config.parallelism.dp) == (2, 1, 1)
    assert config.hardware.device == "cpu" and config.hardware.device_count == 2
    assert config.hardware.cores == os.cpu_count()
    assert config.software["torch"].startswith("2.") and config.software["backend"] == "gloo"
    assert config.recording["steps"] == 2 and config.recording["warmup"] == 1
    assert len(config.recording["loss"]) == 3
    assert config.constraint_errors() == []


def test_traces_carry_rank_steps_and_vtrain_spans(recorded: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = recorded
    for rank in (0, 1):
        with gzip.open(out / f"rank-{rank}.json.gz", "rt") as handle:
            trace = json.load(handle)
        assert trace["distributedInfo"]["rank"] == rank and trace["distributedInfo"]["world_size"] == 2
        names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
        assert sorted({n for n in names if n.startswith("ProfilerStep#")}) == ["ProfilerStep#1", "ProfilerStep#2"]
        kinds = {parsed[0] for parsed in map(parse_span_name, names) if parsed}
        assert kinds == set(SPAN_KINDS) - {"recompute"}
        assert any(e["name"] == "c10d::allreduce_" for e in trace["traceEvents"])


def test_recording_loads_in_hta_and_vtrain_ingest(recorded: tuple[Path, subprocess.CompletedProcess[str]],
                                                   tmp_path: Path) -> None:
    from vtrain.validate.hta import hta_analysis

    out, _ = recorded
    analysis = hta_analysis(out, include_last_profiler_step=True)
    assert sorted(analysis.t.get_all_traces()) == [0, 1]
    result = CliRunner().invoke(app, ["ingest", str(out), "-o", str(tmp_path / "profile"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["world_size"] == 2 and summary["tables"]["collectives"] > 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--tp", "3"], "heads (4) is not divisible by tp (3)"),
    (["--vocab", "127", "--tp", "2"], "vocab (127) is not divisible by tp (2)"),
    (["--global-batch", "5"], "global batch (5) is not divisible by dp*micro_batch (1*2)"),
    (["--schedule", "zigzag"], "schedule must be one of"),
    (["--schedule", "interleaved", "--virtual-stages", "2"], "needs pp >= 2"),
    (["--recompute", "selective"], "recompute must be one of"),
    (["--precision", "fp16"], "fp16 needs loss scaling"),
    (["--warmup", "0"], "--warmup must be >= 1"),
    (["--device", "tpu"], "--device must be one of"),
    # 13 PB by the memory model: refused before a rank starts allocating (a typo took the machine into swap)
    (["--hidden", "262144", "--heads", "64", "--device", "cpu"], "rank(s) need at least"),
    # CUDA graphs need a GPU (the H200 recording in traces/gpu/h200-small-graphs was made with this flag)
    (["--cuda-graphs", "--device", "cpu"], "--cuda-graphs needs a CUDA device"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    out = tmp_path / "never"
    result = CliRunner().invoke(app, ["record", *TINY, *flags, "-o", str(out)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not tmp_path.joinpath("never").exists() and list(tmp_path.iterdir()) == []


def test_an_existing_folder_of_the_users_is_refused(tmp_path: Path) -> None:
    """A folder vtrain did not write is refused with the advice that holds: --force would not replace it either."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["record", *TINY, "-o", str(out)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {out}: output folder exists and was not written by vtrain: give another -o"
    assert (out / "keep.txt").read_text() == "mine"


def test_a_failing_rank_stops_the_others_with_one_line(tmp_path: Path) -> None:
    """Rank 1 cannot open its log (a folder is in the way) and dies at once; rank 0 is then waiting in the
    rendezvous for it and must be stopped rather than left hanging."""
    (tmp_path / "logs" / "rank-1.log").mkdir(parents=True)
    config = RunConfig(model=ModelConfig(layers=2, hidden=32, heads=4, seq=16, vocab=128),
                       parallelism=ParallelConfig(dp=2, micro_batch=2, global_batch=4))
    job = RankJob(config=config, staging=str(tmp_path), init_method=f"file://{tmp_path}/store", device="cpu",
                  steps=1, warmup=1, seed=0, threads=1, timeout_s=120, log_dir=str(tmp_path / "logs"))
    with pytest.raises(RankFailure, match=r"^rank 1 failed: IsADirectoryError: .*rank-1\.log'$"):
        _spawn(job, world=2)


def test_cli_reports_a_rank_failure_in_one_line_and_exits_1(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import vtrain.record.launcher as launcher

    def failing(*_args: object, **_kwargs: object) -> None:
        raise RankFailure("rank 1 failed: RuntimeError: out of memory")

    monkeypatch.setattr(launcher, "record", failing)
    out = tmp_path / "t"
    result = CliRunner().invoke(app, ["record", *TINY, "--dp", "2", "-o", str(out)])
    assert result.exit_code == 1
    assert result.output.strip() == f"error: {out}: rank 1 failed: RuntimeError: out of memory"


def test_more_cpu_ranks_than_cores_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """`vtrain record --dp 64` on 2 cores ran without a word (an audit): its ranks take turns on the cores, and the
    recording times the turns with the work. More CPU ranks than cores is said; a core each, or GPUs, are not."""
    import warnings

    import vtrain.record.launcher as launcher
    from vtrain.errors import InputWarning

    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 2)
    with pytest.warns(InputWarning, match="64 ranks on this machine's 2 cores: they take turns on them"):
        launcher._say_shared_cores("cpu", 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launcher._say_shared_cores("cpu", 2)
        launcher._say_shared_cores("cuda", 8)
