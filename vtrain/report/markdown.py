"""``report.md``: the validation report as Markdown."""

from __future__ import annotations

from vtrain.report import tables
from vtrain.report.tables import Table
from vtrain.validate.compare import Comparison
from vtrain.validate.run import Validation


def markdown_table(table: Table) -> str:
    header, rows = table
    if not rows:
        return "_none_\n"
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_markdown(v: Validation) -> str:
    """The whole report."""
    out = [f"# Validation report: `{v.trace_dir}`\n",
           f"- ranks {v.ranks} of world size {v.world_size or '?'}, {v.device} traces",
           f"- profiled iterations {v.iterations}; steady iterations {v.steady} (the first profiled one excluded)",
           f"- run described by: {v.config_source or 'nothing (replay only)'}",
           f"- iteration time: {v.measured['definition']}\n",
           "## Iteration time\n", markdown_table(tables.headline(v.replay, v.model)),
           "\nMeasured spread over the steady iterations:\n", markdown_table(tables.spread(v.measured))]
    out += _prediction("Replay: the traces' own dependency graph, re-simulated with measured durations", v.replay)
    out.append("### Dependency model\n")
    out.append(markdown_table(tables.dependencies(v.replay)))
    if v.model is not None:
        out += _prediction("Model: `vtrain simulate` of the described run", v.model)
        out.append("### Where the error comes from\n")
        out += [f"- {line}" for line in tables.where_the_error_comes_from(v.model)] + [""]
        out.append("### Operators found on one side only\n")
        out.append(markdown_table(tables.one_side(v.model)))
    else:
        out.append(f"## Model\n\nNo model-driven prediction: {v.model_reason}\n")
    out.append("## HTA on the measured and the predicted traces\n")
    hta = tables.hta(v.hta)
    if hta is None:
        out.append(f"{v.hta.get('reason') or 'HTA gave no result.'}\n")
    else:
        out.append("Temporal breakdown and communication/computation overlap (HTA, whole trace):\n")
        out.append(markdown_table(hta))
        for side in ("measured", "replay", "model"):
            if isinstance(v.hta.get(side), dict) and "reason" in v.hta[side]:
                out.append(f"- {side}: {v.hta[side]['reason']}")
    if v.warnings:
        out.append("\n## Warnings\n")
        out += [f"- {line}" for line in v.warnings]
    return "\n".join(out) + "\n"


def _prediction(title: str, c: Comparison) -> list[str]:
    out = [f"## {title}\n", f"Iteration time: measured {tables.ms(c.measured_ms)} ms, predicted "
                            f"{tables.ms(c.predicted_ms)} ms, error {tables.pct(c.error_pct)}.\n"]
    if c.details.get("profile"):
        out.append(f"Latency tables: {c.details['profile']}.\n")
    out += [f"- {note}" for note in c.notes]
    out += ["", "### Per iteration\n", markdown_table(tables.iterations(c))]
    if c.phases:
        out += ["### Per phase (time in phase spans per rank and iteration)\n",
                markdown_table(tables.grouped(c.phases, "phase"))]
    if c.stages:
        out += ["### Per pipeline stage (time in phase spans per rank and iteration)\n",
                markdown_table(tables.grouped(c.stages, "stage"))]
    if c.micro_batches:
        out += ["### Per micro-batch (time in its passes per rank and iteration)\n",
                markdown_table(tables.grouped(c.micro_batches, "micro_batch"))]
    out += ["### Per operator class (per rank and iteration)\n", markdown_table(tables.classes(c)),
            "### Breakdown (per rank and iteration)\n", markdown_table(tables.breakdown(c)),
            "### Ten worst-predicted operators\n", markdown_table(tables.worst(c))]
    return out
