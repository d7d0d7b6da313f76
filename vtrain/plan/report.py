"""The plan folder: every plan as Parquet and CSV, the frontier, ``report.md``, ``report.html`` (plotly:
cost versus time with the frontier and the reference plan, memory per plan, breakdown of the best plans),
``frontier.svg`` (the cost-versus-time chart as a static image) and ``summary.json``."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl

from vtrain.distributed import worker_pool
from vtrain.model.memory import GIB, fit_risk, fit_risk_sentence
from vtrain.outputs import REPORT, staged, write_json, write_text
from vtrain.plan.cost import (
    DEFAULT_PRICE_PER_GPU_HOUR,
    DEFAULT_TOKENS,
    PRICE_SOURCE,
    TOKENS_SOURCE,
    plan_cost,
)
from vtrain.plan.sweep import INVALID, OUT_OF_MEMORY, SIMULATED, PlanTable
from vtrain.simulate.latency import SOURCES
from vtrain.report import document as doc
from vtrain.runconfig import RunConfig
from vtrain.simulate import simulate
from vtrain.simulate.summary import CATEGORIES
from vtrain.tables.store import Profile

#: frontier plans given a full-simulation breakdown in the report
BREAKDOWN_PLANS = 6


@dataclass(frozen=True)
class Breakdown:
    """Where a plan's iteration goes (a full `vtrain simulate` of it), in milliseconds per category."""

    label: str
    iteration_ms: float
    breakdown_ms: dict[str, float]


#: a plan's recomputation in its short label
_RECOMPUTE_LABELS = {"full": "recompute", "selective": "selective-recompute", "none": "no-recompute"}


def label(row: dict[str, Any]) -> str:
    """``t8 d12 p35 mb1 1f1b full overlap`` for a plan row."""
    schedule = row["schedule"] + (f" v{row['virtual_stages']}" if row["virtual_stages"] > 1 else "")
    return (f"t{row['tp']} d{row['dp']} p{row['pp']} mb{row['micro_batch']} {schedule} "
            f"{_RECOMPUTE_LABELS[row['recompute']]}"
            f"{' overlap' if row['dp_overlap'] else ''}{' sp' if row.get('sequence_parallel') else ''}"
            f"{' dist-opt' if row.get('distributed_optimizer') else ''}")


def out_of_memory(row: dict[str, Any]) -> str | None:
    """What a timed plan that does not fit in the device's memory needs (``does not fit: 39.90 GiB modelled, as
    measured 0.37 GiB or more over the device's memory``); None for one that fits."""
    if row.get("fits") is not False:
        return None
    return (f"does not fit: {row['memory_gib']:.2f} GiB modelled, as measured {row['memory_over_gib']:.2f} GiB or "
            "more over the device's memory (timed all the same)")


def breakdowns(table: PlanTable, profile: Profile | None, limit: int = BREAKDOWN_PLANS) -> list[Breakdown]:
    """Full simulations of up to ``limit`` frontier plans (spread from fastest to cheapest), the best plan and
    the reference, for their breakdown; over the sweep's worker processes when it had some (one such simulation
    of 800,000 tasks, t8 d1 p105 of MT-NLG, takes longer than the whole sweep)."""
    frontier = table.frontier().rows(named=True)
    step = max(1, -(-len(frontier) // limit))
    rows = frontier[::step][:limit]
    for extra in (table.best(), table.reference):
        if extra is not None and extra.get("fits") and all(label(extra) != label(r) for r in rows):
            rows.append(extra)
    configs = [_config(table.base, row) for row in rows]
    workers = min(int(table.settings.get("workers") or 1), len(configs))
    if workers <= 1:
        return [_breakdown(label(row), config, profile) for row, config in zip(rows, configs)]
    tasks = [config.parallelism.pp * config.parallelism.virtual_stages * config.parallelism.micro_batches
             for config in configs]
    with worker_pool(workers) as pool:
        pending = {i: pool.apply_async(_breakdown, (label(rows[i]), configs[i], profile))
                   for i in sorted(range(len(configs)), key=lambda i: -tasks[i])}  # the largest first
        return [pending[i].get() for i in range(len(configs))]


def _breakdown(name: str, config: RunConfig, profile: Profile | None) -> Breakdown:
    sim = simulate(config, profile)
    return Breakdown(name, sim.iteration_us / 1e3, {key: value / 1e3 for key, value in sim.breakdown_us.items()})


def _config(base: RunConfig, row: dict[str, Any]) -> RunConfig:
    from vtrain.plan.space import Candidate

    return Candidate(row["gpus"], row["tp"], row["pp"], row["dp"], row["micro_batch"], row["schedule"],
                     row["virtual_stages"], row["recompute"], row["dp_overlap"],
                     bool(row.get("sequence_parallel")), bool(row.get("distributed_optimizer"))).config(base)


def summary(table: PlanTable) -> dict[str, Any]:
    """The JSON summary (``--json``, ``summary.json``)."""
    counts = table.counts
    return {
        "plans": counts["enumerated"],
        "pruned": {"invalid": counts["invalid"], "out_of_memory": counts["out_of_memory"]},
        "simulated": counts["simulated"],
        "frontier": table.frontier().to_dicts(),
        "best": table.best(),
        "best_reason": table.no_best_reason(),
        "best_memory_risk": best_memory_risk(table),
        "reference": table.reference,
        "model": table.base.model.describe(), "framework": table.base.framework,
        "fused_kernels": table.base.fused_kernels, "precision": table.base.precision,
        "attention": table.base.attention,
        "device": table.device, "device_memory_gib": table.device_memory_gib, "profile": table.profile,
        "limits": {"max_iteration_s": table.max_iteration_s, "budget_usd": table.budget_usd},
        "pricing": {"tokens": table.pricing.tokens, "price_per_gpu_hour": table.pricing.price_per_gpu_hour,
                    "price_source": _price_source(table), "tokens_source": _tokens_source(table)},
    }


def best_memory_risk(table: PlanTable) -> str | None:
    """What the cheapest plan within limits risks in the device's memory, as the measured peaks its modelled need
    stands for would (:func:`~vtrain.model.memory.fit_risk`): plans are kept unless even the lowest of those peaks is
    over (:func:`~vtrain.model.memory.measured_miss`), so the risk is that it may not fit; ``None`` when they all
    fit."""
    best = table.best()
    if best is None:
        return None
    need, capacity = best["memory_gib"] * GIB, table.device_memory_gib * GIB
    risk = fit_risk(need, capacity)
    if risk is None:
        return None
    return (f"the cheapest plan needs {best['memory_gib']:.1f} of {table.device_memory_gib:g} GiB per GPU (memory "
            f"model): {fit_risk_sentence(need, capacity)}: it {risk}; --device-memory with headroom finds one that "
            f"keeps some")


def _price_source(table: PlanTable) -> str:
    return PRICE_SOURCE if table.pricing.price_per_gpu_hour == DEFAULT_PRICE_PER_GPU_HOUR else "--price-per-gpu-hour"


def _tokens_source(table: PlanTable) -> str:
    return TOKENS_SOURCE if table.pricing.tokens == DEFAULT_TOKENS else "--tokens"


def write_plan_folder(table: PlanTable, folder: Path, details: list[Breakdown]) -> None:
    """Write the plan folder atomically (staged beside ``folder``, renamed into place)."""
    with staged(folder, REPORT, "plan") as staging:
        table.plans.write_parquet(staging / "plans.parquet")
        table.plans.write_csv(staging / "plans.csv")
        table.frontier().write_csv(staging / "frontier.csv")
        write_json(staging / "summary.json", summary(table))
        write_text(staging / "report.md", render_markdown(table, details))
        write_text(staging / "report.html", render_html(table, details))
        write_frontier_svg(table, staging / "frontier.svg")


def document(table: PlanTable, details: list[Breakdown], *, with_figures: bool = False) -> doc.Document:
    """The report's sections, in order; with ``with_figures`` the cost-time scatter with the frontier, memory per
    plan and the breakdown of the best plans."""
    counts, base, m = table.counts, table.base, table.base.model
    heading: list[doc.Block] = [
        doc.Text(f"Global batch {base.parallelism.global_batch}, {base.precision}, {base.framework}'s kernels"
                 f"{'' if base.fused_kernels else ' (without its fused ones)'} and optimizer states, "
                 f"{base.attention} attention, "
                 f"{table.device} with "
                 f"{table.device_memory_gib:g} GiB, profile `{table.profile or 'none (every latency modelled)'}`."
                 + (" Every plan with d > 1 with and without Megatron's distributed optimizer (`dist-opt`)."
                    if table.settings.get("distributed_optimizer") else "")),
        doc.Text(f"Priced for {table.pricing.tokens:.3g} tokens ({_tokens_source(table)}) at "
                 f"${table.pricing.price_per_gpu_hour:.4f} per GPU-hour ({_price_source(table)})."),
        doc.Bullets([f"enumerated: {counts['enumerated']}", f"pruned as invalid (divisibility): {counts['invalid']}",
                     f"pruned as out of memory: {counts['out_of_memory']}", f"simulated: {counts['simulated']}"])]
    if with_figures:
        heading += [doc.Figure(_cost_time_figure(table)), doc.Figure(_memory_figure(table))]
    best, risk = table.best(), best_memory_risk(table)
    sections = [doc.Section("Time-versus-cost frontier", [doc.TableBlock(_plan_table(table.frontier().to_dicts()))]),
                doc.Section(f"Cheapest plan ({table.limits()})", [doc.TableBlock(_plan_table([best])) if best
                                                                  else doc.Text("none meets them"),
                                                                  *([doc.Text(f"{risk[0].upper()}{risk[1:]}.",
                                                                              note=True)] if risk else [])])]
    if table.reference is not None:
        unfit = out_of_memory(table.reference)
        sections.append(doc.Section("Reference plan (the given config's own parallelism)",
                                    [doc.TableBlock(_plan_table([table.reference])),
                                     *([doc.Text(f"It {unfit}.", note=True)] if unfit else [])]))
    if details:
        breakdown = (["plan", "iteration", *CATEGORIES],
                     [[d.label, f"{d.iteration_ms:,.0f}", *(f"{d.breakdown_ms[key]:,.0f}" for key in CATEGORIES)]
                      for d in details])
        sections.append(doc.Section("Breakdown of the best plans (full simulation, ms per GPU)", [
            doc.TableBlock(breakdown), *([doc.Figure(_breakdown_figure(details))] if with_figures else [])]))
    sections.append(doc.Section("Every plan", [doc.Text(
        "Every plan, pruned ones included, is in `plans.parquet` / `plans.csv`; coverage columns (measured / "
        "interpolated / modelled) give the share of predicted device time from each source.")]))
    title = f"Training plans: {m.describe()}"
    return doc.Document(title, heading, sections)


def render_markdown(table: PlanTable, details: list[Breakdown]) -> str:
    """``report.md``."""
    return doc.render_markdown(document(table, details))


def render_html(table: PlanTable, details: list[Breakdown]) -> str:
    """``report.html``: the same sections and the charts, plotly.js inlined once."""
    return doc.render_html(document(table, details, with_figures=True), page_title="vtrain plan")


def _plan_table(rows: list[dict[str, Any]]) -> doc.Table:
    header = ["plan", "GPUs", "memory GiB", "iteration s", "MFU", "days", "USD", "timed from"]
    return header, [[label(r), str(r["gpus"]), f"{r['memory_gib']:.1f}", f"{r['iteration_ms'] / 1e3:.2f}",
                     f"{r['mfu']:.1%}", f"{r['days']:.1f}", f"{r['usd']:,.0f}", timed_from(r)] for r in rows]


def timed_from(row: dict[str, Any]) -> str:
    """Where a timed plan's iteration time came from: the shares of it measured (a profile's latency of the same
    shape), interpolated and modelled (the fitted device model, the datasheet), e.g. ``modelled 88 %, measured
    12 %``."""
    shares = sorted(((row.get(source) or 0.0, source) for source in SOURCES), reverse=True)
    return ", ".join(f"{source} {share:.0%}" for share, source in shares if share >= 0.005) or "-"


def _hover(frame: pl.DataFrame) -> list[str]:
    return [f"{label(r)}<br>{r['gpus']} GPUs, {r['iteration_ms'] / 1e3:.2f} s/iteration, "
            f"{r['memory_gib']:.1f} GiB, MFU {r['mfu']:.1%}" for r in frame.iter_rows(named=True)]


@dataclass(frozen=True)
class CostTimeChart:
    """What the cost-versus-time chart shows, in report.html (plotly) and in ``frontier.svg`` (matplotlib)."""

    plans: pl.DataFrame  # every timed plan
    frontier: pl.DataFrame  # fastest first
    marked: list[tuple[str, dict[str, Any]]]  # (what it is, its row): the reference and the cheapest within limits
    limit_days: float | None  # --max-iteration-s as training days
    iterations: float  # iterations to train on the priced tokens: days = iteration s x iterations / 86,400


def cost_time_chart(table: PlanTable) -> CostTimeChart:
    """The chart's data, from the plan table."""
    base = table.base
    iterations = plan_cost(1.0, 1, base.model, base.parallelism.global_batch, table.pricing, 1.0).iterations
    marked = [(name, row) for name, row in (("reference", table.reference), ("cheapest within limits", table.best()))
              if row is not None and row.get("days") is not None]
    limit = table.max_iteration_s * iterations / 86400 if table.max_iteration_s is not None else None
    return CostTimeChart(table.simulated(), table.frontier(), marked, limit, iterations)


def _cost_time_figure(table: PlanTable) -> go.Figure:
    chart = cost_time_chart(table)
    plans, frontier = chart.plans, chart.frontier
    figure = go.Figure()
    figure.add_trace(go.Scatter(x=plans["days"], y=plans["usd"], mode="markers", name="simulated plans",
                                marker={"size": 6, "color": plans["gpus"], "colorscale": "Viridis",
                                        "colorbar": {"title": "GPUs"}, "opacity": 0.7},
                                text=_hover(plans), hoverinfo="text"))
    figure.add_trace(go.Scatter(x=frontier["days"], y=frontier["usd"], mode="lines+markers", name="Pareto frontier",
                                line={"color": "crimson"}, text=_hover(frontier), hoverinfo="text"))
    for name, row in chart.marked:
        figure.add_trace(go.Scatter(x=[row["days"]], y=[row["usd"]], mode="markers+text", name=name,
                                    text=[f"{name}: {label(row)}"], textposition="top center",
                                    marker={"size": 16, "symbol": _SYMBOLS[name][0], "color": "black"}))
    figure.update_layout(title="Training cost versus time", xaxis_title="training days", yaxis_title="USD",
                         height=560)
    return figure


def _number(value: float, _: int) -> str:
    return f"{value:g}"


def _leading(value: float) -> int:
    """The first significant digit of a positive ``value``."""
    return int(f"{value:e}"[0])


def _dollars(value: float, _: int) -> str:
    return f"${value / 1e6:g}M" if value >= 1e6 else f"${value:,.0f}"


#: the marked plans' symbols (plotly, matplotlib)
_SYMBOLS = {"reference": ("star", "*"), "cheapest within limits": ("diamond", "D")}


def write_frontier_svg(table: PlanTable, path: Path) -> None:
    """``frontier.svg``: the cost-versus-time chart of report.html as a static image (matplotlib; text kept as
    SVG text, no timestamp, fixed ids, so the same plans give the same file)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    chart = cost_time_chart(table)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "vtrain", "font.size": 9}):
        figure = Figure(figsize=(9, 6), layout="constrained")
        axes = figure.add_subplot()
        points = axes.scatter(chart.plans["days"], chart.plans["usd"], c=chart.plans["gpus"], cmap="viridis", s=12,
                              alpha=0.7, linewidths=0, label="simulated plans")
        figure.colorbar(points, ax=axes, label="GPUs")
        axes.plot(chart.frontier["days"], chart.frontier["usd"], "-o", color="crimson", markersize=3,
                  label="Pareto frontier")
        if chart.limit_days is not None:
            axes.axvline(chart.limit_days, color="gray", linestyle="--", linewidth=1,
                         label=f"{table.max_iteration_s:g} s per iteration")
        for name, row in chart.marked:
            axes.plot([row["days"]], [row["usd"]], _SYMBOLS[name][1], color="black", markersize=9,
                      markerfacecolor="none" if name == "reference" else "black", label=f"{name}: {label(row)}")
        if chart.plans.is_empty():  # every plan invalid or out of memory: nothing to put on log axes
            axes.text(0.5, 0.5, textwrap.fill(table.no_best_reason() or "", 60), ha="center", va="center",
                      transform=axes.transAxes)
        axes.set(xscale=_scale(chart.plans["days"]), yscale=_scale(chart.plans["usd"]), ylabel="USD",
                 title=f"Training cost versus time ({len(chart.plans)} plans)",
                 xlabel=f"training days ({table.pricing.tokens / 1e9:g}B tokens: {chart.iterations:,.0f} iterations)")
        for axis, form in ((axes.xaxis, _number), (axes.yaxis, _dollars)):
            axis.set_major_formatter(FuncFormatter(form))
            axis.set_minor_formatter(FuncFormatter(lambda value, at, form=form: form(value, at) if _leading(value)
                                                   in (2, 3, 5) else ""))
        figure.legend(loc="outside lower center", ncols=2, fontsize=8)
        figure.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")


def _scale(values: pl.Series) -> str:
    """A chart axis's scale for ``values``: logarithmic where they are all positive, else linear (none, or every
    cost $0 at ``--price-per-gpu-hour 0``: a log axis has no place for 0, and matplotlib warned)."""
    return "log" if len(values) and values.min() > 0 else "linear"


def _memory_figure(table: PlanTable) -> go.Figure:
    valid = table.plans.filter(pl.col("status") != INVALID).with_row_index("plan")
    figure = go.Figure()
    for status, color in ((SIMULATED, "seagreen"), (OUT_OF_MEMORY, "lightgray")):
        part = valid.filter(pl.col("status") == status)
        text = [f"{label(r)}<br>{r['gpus']} GPUs, {r['memory_gib']:.1f} GiB" for r in part.iter_rows(named=True)]
        figure.add_trace(go.Scatter(x=part["tp"] * part["pp"], y=part["memory_gib"], mode="markers",
                                    name="fits" if status == SIMULATED else "out of memory",
                                    marker={"color": color, "size": 5}, text=text, hoverinfo="text"))
    figure.add_hline(y=table.device_memory_gib, line_dash="dash", annotation_text="device memory")
    figure.update_layout(title="Peak memory per GPU of every valid plan", xaxis_title="model-parallel GPUs (t·p)",
                         yaxis_title="GiB", xaxis_type="log", yaxis_type="log", height=480)
    return figure


def _breakdown_figure(details: list[Breakdown]) -> go.Figure:
    figure = go.Figure()
    for key in CATEGORIES:
        figure.add_trace(go.Bar(name=key, y=[d.label for d in details], x=[d.breakdown_ms[key] / 1e3 for d in details],
                                orientation="h"))
    figure.update_layout(barmode="stack", title="Where the iteration goes (full simulation of the best plans)",
                         xaxis_title="seconds per iteration (mean over GPUs)", height=120 + 50 * len(details))
    return figure
