"""Ingest: Kineto (PyTorch profiler) traces -> polars tables of kernels, CPU ops and collectives."""
