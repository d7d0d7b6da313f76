"""GEMMs called with an output argument (Inductor's ``extern_kernels.mm(a, b, out=buf)``), on the real traces of a
model trained under ``torch.compile`` (``tests/data/compiled-cpu``): the profiler records the ``out=`` tensor as one
more input, and the signature leaves it out, so that ingest's tables, the model's lookups and validate's comparison
see the GEMMs the model places. An audit found the compiled run's prediction with 7 % of its time measured, its
GEMMs' 360 ms put into host gaps and no GEMM row in its per-class table; and the same run recorded without shapes
blamed the run config."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.ingest.pipeline import ingest_to_folder, ingest_traces
from vtrain.tables.signature import GEMM_INPUTS, without_out_argument
from vtrain.tables.store import load_profile

COMPILED = REPO / "tests" / "data" / "compiled-cpu"
WITH_SHAPES, NO_SHAPES = COMPILED / "with-shapes", COMPILED / "no-shapes"
#: the run both recordings are of (tests/data/compiled-cpu/README.md)
RUN = """model: {layers: 2, hidden: 128, heads: 4, seq: 64, vocab: 512}
parallelism: {tp: 1, pp: 1, dp: 2, micro_batch: 4, global_batch: 16, schedule: 1f1b, recompute: none,
              dp_overlap: true, dp_bucket_mb: 25.0}
precision: fp32
hardware: {device: cpu, device_count: 2}
"""
UNMEASURED = "of the simulated operators' time was measured"


def _gemm_signatures(op_latency: pl.DataFrame) -> set[tuple[str, str, str]]:
    gemms = op_latency.filter(pl.col("op").is_in(list(GEMM_INPUTS)))
    return set(gemms.select("op", "input_dims", "input_types").iter_rows())


def _has_out_argument(operator: str) -> bool:
    """Whether an operator as a report names it (``aten::mm [[256,512],[512,128],[256,128]]``) has an output
    argument."""
    name, _, dims = operator.partition(" ")
    return bool(dims) and without_out_argument(name, dims)[0] != dims


def _validate(traces: Path, tmp_path: Path) -> tuple[str, dict]:
    """`vtrain validate` of ``traces`` with their run config: its warnings and its model side's metrics."""
    config = tmp_path / "run.yaml"
    config.write_text(RUN)
    ran = vtrain_in_process("validate", traces, "--config", config, "--no-hta", "-o", tmp_path / "report")
    assert ran.returncode == 0, ran.stderr
    return ran.stderr, json.loads((tmp_path / "report" / "metrics.json").read_text())["model"]


@pytest.mark.parametrize(("name", "dims", "types", "kept"), [
    ("aten::mm", "[[256, 512], [512, 128], [256, 128]]", '["float", "float", "float"]',
     ("[[256, 512], [512, 128]]", '["float", "float"]')),
    ("aten::addmm", "[[128],[256,512],[512,128],[],[],[256,128]]",  # compact, as the replay writes them
     '["float","float","float","Scalar","Scalar","float"]',
     ("[[128],[256,512],[512,128],[],[]]", '["float","float","float","Scalar","Scalar"]')),
    ("aten::bmm", "[[16, 64, 64], [16, 64, 32], [16, 64, 32]]", None, ("[[16, 64, 64], [16, 64, 32]]", None)),
    ("aten::baddbmm", "[[16, 64, 64], [16, 64, 32], [16, 32, 64], [], [], [16, 64, 64]]", None,
     ("[[16, 64, 64], [16, 64, 32], [16, 32, 64], [], []]", None)),
    ("aten::addbmm", "[[64, 64], [16, 64, 32], [16, 32, 64], [], [], [64, 64]]", None,
     ("[[64, 64], [16, 64, 32], [16, 32, 64], [], []]", None)),
    # real inputs stay: an eager GEMM's, a bias of the result's shape, another operator's, a third matrix of
    # another shape
    ("aten::mm", "[[256, 512], [512, 128]]", '["float", "float"]', None),
    ("aten::addmm", "[[256, 128], [256, 512], [512, 128], [], []]", None, None),
    ("aten::add", "[[256, 128], [256, 128], [256, 128]]", None, None),
    ("aten::mm", "[[256, 512], [512, 128], [512, 128]]", None, None),
])
def test_only_an_output_argument_of_the_results_shape_is_left_out(name: str, dims: str, types: str | None,
                                                                  kept: tuple[str, str | None] | None) -> None:
    assert without_out_argument(name, dims, types) == (kept or (dims, types))


def test_ingest_keys_compiled_gemms_as_the_model_places_them() -> None:
    """Every GEMM of the compiled run is in ``op_latency`` under its inputs alone: ``aten::mm [[256, 512], [512,
    128]]``, as an eager run records it and the model places it."""
    signatures = _gemm_signatures(ingest_traces(WITH_SHAPES).op_latency)
    assert ("aten::mm", "[[256, 512], [512, 128]]", '["float", "float"]') in signatures
    assert ("aten::addmm", "[[128], [256, 512], [512, 128], [], []]",
            '["float", "float", "float", "Scalar", "Scalar"]') in signatures
    assert ("aten::bmm", "[[16, 64, 64], [16, 64, 32]]", '["float", "float"]') in signatures
    assert all(len(json.loads(dims)) == GEMM_INPUTS[op] for op, dims, _ in signatures), signatures


def test_a_profile_written_with_output_arguments_is_read_without_them(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile folder an older vtrain wrote from compiled traces holds the output argument in its signatures
    (ingest as it was: the rule left out); read, its GEMMs are the model's, and its latencies those of the same
    traces ingested today."""
    today = ingest_traces(WITH_SHAPES)
    with monkeypatch.context() as patched:
        patched.setattr("vtrain.ingest.extract.signatures_without_out", lambda frame, op: frame)
        ingest_to_folder(WITH_SHAPES, tmp_path / "older")
    written = pl.read_parquet(tmp_path / "older" / "op_latency.parquet")
    assert any(len(json.loads(dims)) == 3 for op, dims, _ in _gemm_signatures(written) if op == "aten::mm")
    read = load_profile(tmp_path / "older")
    columns = ["op", "input_dims", "input_types", "count", "median_us"]
    assert set(read.op_latency.select(columns).iter_rows()) == set(today.op_latency.select(columns).iter_rows())
    assert read["cpu_ops"]["input_dims"].to_list() == today["cpu_ops"]["input_dims"].to_list()


def test_a_compiled_runs_gemms_are_measured(tmp_path: Path) -> None:
    """Validated with its own run config, the compiled run's GEMMs are found measured: 74 % of the simulated time
    (6 % before, its GEMMs modelled from the device and their measured time spread as host gaps: compute
    predicted 43 ms against 590 measured), the compute predicted within a quarter of the measured (-12 %), and
    the per-class table compares its GEMMs. No operator with an output argument is on one side alone, and no
    warning doubts the run config."""
    warnings, model = _validate(WITH_SHAPES, tmp_path)
    assert UNMEASURED not in warnings, warnings
    assert model["coverage"]["measured"] > 0.5, model["coverage"]
    compute = next(row for row in model["breakdown"] if row["category"] == "compute")
    assert compute["predicted_ms"] == pytest.approx(compute["measured_ms"], rel=0.25), compute
    assert "gemm" in [row["op_class"] for row in model["classes"]], model["classes"]
    assert not [row for row in model["one_side_only"] if _has_out_argument(row["op"])], model["one_side_only"]


def test_traces_without_shapes_say_so_in_one_line(tmp_path: Path) -> None:
    """The same run recorded with ``record_shapes=False``: nothing of the simulated time is measured, because no
    operator carries its shapes, not because the run config describes another run (it asked "does it describe
    these traces?"). One line says the traces' reason."""
    warnings, model = _validate(NO_SHAPES, tmp_path)
    said = [line for line in warnings.splitlines() if UNMEASURED in line]
    assert len(said) == 1, warnings
    assert said[0].startswith(f"warning: {NO_SHAPES}: ") and "record_shapes=True" in said[0], said
    assert "does it describe these traces?" not in said[0], said
    assert model["coverage"]["measured"] == 0.0
