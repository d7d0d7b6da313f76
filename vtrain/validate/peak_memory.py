"""The memory model against the peak memory a recording measured.

``vtrain record`` on GPUs writes each rank's ``torch.cuda.max_memory_allocated`` over the recorded iterations into
``run.yaml`` (``recording.peak_memory_bytes``, one number per rank). :func:`peak_memory_rows` puts each traced
rank's beside the memory model's peak for the pipeline stage the rank runs (:func:`vtrain.model.memory.stage_memory`),
for `vtrain validate`'s report and ``metrics.json``.
"""

from __future__ import annotations

from typing import Any

from vtrain.model.gpt import GptShape
from vtrain.model.memory import GIB, stage_memory
from vtrain.partition import partition
from vtrain.parallel import Layout
from vtrain.runconfig import RunConfig

SOURCE = "torch.cuda.max_memory_allocated over the recorded iterations (run.yaml: recording.peak_memory_bytes)"


def measured_peaks(config: RunConfig) -> list[int] | None:
    """The recording's peak per rank, or ``None`` when it has none or they are not one positive integer a rank
    (a run.yaml written by hand or by another tool)."""
    peaks = config.recording.get("peak_memory_bytes")
    if peaks is None:
        return None
    ranks = config.parallelism.world_size
    if not isinstance(peaks, list) or len(peaks) != ranks or not all(
            isinstance(peak, int) and not isinstance(peak, bool) and peak > 0 for peak in peaks):
        raise ValueError(f"recording.peak_memory_bytes is not one positive whole number of bytes for each of the "
                         f"{ranks} rank(s)")
    return peaks


def peak_memory_rows(config: RunConfig, ranks: list[int]) -> list[dict[str, Any]]:
    """For each traced rank with a measured peak: its stage, the measured and modelled GiB and the model's error
    (the model's peak of the rank's stage against the measurement). Empty without measured peaks."""
    peaks = measured_peaks(config)
    if peaks is None:
        return []
    layout, shape, chunks = Layout.of(config), GptShape.from_config(config), partition(config)
    modelled: dict[int, int] = {}
    rows = []
    for rank in sorted(r for r in ranks if 0 <= r < len(peaks)):
        stage = layout.stage(rank)
        if stage not in modelled:
            modelled[stage] = stage_memory(config, shape, chunks[stage]).total_bytes
        rows.append({"rank": rank, "stage": stage, "measured_gib": peaks[rank] / GIB,
                     "model_gib": modelled[stage] / GIB,
                     "error_pct": 100.0 * (modelled[stage] - peaks[rank]) / peaks[rank]})
    return rows
