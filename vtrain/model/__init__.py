"""The workload model: the ops of the reference GPT model per block, their shapes, FLOPs and bytes, the
partition of layers onto pipeline stages, and the memory each stage holds."""

from vtrain.model.gpt import GptShape
from vtrain.model.ops import Collective, Op, Step, op_cost
from vtrain.model.partition import Chunk, partition

__all__ = ["Chunk", "Collective", "GptShape", "Op", "Step", "op_cost", "partition"]
