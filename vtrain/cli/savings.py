"""``python -m vtrain.cli.savings PLAN_DIR [PLAN_DIR ...]``: print what the plans of each `vtrain plan` folder
save over the plan the run used (:func:`vtrain.studies.savings.savings_table`); bad input is one line, exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

from vtrain.cli.errors import report
from vtrain.errors import InputError
from vtrain.studies.savings import savings_table


def main(argv: list[str]) -> int:
    """Print the comparison of every plan folder named in ``argv``."""
    if not argv:
        print("usage: python -m vtrain.cli.savings PLAN_DIR [PLAN_DIR ...]", file=sys.stderr)
        return 2
    try:
        for folder in map(Path, argv):
            print(f"### {folder.name}\n\n{savings_table(folder)}")
    except InputError as exc:
        return report(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
