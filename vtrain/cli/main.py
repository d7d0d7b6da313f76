"""Entry point of the `vtrain` console script."""

from __future__ import annotations

import typer

from vtrain.cli import ingest, record, simulate, tables
from vtrain.cli import validate
from vtrain.cli import calibrate, fit

app = typer.Typer(
    name="vtrain",
    help="Trace-driven simulator and validator for 3D-parallel LLM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("ingest")(ingest.ingest_command)
app.command("tables")(tables.tables_command)
app.command("record")(record.record_command)
app.command("simulate")(simulate.simulate_command)
app.command("validate")(validate.validate_command)
app.command("calibrate")(calibrate.calibrate_command)
app.command("fit")(fit.fit_command)

if __name__ == "__main__":
    app()
