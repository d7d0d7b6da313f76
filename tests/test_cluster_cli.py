"""`vtrain cluster` from the command line on the shipped A100 profile: JSON, files, and bad job files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process

PROFILE = REPO / "profiles" / "a100"

# two small GPT models (fast to plan) on a 4-GPU cluster; the second arrives later and asks for all 4 GPUs
JOBS = """\
jobs:
  - {name: small, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 2.0e+8, arrival_h: 0, gpus: 2}
  - {name: wide, layers: 8, hidden: 1024, heads: 16, seq: 256, tokens: 4.0e+8, arrival_h: 0.01, gpus: 4,
     deadline_h: 1000, global_batch: 64}
"""


def vtrain(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vtrain.cli.main", "cluster", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=600)


def test_both_policies_json_and_report(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    result = vtrain(jobs, "--gpus", 4, "--profile", PROFILE, "-o", out, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert "not interleaving, selective recomputation" in summary["plans_searched"]  # a narrower space than plan's
    for policy in ("baseline", "vtrain"):
        s = summary["policies"][policy]
        assert {"makespan_h", "mean_jct_h", "utilization", "jobs"} <= set(s)
        assert [j["name"] for j in s["jobs"]] == ["small", "wide"]
        assert 0 < s["utilization"] <= 1
        for job in s["jobs"]:
            assert job["start_h"] >= job["arrival_h"] and job["end_h"] > job["start_h"]
            assert all(seg["plan"].startswith("t") for seg in job["segments"])  # a plan from vtrain plan
    baseline = {j["name"]: j for j in summary["policies"]["baseline"]["jobs"]}
    # FIFO: "wide" asks for all 4 GPUs and waits for "small" to finish
    assert baseline["wide"]["start_h"] == pytest.approx(baseline["small"]["end_h"])
    assert [seg["gpus"] for seg in baseline["wide"]["segments"]] == [4]
    for name in ("report.md", "report.html", "schedule.json", "jobs.csv"):
        assert (out / name).is_file()
    assert "plotly" in (out / "report.html").read_text()[:5_000_000]


@pytest.mark.parametrize("text,message", [
    ("jobs: []\n", "no jobs"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, arrival_h: 0, gpus: 2}\n", "missing tokens"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpus: 8}\n",
     "asks for 8 GPUs, the cluster has 4"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0}\n",
     "the baseline policy needs gpus"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 500, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpus: 2}\n",
     "not divisible by heads"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: -5, arrival_h: 0, gpus: 2}\n",
     "tokens must be above 0"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpu: 2}\n",
     "unknown key gpu"),
    (("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpus: 2}\n"
      "  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpus: 2}\n"),
     "names must be unique"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, tokens: 1e+8, arrival_h: 0, gpus: 3}\n",
     "no plan runs it on the 3 GPUs"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, kv_heads: 3, seq: 256, tokens: 1e+8, arrival_h: 0}\n",
     "job 'a': heads (8) is not divisible by kv_heads (3)"),
    ("jobs:\n  - {name: a, layers: 4, hidden: 512, heads: 8, seq: 256, mlp: relu, tokens: 1e+8, arrival_h: 0}\n",
     "job 'a': mlp must be one of gelu, swiglu"),
])
def test_bad_job_files_get_one_line_and_nothing_written(tmp_path: Path, text: str, message: str) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(text)
    out = tmp_path / "out"
    # in this process (tests/conftest.py); the tests around run the command as a process
    result = vtrain_in_process("cluster", jobs, "--gpus", 4, "--profile", PROFILE, "-o", out)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {jobs}") and message in lines[0], result.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["jobs.yaml"]


def test_unknown_policy(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    result = vtrain(jobs, "--gpus", 4, "--profile", PROFILE, "--policy", "sjf")
    assert result.returncode == 2 and "--policy must be one of" in result.stderr


def test_llama_like_jobs(tmp_path: Path) -> None:
    """A job file says a LLaMA-like layer as a run config does (here with the reference model's kernels; the
    default, Megatron's, takes it too)."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  - {name: llama, layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn_hidden: 1376, "
                    "mlp: swiglu, seq: 256, tokens: 2.0e+8, arrival_h: 0, gpus: 2}\n")
    result = vtrain_in_process("cluster", jobs, "--gpus", 4, "--profile", PROFILE, "--framework", "reference",
                               "-o", tmp_path / "out", "--json")
    assert result.returncode == 0, result.stderr
    [job] = json.loads(result.stdout)["policies"]["vtrain"]["jobs"]
    assert job["name"] == "llama" and job["end_h"] > job["start_h"]
    # its whole layer (RMSNorm, rotary positions, no biases, its own output projection) under Megatron's kernels;
    # with the reference model's, one line naming the job
    jobs.write_text("jobs:\n  - {name: llama, layers: 4, hidden: 512, heads: 8, kv_heads: 2, ffn_hidden: 1376, "
                    "mlp: swiglu, norm: rmsnorm, position: rope, bias: false, tie_embeddings: false, seq: 256, "
                    "tokens: 2.0e+8, arrival_h: 0, gpus: 2}\n")
    result = vtrain_in_process("cluster", jobs, "--gpus", 4, "--profile", PROFILE, "-o", tmp_path / "whole", "--json")
    assert result.returncode == 0, result.stderr
    refused = vtrain_in_process("cluster", jobs, "--gpus", 4, "--framework", "reference", "-o", tmp_path / "x")
    assert refused.returncode == 2 and "job 'llama'" in refused.stderr and len(refused.stderr.splitlines()) == 1
