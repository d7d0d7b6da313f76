"""`vtrain size --gpus N --days D --profile P [--family gpt|llama] [--loss-model chinchilla|chinchilla-published]
[-o OUT] [--json]`: the model shape and token count with the lowest loss for a budget of GPUs and days, each shape at
its best plan's speed."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from vtrain.cli.errors import user_errors, warn
from vtrain.cli.options import (
    attention_option,
    device_memory_option,
    device_option,
    force_option,
    framework_option,
    gpus_per_node_option,
    inter_node_gbps_option,
    max_micro_batch_option,
    profile_option,
    real_option,
)
from vtrain.errors import InputError
from vtrain.outputs import REPORT, check_output, staged

if TYPE_CHECKING:
    from vtrain.studies.sizing import Sized

REPORTS = Path("reports")


@user_errors
def size_command(
    gpus: int = typer.Option(..., "--gpus", min=1, max=1 << 20, help="GPUs in the budget."),
    days: float = real_option(..., "--days", 0.001, 3650, "Days in the budget."),
    profile: Path | None = profile_option(),
    loss_model: str = typer.Option("chinchilla", "--loss-model", help="Loss model: chinchilla (Chinchilla's loss, "
                                   "Besiroglu et al.'s refit of its data: ~20 tokens per parameter at the optimum) or "
                                   "chinchilla-published (the constants Hoffmann et al. printed: 50-120)."),
    mfu: float = real_option(0.4, "--mfu", 0.01, 1.0, "The fixed MFU of the comparison answer."),
    family: str = typer.Option("gpt", "--family",
                               help="The shapes searched: gpt (GPT-3's, OPT's and Megatron's) or llama (LLaMA 2's and "
                                    "3's layers: GQA, SwiGLU, RMSNorm, RoPE)."),
    seq: int = typer.Option(2048, "--seq", min=1, max=1 << 21, help="Sequence length."),
    vocab: int = typer.Option(51200, "--vocab", min=1, max=1 << 22, help="Vocabulary size."),
    global_batch: int = typer.Option(1536, "--global-batch", min=1, max=1 << 24, help="Sequences per iteration."),
    output: Path | None = typer.Option(None, "-o", "--output",
                                       help="Report folder (default reports/size-<GPUs>x<days>d[-<family>][-<GPU>])."),
    force: bool = force_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
    device: str = device_option(),
    gpus_per_node: int = gpus_per_node_option(),
    inter_node_gbps: float | None = inter_node_gbps_option(),
    device_memory: float | None = device_memory_option(),
    max_micro_batch: int = max_micro_batch_option(),
    framework: str = framework_option(),
    attention: str | None = attention_option("How the jobs run attention: "),
) -> None:
    """Search model shapes used in practice for the lowest loss a budget of GPUs and days buys."""
    from vtrain.runconfig import RunConfig
    from vtrain.studies.predict import Cluster, describe, peak_flops, plan_throughput
    from vtrain.studies.size_report import SizeStudy, size_summary, write_size_files
    from vtrain.studies.sizing import (FAMILIES, LOSS_MODELS, Budget, best, practice_shapes, size_with_fixed_mfu,
                                       size_with_plans)

    if loss_model not in LOSS_MODELS:
        raise InputError(f"--loss-model must be one of {', '.join(LOSS_MODELS)} (got {loss_model!r})")
    loss = LOSS_MODELS[loss_model]
    family = family.strip().lower()
    if family not in FAMILIES:
        raise InputError(f"--family must be one of {', '.join(FAMILIES)} (got {family!r})")
    shapes = practice_shapes(seq, vocab, family)
    unplaced = RunConfig(model=shapes[0], framework=framework).model_errors()
    if unplaced:
        raise InputError(f"--family {family}: {unplaced[0]}")
    target = output if output is not None else REPORTS / _default_folder(gpus, days, family, device)
    check_output(target, inputs=[profile], force=force)
    hardware = Cluster(device=device, gpus_per_node=gpus_per_node, inter_node_gbps=inter_node_gbps,
                       device_memory_gib=device_memory, framework=framework, attention=attention or "eager")
    throughput = plan_throughput(profile, hardware, max_micro_batch)
    budget = Budget(gpus=gpus, days=days, peak_flops=peak_flops(hardware))
    planned = size_with_plans(shapes, budget, throughput, global_batch, loss)
    chosen = best(planned)
    if chosen is None:
        raise InputError(f"no shape has a plan that runs on {gpus} GPUs (divisibility or device memory)")
    _say_an_edge_of_the_shapes(planned, chosen)
    study = SizeStudy(budget, planned, size_with_fixed_mfu(shapes, budget, mfu, loss), mfu, describe(hardware),
                      str(profile) if profile else None, loss)
    with staged(target, REPORT, "size") as staging:
        write_size_files(study, staging)
    summary = size_summary(study)
    if as_json:
        print(json.dumps({**summary, "output": str(target)}, indent=2))
        return
    closed = summary["fixed_mfu"]["closed_form"]
    print(f"with real plans: {summary['parameters'] / 1e9:.1f}B parameters (l{summary['layers']} "
          f"h{summary['hidden']} a{summary['heads']}, {summary['plan_label']}, MFU {summary['plan']['mfu']:.1%}) "
          f"on {summary['tokens'] / 1e9:,.0f}B tokens, loss {summary['loss']:.4f}")
    print(f"at a fixed {mfu:.0%} MFU: {closed['parameters'] / 1e9:.1f}B parameters on {closed['tokens'] / 1e9:,.0f}B "
          f"tokens, loss {closed['loss']:.4f} (closed form)")
    print(f"wrote {target}")


def _say_an_edge_of_the_shapes(planned: list[Sized], chosen: Sized) -> None:
    """One warning line when the lowest loss is the smallest or the largest shape searched that runs: the optimum
    may lie beyond the shapes, and the answer is the edge of the grid, not the budget's."""
    runnable = sorted((s for s in planned if math.isfinite(s.loss)), key=lambda s: s.parameters)
    if not runnable or chosen not in (runnable[0], runnable[-1]):
        return
    if len(runnable) == 1:  # the only one: as much the smallest as the largest (1 GPU for 86 s: 1.3B on 0B tokens)
        warn(f"the only shape searched that runs is {chosen.parameters / 1e9:.1f}B parameters: the lowest loss of "
             f"this budget may lie at another size, which is not among the shapes")
        return
    edge, beyond = ("smallest", "smaller") if chosen is runnable[0] else ("largest", "larger")
    warn(f"the lowest loss is the {edge} shape searched that runs ({chosen.parameters / 1e9:.1f}B parameters): a "
         f"{beyond} model may do better on this budget, and is not among the shapes")


def _default_folder(gpus: int, days: float, family: str, device: str) -> str:
    """``size-1024x30d``, with the family and the GPU where they are not the defaults
    (``size-1024x30d-llama-a100-80gb``): the README's LLaMA question after its GPT one was refused, its folder taken
    by the first (an audit)."""
    parts = [f"size-{gpus}x{days:g}d"] + ([family] if family != "gpt" else [])
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return "-".join(parts + ([slug] if slug and slug != "a100" else []))
