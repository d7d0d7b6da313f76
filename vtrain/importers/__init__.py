"""Importers for measurements made by others: nccl-tests, vidur and LLMCompass benchmark tables, and measured
iteration times (tables, Megatron-LM logs). Each returns a frame in one of vtrain's table schemas (``nccl_latency``,
``op_benchmarks``) or, for measurements, a plain table and the run configs it describes."""

from vtrain.importers._read import file_digest
from vtrain.importers.llmcompass import read_llmcompass, read_llmcompass_network
from vtrain.importers.measurements import measurement_config, measurement_errors, read_measurements
from vtrain.importers.nccl_tests import read_nccl_tests
from vtrain.importers.vidur import read_vidur_compute, read_vidur_network

__all__ = [
    "file_digest", "measurement_config", "measurement_errors", "read_llmcompass", "read_llmcompass_network",
    "read_measurements", "read_nccl_tests", "read_vidur_compute", "read_vidur_network",
]
