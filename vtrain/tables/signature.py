"""What an operator call's signature is: its name, input dims and input types as the profiler records them, but
for a GEMM called with an output argument.

Inductor (``torch.compile``) calls its GEMMs with one, ``extern_kernels.mm(a, b, out=buf)``, on CPUs and GPUs
alike, and the profiler records the ``out=`` tensor as one more input: ``aten::mm [[256, 512], [512, 128], [256,
128]]``, where an eager call records ``[[256, 512], [512, 128]]``. It is the result's shape, which the other inputs
already tell; with it, a compiled run's GEMMs were never the operators the model places (its prediction of a CPU
run found 7 % of its time measured, and put the GEMMs' 360 ms into host gaps). The signature leaves it out
(:func:`without_out_argument`), wherever calls are read: ingest's frames, a profile folder an older vtrain wrote
with it, and `vtrain validate`'s measured timeline (:func:`signatures_without_out`).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import polars as pl

from vtrain.tables.latency import SIGNATURE

#: the GEMM operators that take an output argument, and their inputs without it (``addmm``: the bias, the two
#: matrices, beta and alpha)
GEMM_INPUTS = {"aten::mm": 2, "aten::bmm": 2, "aten::addmm": 5, "aten::baddbmm": 5, "aten::addbmm": 5}

#: the tables of a profile whose rows carry an operator's signature, and the column of its name
SIGNED_TABLES = {"cpu_ops": "name", "kernels": "cpu_op", "op_latency": "op"}


@lru_cache(maxsize=4096)
def without_out_argument(name: str, dims: str | None, types: str | None = None) -> tuple[str | None, str | None]:
    """A call's input dims and types (JSON texts) without its output argument: those of a GEMM of
    :data:`GEMM_INPUTS` that has one more input than it takes, the result's shape; any other call's as they are.
    The texts keep their spacing (ingest writes ``[[8, 64]]``, the replay ``[[8,64]]``); types that are not one a
    dim stay as they are."""
    inputs = GEMM_INPUTS.get(name)
    if inputs is None or dims is None:
        return dims, types
    parsed = _parsed(dims)
    if len(parsed) != inputs + 1 or parsed[-1] != _result_shape(name, parsed[:inputs]):
        return dims, types
    dtypes = _parsed(types) if types is not None else []
    return _without_last(parsed, dims), _without_last(dtypes, types) if len(dtypes) == len(parsed) else types


def _parsed(text: str) -> list[Any]:
    """A JSON list's items; none for a text that is no list."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return []
    return value if isinstance(value, list) else []


def _result_shape(name: str, inputs: list[Any]) -> list[int] | None:
    """The shape of a GEMM's result, from its last two matrix inputs ([..., m, k] x [..., k, n]): [..., m, n], the
    batch summed away by ``addbmm``; None without two matrices."""
    matrices = [d for d in inputs if isinstance(d, list) and len(d) >= 2 and all(type(x) is int for x in d)]
    if len(matrices) < 2:
        return None
    a, b = matrices[-2], matrices[-1]
    return (a[-2:-1] if name == "aten::addbmm" else a[:-1]) + b[-1:]


def _without_last(items: list[Any], text: str) -> str:
    """The text of a JSON list without its last item, spaced as ``text`` is."""
    compact = ", " not in text
    return json.dumps(items[:-1], separators=(",", ":") if compact else None)


def signatures_without_out(frame: pl.DataFrame, op: str) -> pl.DataFrame:
    """``frame`` with the signature of every call (its operator in column ``op``, ``input_dims`` and, where the
    frame has it, ``input_types``) without its output argument (:func:`without_out_argument`); the same frame
    where no call has one."""
    columns = [column for column in ("input_dims", "input_types") if column in frame.columns]
    keys = [op, *columns]
    calls = frame.filter(pl.col(op).cast(pl.String).is_in(list(GEMM_INPUTS))).select(keys).unique()
    changed = []
    for key in calls.iter_rows():
        texts = tuple(None if text is None else str(text) for text in key)
        signature = without_out_argument(*texts)[:len(columns)]
        if signature != texts[1:]:
            changed.append((*key, *signature))
    if not changed:
        return frame
    new = [f"_{column}" for column in columns]
    table = pl.DataFrame(changed, schema={**{k: calls.schema[k] for k in keys}, **dict.fromkeys(new, pl.String)},
                         orient="row")
    return (frame.join(table, on=keys, how="left", nulls_equal=True, maintain_order="left")
            .with_columns([pl.coalesce(pl.col(f"_{column}").cast(frame.schema[column]), column).alias(column)
                           for column in columns])
            .drop(new))


def read_signatures(frame: pl.DataFrame, table: str) -> pl.DataFrame:
    """A profile folder's table, which an older vtrain may have written with GEMMs' output arguments, with its calls'
    signatures without them (:func:`signatures_without_out`); in ``op_latency``, where two rows become one signature
    (a GEMM called with and without one), the row of more calls stays."""
    op = SIGNED_TABLES.get(table)
    if op is None:
        return frame
    frame = signatures_without_out(frame, op)
    if table != "op_latency" or not frame.select(SIGNATURE).is_duplicated().any():
        return frame
    return (frame.with_row_index("_row").sort("count", "_row", descending=[True, False])
            .unique(SIGNATURE, keep="first", maintain_order=True).sort("_row").drop("_row"))
