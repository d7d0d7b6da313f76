"""Datasheet device models (dense tensor-core peaks) and the lookup by device name.

The SXM parts have NVLink between every GPU of a node. The PCIe cards (``H100-PCIe``, ``H100-NVL``,
``A100-40GB-PCIe``, ``A100-80GB-PCIe``, the A800 and H800 cards) have their own peaks, memory and SM counts, and talk
to the node's other GPUs over PCIe (Gen5 for H100, Gen4 for A100: the datasheet's per-direction rate; a pair joined
by an NVLink bridge is faster: ``--intra-node-gbps``). The export parts (``H800``, ``A800-80GB``) are the H100 and
A100 with NVLink at 400 GB/s both ways. Variants of one die (:data:`GPU_DIES`: the cards, the export parts, H200
and GH200 of the H100's) share a profile: one fitted on any of them times another's kernels on that one's roofline,
and its collectives on its links (:func:`vtrain.fit.device.on_gpu`).

Values marked ``datasheet`` are typed from NVIDIA's (AMD's for its parts) published specifications; values marked
``assumed`` are round typical numbers (kernel launch overhead, achieved efficiencies, link latencies, DGX-style
NICs) that calibration is expected to replace with fitted ones.
"""

from __future__ import annotations

import re
from dataclasses import replace

from vtrain.collective_cost import Link
from vtrain.devices.cpu import measured_cpu
from vtrain.devices.model import DeviceModel
from vtrain.errors import InputError
from vtrain.runconfig import RunConfig

TERA = 1e12
GB = 1e9

_ASSUMED = ("launch_overhead_us", "gemm_efficiency", "memory_efficiency", "intra_node.alpha_us",
            "inter_node.alpha_us", "inter_node.bandwidth_gbps")
_DATASHEET = ("peak_flops", "memory_bandwidth", "intra_node.bandwidth_gbps", "memory_bytes", "sm_count")
_PROVENANCE = {**{key: "datasheet" for key in _DATASHEET}, **{key: "assumed" for key in _ASSUMED}}


#: the memory a GPU reports (``torch.cuda.get_device_properties().total_memory``, Kineto's
#: ``deviceProperties.totalGlobalMem``), where a real trace in this repository records it: what a run can allocate
#: at most, a little under the datasheet's (an "80 GB" H100 has 79.18 GiB); other GPUs keep their datasheet's size
REPORTED_MEMORY_BYTES = {
    "H100": 85_017_493_504,  # NVIDIA H100 80GB HBM3: traces/gpu/h100-small-eager
    "H200": 150_109_880_320,  # NVIDIA H200: traces/gpu/h200-small-eager
    "V100": 34_079_637_504,  # Tesla V100-SXM2-32GB: traces/hta-v100-1rank (HTA's test data)
}


def _gpu(name: str, fp16_tflops: float, fp32_tflops: float, bf16: bool, mem_gbs: float, nvlink_gbs: float,
         nic_gbits: float, memory_gb: int, sm_count: int) -> DeviceModel:
    peaks = {"float": fp32_tflops * TERA, "c10::Half": fp16_tflops * TERA}
    if bf16:
        peaks["c10::BFloat16"] = fp16_tflops * TERA
    provenance = dict(_PROVENANCE)
    if name in REPORTED_MEMORY_BYTES:
        provenance["memory_bytes"] = "measured"
    return DeviceModel(
        name=name, peak_flops=peaks, memory_bandwidth=mem_gbs * GB, launch_overhead_us=4.0,
        gemm_efficiency=0.7, memory_efficiency=0.8,
        intra_node=Link(alpha_us=2.0, bandwidth_gbps=nvlink_gbs),  # NVLink, per direction
        inter_node=Link(alpha_us=6.0, bandwidth_gbps=nic_gbits / 8.0),  # one NIC per GPU
        memory_bytes=REPORTED_MEMORY_BYTES.get(name, memory_gb * 2**30), sm_count=sm_count, provenance=provenance,
    )


#: name -> datasheet model. NVLink bandwidth is per direction (half the bidirectional figure), as is PCIe's (Gen4 x16
#: 32 GB/s, Gen5 64 GB/s). SM counts: the streaming multiprocessors (V100 80, A100 108, H100 SXM and NVL 132, H100
#: PCIe 114, H200 132), as NVIDIA's architecture papers and datasheets list them (AMD's parts: compute units).
DATASHEET_DEVICES: dict[str, DeviceModel] = {
    "V100": _gpu("V100", fp16_tflops=125, fp32_tflops=15.7, bf16=False, mem_gbs=900, nvlink_gbs=150,
                 nic_gbits=100, memory_gb=32, sm_count=80),
    "A100-40GB": _gpu("A100-40GB", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=1555, nvlink_gbs=300,
                      nic_gbits=200, memory_gb=40, sm_count=108),
    "A100-80GB": _gpu("A100-80GB", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=2039, nvlink_gbs=300,
                      nic_gbits=200, memory_gb=80, sm_count=108),
    "H100": _gpu("H100", fp16_tflops=989, fp32_tflops=67, bf16=True, mem_gbs=3350, nvlink_gbs=450,
                 nic_gbits=400, memory_gb=80, sm_count=132),
    "H200": _gpu("H200", fp16_tflops=989, fp32_tflops=67, bf16=True, mem_gbs=4800, nvlink_gbs=450,
                 nic_gbits=400, memory_gb=141, sm_count=132),
    "A100-40GB-PCIe": _gpu("A100-40GB-PCIe", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=1555,
                           nvlink_gbs=32, nic_gbits=200, memory_gb=40, sm_count=108),
    "A100-80GB-PCIe": _gpu("A100-80GB-PCIe", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=1935,
                           nvlink_gbs=32, nic_gbits=200, memory_gb=80, sm_count=108),
    "H100-PCIe": _gpu("H100-PCIe", fp16_tflops=756, fp32_tflops=51, bf16=True, mem_gbs=2000, nvlink_gbs=64,
                      nic_gbits=400, memory_gb=80, sm_count=114),
    "H100-NVL": _gpu("H100-NVL", fp16_tflops=835, fp32_tflops=60, bf16=True, mem_gbs=3900, nvlink_gbs=64,
                     nic_gbits=400, memory_gb=94, sm_count=132),
    # the export parts: an H100 and an A100 whose NVLink runs at 400 GB/s both ways (200 a direction)
    "H800": _gpu("H800", fp16_tflops=989, fp32_tflops=67, bf16=True, mem_gbs=3350, nvlink_gbs=200,
                 nic_gbits=400, memory_gb=80, sm_count=132),
    "H800-PCIe": _gpu("H800-PCIe", fp16_tflops=756, fp32_tflops=51, bf16=True, mem_gbs=2000, nvlink_gbs=64,
                      nic_gbits=400, memory_gb=80, sm_count=114),
    "A800-80GB": _gpu("A800-80GB", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=2039, nvlink_gbs=200,
                      nic_gbits=200, memory_gb=80, sm_count=108),
    "A800-40GB-PCIe": _gpu("A800-40GB-PCIe", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=1555,
                           nvlink_gbs=32, nic_gbits=200, memory_gb=40, sm_count=108),
    "A800-80GB-PCIe": _gpu("A800-80GB-PCIe", fp16_tflops=312, fp32_tflops=19.5, bf16=True, mem_gbs=1935,
                           nvlink_gbs=32, nic_gbits=200, memory_gb=80, sm_count=108),
    # Grace Hopper: the H100 die beside a Grace CPU, with 96 GB of HBM3 (the "480GB" superchip) or 144 GB of HBM3e
    "GH200": _gpu("GH200", fp16_tflops=989, fp32_tflops=67, bf16=True, mem_gbs=4000, nvlink_gbs=450,
                  nic_gbits=400, memory_gb=96, sm_count=132),
    "GH200-144GB": _gpu("GH200-144GB", fp16_tflops=989, fp32_tflops=67, bf16=True, mem_gbs=4900, nvlink_gbs=450,
                        nic_gbits=400, memory_gb=144, sm_count=132),
    # the China part of the H100 die: 148 TFLOP/s dense, 96 GB of HBM3 at 4.0 TB/s, NVLink at 900 GB/s both ways
    "H20": _gpu("H20", fp16_tflops=148, fp32_tflops=44, bf16=True, mem_gbs=4000, nvlink_gbs=450,
                nic_gbits=400, memory_gb=96, sm_count=78),
    # Blackwell: HGX B200 (180 GB of HBM3e a GPU, as DGX B200's 1,440 GB make) and GB200 NVL72's GPUs (13.4 TB over
    # 72), NVLink 5 at 1.8 TB/s both ways
    "B200": _gpu("B200", fp16_tflops=2250, fp32_tflops=75, bf16=True, mem_gbs=8000, nvlink_gbs=900,
                 nic_gbits=400, memory_gb=180, sm_count=148),
    "GB200": _gpu("GB200", fp16_tflops=2500, fp32_tflops=80, bf16=True, mem_gbs=8000, nvlink_gbs=900,
                  nic_gbits=400, memory_gb=186, sm_count=148),
    # Ada cards in clouds' training and fine-tuning instances: PCIe Gen4 between GPUs, no NVLink
    "L40S": _gpu("L40S", fp16_tflops=362, fp32_tflops=91.6, bf16=True, mem_gbs=864, nvlink_gbs=32,
                 nic_gbits=200, memory_gb=48, sm_count=142),
    "L40": _gpu("L40", fp16_tflops=181, fp32_tflops=90.5, bf16=True, mem_gbs=864, nvlink_gbs=32,
                nic_gbits=200, memory_gb=48, sm_count=142),
    "L4": _gpu("L4", fp16_tflops=121, fp32_tflops=30.3, bf16=True, mem_gbs=300, nvlink_gbs=32,
               nic_gbits=100, memory_gb=24, sm_count=58),
    # AMD's datasheet: 304 compute units, seven Infinity Fabric links of 64 GB/s a direction to the node's others
    "MI300X": _gpu("MI300X", fp16_tflops=1307, fp32_tflops=163, bf16=True, mem_gbs=5300, nvlink_gbs=448,
                   nic_gbits=400, memory_gb=192, sm_count=304),
    "MI325X": _gpu("MI325X", fp16_tflops=1307, fp32_tflops=163, bf16=True, mem_gbs=6000, nvlink_gbs=448,
                   nic_gbits=400, memory_gb=256, sm_count=304),
    # an MI250X or MI250 is two dies (GCDs) that PyTorch sees as two GPUs: one GCD's half of the package's
    # 383 (362) TFLOP/s, 128 GB and 3.2 TB/s, its 110 (104) compute units; Infinity Fabric at 50 GB/s a direction to
    # another package's GCD (Frontier's and LUMI's nodes)
    "MI250X": _gpu("MI250X", fp16_tflops=191.5, fp32_tflops=23.9, bf16=True, mem_gbs=1638, nvlink_gbs=50,
                   nic_gbits=200, memory_gb=64, sm_count=110),
    "MI250": _gpu("MI250", fp16_tflops=181, fp32_tflops=22.6, bf16=True, mem_gbs=1638, nvlink_gbs=50,
                  nic_gbits=200, memory_gb=64, sm_count=104),
}

#: catalog name -> the die it is made of: the variants of one die share a profile's fitted kernel efficiencies
#: (:func:`vtrain.fit.device.on_gpu` moves them onto a variant's roofline and links)
GPU_DIES: dict[str, str] = {
    "V100": "GV100", "A100-40GB": "GA100", "A100-80GB": "GA100", "A100-40GB-PCIe": "GA100",
    "A100-80GB-PCIe": "GA100", "A800-80GB": "GA100", "A800-40GB-PCIe": "GA100", "A800-80GB-PCIe": "GA100",
    "H100": "GH100", "H100-PCIe": "GH100", "H100-NVL": "GH100", "H200": "GH100", "H800": "GH100",
    "H800-PCIe": "GH100", "GH200": "GH100", "GH200-144GB": "GH100", "H20": "GH100", "B200": "GB100",
    "GB200": "GB100", "L40S": "AD102", "L40": "AD102", "L4": "AD104", "MI300X": "MI300X", "MI325X": "MI300X",
    "MI250X": "MI200", "MI250": "MI200",
}

KNOWN_DEVICES = ("cpu", *DATASHEET_DEVICES)


def canonical_device_name(name: str) -> str | None:
    """Map a device string (``A100``, ``NVIDIA A100-SXM4-80GB``, ``h200``, ``cpu`` ...) to a catalog key; a part
    name followed by another digit is another part (``A1000``, an RTX card, was taken for an A100)."""
    key = name.lower().replace(" ", "").replace("_", "-")
    if key in ("cpu", "host"):
        return "cpu"
    words = re.sub(r"[\s_]+", "-", name.lower())  # where the words of the name end
    pcie = "pcie" in key
    if _names(words, "gh200"):  # before H200: "NVIDIA GH200 480GB" has 96 GB of HBM3, "GH200 144G HBM3e" 144 GB
        return "GH200-144GB" if "144g" in key or "hbm3e" in key else "GH200"
    if _names(words, "h200"):
        return "H200"
    if _names(words, "h100"):
        return "H100-NVL" if "nvl" in key else "H100-PCIe" if pcie else "H100"
    if _names(words, "h800"):
        return "H800-PCIe" if pcie else "H800"
    if _names(words, "a100"):
        memory = "80GB" if "80g" in key else "40GB"
        return f"A100-{memory}-PCIe" if pcie else f"A100-{memory}"
    if _names(words, "a800"):  # the SXM part has 80 GB; the cards (PCIe, "A800 40GB Active") 40 or 80
        memory = "80GB" if "80g" in key else "40GB"
        return f"A800-{memory}-PCIe" if pcie or "active" in key else "A800-80GB"
    if _names(words, "v100"):
        return "V100"
    return _other_gpu(key, words)


#: the other parts by the name drivers write, lower case without spaces; first match wins ("gb200" before "b200",
#: "h20" only once H200 and GH200 are out)
_OTHER_NAMES = (("gb200", "GB200"), ("b200", "B200"), ("h20", "H20"), ("l40s", "L40S"), ("l40", "L40"),
                ("nvidial4", "L4"), ("mi325x", "MI325X"), ("mi300x", "MI300X"), ("mi250x", "MI250X"),
                ("mi250", "MI250"))


def _other_gpu(key: str, words: str) -> str | None:
    return next((name for part, name in _OTHER_NAMES if _names(words, part) or key == name.lower()), None)


def _names(words: str, part: str) -> bool:
    """Whether a device string (lower case, words joined by ``-``) names ``part`` (its characters, words joined
    or not) with no other digit after it."""
    return re.search("-?".join(map(re.escape, part)) + "(?![0-9])", words) is not None


def same_die(one: str, other: str) -> bool:
    """Whether two device names are variants of one die (``A100-40GB`` and ``A100-80GB``, ``H100`` and ``H800``):
    a profile fitted on one times the other's kernels at the efficiencies it learnt."""
    first, second = canonical_device_name(one) or one, canonical_device_name(other) or other
    return GPU_DIES.get(first, first) == GPU_DIES.get(second, second)


def device_model(name: str, source: str | None = None) -> DeviceModel:
    """The device model for ``name``: a datasheet GPU, or the host CPU measured on this machine.

    Raises :class:`InputError` (naming ``source``) for an unknown device rather than guessing one.
    """
    key = canonical_device_name(name)
    if key is None:
        raise InputError(f"unknown device {name!r} (known: {', '.join(KNOWN_DEVICES)})", source)
    if key == "cpu":
        return measured_cpu()
    return DATASHEET_DEVICES[key]


def device_for_config(config: RunConfig, source: str | None = None) -> DeviceModel:
    """The device model of a run config, with the config's link bandwidths (if given) replacing the defaults.

    ``intra_node_gbps`` is GB/s per GPU and ``inter_node_gbps`` Gbit/s per node, shared by its ``gpus_per_node``
    GPUs (the inter-node link's bandwidth is a GPU's share: :class:`~vtrain.collective_cost.Link`).
    """
    device = device_model(config.hardware.device, source)
    hardware = config.hardware
    provenance = dict(device.provenance)
    intra, inter = device.intra_node, device.inter_node
    if hardware.intra_node_gbps is not None:
        intra = replace(intra, bandwidth_gbps=float(hardware.intra_node_gbps))
        provenance["intra_node.bandwidth_gbps"] = "config"
    if hardware.inter_node_gbps is not None:
        inter = replace(inter, bandwidth_gbps=float(hardware.inter_node_gbps) / 8.0 / max(hardware.gpus_per_node, 1))
        provenance["inter_node.bandwidth_gbps"] = "config"
    return replace(device, intra_node=intra, inter_node=inter, provenance=provenance)
