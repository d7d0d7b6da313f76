"""Validation: how far the simulator is from measured traces, and where the error comes from.

Two predictions are compared with the measured traces: the *replay* (:mod:`vtrain.replay`, the traces' own
dependency graph re-simulated with measured durations) and the *model* (`vtrain simulate` of the described
run from latency tables that did not see the iterations under test).
"""
