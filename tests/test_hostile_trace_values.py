"""Trace values and names a fuzzing session over the shipped traces found unhandled (session 31): each is one line and
exit 2, or a warning and a result, never a traceback or a report half-made.

- A folder named with bytes that are no UTF-8 (a Latin-1 name from an old host or an archive) failed `validate` and
  `whatif` once their work was done, writing the report.
- ProfilerStep#N spans of no length (their iterations hold no event) ended `whatif` in a traceback after its report
  was written, `validate` said the traces had no events the replay can use (they hold 1,140 kernels), and `ingest`
  said nothing.
- A rank beyond 32 bits in a file name, a device number beyond 32 bits, a collective's group size beyond 32 bits:
  tracebacks from the tables' 32-bit columns; a world size of 10^8 ran for minutes, 2^31 until the kernel killed it.
- A device name holding a line break printed a line of its own in ingest's summary.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process

H100 = REPO / "traces" / "gpu" / "h100-small-eager"
MI250 = REPO / "traces" / "wild" / "mi250-rocm" / "rank-0.json.gz"


def _trace(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _write(folder: Path, trace: dict, name: str = "rank-0.json.gz") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(gzip.compress(json.dumps(trace).encode()))
    return folder


def _one_line_refusal(ran, *words: str) -> None:
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and all(word in lines[0] for word in words), lines


@pytest.mark.parametrize("command", [["validate", "--no-hta"], ["whatif", "--scale", "gemm=0.5"]])
def test_a_folder_named_in_bytes_that_are_no_utf8_gets_its_report(command: list[str], tmp_path: Path) -> None:
    folder = Path(os.fsdecode(str(tmp_path).encode() + b"/traces-\xff"))
    folder.mkdir()
    shutil.copy(H100 / "rank-0.json.gz", folder)
    ran = vtrain_in_process(command[0], folder, *command[1:], "-o", tmp_path / "report")
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert "traces-\\udcff" in (tmp_path / "report" / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", [["validate", "--no-hta"], ["whatif", "--scale", "gemm=0.5"]])
def test_steps_of_no_length_are_one_line_and_no_report(command: list[str], tmp_path: Path) -> None:
    trace = _trace(H100 / "rank-0.json.gz")
    for event in trace["traceEvents"]:
        if str(event.get("name", "")).startswith("ProfilerStep#"):
            event["dur"] = 0
    folder = _write(tmp_path / "steps", trace)
    ran = vtrain_in_process(command[0], folder, *command[1:], "-o", tmp_path / "report")
    _one_line_refusal(ran, "3 ProfilerStep#N spans hold none of its events")
    assert not (tmp_path / "report").exists()


def test_steps_of_no_length_are_said_by_ingest(tmp_path: Path) -> None:
    """It said "3 iterations" and nothing else."""
    trace = _trace(H100 / "rank-0.json.gz")
    for event in trace["traceEvents"]:
        if str(event.get("name", "")).startswith("ProfilerStep#"):
            event["dur"] = 0
    ran = vtrain_in_process("ingest", _write(tmp_path / "steps", trace), "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert "its 3 ProfilerStep#N spans hold none of its events" in ran.stderr


@pytest.mark.parametrize("command", [["ingest"], ["validate", "--no-hta"], ["whatif", "--scale", "gemm=0.5"]])
@pytest.mark.parametrize(("name", "world", "said"), [
    ("trace_rank-3000000000.json.gz", None, "rank 3,000,000,000 is beyond"),
    ("rank-0.json.gz", 10**8, "world size 100,000,000 is beyond"),
])
def test_ranks_and_worlds_beyond_any_job_are_one_line(command: list[str], name: str, world: int | None, said: str,
                                                      tmp_path: Path) -> None:
    trace = _trace(MI250)
    if world is not None:
        trace["distributedInfo"] = {"rank": 0, "world_size": world}
    folder = _write(tmp_path / "traces", trace, name)
    _one_line_refusal(vtrain_in_process(command[0], folder, *command[1:], "-o", tmp_path / "out"), said)


def test_a_device_number_beyond_32_bits_is_a_malformed_event(tmp_path: Path) -> None:
    trace = _trace(H100 / "rank-0.json.gz")
    for event in trace["traceEvents"]:
        if event.get("cat") == "kernel":
            event["args"]["device"] = 2**40
    folder = _write(tmp_path / "traces", trace)
    _one_line_refusal(vtrain_in_process("ingest", folder, "-o", tmp_path / "profile"), "args.device")
    validated = vtrain_in_process("validate", folder, "--no-hta", "-o", tmp_path / "report")  # reads it loosely
    assert validated.returncode == 0 and "Traceback" not in validated.stderr, validated.stderr


def test_a_group_size_beyond_32_bits_is_read_as_absent(tmp_path: Path) -> None:
    trace = _trace(REPO / "traces" / "hta-a100-2rank-nccl" / "rank-0.json.gz")
    for event in trace["traceEvents"]:
        if isinstance(event.get("args"), dict) and "Group size" in event["args"]:
            event["args"]["Group size"] = 2**40
    folder = _write(tmp_path / "traces", trace)
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert "collectives carry a size no collective can have" in ran.stderr


def test_a_device_name_with_a_line_break_stays_on_its_line(tmp_path: Path) -> None:
    trace = _trace(H100 / "rank-0.json.gz")
    trace["deviceProperties"][0]["name"] = "NVIDIA H100\nerror: fake"
    folder = _write(tmp_path / "traces", trace)
    ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert not any(line.startswith("error:") for line in ran.stdout.splitlines())
    assert "on NVIDIA H100 error: fake" in ran.stdout.splitlines()[0]


def _in_nanoseconds(trace: dict, *, since_1970: bool) -> dict:
    """The trace as a tool writing integer nanoseconds would: since 1970 (in 2024, 1.7e18), or from its first event."""
    events = [event for event in trace["traceEvents"] if "ts" in event]
    first = min(event["ts"] for event in events)
    for event in events:
        event["ts"] = round((event["ts"] - first) * 1000) + (1_712_195_495_519_689_000 if since_1970 else 0)
        if "dur" in event:
            event["dur"] = round(event["dur"] * 1000)
    return trace


@pytest.mark.parametrize("since_1970, said", [(True, "the year 5000"), (False, "at the median")])
@pytest.mark.parametrize("command", [["ingest"], ["validate", "--no-hta"]])
def test_times_written_in_nanoseconds_are_said(command: list[str], since_1970: bool, said: str,
                                               tmp_path: Path) -> None:
    folder = _write(tmp_path / "ns", _in_nanoseconds(_trace(H100 / "rank-0.json.gz"), since_1970=since_1970))
    ran = vtrain_in_process(command[0], folder, *command[1:], "-o", tmp_path / "out")
    assert "Traceback" not in ran.stderr, ran.stderr
    assert [line for line in ran.stderr.splitlines() if "nanoseconds" in line and said in line], ran.stderr
    shipped = vtrain_in_process(command[0], H100, *command[1:], "-o", tmp_path / "shipped")
    assert shipped.returncode == 0 and "nanoseconds" not in shipped.stderr, shipped.stderr
