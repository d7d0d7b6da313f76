"""`vtrain plan MODEL --gpus N[,N...] --profile PROFILE ...`: sweep the design space, price it, find the
frontier."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import typer

from vtrain.cli.errors import user_errors, warn
from vtrain.cli.options import (
    attention_option,
    bias_option,
    device_memory_option,
    dropout_option,
    ffn_hidden_option,
    framework_option,
    inter_node_gbps_option,
    kv_heads_option,
    mlp_option,
    norm_option,
    position_option,
    tie_embeddings_option,
    real_option,
)
from vtrain.devices.catalog import canonical_device_name, device_model
from vtrain.distributed import workers_within_cores
from vtrain.errors import InputError
from vtrain.limits import MAX_MICRO_BATCH_TRIED, MAX_PRICE_PER_GPU_HOUR, MAX_TOKENS
from vtrain.outputs import check_output
from vtrain.plan.cost import (
    DEFAULT_PRICE_PER_GPU_HOUR,
    DEFAULT_TOKENS,
    PRICE_SOURCE,
    PRICED_DEVICE,
    TOKENS_SOURCE,
    Pricing,
)
from vtrain.run_argument import given_run
from vtrain.runconfig import (
    HardwareConfig,
    ModelConfig,
    ParallelConfig,
    RunConfig,
)

if TYPE_CHECKING:
    from vtrain.devices.model import DeviceModel
    from vtrain.plan.sweep import PlanTable
    from vtrain.tables.store import Profile

PLANS = Path("plans")


@user_errors
def plan_command(
    model: str | None = typer.Argument(None, help="Run config (run.yaml, vtrain YAML/JSON or vTrain's config "
                                                   "JSON) or a Megatron-LM training log: its model, global batch, "
                                                   "precision and hardware; its own parallelism is the reference plan. "
                                                   "Or a model alone: a Hugging Face config.json or a published "
                                                   "architecture's name (llama-3-70b, gpt-3-175b, ...; give "
                                                   "--global-batch). Or give --layers ... instead."),
    gpus: str = typer.Option(..., "--gpus", help="GPU counts: N, N,M,... or ..N for every count up to N."),
    profile: Path | None = typer.Option(None, "--profile", help="Profile folder (latency tables, device model)."),
    device_memory: float | None = device_memory_option(),
    inter_node_gbps: float | None = inter_node_gbps_option(),
    price: float | None = real_option(None, "--price-per-gpu-hour", 0.0, MAX_PRICE_PER_GPU_HOUR,
                                      f"USD per GPU-hour (default {PRICE_SOURCE})."),
    tokens: float = real_option(DEFAULT_TOKENS, "--tokens", 1.0, MAX_TOKENS,
                                f"Tokens to train on (default {TOKENS_SOURCE})."),
    global_batch: int | None = typer.Option(None, "--global-batch", min=1, help="Sequences per iteration."),
    max_iteration_s: float | None = real_option(None, "--max-iteration-s", 0.0, math.inf,
                                                "Best plan: at most this many seconds per iteration."),
    budget_usd: float | None = real_option(None, "--budget-usd", 0.0, math.inf, "Best plan: at most this cost."),
    max_micro_batch: int = typer.Option(8, "--max-micro-batch", min=1, max=MAX_MICRO_BATCH_TRIED,
                                        help="Largest micro-batch tried."),
    distributed_optimizer: bool = typer.Option(False, "--distributed-optimizer",
                                               help="Also search every plan with Megatron's distributed optimizer "
                                                    "(ZeRO-1: optimizer states split over the data-parallel "
                                                    "ranks; framework megatron)."),
    output: Path | None = typer.Option(None, "-o", "--output", help="Plan folder (default plans/<model name>)."),
    force: bool = typer.Option(False, "--force", help="Replace the plan folder if vtrain wrote it."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    workers: int = typer.Option(1, "--workers", min=1, help="Processes timing plans in parallel."),
    ray: bool = typer.Option(False, "--ray", help="Time plans as Ray tasks (pip install 'vtrain[ray]'): on the "
                                                  "cluster at --ray-address, else RAY_ADDRESS, else a local one."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address (ray://HOST:10001, "
                                                                       "auto); implies --ray."),
    layers: int | None = typer.Option(None, "--layers", min=1, help="Model without a run config: layers."),
    hidden: int | None = typer.Option(None, "--hidden", min=1, help="Hidden size."),
    heads: int | None = typer.Option(None, "--heads", min=1, help="Attention heads."),
    seq: int | None = typer.Option(None, "--seq", min=1, help="Sequence length (with a run config: trains its "
                                   "model at this length)."),
    vocab: int = typer.Option(51200, "--vocab", min=1, help="Vocabulary size."),
    ffn_hidden: int | None = ffn_hidden_option(),
    kv_heads: int | None = kv_heads_option(),
    mlp: str = mlp_option(),
    norm: str = norm_option(),
    position: str = position_option(),
    bias: bool = bias_option(),
    tie_embeddings: bool | None = tie_embeddings_option(),
    dropout: bool | None = dropout_option(),
    device: str | None = typer.Option(None, "--device", help="GPU type (default: the run config's; for a "
                                      "model without a run of its own, the profile's GPU; else A100)."),
    attention: str | None = attention_option(),
    precision: str | None = typer.Option(None, "--precision", help="fp16, bf16 or fp32 (default: the run "
                                         "config's; fp16 for a model given by its shape)."),
    framework: str | None = framework_option("Whose kernels, mixed precision and optimizer states the plans run "
                                             "with (default: the run config's; megatron for a model given by its "
                                             "shape): ", default=None),
) -> None:
    """Enumerate every parallel plan, prune invalid and out-of-memory ones, time and price the rest, and write the
    time-versus-cost frontier."""
    from vtrain.cli.progress import counting
    from vtrain.plan.report import breakdowns, summary, write_plan_folder
    from vtrain.plan.space import parse_gpus
    from vtrain.plan.sweep import sweep
    from vtrain.tables.store import load_profile

    shape = ModelShape(layers, hidden, heads, seq, vocab, ffn_hidden, kv_heads, mlp, norm, position, bias,
                       tie_embeddings, dropout)
    table_profile = load_profile(profile) if profile is not None else None
    command_line = [name for name, value in (("seq", seq), ("precision", precision), ("framework", framework),
                                             ("attention", attention)) if value is not None]
    base, reference = _base_config(model, global_batch, shape, device, table_profile, command_line)
    if attention is not None:
        base = replace(base, attention=attention)
    if framework is not None:
        base = replace(base, framework=framework)
    if precision is not None:
        base = replace(base, precision=precision)  # RunConfig reads its name (runconfig.precision_named)
    if inter_node_gbps is not None:
        base = replace(base, hardware=replace(base.hardware, inter_node_gbps=inter_node_gbps))
    unplannable = base.model_errors()
    if unplannable:
        raise InputError(f"no plan can train this model: {unplannable[0]}", model)
    datasheet = device_model(base.hardware.device, "--device" if device is not None else str(model))  # before warnings
    counts = parse_gpus(gpus, base)
    name = Path(model).stem if model is not None else f"gpt-l{layers}-h{hidden}"
    target = output if output is not None else PLANS / name
    check_output(target, inputs=[model, profile], force=force)
    if price is None:
        price = DEFAULT_PRICE_PER_GPU_HOUR
        gpu = base.hardware.device
        if canonical_device_name(gpu) not in (PRICED_DEVICE, "cpu"):
            warn(f"the default price, ${price:.4f} per GPU-hour, is AWS p4d's for an {PRICED_DEVICE}; the plans run "
                 f"on {gpu}: give --price-per-gpu-hour for their cost")
    if price == 0:
        warn("--price-per-gpu-hour 0: every plan costs $0, so the cheapest plan is the fastest of those within the "
             "limits (and any --budget-usd is met)")
    per_iteration = base.parallelism.global_batch * base.model.seq
    if tokens < per_iteration:
        warn(f"--tokens {tokens:,.0f} is less than one iteration's {per_iteration:,} (global batch "
             f"{base.parallelism.global_batch} x sequence {base.model.seq}): each plan is priced for "
             f"{tokens / per_iteration:.3g} of an iteration")
    _say_the_network(base, max(counts), table_profile)
    _say_memory_beyond_the_device(datasheet, device_memory)
    workers = workers_within_cores(workers, warn)
    with counting("timing plans") as progress:
        table = sweep(base, counts, table_profile, device_memory_gib=device_memory, divisible=".." in gpus,
                      pricing=Pricing(tokens=tokens, price_per_gpu_hour=price), max_micro_batch=max_micro_batch,
                      distributed_optimizer=distributed_optimizer, max_iteration_s=max_iteration_s,
                      budget_usd=budget_usd, workers=workers, ray_address=ray_address or ("local" if ray else None),
                      progress=progress, time_reference=reference)
    reason = table.no_best_reason()
    if reason is not None:
        warn(f"{reason}; there is no cheapest plan within limits (plans.csv gives each plan's reason and time)")
    _say_a_best_plan_at_the_memory_limit(table)
    details = breakdowns(table, table_profile)
    write_plan_folder(table, target, details)
    if as_json:
        print(json.dumps({**summary(table), "output": str(target)}, indent=2, default=str))
        return
    _print_summary(table, target)


def _say_the_network(base: RunConfig, gpus: int, profile: Profile | None) -> None:
    """One warning line when the plans' largest GPU count spans more than a node and the network that times it is
    not the user's: curves measured on fewer nodes (:meth:`~vtrain.devices.model.DeviceModel.unmeasured_nodes`),
    or a rate assumed (`simulate` says it on its network line; a plan's table has none)."""
    from vtrain.fit.device import device_for_run

    hardware = replace(base.hardware, device_count=gpus)
    device = device_for_run(replace(base, hardware=hardware), profile)
    if hardware.nodes < 2:
        return
    if line := device.unmeasured_nodes(hardware.nodes):
        warn(f"plans on up to {gpus:,} GPUs: {line}")
    elif device.provenance.get("inter_node.bandwidth_gbps") == "assumed":
        warn(f"plans on up to {gpus:,} GPUs ({hardware.nodes:,} nodes) cross the network, which is assumed: "
             f"{device.describe_network(hardware.gpus_per_node)}")


def _say_memory_beyond_the_device(gpu: DeviceModel, device_memory: float | None) -> None:
    """One warning line for a ``--device-memory`` over the run's GPU's memory (80 typed 800?); none for a CPU."""
    if device_memory is None or gpu.memory_bytes is None or canonical_device_name(gpu.name) in (None, "cpu"):
        return
    has = gpu.memory_bytes / 2**30
    if device_memory > has:
        warn(f"--device-memory {device_memory:g} GiB is more than the {has:.2f} GiB each {gpu.name} has: "
             f"plans are kept that need more memory than the GPU has")


def _say_a_best_plan_at_the_memory_limit(table: PlanTable) -> None:
    """One warning line when the cheapest plan within limits may not fit as measured peaks would
    (:func:`~vtrain.plan.report.best_memory_risk`)."""
    from vtrain.plan.report import best_memory_risk

    risk = best_memory_risk(table)
    if risk is not None:
        warn(risk)


class ModelShape(NamedTuple):
    """The model as the command line gives it (no run config)."""

    layers: int | None
    hidden: int | None
    heads: int | None
    seq: int | None
    vocab: int
    ffn_hidden: int | None
    kv_heads: int | None
    mlp: str
    norm: str
    position: str
    bias: bool
    tie_embeddings: bool | None
    dropout: bool | None

    def given(self) -> list[str]:
        """The flags of the model's shape that were given."""
        flags = (("--layers", self.layers), ("--hidden", self.hidden), ("--heads", self.heads), ("--seq", self.seq),
                 ("--ffn-hidden", self.ffn_hidden), ("--kv-heads", self.kv_heads),
                 ("--mlp", None if self.mlp == "gelu" else self.mlp),
                 ("--norm", None if self.norm == "layernorm" else self.norm),
                 ("--position", None if self.position == "learned" else self.position),
                 ("--no-bias", None if self.bias else False),
                 ("--tie-embeddings" if self.tie_embeddings else "--untie-embeddings", self.tie_embeddings),
                 ("--dropout" if self.dropout else "--no-dropout", self.dropout))
        return [flag for flag, value in flags if value is not None]


def _base_config(model: str | None, global_batch: int | None, shape: ModelShape, device: str | None,
                 profile: Profile | None, command_line: list[str]) -> tuple[RunConfig, bool]:
    """The run config whose model, batch, precision and hardware are swept (on ``device`` when given), and whether
    its own layout is a run to time beside the plans (a run config's or a log's, not a bare model's); a model's
    assumed settings are said but those ``command_line`` gives."""
    given = [flag for flag in shape.given() if model is None or flag != "--seq"]
    if model is not None and given:
        raise InputError(f"give a run config or the model's shape ({', '.join(given)}), not both: the run config's "
                         f"model would be swept")
    if model is not None:
        run = given_run(model, profile, device, command_line)
        base = run.config
        if global_batch is None and run.model_only:
            raise InputError("gives a model, not its batch: give --global-batch (sequences an iteration)", model)
        if shape.seq is not None:
            base = replace(base, model=replace(base.model, seq=shape.seq))
        if device is not None:
            base = replace(base, hardware=replace(base.hardware, device=device))
        return (base.with_overrides(global_batch=global_batch) if global_batch is not None else base,
                not run.model_only)
    missing = [flag for flag, value in (("--layers", shape.layers), ("--hidden", shape.hidden),
                                        ("--heads", shape.heads), ("--seq", shape.seq),
                                        ("--global-batch", global_batch)) if value is None]
    if missing:
        raise InputError(f"give a run config or the model's {', '.join(missing)}")
    model_config = ModelConfig(layers=shape.layers, hidden=shape.hidden, heads=shape.heads, seq=shape.seq,
                               vocab=shape.vocab, ffn_hidden=shape.ffn_hidden, kv_heads=shape.kv_heads, mlp=shape.mlp,
                               norm=shape.norm, position=shape.position, bias=shape.bias,
                               tie_embeddings=shape.tie_embeddings, dropout=shape.dropout)
    from vtrain.fit.device import profile_gpu

    gpu = device or (profile_gpu(profile) if profile is not None else None) or "A100"
    return RunConfig(model=model_config, framework="megatron", parallelism=ParallelConfig(global_batch=global_batch),
                     precision="fp16", hardware=replace(HardwareConfig(), device=gpu)), False


def _print_summary(table: PlanTable, target: Path) -> None:
    from rich.table import Table

    from vtrain.plan.report import label, out_of_memory, timed_from
    from vtrain.report.console import stdout_console

    out = stdout_console()
    counts = table.counts
    out.print(f"{counts['enumerated']} plans: {counts['invalid']} invalid, {counts['out_of_memory']} out of "
              f"memory, {counts['simulated']} simulated; days and USD for {table.pricing.tokens / 1e9:,.4g}B tokens "
              f"(--tokens) at ${table.pricing.price_per_gpu_hour:,.4g} per GPU-hour")
    grid = Table(title="time-versus-cost frontier")
    for column in ("plan", "GPUs", "GiB", "s/iter", "MFU", "days", "USD", "timed from"):
        grid.add_column(column)
    for row in table.frontier().iter_rows(named=True):
        grid.add_row(label(row), str(row["gpus"]), f"{row['memory_gib']:.1f}", f"{row['iteration_ms'] / 1e3:.2f}",
                     f"{row['mfu']:.1%}", f"{row['days']:.1f}", f"{row['usd']:,.0f}", timed_from(row))
    out.print(grid)
    for title, row in (("cheapest within limits", table.best()), ("reference", table.reference)):
        if row is not None and row.get("iteration_ms") is not None:
            unfit = out_of_memory(row)
            out.print(f"{title}: {label(row)} on {row['gpus']} GPUs, {row['iteration_ms'] / 1e3:.2f} s/iteration, "
                      f"{row['days']:.1f} days, ${row['usd']:,.0f} (timed from: {timed_from(row)})"
                      + (f"; it {unfit}" if unfit else ""))
    out.print(f"wrote {target}")
