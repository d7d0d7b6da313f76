"""`vtrain validate` reads each trace file once: the replay's tolerant decoding also gives ingest's tables for
the model's profile (the same tables `vtrain ingest` builds), the replayed traces are written from the text kept
in memory, and the report's staging folder is created only once there are results to write."""

from __future__ import annotations

import builtins
import gzip
import io
import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import vtrain.cli.validate as validate_cli
from tests.conftest import TRACES
from vtrain.cli.main import app
from vtrain.ingest.discover import find_trace_files
from vtrain.ingest.pipeline import ingest_traces
from vtrain.replay.trace import read_trace_set
from vtrain.validate.profile import RankTablesSink
from vtrain.validate.traces import validate_traces

RECORDED = TRACES / "t1p1d2"  # two ranks and a run.yaml: the model side is built from the traces
A100 = TRACES / "hta-a100-2rank-nccl"  # NCCL collectives with their metadata, process groups


def _count_opens(monkeypatch: pytest.MonkeyPatch, paths: list[Path]) -> Counter[Path]:
    """Count every open of ``paths`` through Python's ``open`` (``Path.open`` and ``gzip.open`` use it)."""
    watched = {p.resolve() for p in paths}
    opened: Counter[Path] = Counter()
    real = io.open

    def counting(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and Path(file).resolve() in watched:
            opened[Path(file).resolve()] += 1
        return real(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    return opened


def _watch_preparing(monkeypatch: pytest.MonkeyPatch, parent: Path) -> list[list[str]]:
    """What is in ``parent`` (staging folders by the name they stage) each time a trace folder has been prepared."""
    seen: list[list[str]] = []
    real = validate_cli.prepare_validation

    def watched(*args: Any, **kwargs: Any) -> Any:
        prepared = real(*args, **kwargs)
        seen.append(sorted(p.name.split(".vtrain-staging")[0] for p in parent.iterdir()))
        return prepared

    monkeypatch.setattr(validate_cli, "prepare_validation", watched)
    return seen


@dataclass
class Watched:
    """One `validate_traces` run on a copy of the recorded run, watched: the opens of each trace file, and every
    file the trace reader read."""

    files: list[Path]
    opened: Counter[Path]
    read: list[Path]
    result: Any
    work: Path


@pytest.fixture(scope="module")
def watched_validation(tmp_path_factory: pytest.TempPathFactory) -> Watched:
    """The validation both tests below look into (each watches what it needs; one run serves both)."""
    import vtrain.replay.trace as replay_trace

    tmp = tmp_path_factory.mktemp("watched")
    folder = tmp / "run"
    shutil.copytree(RECORDED, folder)
    files = find_trace_files(folder)
    read: list[Path] = []
    real = replay_trace.load_text

    def recording(path: Path, *args: Any, **kwargs: Any) -> Any:
        read.append(Path(path))
        return real(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as monkeypatch:
        opened = _count_opens(monkeypatch, files)
        monkeypatch.setattr(replay_trace, "load_text", recording)
        result = validate_traces(folder, tmp / "work", with_hta=False)
    return Watched(files=files, opened=opened, read=read, result=result, work=tmp / "work")


def test_validate_opens_each_trace_file_once(watched_validation: Watched) -> None:
    """Replay, the model's profile (ingest's tables) and the replayed traces from one read of each file."""
    files, result = watched_validation.files, watched_validation.result
    assert result.model is not None, result.model_reason
    assert dict(watched_validation.opened) == {f.resolve(): 1 for f in files}
    assert sorted(p.name for p in (watched_validation.work / "predicted" / "replay").iterdir()) == [
        "rank-0.json.gz", "rank-1.json.gz"]


@pytest.mark.parametrize("folder", [RECORDED, A100], ids=["t1p1d2", "a100-nccl"])
def test_tables_from_the_replays_decoding_are_ingests(folder: Path, shipped_profile) -> None:
    """The tables built from the replay's decoded events equal `vtrain ingest`'s (its own strict decoder)."""
    sink = RankTablesSink()
    traces = read_trace_set(folder, sink)
    mine = sink.profile(folder, traces[0].world_size)
    ingested = shipped_profile(folder)  # `ingest_traces(folder)`, once per test run (tests/conftest.py)
    assert mine["cpu_ops"].height > 0 and mine["collectives"].height > 0
    assert folder == RECORDED or mine["kernels"].height > 0  # t1p1d2 ran on CPUs
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(mine[table], ingested[table])
    assert mine.metadata["world_size"] == ingested.metadata["world_size"]
    assert mine.metadata["iterations"] == ingested.metadata["iterations"]


def test_an_argument_of_the_wrong_type_does_not_fail_the_file(tmp_path: Path) -> None:
    """``"External id": "5"`` (a number as a string) fails `vtrain ingest`'s strict decoder; validate's tolerant one
    reads it as the number, and a list where a number belongs is left out, not the event."""
    folder = tmp_path / "run"
    shutil.copytree(A100, folder)
    path = folder / "rank-0.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})]
    ops[10]["args"]["External id"] = str(ops[10]["args"]["External id"])
    ops[11]["args"]["Group size"] = [1, 2]
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    kernels[3]["args"]["correlation"] = str(kernels[3]["args"]["correlation"])
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))

    sink, plain = RankTablesSink(), RankTablesSink()
    read_trace_set(folder, sink)
    read_trace_set(A100, plain)
    for table in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(sink.profile(folder, 2)[table], plain.profile(A100, 2)[table])
    with pytest.raises(Exception, match="malformed trace event"):
        ingest_traces(folder)


def test_the_staging_folder_appears_only_when_results_are_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While the traces are read, replayed and simulated nothing is in the output's parent: a kill then leaves
    nothing behind."""
    parent = tmp_path / "out"
    parent.mkdir()
    seen = _watch_preparing(monkeypatch, parent)
    result = CliRunner().invoke(app, ["validate", str(A100), "-o", str(parent / "result"), "--no-hta", "--json"])
    assert result.exit_code == 0, result.output
    assert seen == [[]]
    assert sorted(p.name for p in parent.iterdir()) == ["result"]
    assert (parent / "result" / "predicted" / "replay" / "rank-0.json.gz").exists()
    assert pl.read_parquet(parent / "result" / "tables" / "iterations.parquet").height > 0


def test_a_suite_creates_its_staging_folder_only_once_the_first_set_is_prepared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--suite`` prepares its first set before the staging folder exists, and every set is prepared once."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: two\nsets:\n  - name: first\n    traces: {A100}\n  - name: second\n    traces: {A100}\n")
    parent = tmp_path / "out"
    parent.mkdir()
    seen = _watch_preparing(monkeypatch, parent)
    result = CliRunner().invoke(app, ["validate", "--suite", str(suite), "-o", str(parent / "result"), "--no-hta",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert len(seen) == 2 and seen[0] == [] and seen[1] != []  # the second set is prepared into the staging folder
    assert sorted(p.name for p in parent.iterdir()) == ["result"]
    assert sorted(p.name for p in (parent / "result").iterdir() if p.is_dir()) == ["first", "second"]


def test_the_models_prediction_is_read_from_memory_as_its_files_would_be(watched_validation: Watched,
                                                                         tmp_path: Path, shipped_profile) -> None:
    """The predicted traces are written for the report, and the comparison takes the same events from memory:
    nothing under ``predicted/model`` is read back, and the events kept equal the files' events read back."""
    from vtrain.runconfig import load_run_config
    from vtrain.validate.model import predict, write_prediction

    result, read = watched_validation.result, watched_validation.read
    assert result.model is not None, result.model_reason
    assert (watched_validation.work / "predicted" / "model").is_dir()  # it was written, and not read back:
    assert read and not [p for p in read if "predicted" in p.parts]

    config = load_run_config(RECORDED / "run.yaml")
    # `ingest_traces(RECORDED)`, once per test run (tests/conftest.py)
    prediction = predict(config, shipped_profile(RECORDED), "traces", RECORDED / "run.yaml")
    kept = write_prediction(prediction, tmp_path / "model")
    from_files = read_trace_set(tmp_path / "model")
    assert [t.rank for t in kept] == [t.rank for t in from_files] and kept
    for mine, theirs in zip(kept, from_files):
        assert len(mine.kind) > 100
        for column in ("kind", "cat", "name", "lane", "ts", "dur", "correlation", "external_id", "collective_name",
                       "elements", "pg_ranks", "pg_name", "input_dims", "index"):
            assert list(getattr(mine, column)) == list(getattr(theirs, column)), column
        assert (mine.world_size, mine.process_groups, mine.dropped) == (
            theirs.world_size, theirs.process_groups, theirs.dropped)
