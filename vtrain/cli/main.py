"""Entry point of the `vtrain` console script.

A command's module is imported only when that command runs (or when the help lists the commands): importing
every command's dependencies up front (networkx, plotly, the simulator, ...) made each command start over half
a second later.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer import _click  # typer's own copy of click

#: command name -> (module, function)
COMMANDS = {
    "ingest": ("vtrain.cli.ingest", "ingest_command"),
    "tables": ("vtrain.cli.tables", "tables_command"),
    "record": ("vtrain.cli.record", "record_command"),
    "simulate": ("vtrain.cli.simulate", "simulate_command"),
    "validate": ("vtrain.cli.validate", "validate_command"),
    "calibrate": ("vtrain.cli.calibrate", "calibrate_command"),
    "fit": ("vtrain.cli.fit", "fit_command"),
}


class _LazyCommands(TyperGroup):
    """The command group, loading a command's module on first use."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, function = COMMANDS[cmd_name]
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        single.command(cmd_name)(getattr(importlib.import_module(module), function))
        return typer.main.get_command(single)


app = typer.Typer(
    name="vtrain",
    help="Trace-driven simulator and validator for 3D-parallel LLM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_LazyCommands,
)


@app.callback()
def _group() -> None:
    """Trace-driven simulator and validator for 3D-parallel LLM training."""


if __name__ == "__main__":
    app()
