"""The cost-optimal comparison of a plan folder: which plans it picks and what they save."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from vtrain.cli.savings import main
from vtrain.errors import InputError
from vtrain.studies.savings import choices, savings_table


def plan(gpus: int, tp: int, dp: int, pp: int, days: float, usd: float, status: str = "simulated") -> dict:
    return {"gpus": gpus, "tp": tp, "dp": dp, "pp": pp, "micro_batch": 1, "schedule": "1f1b", "virtual_stages": 1,
            "recompute": "full", "dp_overlap": False, "status": status, "iteration_ms": days * 1000.0,
            "mfu": 0.3, "days": days, "usd": usd}


def folder(tmp_path: Path, reference: dict | None, plans: list[dict]) -> Path:
    (tmp_path / "summary.json").write_text(json.dumps({"reference": reference}))
    pl.DataFrame(plans).write_parquet(tmp_path / "plans.parquet")
    return tmp_path


def test_picks_and_savings(tmp_path: Path) -> None:
    original = plan(16, 8, 1, 2, days=10, usd=100)
    plans = [original,
             plan(16, 4, 2, 2, days=8, usd=80),      # best on the same GPUs
             plan(8, 8, 1, 1, days=12, usd=60),      # cheapest, slower
             plan(32, 8, 2, 2, days=5, usd=90),      # fastest (no slower than the original, but dearer than 80)
             plan(4, 4, 1, 1, days=1, usd=1, status="out_of_memory")]
    _, picked = choices(folder(tmp_path, original, plans))
    got = {c.why: (c.row["gpus"], c.row["tp"], c.row["dp"]) for c in picked}
    assert got == {"best plan on the same GPUs": (16, 4, 2), "cheapest plan no slower than the original": (16, 4, 2),
                   "cheapest plan": (8, 8, 1), "fastest plan": (32, 8, 2)}
    table = savings_table(tmp_path)
    assert "| +20.0% | +20.0% |" in table  # t4 d2: 8 of 10 days, 80 of 100 USD
    assert "| -20.0% | +40.0% |" in table  # the cheapest: 12 days, 60 USD


def test_a_folder_without_a_reference_is_refused(tmp_path: Path, capsys) -> None:
    folder(tmp_path, None, [plan(8, 8, 1, 1, days=1, usd=1)])
    with pytest.raises(InputError, match="no timed reference plan"):
        choices(tmp_path)
    assert main([str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
