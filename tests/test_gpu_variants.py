"""GPUs as other clusters have them: the export parts (H800, A800: NVLink at 400 GB/s both ways), Grace Hopper
(GH200, 96 GB HBM3 or 144 GB HBM3e), AMD's MI300X; a die's variants share a profile; a model without a run of its own
goes on the profile's GPU.

Before, an H800 trace's run was no device vtrain knew (`validate` skipped its model prediction), ``NVIDIA GH200
480GB`` was read as an H200 (141 GB, 4.8 TB/s), and ``vtrain simulate llama-2-7b --profile profiles/h100`` ran the
H100's kernels on an A100's datasheet."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.devices.catalog import DATASHEET_DEVICES, canonical_device_name, same_die

H100_TRACE = REPO / "traces" / "gpu" / "h100-small-eager"


@pytest.mark.parametrize(("name", "meant"), [
    ("NVIDIA H800", "H800"), ("NVIDIA H800 PCIe", "H800-PCIe"), ("NVIDIA A800-SXM4-80GB", "A800-80GB"),
    ("NVIDIA A800 80GB PCIe", "A800-80GB-PCIe"), ("NVIDIA A800 40GB Active", "A800-40GB-PCIe"),
    ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA GH200 144G HBM3e", "GH200-144GB"), ("NVIDIA H200", "H200"),
    ("AMD Instinct MI300X", "MI300X"), ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"), ("NVIDIA H20", "H20"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"), ("NVIDIA L4", "L4"), ("AMD Instinct MI250X / MI250", "MI250X"),
    ("AMD Instinct MI250", "MI250"), ("AMD Instinct MI325X", "MI325X"), ("AMD Radeon Graphics", None),
    ("NVIDIA GeForce RTX 4090", None), ("Tesla T4", None),
    # another digit after a part's name is another part: an RTX A1000 was simulated as an A100, "H1000" as an H100
    ("NVIDIA RTX A1000", None), ("A1000", None), ("H1000", None), ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("A100_80GB", "A100-80GB"),
])
def test_device_names_as_drivers_write_them(name: str, meant: str | None) -> None:
    assert canonical_device_name(name) == meant


def test_the_variants_datasheets() -> None:
    """What tells each variant from its die's first part: the link, the memory."""
    devices = DATASHEET_DEVICES
    assert devices["H800"].intra_node.bandwidth_gbps == 200 and devices["A800-80GB"].intra_node.bandwidth_gbps == 200
    assert devices["H800"].peak_for("c10::BFloat16") == devices["H100"].peak_for("c10::BFloat16")
    assert devices["GH200"].memory_bytes == 96 * 2**30 and devices["GH200"].memory_bandwidth == pytest.approx(4.0e12)
    assert devices["GH200-144GB"].memory_bytes == 144 * 2**30
    assert devices["MI300X"].peak_for("c10::BFloat16") == pytest.approx(1307e12)


@pytest.mark.parametrize(("one", "other", "same"), [
    ("H100", "NVIDIA H800", True), ("H100", "H200", True), ("NVIDIA GH200 480GB", "H100 PCIe", True),
    ("A100-40GB", "NVIDIA A800-SXM4-80GB", True), ("A100-40GB", "H100", False), ("H100", "MI300X", False),
    ("V100", "A100-80GB", False),
])
def test_which_gpus_share_a_die(one: str, other: str, same: bool) -> None:
    assert same_die(one, other) is same


def simulate(*args: object) -> dict:
    ran = vtrain_in_process("simulate", "llama-2-7b", "--global-batch", "8", "--json", *args)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_an_h800_run_on_the_h100_profile_is_the_h100_with_slower_links() -> None:
    """One GPU: the same kernels, the same time; eight: the tensor-parallel all-reduces run at 200 GB/s, not the
    H100's 450."""
    profile = ("--profile", REPO / "profiles" / "h100")
    alone = [simulate(*profile, "--device", device) for device in ("H100", "NVIDIA H800")]
    assert alone[1]["iteration_time_ms"] == pytest.approx(alone[0]["iteration_time_ms"], rel=1e-9)
    wide = [simulate(*profile, "--tp", "8", "--device", device) for device in ("H100", "NVIDIA H800")]
    assert wide[1]["device"]["name"] == "H800"
    assert wide[1]["breakdown_ms"]["tp"] > 1.8 * wide[0]["breakdown_ms"]["tp"]
    assert wide[1]["breakdown_ms"]["compute"] == pytest.approx(wide[0]["breakdown_ms"]["compute"], rel=1e-9)


def test_a_gh200_run_on_the_h100_profile_moves_its_bytes_faster() -> None:
    """The H100 profile's kernel efficiencies on GH200's 4.0 TB/s: memory-bound work is quicker, no GEMM slower."""
    profile = ("--profile", REPO / "profiles" / "h100")
    h100, gh200 = (simulate(*profile, "--device", device) for device in ("H100", "NVIDIA GH200 480GB"))
    assert gh200["device"]["name"] == "GH200"
    assert gh200["breakdown_ms"]["compute"] < 0.97 * h100["breakdown_ms"]["compute"]


def test_a_model_without_a_run_goes_on_the_profiles_gpu() -> None:
    """A published architecture's name with the H100 profile: on an H100, as ``--device H100`` puts it (it went on
    an A100 with a warning that the profile's device model was not used)."""
    profile = ("--profile", REPO / "profiles" / "h100")
    ran = vtrain_in_process("simulate", "llama-2-7b", "--global-batch", "8", "--json", *profile)
    assert ran.returncode == 0 and "not used" not in ran.stderr, ran.stderr
    assert json.loads(ran.stdout) == simulate(*profile, "--device", "H100")


def _renamed_trace(target: Path, gpu: str) -> Path:
    """The H100 recording as if made on ``gpu``: its traces' and run's device names replaced."""
    target.mkdir()
    trace = gzip.decompress((H100_TRACE / "rank-0.json.gz").read_bytes()).decode()
    assert "NVIDIA H100 80GB HBM3" in trace
    (target / "rank-0.json.gz").write_bytes(gzip.compress(trace.replace("NVIDIA H100 80GB HBM3", gpu).encode()))
    run = (H100_TRACE / "run.yaml").read_text()
    (target / "run.yaml").write_text(run.replace("NVIDIA H100 80GB HBM3", gpu))
    return target


def test_a_trace_recorded_on_an_h800_is_validated_on_its_model(tmp_path: Path) -> None:
    """The model side of `validate` simulates the traced run on its own GPU (it said "unknown device")."""
    traces = _renamed_trace(tmp_path / "h800", "NVIDIA H800")
    ran = vtrain_in_process("validate", traces, "-o", tmp_path / "report", "--no-hta")
    assert ran.returncode == 0, ran.stderr
    assert "unknown device" not in ran.stderr and "model (vtrain simulate)" in ran.stdout


def test_a_profile_traced_on_an_unknown_gpu_says_where_a_bare_model_goes(tmp_path: Path) -> None:
    """An RTX 4090 recording (a GPU the catalog does not hold) ingested, then a model by name on it: one warning
    line naming the traced GPU and the datasheet used instead; the same prediction as on an A100."""
    traces = _renamed_trace(tmp_path / "rtx", "NVIDIA GeForce RTX 4090")
    assert vtrain_in_process("ingest", traces, "-o", tmp_path / "profile").returncode == 0
    ran = vtrain_in_process("simulate", "llama-2-7b", "--global-batch", "8", "--json", "--profile",
                            tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    said = [line for line in ran.stderr.splitlines() if "RTX 4090" in line]
    assert len(said) == 1 and "a GPU vtrain does not know" in said[0] and "A100" in said[0]
    assert json.loads(ran.stdout)["device"]["name"] == "A100-40GB"


def test_a_blackwell_recording_puts_a_bare_model_on_blackwell(tmp_path: Path) -> None:
    """A B200 recording (B200 and GB200 were no GPU vtrain knew): a model by name on its profile runs on the B200's
    datasheet, without a word of an unknown GPU."""
    traces = _renamed_trace(tmp_path / "b200", "NVIDIA B200")
    assert vtrain_in_process("ingest", traces, "-o", tmp_path / "profile").returncode == 0
    ran = vtrain_in_process("simulate", "llama-2-7b", "--global-batch", "8", "--json", "--profile",
                            tmp_path / "profile")
    assert ran.returncode == 0, ran.stderr
    assert "does not know" not in ran.stderr and json.loads(ran.stdout)["device"]["name"] == "B200"


def test_a_plan_for_a_model_given_by_its_shape_runs_on_the_profiles_gpu(tmp_path: Path) -> None:
    """`vtrain plan --layers ... --profile profiles/h100` plans H100s (their memory prunes, their roofline times):
    the default price's warning names them."""
    ran = vtrain_in_process("plan", "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq", "1024",
                            "--global-batch", "16", "--gpus", "4", "--profile", REPO / "profiles" / "h100", "-o",
                            tmp_path / "plans", "--json")
    assert ran.returncode == 0, ran.stderr
    assert "the plans run on H100" in ran.stderr


@pytest.mark.parametrize("device", ["H20", "H100-PCIe"])
def test_a_cut_down_variant_is_not_timed_by_the_latencies_measured_on_the_full_part(device: str) -> None:
    """An H20 (148 TFLOP/s of the H100's 989) with the H100 profile: the H100's measured and interpolated kernels
    timed 40 % of its work, so a plan of LLaMA-2-7B ran at 200 % MFU, faster than its peak allows (an audit); an
    H100-PCIe's (756) kernels, likewise. The profile's fitted device, on the variant's roofline, times it, and
    that is said; an H200 (the H100's peaks) keeps the measured latencies."""
    profile = ("--profile", REPO / "profiles" / "h100")
    shape = ("llama-2-7b", "--global-batch", "64", "--tp", "8", "--gpus", "8")
    ran = vtrain_in_process("simulate", *shape, *profile, "--device", device, "--json")
    assert ran.returncode == 0, ran.stderr
    assert f"the run is on {device}, a variant with" in ran.stderr and "measured latencies are not used" in ran.stderr
    cut = json.loads(ran.stdout)
    assert cut["coverage"]["measured"] == cut["coverage"]["interpolated"] == 0.0
    peak = DATASHEET_DEVICES[device].peak_for("c10::BFloat16") * 8
    flop = 6 * 6.74e9 * 64 * 4096  # LLaMA-2-7B's 6N per token, attention aside: a floor on the iteration's work
    assert cut["iteration_time_ms"] / 1e3 > flop / peak
    h200 = vtrain_in_process("simulate", *shape, *profile, "--device", "H200", "--json")
    assert "measured latencies are not used" not in h200.stderr
    assert json.loads(h200.stdout)["coverage"]["interpolated"] > 0.2


@pytest.mark.parametrize(("device", "trace"), [("H100", "gpu/h100-small-eager"), ("H200", "gpu/h200-small-eager"),
                                               ("V100", "hta-v100-1rank")])
def test_a_gpus_memory_is_what_it_reports_where_a_trace_says_it(device: str, trace: str) -> None:
    """An "80 GB" H100 reports 79.18 GiB (its trace's deviceProperties.totalGlobalMem): plans at 79.9 GiB were called
    fitting (an audit). The capacity is the reported one, said as measured."""
    document = json.loads(gzip.decompress((REPO / "traces" / trace / "rank-0.json.gz").read_bytes()))
    reported = document["deviceProperties"][0]["totalGlobalMem"]
    assert DATASHEET_DEVICES[device].memory_bytes == reported
    assert DATASHEET_DEVICES[device].provenance["memory_bytes"] == "measured"


def test_a_profiles_device_says_where_its_memory_comes_from() -> None:
    """The profile's fitted device copied the provenance it was fitted with: an H100's memory, measured, read
    "datasheet" (a review); an A100-80GB's, moved onto from an A100-40GB profile, is the datasheet's."""
    h100 = simulate("--profile", REPO / "profiles" / "h100", "--device", "H100")
    assert h100["device"]["provenance"]["memory_bytes"] == "measured"
    a100 = simulate("--profile", REPO / "profiles" / "a100", "--device", "A100-80GB")
    assert a100["device"]["provenance"]["memory_bytes"] == "datasheet"
