"""Entry point of `python -m vtrain.cli.main` and of the `vtrain` console script.

`vtrain ingest` parses its own arguments and runs without importing typer (see :mod:`vtrain.cli.ingest`); every
other command goes through the typer app of :mod:`vtrain.cli.app`, imported only then.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    """Run the command named on the command line."""
    if sys.argv[1:2] == ["ingest"]:
        from vtrain.cli.ingest import main as ingest

        sys.exit(ingest(sys.argv[2:]))
    from vtrain.cli.app import app

    app()


def __getattr__(name: str) -> Any:
    """``app``, the typer app (the console script and the tests use it), imported on first use."""
    if name == "app":
        from vtrain.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
