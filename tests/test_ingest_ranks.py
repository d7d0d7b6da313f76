"""Ingest rank by rank and rank-parallel: ``--workers K`` gives exactly the serial run's tables, warnings and
errors; each rank's text is read window by window (gzip files too, every member of them); Ctrl-C stops a pool of
workers with one line and nothing left behind.

The folders are made from real shipped traces (:mod:`tests.benchmarks.trace_folder`: a 128-rank job's sm80 rank
copied to more ranks) and from the real A100 trace.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.benchmarks.trace_folder import SM80_RANK, V100_RANK, make_trace_folder
from tests.conftest import REPO, TRACES
from vtrain.errors import InputError
from vtrain.ingest.pipeline import default_workers, ingest_traces
from vtrain.ingest.text import load_text
from vtrain.tables.store import load_profile

A100 = TRACES / "hta-a100-2rank-nccl"
#: op_latency's rows with equal medians come in no fixed order (its group_by): compared as sets of rows
_UNORDERED = {"op_latency"}


def _assert_same_profile(a, b) -> None:
    assert a.tables.keys() == b.tables.keys()
    for name in a.tables:
        assert_frame_equal(a[name], b[name], check_row_order=name not in _UNORDERED)
    changing = {"created_at", "ingest_seconds"}
    assert {k: v for k, v in a.metadata.items() if k not in changing} == \
        {k: v for k, v in b.metadata.items() if k not in changing}


@pytest.fixture(scope="module")
def six_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six ranks (gzip files) of the sm80 job's rank 0."""
    folder = tmp_path_factory.mktemp("six")
    make_trace_folder(SM80_RANK, folder, total_bytes=1, ranks=6, compress=True)
    return folder


def test_parallel_ingest_gives_the_serial_tables(six_ranks: Path) -> None:
    serial = ingest_traces(six_ranks, workers=1)
    parallel = ingest_traces(six_ranks, workers=3)
    _assert_same_profile(serial, parallel)
    assert serial.metadata["ranks"] == list(range(6)) and serial.metadata["world_size"] == 6
    assert serial["kernels"]["rank"].unique(maintain_order=True).to_list() == list(range(6))
    # every rank is the same trace: the same rows, rank by rank
    per_rank = serial["kernels"].partition_by("rank", maintain_order=True)
    assert {frame.drop("rank").hash_rows().sum() for frame in per_rank} == {per_rank[0].drop("rank").hash_rows().sum()}


def test_rank_by_rank_gives_the_tables_of_one_pass(tmp_path: Path) -> None:
    """The real A100 trace alone: its tables do not depend on how the folder is cut (a copy of the same rank as
    rank 1 of the job adds its rows, and changes nothing of rank 0's)."""
    alone = ingest_traces(A100)
    both = tmp_path / "both"
    both.mkdir()
    shutil.copy(A100 / "rank-0.json.gz", both / "rank-0.json.gz")
    trace = json.loads(gzip.decompress((A100 / "rank-0.json.gz").read_bytes()))
    trace["distributedInfo"]["rank"] = 1
    (both / "rank-1.json").write_text(json.dumps(trace))
    together = ingest_traces(both, workers=2)
    for name in ("kernels", "cpu_ops", "collectives"):
        assert_frame_equal(together[name].filter(pl.col("rank") == 0), alone[name])
        assert together[name].height == 2 * alone[name].height


def test_warnings_and_errors_come_in_folder_order_whichever_process_read_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "odd"
    make_trace_folder(SM80_RANK, folder, total_bytes=1, ranks=4)
    for rank in (1, 3):  # events with a negative duration: a warning naming each file
        path = folder / f"rank-{rank}.json"
        path.write_text(path.read_text().replace('"dur":', '"dur":-', rank))
    warnings: dict[int, list[str]] = {1: [], 3: []}
    for workers, lines in warnings.items():
        ingest_traces(folder, workers=workers, warn=lines.append)
    assert warnings[1] == warnings[3]
    assert [w.split(":")[0] for w in warnings[1]] == [str(folder / "rank-1.json"), str(folder / "rank-3.json")]

    # a malformed rank 2 and a rank 3 that claims rank 1: the serial run stops at rank 2's error, and so does the
    # pool, although another worker may read rank 3 first
    (folder / "rank-2.json").write_text((folder / "rank-2.json").read_text()[:-1000])
    path = folder / "rank-3.json"
    header = path.read_text()
    assert '"rank": 3' in header[:10_000]
    path.write_text(header.replace('"rank": 3', '"rank": 1', 1))
    errors = {}
    for workers in (1, 3):
        with pytest.raises(InputError) as caught:
            ingest_traces(folder, workers=workers)
        errors[workers] = str(caught.value)
    assert errors[1] == errors[3] and errors[1].startswith(str(folder / "rank-2.json"))
    # the command: one line, and nothing left once the workers, still writing other ranks, are stopped
    out = tmp_path / "out"
    for _ in range(3):
        done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(folder), "-o",
                               str(out / "result"), "--workers", "2"], cwd=REPO, capture_output=True, text=True,
                              check=False)
        lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: --workers")]  # 1 core
        # one line: the warnings of the files read before the bad one are said only when the folder is ingested
        assert done.returncode == 2 and lines == [f"error: {errors[1]}"], done.stderr
        assert not out.exists()
    (folder / "rank-2.json").unlink()
    for workers in (1, 3):
        with pytest.raises(InputError, match="rank 1 is claimed by both rank-1.json and rank-3.json"):
            ingest_traces(folder, workers=workers)


def test_cli_workers_flag(six_ranks: Path, tmp_path: Path) -> None:
    summaries = []
    for workers in ("1", "4"):
        out = tmp_path / f"profile-{workers}"
        done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(six_ranks), "-o", str(out),
                               "--json", "--workers", workers], cwd=REPO, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        summaries.append(json.loads(done.stdout))
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging or spool left
        assert sorted(p.name for p in out.iterdir()) == sorted(
            [".vtrain-output", "metadata.json", *(f"{t}.parquet" for t in (
                "kernels", "cpu_ops", "collectives", "graph_launches", "op_latency", "nccl_latency"))])
    assert summaries[0]["ranks"] == summaries[1]["ranks"] and len(summaries[0]["ranks"]) == 6
    assert summaries[0]["tables"] == summaries[1]["tables"]
    one, four = load_profile(tmp_path / "profile-1"), load_profile(tmp_path / "profile-4")
    _assert_same_profile(one, four)
    for bad in ("0", "-2", "two", "100000"):
        done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(six_ranks), "-o",
                               str(tmp_path / "bad"), "--workers", bad], cwd=REPO, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--workers" in done.stderr, done.stderr
        assert not (tmp_path / "bad").exists()


def test_default_workers_is_one_for_a_small_folder(six_ranks: Path, tmp_path: Path) -> None:
    assert default_workers(sorted(six_ranks.iterdir())) == 1
    big = tmp_path / "big"
    big.mkdir()
    for rank in range(3):  # sparse files: their size, not their bytes, decides
        with (big / f"rank-{rank}.json").open("wb") as handle:
            handle.truncate(40 << 20)
    assert 1 <= default_workers(sorted(big.iterdir())) <= 3


def test_a_gzip_file_of_several_members_is_read_whole(tmp_path: Path) -> None:
    """``gzip`` and ``zcat`` read every member of a gzip file (what ``cat a.gz b.gz`` or a parallel gzip
    writes); ingest read only the first, a truncated trace, before."""
    text = gzip.decompress((A100 / "rank-0.json.gz").read_bytes())
    folder = tmp_path / "members"
    folder.mkdir()
    cut = len(text) // 3
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]) + b"\0" * 512)
    assert bytes(load_text(folder / "rank-0.json.gz").buffer) == text
    _assert_same_profile(ingest_traces(folder), _with_source_of(ingest_traces(A100), folder))
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:])[:-100])
    with pytest.raises(InputError, match="truncated gzip file"):
        load_text(folder / "rank-0.json.gz")
    (folder / "rank-0.json.gz").write_bytes(gzip.compress(text[:cut]) + b"not gzip at all")
    with pytest.raises(InputError, match="corrupt gzip data"):
        load_text(folder / "rank-0.json.gz")


def _with_source_of(profile, folder: Path):
    """``profile`` as if read from ``folder``'s one file (its name, size and hash differ, and its warnings name it)."""
    source = json.loads(json.dumps(profile.metadata["sources"][0]))
    file = next(folder.iterdir())
    source.update(bytes=file.stat().st_size, sha256=hashlib.sha256(file.read_bytes()).hexdigest())
    warnings = [line.replace(str(A100), str(folder)) for line in profile.metadata["warnings"]]
    profile.metadata.update(source_dir=str(folder), sources=[source], warnings=warnings)
    return profile


def test_decoded_text_is_released_window_by_window(tmp_path: Path) -> None:
    """After a rank's events are read, no more than a few pages of its text stay resident (the whole text did
    before): the process's mapped file pages are counted by the kernel."""
    from vtrain.ingest.events import read_rank_events
    from vtrain.ingest.spans import read_header

    folder = tmp_path / "one"
    make_trace_folder(V100_RANK, folder, total_bytes=1, ranks=1)
    text = load_text(folder / "rank-0.json")
    _, span = read_header(text)
    events = read_rank_events(text, span)
    assert events.device.height > 20_000
    assert _resident_bytes(text.path) < 8 << 20 < len(text.buffer) // 4


def _resident_bytes(path: Path) -> int:
    """The resident bytes of the process's mappings of ``path`` (``/proc/self/smaps``)."""
    resident, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isdigit() or line[:1] in "abcdef" and "-" in line.split()[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            resident += int(line.split()[1]) * 1024
    return resident


def test_ctrl_c_stops_the_workers_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    make_trace_folder(V100_RANK, folder, total_bytes=8 * 60_000_000, ranks=8)
    parent = tmp_path / "out"
    parent.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "vtrain.cli.main", "ingest", str(folder), "-o",
                                str(parent / "result"), "--workers", "2"], cwd=REPO, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while not list(parent.glob(".result.vtrain-staging-*/.ranks/*-kernels.arrow")):  # a worker finished a rank
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches every process of the terminal's group
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.splitlines() == ["interrupted"], err
    assert list(parent.iterdir()) == []


def test_latency_tables_from_the_spool_equal_those_of_the_texts(tmp_path: Path) -> None:
    """The spooled operator calls are read as categories (a tenth of the memory): ``op_latency`` must be what
    the calls as texts give, ties between kernel sequences included (the lexically first wins, not the first
    seen)."""
    from vtrain.ingest.pipeline import IngestedRanks
    from vtrain.ingest.rank import RankResult, spool_file
    from vtrain.tables.latency import gpu_op_calls, op_latency

    profile = ingest_traces(A100)
    calls = gpu_op_calls(profile["kernels"])
    assert_frame_equal(profile["op_latency"], op_latency(calls), check_row_order=False)

    tie = pl.DataFrame({"rank": [0, 0], "external_id": [1, 2], "op": ["aten::mm"] * 2, "input_dims": [None, None],
                        "input_types": [None, None], "kernels": ["zz_gemm", "aa_gemm"], "n_kernels": [1, 1],
                        "dur": [1.0, 2.0], "device_type": ["cuda"] * 2},
                       schema_overrides={"input_dims": pl.String, "input_types": pl.String, "n_kernels": pl.Int32})
    tie.write_ipc(spool_file(tmp_path, 0, "calls"))
    profile["collectives"].head(0).write_ipc(spool_file(tmp_path, 0, "collectives"))
    profile["cpu_ops"].head(0).write_ipc(spool_file(tmp_path, 0, "comm_ops"))
    ranks = IngestedRanks(tmp_path, [RankResult(index=0, path=tmp_path, rows={"kernels": 2})], {})
    table = ranks.latency_tables()["op_latency"]
    assert_frame_equal(table, op_latency(tie), check_row_order=False)
    assert table["kernels"].to_list() == ["aa_gemm"] and table.schema == op_latency(tie).schema


def test_ray_gives_the_serial_tables(six_ranks: Path) -> None:
    """Ranks read as Ray tasks on a local instance (as `vtrain ingest --ray`): the same profile, in the same
    order, as in one process."""
    ray = pytest.importorskip("ray")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception when its node does not start
        pytest.skip(f"a local Ray instance did not start on this machine: {exc}")
    try:
        on_ray = ingest_traces(six_ranks, ray_address="local")
    finally:
        ray.shutdown()
    _assert_same_profile(ingest_traces(six_ranks), on_ray)


def test_ray_tasks_finishing_in_any_order_give_the_serial_tables(six_ranks: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a Ray cluster: the Ray runner replaced by one that runs the same task function in this process
    and returns the ranks last first, as tasks on a cluster may finish. The spooled tables travel as bytes and
    the ranks are taken in folder order."""
    from vtrain import distributed

    seen = []

    def last_first(address, function, base, profile, device, groups):
        seen.append(address)
        results = [function(base, profile, device, group) for group in groups]
        yield from reversed(results)

    monkeypatch.setattr(distributed, "run_on_ray", last_first)
    _assert_same_profile(ingest_traces(six_ranks), ingest_traces(six_ranks, ray_address="ray://head:10001"))
    assert seen == ["ray://head:10001"]
    done = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "ingest", str(six_ranks), "-o",
                           str(six_ranks.parent / "no-ray"), "--ray-address", "ray://nowhere:1"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Ray" in done.stderr, done.stderr
    assert not [p for p in six_ranks.parent.iterdir() if p.name.startswith(".no-ray")]  # no staging folder left
    assert not (six_ranks.parent / "no-ray").exists()


def test_a_folder_of_gpu_and_cpu_only_ranks(tmp_path: Path) -> None:
    """A GPU rank (the real A100 trace, rank 0 of 2) beside a CPU-only one (rank 1 of the recorded gloo run
    t1p1d2): operator latencies come from kernels on the first and from CPU ops on the second, in one table."""
    from vtrain.tables.latency import cpu_op_calls, gpu_op_calls, op_latency

    shutil.copy(A100 / "rank-0.json.gz", tmp_path / "rank-0.json.gz")
    shutil.copy(TRACES / "t1p1d2" / "rank-1.json.gz", tmp_path / "rank-1.json.gz")
    profile = ingest_traces(tmp_path, workers=2)
    columns = ["op", "input_dims", "input_types", "device_type", "kernels", "n_kernels", "dur"]
    calls = pl.concat([gpu_op_calls(profile["kernels"]).select(columns),
                       cpu_op_calls(profile["cpu_ops"].filter(pl.col("rank") == 1)).select(columns)])
    assert set(profile["op_latency"]["device_type"]) == {"cuda", "cpu"}
    assert_frame_equal(profile["op_latency"], op_latency(calls), check_row_order=False)


@pytest.mark.parametrize(("name", "rank"), [
    ("rank-3.json.gz", 3), ("trace_rank_12.pt.trace.json", 12), ("RANK7.json", 7), ("worker_rank-2.json", 2),
    ("node0_local_rank4_rank12.json", 12), ("localrank4_rank12.json", 12), ("frank2.json", None),
    ("local_rank4.json", None), ("host_123.1700000000.pt.trace.json", None)])
def test_the_rank_a_file_name_says(name: str, rank: int | None) -> None:
    """A rank written in the name, never the node-local rank torchrun also writes, nor digits after a word that
    ends in "rank"."""
    from vtrain.ingest.discover import rank_from_file_name

    assert rank_from_file_name(Path(name)) == rank
