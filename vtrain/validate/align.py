"""Aligning a predicted timeline with the measured one: spans by their recorded names, operators by sequence.

* Spans (``vtrain/...`` names, see :mod:`vtrain.naming`) are matched by rank, name and occurrence.
* Operators of a replay are the measured events themselves, matched one to one.
* Operators of a model prediction are matched per rank and iteration by aligning the two sequences of operator
  signatures (name and input dims; kernel name on GPUs) in time order (:class:`difflib.SequenceMatcher`, the
  longest common blocks first), then pairing what is left by signature; the rest is reported as found on one
  side only.
"""

from __future__ import annotations

from collections import defaultdict
from difflib import SequenceMatcher

import polars as pl

_SPAN_COLUMNS = ["rank", "iteration", "name", "span_kind", "phase", "stage", "mb", "purpose", "op"]
_ALIGNED_SCHEMA = {"rank": pl.Int32, "iteration": pl.Int64, "name": pl.String, "op_class": pl.String,
                   "measured_us": pl.Float64, "predicted_us": pl.Float64}


def align_spans(measured: pl.DataFrame, predicted: pl.DataFrame, rank_map: dict[int, int] | None = None,
                iteration_map: dict[int, int] | None = None) -> pl.DataFrame:
    """Measured spans with the predicted duration of the same span (null when the prediction has none).

    ``rank_map`` / ``iteration_map`` send a measured rank / iteration to the predicted one (a model predicts one
    iteration of one representative rank per pipeline stage); identity when not given.
    """
    keyed = measured.with_columns(
        p_rank=_mapped("rank", rank_map, pl.Int32), p_iteration=_mapped("iteration", iteration_map, pl.Int64))
    other = predicted.select(p_rank=pl.col("rank"), p_iteration=pl.col("iteration"), name="name",
                             occurrence="occurrence", predicted_us="dur")
    return (
        keyed.join(other, on=["p_rank", "p_iteration", "name", "occurrence"], how="left")
        .select(*_SPAN_COLUMNS, measured_us="dur", predicted_us="predicted_us")
    )


def _mapped(column: str, mapping: dict[int, int] | None, dtype: pl.DataType) -> pl.Expr:
    if mapping is None:
        return pl.col(column).cast(dtype)
    return pl.col(column).replace_strict(mapping, default=None, return_dtype=dtype)


def align_events(measured: pl.DataFrame, predicted: pl.DataFrame) -> pl.DataFrame:
    """Operators of one timeline replayed: the same events, matched by rank and event number."""
    other = predicted.select("rank", "event", predicted_us="dur")
    return (
        measured.join(other, on=["rank", "event"], how="left")
        .select("rank", "iteration", name="signature", op_class="op_class", measured_us="dur",
                predicted_us="predicted_us")
    )


def align_sequences(measured: pl.DataFrame, predicted: pl.DataFrame, rank_map: dict[int, int],
                    predicted_iteration: int) -> pl.DataFrame:
    """Operators of a model prediction matched to the measured ones by sequence alignment of their names.

    Each measured rank and iteration is aligned with the predicted operators of ``rank_map[rank]``; unmatched
    operators of either side get a null on the other.
    """
    by_rank = {rank: group.sort("start") for (rank,), group in predicted.group_by("rank")}
    rows: list[tuple] = []
    for (rank, iteration), group in measured.group_by("rank", "iteration"):
        group = group.sort("start")
        mine = by_rank.get(rank_map.get(rank, -1))
        if mine is None:
            rows += [(rank, iteration, n, c, d, None)
                     for n, c, d in group.select("signature", "op_class", "dur").iter_rows()]
            continue
        rows += _aligned_rows(rank, iteration, group, mine)
    if not rows:
        return pl.DataFrame(schema=_ALIGNED_SCHEMA)
    return pl.DataFrame(rows, schema=_ALIGNED_SCHEMA, orient="row")


def _aligned_rows(rank: int, iteration: int, measured: pl.DataFrame, predicted: pl.DataFrame) -> list[tuple]:
    """Longest common blocks first; what is left is paired by signature in order of appearance (operators the
    two sides run in a different order); the rest is one side only."""
    m_names, m_class, m_dur = (measured[c].to_list() for c in ("signature", "op_class", "dur"))
    p_names, p_class, p_dur = (predicted[c].to_list() for c in ("signature", "op_class", "dur"))
    rows: list[tuple] = []
    left_m: dict[str, list[int]] = defaultdict(list)
    left_p: dict[str, list[int]] = defaultdict(list)
    matcher = SequenceMatcher(None, m_names, p_names, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            rows += [(rank, iteration, m_names[i], m_class[i], m_dur[i], p_dur[j])
                     for i, j in zip(range(i1, i2), range(j1, j2))]
            continue
        for i in range(i1, i2):
            left_m[m_names[i]].append(i)
        for j in range(j1, j2):
            left_p[p_names[j]].append(j)
    for name, mine in left_m.items():
        theirs = left_p.pop(name, [])
        rows += [(rank, iteration, name, m_class[i], m_dur[i], p_dur[j]) for i, j in zip(mine, theirs)]
        rows += [(rank, iteration, name, m_class[i], m_dur[i], None) for i in mine[len(theirs):]]
        rows += [(rank, iteration, name, p_class[j], None, p_dur[j]) for j in theirs[len(mine):]]
    for name, theirs in left_p.items():
        rows += [(rank, iteration, name, p_class[j], None, p_dur[j]) for j in theirs]
    return rows
