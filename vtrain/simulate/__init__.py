"""Simulation: latency resolution, list scheduling, the summary (breakdown, coverage, critical path) and the
predicted Chrome trace."""

from vtrain.simulate.latency import INTERPOLATED, MEASURED, MODELLED, Resolution
from vtrain.simulate.run import Simulation, simulate

__all__ = ["INTERPOLATED", "MEASURED", "MODELLED", "Resolution", "Simulation", "simulate"]
