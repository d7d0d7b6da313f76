"""The execution graph: tasks per pipeline stage on compute and communication streams, and the schedules that
order them."""

from vtrain.graph.build import ExecutionGraph, Stream, Task, build_graph
from vtrain.graph.work import BlockWork, Bucket, CommWork, GraphInputs, PhaseWork
from vtrain.parallel import stage_order

__all__ = ["BlockWork", "Bucket", "CommWork", "ExecutionGraph", "GraphInputs", "PhaseWork", "Stream", "Task",
           "build_graph", "stage_order"]
