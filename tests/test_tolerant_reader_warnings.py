"""What the tolerant reader of `vtrain validate` and `vtrain whatif` (vtrain.replay.trace) reads loosely or leaves
out is said, one warning line per rank file, as `vtrain ingest` says what it leaves out (an audit found these read in
silence). Each input is made in tmp_path from a small real trace shipped in the repo (traces/wild/mi250-rocm: an
MI250 ROCm trace, 14 kernels).

- Entries of ``traceEvents`` that are not objects, complete events without a category, and events with a time or
  duration beyond a float's range (``1e400``, or an integer of 400 digits: that one was a traceback) are left out;
  events whose name is not text are kept with an empty name, events whose ``args`` are not an object without their
  args; all said in one "malformed events" line (`vtrain ingest` fails the file for most of them).
- Complete events without a name are kept with an empty name and said, by ingest as by the replay.
- A file named for one rank whose ``distributedInfo.rank`` says another is read as the trace's rank, and said, by
  ingest as by the replay (one check: vtrain.ingest.discover.rank_and_world_size).
- The shipped traces give none of these warnings.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TRACES, vtrain_in_process
from tests.test_hostile_trace_audit import COMMANDS, rank_of
from vtrain.replay.trace import read_trace_set, trace_set_warnings

SOURCE = TRACES / "wild" / "mi250-rocm" / "rank-0.json.gz"
#: written as the JSON number 1e400, which json.dumps cannot write
TOO_LARGE = "TOO-LARGE-FOR-A-FLOAT"
NEW_WARNINGS = ("malformed events", "the file name says rank")


def write_trace(folder: Path, change: Callable[[dict], None], name: str = "rank-0.json") -> Path:
    """The shipped MI250 trace, edited by ``change`` (the whole document), written to ``folder/name`` as plain
    JSON (the string :data:`TOO_LARGE` as the number ``1e400``)."""
    document = json.loads(gzip.decompress(SOURCE.read_bytes()))
    change(document)
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(document).replace(f'"{TOO_LARGE}"', "1e400"))
    return path


def events_of(category: str) -> Callable[[dict], list[dict]]:
    """The events of a category of the document."""
    return lambda document: [e for e in document["traceEvents"] if isinstance(e, dict) and e.get("cat") == category]


kernels, cpu_ops = events_of("kernel"), events_of("cpu_op")


def not_objects(document: dict) -> None:
    document["traceEvents"][3:3] = [42, "event", [1, 2], None]


def infinite_times(document: dict) -> None:
    cpu_ops(document)[0]["dur"] = TOO_LARGE
    cpu_ops(document)[1]["ts"] = TOO_LARGE
    cpu_ops(document)[2]["dur"] = 10 ** 400  # an integer: no float holds it (it was a traceback)


def no_category(document: dict) -> None:
    events_of("Trace")(document)[0]["cat"] = 5


def no_names(document: dict) -> None:
    del kernels(document)[1]["name"]
    cpu_ops(document)[3]["name"] = ""


def names_not_text(document: dict) -> None:
    kernels(document)[2]["name"] = 7
    cpu_ops(document)[4]["name"] = ["a"]


def args_not_an_object(document: dict) -> None:
    cpu_ops(document)[5]["args"] = [1, 2]


def times_as_text(document: dict) -> None:
    """Times and a duration quoted, as some writers other than Kineto do (read silently before)."""
    for event in cpu_ops(document)[6:8]:
        event["ts"] = str(event["ts"])
    kernels(document)[3]["dur"] = str(kernels(document)[3]["dur"])


def durations_as_text(document: dict) -> None:
    """Durations quoted, the times not: ingest's fast decoder read them as numbers without a word."""
    for event in kernels(document)[:2]:
        event["dur"] = str(event["dur"])


CASES = {  # in the order the warning says them: change, what the warning says of it, events left out
    "not-objects": (not_objects, "4 entries of traceEvents that are not objects (left out)", 0),
    "infinite": (infinite_times, "3 with a time or duration beyond a float's range, such as 1e400 (left out)", 3),
    "no-category": (no_category, "1 without a category or with one that is not text (left out)", 0),
    "no-names": (no_names, "2 without a name (kept, with an empty name)", 0),
    "names-not-text": (names_not_text, "2 with a name that is not text (kept, with an empty name)", 0),
    "args-not-an-object": (args_not_an_object, "1 with args that are not an object (kept, without their args)", 0),
    "times-as-text": (times_as_text, '3 times or durations written as text, "ts": "1234.5" (read as the numbers '
                                     'they hold)', 0),
}


@pytest.mark.parametrize("case", CASES)
def test_the_replay_reader_says_what_it_read_loosely(case: str, tmp_path: Path) -> None:
    change, said, left_out = CASES[case]
    path = write_trace(tmp_path, change)
    whole = read_trace_set(SOURCE.parent)[0]
    trace = read_trace_set(tmp_path)[0]
    assert trace_set_warnings(tmp_path, [trace], None) == [f"{path}: malformed events: {said}"]
    assert len(trace) == len(whole) - left_out  # what is said to be kept is kept, what is left out is not
    assert all(map(math.isfinite, list(trace.ts) + list(trace.dur)))
    assert trace.name.count("") == (2 if case in ("no-names", "names-not-text") else 0)


def every_kind(document: dict) -> None:
    """Every malformed event of :data:`CASES` in one file, which also says another rank than its name's."""
    for change, _, _ in CASES.values():
        change(document)
    rank_of(0, 4)(document)


@pytest.mark.parametrize("command", ["validate", "whatif"])
def test_one_line_per_file_in_validate_and_whatif(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    path = write_trace(traces, every_kind, "rank-3.json")
    ran = vtrain_in_process(*COMMANDS[command](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.splitlines()
    assert [line for line in lines if "malformed events" in line] == [
        f"warning: {path}: malformed events: " + "; ".join(said for _, said, _ in CASES.values())]
    assert (f"warning: {path}: the file name says rank 3 but its distributedInfo.rank is 0: read as rank 0, as the "
            f"trace says") in lines
    assert f"warning: {traces}: 3 of 4 ranks have no trace file (missing: 1, 2, 3)" in lines


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_rank_its_name_contradicts_is_the_traces_and_said(command: str, tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    path = write_trace(traces, rank_of(3, 4))
    ran = vtrain_in_process(*COMMANDS[command](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.splitlines()
    assert lines.count(f"warning: {path}: the file name says rank 0 but its distributedInfo.rank is 3: read as rank "
                       f"3, as the trace says") == 1
    assert f"warning: {traces}: 3 of 4 ranks have no trace file (missing: 0, 1, 2)" in lines


#: what ingest reads loosely and says in the same words as the replay: the file's change and its warning
SAID_BY_EVERY_COMMAND = {"no-names": (no_names, "2 without a name (kept, with an empty name)"),
                         "times-as-text": CASES["times-as-text"][:2],
                         "durations-as-text": (durations_as_text, '2 times or durations written as text, "ts": '
                                                                  '"1234.5" (read as the numbers they hold)')}


@pytest.mark.parametrize("case", SAID_BY_EVERY_COMMAND)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_what_every_command_reads_loosely_is_said(command: str, case: str, tmp_path: Path) -> None:
    change, said = SAID_BY_EVERY_COMMAND[case]
    traces = tmp_path / "traces"
    path = write_trace(traces, change)
    ran = vtrain_in_process(*COMMANDS[command](traces, tmp_path / "out"))
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    assert f"warning: {path}: malformed events: {said}" in ran.stderr.splitlines()


SHIPPED = [TRACES / "hta-a100-2rank-nccl", TRACES / "gpu" / "h200-small-eager", TRACES / "t1p1d2"]


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda folder: folder.name)
def test_shipped_traces_give_none_of_these_warnings(folder: Path, shipped_traces, tmp_path: Path) -> None:
    warned = trace_set_warnings(folder, shipped_traces(folder), None)
    assert not [line for line in warned if any(new in line for new in NEW_WARNINGS)], warned
    if folder != SHIPPED[-1]:  # ingest is strict about the rest; the largest folder is spared
        ran = vtrain_in_process("ingest", folder, "-o", tmp_path / "profile")
        assert ran.returncode == 0 and not any(new in ran.stderr for new in NEW_WARNINGS), ran.stderr
