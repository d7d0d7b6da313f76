"""nccl-tests results as rows of the ``nccl_latency`` table.

Two layouts are read:

* vTrain's CSV (``allreduce_<N>gpu.csv``): ``size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)``,
  the out-of-place then the in-place timing of each message size, times in nanoseconds;
* the text the ``*_perf`` binaries print (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``...):
  the ``#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong`` table (older
  versions have no ``root`` column and say ``error`` for ``#wrong``), times in microseconds.

Each row combines the timings of one message size (out-of-place and in-place: ``count`` 2): ``median_us`` is their
median, ``p10_us``/``p90_us`` the fastest and the slowest of them (with so few timings these bound the true
percentiles), ``algbw_gbps`` = bytes / median time and ``busbw_gbps`` = algbw x
:func:`~vtrain.collective_cost.bus_bandwidth_factor`, as nccl-tests defines them. ``bytes`` is nccl-tests' size
column (for all-gather the output buffer, as in traces).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import polars as pl

from vtrain.collective_cost import with_bandwidths
from vtrain.errors import InputError, warn_input
from vtrain.importers._read import LINE, csv_rows, numbers, read_text
from vtrain.tables.store import conform

SOURCE = "nccl-tests"

#: nccl-tests' test names (``_perf`` and underscores dropped) -> vtrain's collective names
COLLECTIVES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv",
}

CSV_HEADER = ["size(B)", "count", "type", "time(ns)", "busbw(GB/s)", "time(ns)", "busbw(GB/s)"]
_CSV_COLUMNS = ["size(B)", "count", "type", "time(ns) out-of-place", "busbw(GB/s) out-of-place",
                "time(ns) in-place", "busbw(GB/s) in-place"]
_CSV_NAME = re.compile(r"^([A-Za-z_]+?)_(\d+)gpus?\.csv$")
_TEST_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_PERF_BINARY = re.compile(r"\b([a-z_]+?)_perf(?![a-z])")
#: a ``#  Rank  N Group  G Pid  P on  HOST device ...`` line (nccl-tests before 2.10 wrote no ``Group``: one group)
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)(?:\s+Group\s+(\d+))?.*?\son\s+(\S+)\s+device\b")
#: what launchers put before each line of a rank's output: ``mpirun --tag-output`` (``[1,0]<stdout>:``) and
#: ``srun --label`` (``0: ``, `` 0: `` padded beyond 10 tasks) and MPICH's ``-prepend-rank`` (``[0] ``)
_LAUNCHER_PREFIX = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:|\s*\d+: |\[\d+\] )")
_NRANKS = re.compile(r"\bnranks\s*[:=]?\s*(\d+)", re.IGNORECASE)


def read_nccl_tests(path: str | Path, group_size: int | None = None, nodes: int = 1,
                    collective: str | None = None) -> pl.DataFrame:
    """Read one nccl-tests result (vTrain's CSV layout or the ``*_perf`` text output) as ``nccl_latency`` rows.

    For the CSV layout the group size is ``group_size``, else the ``<N>`` of ``<name>_<N>gpu.csv``; for the text
    output it is the ranks of one group in the ``#  Rank  N Group  G ...`` lines, else an ``nranks`` header,
    else ``group_size`` (an error when the output says otherwise). The collective is ``collective`` (vtrain's
    name, e.g. ``"all_reduce"``), else the ``# Collective test starting: <test>_perf`` line or a
    ``<test>_perf`` binary name in the text, else the file name. ``nodes`` is the number of nodes the group
    spans, unless the ``#  Rank`` lines name more hosts for a group; ``device_type`` is ``"cuda"`` and
    ``source`` ``"nccl-tests"``. Lines a launcher prefixed with its rank (``mpirun --tag-output``, ``srun
    --label``) are read without the prefix.
    """
    path = Path(path)
    text = read_text(path)
    if collective is not None:
        collective = _known_collective(collective, path)
    first_line = next(line for line in text.splitlines() if line.strip())
    if first_line.replace(" ", "").lower().startswith("size(b)"):
        frame = _read_csv_layout(path, group_size, collective)
    else:
        frame = _read_perf_output(path, text, group_size, collective)
    keys = [column for column in ("collective", "group_size", "nodes", "bytes") if column in frame.columns]
    # a size timed twice (two runs in one output): one row of all its times
    frame = frame.group_by(keys, maintain_order=True).agg(pl.col("times_us").list.explode())
    frame = frame.with_columns(
        count=pl.col("times_us").list.len(), median_us=pl.col("times_us").list.median(),
        p10_us=pl.col("times_us").list.min(), p90_us=pl.col("times_us").list.max(),
        device_type=pl.lit("cuda"), source=pl.lit(SOURCE),
        nodes=pl.lit(nodes) if "nodes" not in frame.columns else pl.max_horizontal("nodes", pl.lit(nodes)),
    )
    if frame["group_size"].min() < 1:
        raise InputError(f"a group of {frame['group_size'].min()} GPUs: a collective needs one or more", path)
    return conform(with_bandwidths(frame), "nccl_latency")


def collective_name(test: str) -> str | None:
    """vtrain's collective name for an nccl-tests test or binary name (``all_reduce_perf``, ``allreduce``...)."""
    return COLLECTIVES.get(test.lower().removesuffix("_perf").replace("_", ""))


def _known_collective(name: str, path: Path) -> str:
    """vtrain's name for a collective given as vtrain or nccl-tests names it."""
    known = name if name in COLLECTIVES.values() else collective_name(name)
    if known is None:
        raise InputError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVES.values())})", path)
    return known


def _read_csv_layout(path: Path, group_size: int | None, collective: str | None) -> pl.DataFrame:
    names, rows = csv_rows(path)
    if names != CSV_HEADER:
        raise InputError(f"expected the columns {','.join(CSV_HEADER)}; found {','.join(names)}", path)
    match = _CSV_NAME.match(path.name)
    if group_size is None:
        if match is None:
            raise InputError("group size unknown: the file name is not <collective>_<N>gpu.csv and no group size "
                             "was given", path)
        group_size = int(match.group(2))
    if collective is None:
        collective = collective_name(match.group(1)) if match else None
        if collective is None:
            raise InputError("collective unknown: the file name does not start with an nccl-tests name "
                             "(allreduce, allgather, ...) and none was given", path)
    rows = numbers(rows.rename(dict(zip(rows.columns[:len(_CSV_COLUMNS)], _CSV_COLUMNS, strict=True))),
                   {"size(B)": pl.Int64, "time(ns) out-of-place": pl.Float64, "time(ns) in-place": pl.Float64}, path)
    return rows.select(
        collective=pl.lit(collective), group_size=pl.lit(group_size), bytes=pl.col("size(B)"),
        times_us=pl.concat_list(pl.col("time(ns) out-of-place") / 1e3, pl.col("time(ns) in-place") / 1e3),
    )


def _read_perf_output(path: Path, text: str, group_size: int | None, collective: str | None) -> pl.DataFrame:
    header: list[str] | None = None
    groups: Counter[str] = Counter()
    hosts: dict[str, set[str]] = {}
    ranks: Counter[tuple[str, str]] = Counter()  # (group, rank) -> how many times it is listed
    nranks: int | None = None
    tests: list[str] = []
    records: list[dict] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = _LAUNCHER_PREFIX.sub("", line)
        if line.lstrip().startswith("#"):
            words = line.lstrip().lstrip("#").split()
            if words[:3] == ["size", "count", "type"]:
                header = words
            elif rank := _RANK_LINE.match(line.strip()):
                group = rank.group(2) or "0"
                groups[group] += 1
                ranks[(group, rank.group(1))] += 1
                hosts.setdefault(group, set()).add(rank.group(3))
            elif starting := _TEST_STARTING.search(line):
                tests.append(starting.group(1))
            elif found := _NRANKS.search(line):
                nranks = int(found.group(1))
            continue
        tokens = line.split()
        if header is None or not tokens or not tokens[0].isdigit():
            continue  # text around the table (NCCL INFO lines, warnings)
        records.append({LINE: number, "tokens": tokens})
    if header is None or not records:
        raise InputError("no nccl-tests results: neither the size,count,type... table of a *_perf run nor "
                         f"the CSV layout ({','.join(CSV_HEADER)})", path)
    if twice := next((key for key, count in ranks.items() if count > 1), None):
        raise InputError(f"rank {twice[1]} is listed {ranks[twice]} times: the output holds several runs (appended, or "
                         f"one-GPU runs of a build without MPI started by a launcher), whose group sizes and times "
                         f"would be mixed; give one run per file", path)
    records = _without_a_cut_off_last_row(records, header, path)
    records = _without_wrong_results(records, header, path)
    _say_repeated_sizes(records, path)
    listed = _group_size(groups, nranks, path)
    if group_size is not None and listed is not None and group_size != listed:
        raise InputError(f"group size {group_size} was given but the output lists {listed} ranks per group", path)
    group_size = listed or group_size
    if group_size is None:
        raise InputError("group size unknown: the output has no '#  Rank' lines or nranks, and none was given",
                         path)
    collective = collective or _collective_from_text(text, tests, path)
    time_columns = [i for i, word in enumerate(header) if word == "time"]
    return pl.DataFrame({
        "collective": collective, "group_size": group_size, "nodes": max(map(len, hosts.values()), default=1),
        "bytes": [_integer(record, 0, header, path) for record in records],
        "times_us": [[_number(record, i, header, path) for i in time_columns] for record in records],
    }, schema={"collective": pl.String, "group_size": pl.Int32, "nodes": pl.Int32, "bytes": pl.Int64,
               "times_us": pl.List(pl.Float64)})


def _without_a_cut_off_last_row(records: list[dict], header: list[str], path: Path) -> list[dict]:
    """The rows without the last one when it has fewer fields than the header (the run was stopped, or the output
    copied, while it was written): left out and said. A short row before the last is refused (by :func:`_token`)."""
    last = records[-1]
    if len(records) < 2 or len(last["tokens"]) >= len(header):
        return records
    warn_input(f"its last row (line {last[LINE]}, {last['tokens'][0]} bytes) has {len(last['tokens'])} of the "
               f"header's {len(header)} fields, cut off as the run stopped or the output was copied: left out", path)
    return records[:-1]


def _without_wrong_results(records: list[dict], header: list[str], path: Path) -> list[dict]:
    """The rows whose results nccl-tests checked as right: a non-zero ``#wrong`` (``error`` in older versions)
    means the collective returned wrong data, and its time is not a measurement of it; said in one warning.
    ``N/A`` (``-c 0``: not checked) is kept."""
    checks = [i for i, word in enumerate(header) if word in ("#wrong", "wrong", "error")]

    def wrong(record: dict) -> bool:
        for i in checks:
            try:
                if i < len(record["tokens"]) and float(record["tokens"][i]) != 0:
                    return True
            except ValueError:  # N/A
                continue
        return False

    kept = [record for record in records if not wrong(record)]
    if len(kept) < len(records):
        warn_input(f"{len(records) - len(kept)} of its {len(records)} rows report wrong results (#wrong not 0: "
                   "nccl-tests found the collective's data wrong): left out", path)
    if not kept:
        raise InputError("every row reports wrong results (#wrong not 0): no measurement to read", path)
    return kept


def _say_repeated_sizes(records: list[dict], path: Path) -> None:
    """One warning for an output whose table gives a size more than once (two runs appended, ``-d all``): their
    times are all taken as samples of the size."""
    sizes = Counter(record["tokens"][0] for record in records)
    repeated = sum(1 for count in sizes.values() if count > 1)
    if repeated:
        warn_input(f"{repeated} of its {len(sizes)} message sizes are timed more than once (several runs or data "
                   "types in one output?): each size's times are taken together", path)


def _group_size(groups: Counter[str], nranks: int | None, path: Path) -> int | None:
    if groups:
        sizes = set(groups.values())
        if len(sizes) > 1:
            raise InputError(f"the '#  Rank' lines list groups of different sizes ({sorted(sizes)})", path)
        return sizes.pop()
    return nranks


def _collective_from_text(text: str, tests: list[str], path: Path) -> str:
    names = {collective_name(test) for test in tests} or {collective_name(binary)
                                                           for binary in _PERF_BINARY.findall(text)}
    names.discard(None)
    if not names:
        names = {collective_name(binary) for binary in _PERF_BINARY.findall(path.name)} - {None}
    if len(names) != 1:
        found = f"several ({', '.join(sorted(names))})" if names else "none"
        raise InputError(f"cannot tell the collective: the output names {found}; give it explicitly", path)
    return names.pop()


def _token(record: dict, index: int, header: list[str], path: Path) -> str:
    tokens = record["tokens"]
    if len(tokens) != len(header):
        raise InputError(f"line {record[LINE]}: {len(tokens)} fields where the table header has {len(header)}",
                         path)
    return tokens[index]


def _integer(record: dict, index: int, header: list[str], path: Path) -> int:
    return int(_token(record, index, header, path))  # the first token is known to be digits


def _number(record: dict, index: int, header: list[str], path: Path) -> float:
    token = _token(record, index, header, path)
    try:
        return float(token)
    except ValueError:
        raise InputError(f"line {record[LINE]}: {header[index]!r} is not a number: {token!r}", path) from None
