"""The clock check of `vtrain validate` (:func:`vtrain.ingest.clocks.clocks_disagree`) on iteration tables:
ranks of one job start each iteration within an iteration of each other; a rank further off is on another clock.
(The command itself, on a real folder with a rank's clock shifted: ``tests/test_validate_cli.py``.)"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from vtrain.ingest.clocks import clocks_disagree


def _iterations(offsets_us: dict[int, float], iteration_us: float = 500_000.0, count: int = 5) -> pl.DataFrame:
    """Rows of ``count`` iterations per rank, each rank's starts moved by its offset."""
    return pl.DataFrame([{"rank": rank, "iteration": i, "start": i * iteration_us + offset, "time_us": iteration_us}
                         for rank, offset in offsets_us.items() for i in range(1, count + 1)])


def test_a_pipeline_stagger_is_not_a_clock() -> None:
    """Later pipeline stages start their step up to a bubble later: less than an iteration."""
    assert clocks_disagree(Path("run"), _iterations({0: 0.0, 1: 120_000.0, 2: 240_000.0, 3: 360_000.0})) is None
    assert clocks_disagree(Path("run"), _iterations({0: 0.0})) is None  # one rank: nothing to compare


def test_the_rank_off_the_clock_is_named_against_a_typical_one() -> None:
    line = clocks_disagree(Path("run"), _iterations({0: 0.0, 1: 1_000.0, 2: -2.5e6, 3: 0.0}))
    assert line is not None and "rank 2 -2.50" in line and "from rank 0" in line
    assert "rank 1 " not in line and "rank 3 " not in line
