"""What a plan costs: training days and dollars for a number of tokens, throughput and model FLOPs utilisation.

Cost = iteration time × iterations × GPUs × price per GPU-hour, the way vTrain prices its plans. The default
price is the one vTrain's paper uses: an AWS EC2 p4d.24xlarge (8 × A100-40GB) on demand at $32.77 per hour,
i.e. $4.10 per A100-hour.
"""

from __future__ import annotations

from dataclasses import dataclass

from vtrain.flops import mfu
from vtrain.runconfig import ModelConfig

P4D_PRICE_PER_HOUR = 32.77
P4D_GPUS = 8
#: the GPU the default price is for (the catalog's name): a plan on any other says so
PRICED_DEVICE = "A100-40GB"
DEFAULT_PRICE_PER_GPU_HOUR = P4D_PRICE_PER_HOUR / P4D_GPUS
PRICE_SOURCE = (f"AWS EC2 p4d.24xlarge on demand, ${P4D_PRICE_PER_HOUR}/h for {P4D_GPUS} {PRICED_DEVICE} "
                f"(the price vTrain's paper uses): ${DEFAULT_PRICE_PER_GPU_HOUR:.4f} per GPU-hour")
#: MT-NLG 530B's training tokens (Smith et al., 2022), the default --tokens
DEFAULT_TOKENS = 270e9
TOKENS_SOURCE = "MT-NLG 530B's 270B training tokens (Smith et al., 2022)"


@dataclass(frozen=True)
class Pricing:
    """How plans are priced: tokens to train on and the price of one GPU-hour."""

    tokens: float = DEFAULT_TOKENS
    price_per_gpu_hour: float = DEFAULT_PRICE_PER_GPU_HOUR


@dataclass(frozen=True)
class PlanCost:
    """Time and money of training on ``tokens`` with one plan."""

    iterations: float
    days: float
    usd: float
    tokens_per_s: float
    mfu: float


def plan_cost(iteration_s: float, gpus: int, model: ModelConfig, global_batch: int, pricing: Pricing,
              peak_flops: float) -> PlanCost:
    """Days, dollars, tokens per second and MFU (against ``peak_flops`` per GPU) of one plan."""
    tokens_per_iteration = global_batch * model.seq
    iterations = pricing.tokens / tokens_per_iteration
    seconds = iterations * iteration_s
    usd = seconds / 3600 * gpus * pricing.price_per_gpu_hour
    return PlanCost(iterations=iterations, days=seconds / 86400, usd=usd,
                    tokens_per_s=tokens_per_iteration / iteration_s,
                    mfu=mfu(model, global_batch, iteration_s, gpus, peak_flops))
