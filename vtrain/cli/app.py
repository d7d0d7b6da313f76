"""The typer app of the `vtrain` commands.

A command's module is imported only when that command runs (or when the help lists the commands): importing
every command's dependencies up front (networkx, plotly, the simulator, ...) made each command start over half
a second later. `vtrain ingest` and `vtrain simulate` parse their own arguments (see :mod:`vtrain.cli.ingest`):
here they are commands that hand them over.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer import _click  # typer's own copy of click

#: command name -> (module, function, the line `vtrain --help` lists it with: at most 60 characters, so that click,
#: which cuts a longer one at 80 columns, shows it whole)
COMMANDS = {
    "ingest": ("vtrain.cli.app", "own_arguments_command", "Read Kineto traces (one per rank) into latency tables."),
    "tables": ("vtrain.cli.tables", "tables_command", "Print a profile's operator and NCCL latency tables."),
    "record": ("vtrain.cli.record", "record_command", "Train a GPT with real t, p and d parallelism; trace it."),
    "simulate": ("vtrain.cli.app", "own_arguments_command", "Predict a run's iteration time and timeline."),
    "validate": ("vtrain.cli.validate", "validate_command", "Replay and model measured traces; report the error."),
    "calibrate": ("vtrain.cli.calibrate", "calibrate_command", "Make a profile's new version from new traces; drift."),
    "fit": ("vtrain.cli.fit", "fit_command", "Fit a device model to measurements made elsewhere."),
    "plan": ("vtrain.cli.plan", "plan_command", "Search parallel plans by time, memory and cost."),
    "whatif": ("vtrain.cli.whatif", "whatif_command", "Re-time a measured run with changed durations."),
    "cluster": ("vtrain.cli.cluster", "cluster_command", "Share a GPU cluster among jobs: FIFO against vTrain's."),
    "size": ("vtrain.cli.size", "size_command", "Find the lowest-loss model shape for a GPU budget."),
}

#: for a command that parses its own arguments: all of them, help included, are handed to it unparsed
_OWN_ARGUMENTS = {"context_settings": {"ignore_unknown_options": True, "allow_extra_args": True},
                  "add_help_option": False}


def own_arguments_command(ctx: typer.Context) -> None:
    """Hand the arguments to the command's own parser (`vtrain ingest`, `vtrain simulate`)."""
    from vtrain.cli.main import OWN_ARGUMENTS

    raise typer.Exit(importlib.import_module(OWN_ARGUMENTS[str(ctx.info_name)]).main(ctx.args))


class _LazyCommands(TyperGroup):
    """The command group, loading a command's module on first use."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, function, short_help = COMMANDS[cmd_name]
        settings: dict[str, Any] = {"short_help": short_help}
        if module == __name__:  # a command that parses its own arguments
            from vtrain.cli.main import OWN_ARGUMENTS

            settings |= {"help": importlib.import_module(OWN_ARGUMENTS[cmd_name]).HELP, **_OWN_ARGUMENTS}
        single = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
        single.command(cmd_name, **settings)(getattr(importlib.import_module(module), function))
        return typer.main.get_command(single)


app = typer.Typer(
    name="vtrain",
    help="Trace-driven simulator and validator for 3D-parallel LLM training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's help: flags wrap, never cut at 80 columns (rich's cut --price-per-gp…)
    cls=_LazyCommands,
)


@app.callback()
def _group() -> None:
    """Trace-driven simulator and validator for 3D-parallel LLM training."""
