"""The sizing study's output: ``report.md`` / ``report.html`` (the answer with real plans next to the fixed-MFU
answers, the loss-versus-size curve, every shape's plan), ``size.json`` and ``candidates.csv``."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vtrain.outputs import write_json, write_text
from vtrain.report.document import Document, Figure, Section, TableBlock, Text, render_html, render_markdown
from vtrain.studies.predict import STUDIED_SPACE
from vtrain.studies.sizing import Budget, LossModel, Sized, best


@dataclass(frozen=True)
class SizeStudy:
    """The shapes under a budget, with their best plans and at a fixed MFU."""

    budget: Budget
    planned: list[Sized]
    fixed: list[Sized]
    mfu: float
    hardware: str
    profile: str | None
    loss_model: LossModel


def size_summary(study: SizeStudy) -> dict[str, Any]:
    """The JSON summary (``--json``, ``size.json``): the answer with real plans at the top level."""
    answer = best(study.planned)
    flops = study.budget.flops(study.mfu)
    n_opt, d_opt = study.loss_model.optimum(flops)
    fixed = best(study.fixed)
    return {
        **(answer.to_dict() if answer else {"parameters": None, "tokens": None, "plan": None, "loss": None}),
        "source": "modelled: each shape's speed from its best plan, timed by vtrain from the profile",
        "plans_searched": STUDIED_SPACE,
        "loss_model": study.loss_model.source,
        "budget": {"gpus": study.budget.gpus, "days": study.budget.days, "hardware": study.hardware,
                   "peak_flops_per_gpu": study.budget.peak_flops, "profile": study.profile},
        "fixed_mfu": {"mfu": study.mfu, "flops": flops,
                      "closed_form": {"parameters": n_opt, "tokens": d_opt,
                                      "loss": study.loss_model.loss(n_opt, d_opt)},
                      "grid": fixed.to_dict() if fixed else None},
        "candidates": [s.to_dict() for s in study.planned],
    }


def write_size_files(study: SizeStudy, folder: Path) -> None:
    """Every file of the study into ``folder`` (a staging folder)."""
    document = size_document(study)
    write_text(folder / "report.md", render_markdown(document))
    write_text(folder / "report.html", render_html(document))
    write_json(folder / "size.json", size_summary(study))
    with (folder / "candidates.csv").open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["layers", "hidden", "heads", "kv_heads", "ffn_hidden", "parameters", "plan", "mfu",
                         "tokens_per_s", "tokens", "loss", "fixed_mfu_tokens", "fixed_mfu_loss"])
        for planned, fixed in zip(study.planned, study.fixed):
            p = planned.prediction
            m = planned.model
            writer.writerow([m.layers, m.hidden, m.heads, m.query_groups, m.ffn, planned.parameters,
                             p.label if p else "", f"{p.plan.get('mfu', float('nan')):.4f}" if p else "",
                             f"{p.tokens_per_s:.1f}" if p else "", f"{planned.tokens:.4g}", f"{planned.loss:.5f}",
                             f"{fixed.tokens:.4g}", f"{fixed.loss:.5f}"])


def size_document(study: SizeStudy) -> Document:
    """The report's sections."""
    b = study.budget
    answer, fixed = best(study.planned), best(study.fixed)
    n_opt, d_opt = study.loss_model.optimum(b.flops(study.mfu))
    rows = [["closed form at a fixed MFU", f"{n_opt / 1e9:.1f}B", "–", f"{d_opt / 1e9:,.0f}B",
             f"{study.mfu:.0%} (assumed)", f"{study.loss_model.loss(n_opt, d_opt):.4f}"]]
    if fixed is not None:
        rows.append(["best shape at a fixed MFU", f"{fixed.parameters / 1e9:.1f}B", _shape(fixed), 
                     f"{fixed.tokens / 1e9:,.0f}B", f"{study.mfu:.0%} (assumed)", f"{fixed.loss:.4f}"])
    if answer is not None and answer.prediction is not None:
        rows.append(["best shape with its best plan (vtrain)", f"{answer.parameters / 1e9:.1f}B",
                     f"{_shape(answer)}, {answer.prediction.label}", f"{answer.tokens / 1e9:,.0f}B",
                     f"{answer.prediction.plan.get('mfu', float('nan')):.1%} (predicted)", f"{answer.loss:.4f}"])
    heading = [
        Text(f"Budget: {b.gpus} GPUs ({study.hardware}) for {b.days:g} days; profile {study.profile}."),
        Text(f"Loss: {study.loss_model.source}. A shape trains for the whole budget: its tokens are its best plan's "
             "tokens/s (modelled by vtrain from the profile) × the budget's seconds; the fixed-MFU answers assume "
             f"every model runs at {study.mfu:.0%} of peak ({b.peak_flops / 1e12:g} TFLOP/s per GPU) and "
             f"D = C / (6·N). {STUDIED_SPACE}", note=True),
        TableBlock((["answer", "parameters", "shape, plan", "tokens", "MFU", "loss"], rows)),
    ]
    sections = [Section("Loss versus model size", [Figure(loss_figure(study))]),
                Section("Every shape", [TableBlock(_candidate_table(study))])]
    return Document(title="Compute-optimal model size for a GPU budget", heading=heading, sections=sections)


def loss_figure(study: SizeStudy):  # -> plotly Figure
    """Loss against parameters: with each shape's best plan, at the fixed MFU, and the closed-form optimum."""
    import plotly.graph_objects as go

    figure = go.Figure()
    runnable = [s for s in study.planned if s.prediction is not None]
    figure.add_trace(go.Scatter(x=[s.parameters for s in runnable], y=[s.loss for s in runnable],
                                mode="lines+markers", name="best plan per shape (vtrain)",
                                text=[f"{_shape(s)}: {s.prediction.label}, MFU {s.prediction.plan.get('mfu', 0):.0%}"
                                      for s in runnable]))
    figure.add_trace(go.Scatter(x=[s.parameters for s in study.fixed], y=[s.loss for s in study.fixed],
                                mode="lines+markers", name=f"fixed MFU {study.mfu:.0%}", line={"dash": "dash"}))
    n_opt, d_opt = study.loss_model.optimum(study.budget.flops(study.mfu))
    figure.add_trace(go.Scatter(x=[n_opt], y=[study.loss_model.loss(n_opt, d_opt)], mode="markers",
                                marker={"symbol": "star", "size": 14}, name="closed-form optimum (fixed MFU)"))
    figure.update_layout(title=f"{study.budget.gpus} GPUs × {study.budget.days:g} days",
                         xaxis={"title": "parameters", "type": "log"}, yaxis={"title": "predicted loss"})
    return figure


def _shape(s: Sized) -> str:
    """``l48 h8192 a64``, with a LLaMA-like layer's key/value heads and MLP width (``kv8 f28672``)."""
    m = s.model
    llama = f" kv{m.query_groups} f{m.ffn}" if not m.is_gpt else ""
    return f"l{m.layers} h{m.hidden} a{m.heads}{llama}"


def _candidate_table(study: SizeStudy) -> tuple[list[str], list[list[str]]]:
    rows = []
    for planned, fixed in zip(study.planned, study.fixed):
        p = planned.prediction
        rows.append([_shape(planned), f"{planned.parameters / 1e9:.1f}B", p.label if p else "no plan fits",
                     f"{p.plan.get('mfu', float('nan')):.1%}" if p else "–", f"{p.tokens_per_s:,.0f}" if p else "–",
                     f"{planned.tokens / 1e9:,.0f}B" if p else "–", f"{planned.loss:.4f}" if p else "–",
                     f"{fixed.tokens / 1e9:,.0f}B", f"{fixed.loss:.4f}"])
    return (["shape", "parameters", "best plan", "MFU", "tokens/s", "tokens", "loss", "tokens (fixed MFU)",
             "loss (fixed MFU)"], rows)
