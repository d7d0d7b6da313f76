"""Fitting device models to measurements: kernel rooflines, collective α-β curves and host overheads."""
