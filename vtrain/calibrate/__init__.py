"""Calibration: new traces ingested as a version of a base profile, with the drift report of what moved.

:mod:`vtrain.calibrate.drift` compares two profiles row by row, :mod:`vtrain.calibrate.profile` keeps the
lineage of versioned profiles, :mod:`vtrain.calibrate.calibration` is `vtrain calibrate`.
"""
