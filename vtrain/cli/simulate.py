"""`vtrain simulate CONFIG [--profile DIR] [-o OUT_DIR] [--json]`: predict one training iteration.

Its arguments are parsed with argparse, not typer, and the simulator is imported only once they are read: with
typer, pydantic and rich loaded for the arguments, every `vtrain simulate` started 0.2 s later (see
:mod:`vtrain.cli.ingest`, which does the same).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from vtrain.cli.errors import OneLineParser, report, warn
from vtrain.errors import InputError
from vtrain.limits import REAL_BOUNDS

if TYPE_CHECKING:
    from vtrain.runconfig import RunConfig
    from vtrain.simulate import Simulation

#: the command's one-line description (also in `vtrain --help`)
HELP = "Predict the iteration time, breakdown and timeline of a run config."

_SHOWN_STAGES = 8
_SHOWN_PATH = 4


def parser() -> OneLineParser:
    """The command line of `vtrain simulate` (usage errors exit 2, as typer's do)."""
    parsed = OneLineParser(prog="vtrain simulate", description=HELP)
    parsed.add_argument("config", metavar="CONFIG",  # as typed: `./name` is a file, `name` may be a model
                        help="Run config: run.yaml (or its folder), a YAML/JSON in the run-config schema, vTrain's "
                             "config JSON, a model's Hugging Face config.json, a published architecture's name "
                             "(llama-3-70b, gpt-3-175b, ...) or a Megatron-LM training log (the run it logged).")
    parsed.add_argument("--profile", type=Path, metavar="DIR",
                        help="Profile folder from `vtrain ingest` (op and NCCL latencies); without it every latency is "
                             "modelled.")
    parsed.add_argument("-o", "--output", type=Path, metavar="OUT_DIR",
                        help="Write the predicted timeline here: one Chrome trace per simulated rank.")
    parsed.add_argument("--json", dest="as_json", action="store_true", help="Print the summary as JSON.")
    parsed.add_argument("--force", action="store_true", help="Replace the output folder if it exists.")
    overrides = parsed.add_argument_group("overrides of the run config")
    overrides.add_argument("--seq", type=int, metavar="N", help="Override the sequence length (tokens a sequence).")
    overrides.add_argument("--tp", type=int, metavar="N", help="Override tensor-parallel size.")
    overrides.add_argument("--pp", type=int, metavar="N", help="Override pipeline-parallel size.")
    overrides.add_argument("--dp", type=int, metavar="N", help="Override data-parallel size.")
    overrides.add_argument("--micro-batch", type=int, metavar="N", help="Override sequences per micro-batch.")
    overrides.add_argument("--global-batch", type=int, metavar="N", help="Override sequences per iteration.")
    overrides.add_argument("--schedule", metavar="NAME", help="Override schedule: 1f1b, gpipe, interleaved.")
    overrides.add_argument("--virtual-stages", type=int, metavar="V", help="Override model chunks per stage.")
    overrides.add_argument("--recompute", metavar="NAME", help="Override recomputation: none, selective or full.")
    overrides.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                           help="Override Megatron's sequence parallelism (framework megatron).")
    overrides.add_argument("--distributed-optimizer", action=argparse.BooleanOptionalAction, default=None,
                           help="Override Megatron's distributed optimizer: optimizer states sharded over the "
                                "data-parallel ranks (ZeRO-1; framework megatron).")
    overrides.add_argument("--dp-overlap", action=argparse.BooleanOptionalAction,
                           help="Override overlapping of the gradient all-reduce.")
    overrides.add_argument("--dp-bucket-mb", type=float, metavar="MIB", help="Override gradient bucket size (MiB).")
    overrides.add_argument("--gpus", type=int, metavar="N", help="Override the number of devices.")
    overrides.add_argument("--device", metavar="NAME", help="Override the device (A100, H100, cpu, ...); a model "
                           "without a run of its own (a name, a Hugging Face config) runs on the profile's GPU, "
                           "else an A100.")
    overrides.add_argument("--gpus-per-node", type=int, metavar="N", help="Override the GPUs of a node.")
    overrides.add_argument("--inter-node-gbps", type=_rate("inter_node_gbps"), metavar="G",
                           help="Override a node's network, Gbit/s (all its NICs, shared by its GPUs).")
    overrides.add_argument("--intra-node-gbps", type=_rate("intra_node_gbps"), metavar="B",
                           help="Override a GPU's link to the others of its node, GB/s.")
    overrides.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                           help="Override whether each layer's passes are replayed from CUDA graphs.")
    overrides.add_argument("--precision", metavar="NAME", help="Override the precision: fp32, fp16 or bf16.")
    overrides.add_argument("--framework", metavar="NAME",
                           help="Override whose kernels the run launches: megatron or reference.")
    overrides.add_argument("--attention", metavar="NAME",
                           help="Override how attention runs: eager (scores in memory) or flash (one fused kernel).")
    overrides.add_argument("--fused-kernels", action=argparse.BooleanOptionalAction, default=None,
                           help="Override whether Megatron's layers run its fused kernels (--no-fused-kernels: "
                                "PyTorch's operators, as Megatron-core's local layers without apex).")
    return parsed


def _rate(field: str) -> Callable[[str], float]:
    """A link rate flag checked as the run config checks ``field`` (:data:`~vtrain.limits.REAL_BOUNDS`): out of
    range, the flag is named, not the run config (``--inter-node-gbps 0.001`` was blamed on the YAML: an audit)."""
    low, high = REAL_BOUNDS[field]

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not low < value <= high:  # NaN too
            raise argparse.ArgumentTypeError(f"must be above {low:g} and at most {high:g} (got {text!r})")
        return value

    return parse


def main(argv: Sequence[str]) -> int:
    """Run `vtrain simulate` with the arguments that follow the command's name; returns the exit code."""
    args = vars(parser().parse_args(argv))
    try:
        simulate_command(**args)
    except InputError as exc:
        return report(exc)
    return 0


def _with_flags(config: str | Path, flags: dict[str, object]) -> str:
    """The run's name for its errors: ``config``, and the flags given that change it (``run.yaml with --dp 4``: a
    layout the flags broke was blamed on the file)."""
    given = [f"--{'no-' if value is False else ''}{name.replace('_', '-')}"
             + ("" if isinstance(value, bool) else f" {value}") for name, value in flags.items() if value is not None]
    return f"{config} with {' '.join(given)}" if given else str(config)


def simulate_command(config: str | Path, profile: Path | None = None, output: Path | None = None, as_json: bool = False,
                     force: bool = False, gpus: int | None = None, device: str | None = None,
                     gpus_per_node: int | None = None, inter_node_gbps: float | None = None,
                     intra_node_gbps: float | None = None, cuda_graphs: bool | None = None,
                     precision: str | None = None, framework: str | None = None, attention: str | None = None,
                     fused_kernels: bool | None = None, seq: int | None = None, **overrides: object) -> None:
    """Predict the iteration of the run config ``config`` (with ``overrides`` of its parallelism; ``seq`` of its
    model's sequence; ``gpus`` (a model without a run of its own, a Hugging Face config or a published
    architecture's name: by default t x d x p),
    ``device``, ``gpus_per_node`` and the link rates of its hardware; ``cuda_graphs``, ``precision``,
    ``framework``, ``attention`` and ``fused_kernels``) and print the summary; with ``output``, write the predicted
    traces there."""
    from vtrain.outputs import check_output
    from vtrain.run_argument import given_run
    from vtrain.runconfig import framework_named, word_named
    from vtrain.simulate import simulate
    from vtrain.tables.store import load_profile

    table = load_profile(profile) if profile is not None else None
    command_line = [name for name, value in (("seq", seq), ("precision", precision), ("framework", framework),
                                             ("attention", attention)) if value is not None]
    given = given_run(config, table, device, command_line)
    run = given.config.with_overrides(**overrides)
    whole = {key: value for key, value in (("cuda_graphs", cuda_graphs), ("precision", precision),
                                           ("framework", framework_named(framework)),
                                           ("attention", word_named(attention)),
                                           ("fused_kernels", fused_kernels)) if value is not None}
    if seq is not None:
        whole["model"] = replace(run.model, seq=seq)
    if whole:
        run = replace(run, **whole)
    flags = {**overrides, "seq": seq, "gpus": gpus, "device": device, "gpus_per_node": gpus_per_node,
             "inter_node_gbps": inter_node_gbps, "intra_node_gbps": intra_node_gbps, "cuda_graphs": cuda_graphs,
             "precision": precision, "framework": framework, "attention": attention, "fused_kernels": fused_kernels}
    if given.model_only:  # a model without a run of its own: GPUs as its layout needs, the batch as given
        gpus = run.parallelism.world_size if gpus is None else gpus
        if overrides.get("global_batch") is None:
            run = run.with_overrides(global_batch=run.parallelism.micro_batch * run.parallelism.dp)
            warn(f"{config}: gives a model, not its batch: simulated with one micro-batch a replica, "
                 f"{run.parallelism.global_batch} sequence(s) (--global-batch sets the sequences an iteration)")
    hardware = {key: value for key, value in (("device_count", gpus), ("device", device),
                                              ("gpus_per_node", gpus_per_node), ("inter_node_gbps", inter_node_gbps),
                                              ("intra_node_gbps", intra_node_gbps)) if value is not None}
    if hardware:
        run = replace(run, hardware=replace(run.hardware, **hardware))
    if output is not None:
        check_output(output, inputs=[config, profile], force=force)
    sim = simulate(run, table, source=_with_flags(config, flags))
    for line in (_memory_warning(sim), _unsharded_warning(run), sim.device.unmeasured_nodes(run.hardware.nodes)):
        if line:
            warn(f"{config}: {line}")
    written = []
    if output is not None:
        from vtrain.simulate.chrome_trace import write_chrome_traces

        written = write_chrome_traces(sim, output, overwrite=force)
    if as_json:
        summary = sim.to_dict()
        summary["traces"] = [str(path) for path in written]
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(sim))
        if written:
            print(f"wrote {len(written)} trace(s) to {output}")


def _memory_warning(sim: Simulation) -> str | None:
    """A warning when the run's largest stage may need more memory per GPU than its device has: the memory model's
    need, as measured peaks would be within the model's error against them (:func:`~vtrain.model.memory.fit_risk`)."""
    from vtrain.model.memory import GIB, WOULD_NOT_FIT, fit_risk, fit_risk_sentence

    need, capacity = sim.largest_stage_bytes, sim.device.memory_bytes
    risk = fit_risk(need, capacity)
    if risk is None:
        return None
    return (f"its largest pipeline stage needs {need / GIB:,.2f} GiB per GPU (memory model: parameters, gradients, "
            f"optimizer state, activations): {fit_risk_sentence(need, capacity)}, "
            f"{'more than' if risk == WOULD_NOT_FIT else 'around'} the {capacity / GIB:,.0f} GiB of "
            f"{sim.device.name}: the run {risk} (`vtrain plan --device-memory` finds plans that do)")


def _unsharded_warning(run: RunConfig) -> str | None:
    """A warning when the distributed optimizer is asked for without data parallelism: one replica shards nothing
    (predicted as the plain optimizer, which it is)."""
    if not (run.parallelism.distributed_optimizer and run.parallelism.dp == 1):
        return None
    return "the distributed optimizer shards the optimizer states over data-parallel replicas; with dp = 1 it " \
           "shards nothing: predicted as without it"


def format_summary(sim: Simulation) -> str:
    """The human-readable summary."""
    from vtrain.runconfig import FRAMEWORK_KERNELS
    from vtrain.simulate.summary import CATEGORIES, describe_task

    ms = 1e-3
    par, hardware = sim.config.parallelism, sim.config.hardware
    total = sim.iteration_us
    lines = [
        f"iteration time   {total * ms:,.3f} ms",
        f"parallelism      t={par.tp} d={par.dp} p={par.pp}, {par.micro_batches} micro-batches of "
        f"{par.micro_batch}, {par.schedule}"
        + (f" (v={par.virtual_stages})" if par.virtual_stages > 1 else "")
        + f", recompute {par.recompute}, dp overlap {'on' if par.dp_overlap else 'off'}"
        + (", sequence parallel" if par.sequence_parallel else "")
        + (", distributed optimizer" if par.distributed_optimizer else "")
        + (f", layers per stage {' '.join(map(str, par.stage_layers))}" if par.stage_layers else "")
        + (", layers replayed from CUDA graphs" if sim.config.cuda_graphs else "")
        + (", flash attention" if sim.config.attention == "flash" else "")
        + ("" if sim.config.fused_kernels else ", without fused kernels"),
        f"model            {sim.config.model.describe()}; {sim.config.precision}, "
        f"{FRAMEWORK_KERNELS[sim.config.framework]}"
        + (f"; the vocabulary padded to {sim.vocab_rows} rows (a multiple of 128·t = {128 * par.tp}, as Megatron "
           f"pads it)" if sim.vocab_rows != sim.config.model.vocab else ""),
        f"device           {sim.device.describe()}",
        *([f"network          {sim.device.describe_network(hardware.gpus_per_node)}"]
          if hardware.device_count > hardware.gpus_per_node else []),
        f"profile          {sim.profile_path or 'none (every latency modelled)'}",
        "breakdown (mean per GPU)",
    ]
    for key in CATEGORIES:
        value = sim.breakdown_us[key]
        share = value / total if total > 0 else 0.0
        lines.append(f"  {key:<10} {value * ms:>12,.3f} ms  {share:6.1%}")
    shares = sim.coverage_share
    lines.append("coverage         " + "  ".join(f"{key} {shares[key]:.1%}" for key in shares)
                 + "  (distinct signatures: "
                 + ", ".join(f"{key} {count}" for key, count in sim.distinct_sources.items()) + ")")
    lines.append("stages           stage  rank   busy ms   idle ms   bubble ms   memory GiB")
    for summary, memory in list(zip(sim.stages, sim.memory))[:_SHOWN_STAGES]:
        lines.append(f"                 {summary.stage:>5} {summary.rank:>5} {summary.busy_us * ms:>9,.1f} "
                     f"{summary.idle_us * ms:>9,.1f} {summary.breakdown_us['bubble'] * ms:>11,.1f} "
                     f"{memory.total_bytes / 2**30:>12,.2f}")
    if len(sim.stages) > _SHOWN_STAGES:
        lines.append(f"                 ... {len(sim.stages) - _SHOWN_STAGES} more (--json for all)")
    path = [describe_task(task) for task in sim.graph.tasks_at(sim.critical_path)]
    shown = path if len(path) <= 2 * _SHOWN_PATH else path[:_SHOWN_PATH] + ["..."] + path[-_SHOWN_PATH:]
    lines.append(f"critical path    {len(path)} tasks: " + " -> ".join(shown))
    return "\n".join(lines)
