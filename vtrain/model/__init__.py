"""The workload model: the ops of the reference GPT model per block, their shapes, FLOPs and bytes, and the memory
each stage holds (which layers a stage holds: :mod:`vtrain.partition`)."""

from vtrain.model.gpt import GptShape
from vtrain.model.ops import Collective, Op, Step, op_cost

__all__ = ["Collective", "GptShape", "Op", "Step", "op_cost"]
