"""PCIe (and NVL) cards: their own datasheet peaks, memory and links, not the SXM part of their family.

Before, ``H100 PCIe`` (756 TFLOP/s, 2.0 TB/s, PCIe Gen5 between GPUs) was read as the H100 SXM (989 TFLOP/s, 3.35
TB/s, NVLink) wherever a device is named: a table's device column, ``--device``, a trace's device name."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, vtrain_in_process
from vtrain.devices.catalog import DATASHEET_DEVICES, canonical_device_name


@pytest.mark.parametrize(("name", "meant"), [
    ("NVIDIA H100 PCIe", "H100-PCIe"), ("H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("H100-SXM5-80GB", "H100"), ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
    ("A100 80GB PCIe", "A100-80GB-PCIe"), ("NVIDIA A100-SXM4-80GB", "A100-80GB"), ("NVIDIA GH200 480GB", "GH200"),
])
def test_device_names_as_torch_and_tables_write_them(name: str, meant: str) -> None:
    assert canonical_device_name(name) == meant


def test_every_catalog_name_is_its_own_canonical_name() -> None:
    assert all(canonical_device_name(name) == name for name in DATASHEET_DEVICES)


def test_the_pcie_cards_datasheets() -> None:
    h100_pcie, h100 = DATASHEET_DEVICES["H100-PCIe"], DATASHEET_DEVICES["H100"]
    assert h100_pcie.peak_for("c10::BFloat16") == pytest.approx(756e12) and h100_pcie.sm_count == 114
    assert h100_pcie.memory_bandwidth == pytest.approx(2.0e12) and h100_pcie.intra_node.bandwidth_gbps == 64
    assert h100.intra_node.bandwidth_gbps == 450  # NVLink 4, per direction
    assert DATASHEET_DEVICES["A100-80GB-PCIe"].intra_node.bandwidth_gbps == 32  # PCIe Gen4 x16, per direction


def simulate(device: str) -> dict:
    ran = vtrain_in_process("simulate", "llama-2-7b", "--profile", REPO / "profiles" / "h100", "--tp", "4", "--dp",
                            "2", "--global-batch", "64", "--device", device, "--attention", "flash", "--json")
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def test_an_h100_pcie_run_on_the_h100_profile_takes_the_cards_roofline_and_links() -> None:
    """The profile's kernel efficiencies move onto the card's roofline (compute between 989/756 and 3,350/2,000
    slower: its tensor peak and its memory's bandwidth; the H100's measured kernels no longer time it, its peaks
    being another's); its tensor-parallel all-reduces run over PCIe Gen5, not on the NVLink curves the profile
    measured."""
    sxm, pcie = simulate("H100"), simulate("NVIDIA H100 PCIe")
    assert pcie["device"]["name"] == "H100-PCIe"
    assert 1.2 < pcie["breakdown_ms"]["compute"] / sxm["breakdown_ms"]["compute"] < 3350 / 2000 * 1.05
    assert pcie["breakdown_ms"]["tp"] > 4 * sxm["breakdown_ms"]["tp"]
    assert pcie["device"]["provenance"]["intra_node.bandwidth_gbps"] == "config"


def test_an_a100_80gb_run_on_the_a100_40gb_profile_keeps_the_measured_nvlink_curves() -> None:
    """Both SXM parts have NVLink: the variant takes the 80 GB part's roofline and keeps the profile's links."""
    def run(device: str) -> dict:
        ran = vtrain_in_process("simulate", "gpt-3-2.7b", "--profile", REPO / "profiles" / "a100", "--tp", "4",
                                "--global-batch", "8", "--device", device, "--json")
        assert ran.returncode == 0, ran.stderr
        return json.loads(ran.stdout)

    sxm, pcie = run("A100-80GB"), run("A100 80GB PCIe")
    assert sxm["device"]["provenance"]["intra_node.bandwidth_gbps"] != "config"
    assert sxm["coverage_ms"]["measured"] + sxm["coverage_ms"]["interpolated"] > 0  # the profile's nccl-tests
    assert pcie["breakdown_ms"]["tp"] > 4 * sxm["breakdown_ms"]["tp"]
