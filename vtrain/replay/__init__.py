"""Replay: rebuild a trace set's dependency graph from the traces themselves and re-simulate it with the
measured durations (a collective without the time it spent waiting for the slowest rank, where its peers are
in the folder). The gap between the replayed and the measured timeline is what the dependency model misses."""
