"""What the measured iterations say about the ranks that is worth a warning: a rank in none or only some of the
iterations the others profiled, ranks whose clocks disagree, and ranks whose steps are numbered apart from the
others' (renumbered); and which steps are iterations at all (a step that holds nothing is none).

Both are usable input (the validation goes on) that changes what the figures mean, so each is a warning line and a
line in the report, never silence.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from vtrain.ingest.clocks import clocks_disagree, empty_steps, renumber_steps, renumbered_steps_warning, without_steps
from vtrain.replay.trace import KeptRank


def renumbered(trace_dir: Path, frame: pl.DataFrame, traces: list[KeptRank], shifts: dict[int, int]
               ) -> tuple[pl.DataFrame, str | None]:
    """A timeline frame with its steps numbered as the job's iterations, as `vtrain ingest` numbers them: a step that
    holds nothing numbered none (:func:`vtrain.ingest.clocks.empty_steps`: no iteration, measured and steady
    nowhere, its start no clock's; said where it is the rank's last, cut short by the profiler's stop:
    :func:`vtrain.validate.steady.cut_short`), and the steps of the ranks in ``shifts`` renumbered to the others'
    (those whose ``ProfilerStep#N`` numbers run apart from the others', as the replay graph found them:
    :func:`vtrain.ingest.clocks.step_shifts`); and the warning line saying they were renumbered (``None`` when
    every rank numbers its steps alike)."""
    line = renumbered_steps_warning(trace_dir, shifts, {trace.rank: trace.path for trace in traces})
    return renumber_steps(without_steps(frame, empty_steps(frame)), shifts), line


def rank_warnings(trace_dir: Path, traces: list[KeptRank], measured: pl.DataFrame) -> list[str]:
    """The warning lines for the ranks of ``trace_dir`` (``measured``: one row per rank and iteration, with
    ``start`` and ``time_us``, as :func:`vtrain.validate.timeline.iterations` gives)."""
    lines = ranks_outside_iterations(traces, measured)
    if line := clocks_disagree(trace_dir, measured):
        lines.append(line)
    return lines


def ranks_outside_iterations(traces: list[KeptRank], measured: pl.DataFrame) -> list[str]:
    """A warning line for each rank that is in none of the profiled iterations, or in only some, while other ranks
    are (its ProfilerStep#N spans pruned, or profiling started late on it): the measured iteration times are then
    those of the other ranks alone."""
    all_iterations = sorted(measured["iteration"].unique().to_list())
    held = dict(measured.group_by("rank").agg(pl.col("iteration").unique().sort()).iter_rows())
    lines = []
    for trace in traces:
        own = held.get(trace.rank, [])
        if not trace.replayable or len(own) == len(all_iterations):
            continue
        if not own:
            lines.append(f"{trace.path}: rank {trace.rank} is in none of the {len(all_iterations)} profiled "
                         f"iterations of the other ranks (no ProfilerStep#N spans of its own?): the measured "
                         f"iteration times are the other ranks' alone")
            continue
        missing = sorted(set(all_iterations) - set(own))
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        lines.append(f"{trace.path}: rank {trace.rank} is in {len(own)} of the {len(all_iterations)} profiled "
                     f"iterations (not in {shown}): those iterations' measured times are the other ranks' alone")
    return lines
