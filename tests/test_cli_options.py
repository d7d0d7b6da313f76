"""Options that several commands share are one definition (vtrain/cli/options.py): same flag, default, bounds and
help in `vtrain cluster` and `vtrain size`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from vtrain.cli.app import COMMANDS
from vtrain.cli.main import app

SHARED = ("--profile", "--force", "--device", "--gpus-per-node", "--inter-node-gbps", "--device-memory",
          "--max-micro-batch")


def _options(command: str) -> dict[str, dict[str, object]]:
    group = typer.main.get_command(app)
    click_command = group.get_command(group.make_context("vtrain", [command]), command)  # type: ignore[attr-defined]
    described = {}
    for param in click_command.params:
        if param.param_type_name != "option":
            continue
        for flag in param.opts:
            described[flag] = {"name": param.name, "default": param.default, "help": param.help,
                               "required": param.required, "bounds": (param.min, param.max)}
    return described


def test_cluster_and_size_share_their_hardware_and_profile_options() -> None:
    cluster, size = _options("cluster"), _options("size")
    for flag in SHARED:
        assert flag in cluster and flag in size, flag
        assert cluster[flag] == size[flag], flag
    # the bounds travel with the definition: above 0.001 (the parser's check, the run config's bound), at most 1e6
    assert cluster["--inter-node-gbps"]["bounds"] == (None, 1e6)
    assert size["--max-micro-batch"]["default"] == 4


def test_the_command_list_shows_every_command_whole_at_80_columns() -> None:
    """`vtrain --help` lists each command with a line of its own, not one cut with '...' (click cuts a docstring's
    first sentence to fit 80 columns: 'Turn real Kineto traces into kernel, CPU-op, collective and...')."""
    listed = subprocess.run([sys.executable, "-m", "vtrain.cli.main", "--help"], capture_output=True, text=True,
                            env={"COLUMNS": "80", "PATH": ""}, check=True).stdout
    lines = {line.split()[0]: line for line in listed.split("Commands:")[1].splitlines() if line.strip()}
    assert sorted(lines) == sorted(COMMANDS)
    for name, line in lines.items():
        assert not line.rstrip().endswith("..."), line
        assert COMMANDS[name][2] in line and len(line) <= 80, line


def test_running_out_of_memory_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Under a memory limit (`ulimit -v`, a container's) a command ended in a MemoryError traceback, exit 1 (an
    audit: `ingest` at 400 MB); now one line says what ran out."""
    from vtrain.cli import main as entry

    def exhausted(argv: list[str]) -> None:
        raise MemoryError

    monkeypatch.setattr(entry, "_run", exhausted)
    monkeypatch.setattr(sys, "argv", ["vtrain", "tables", "profiles/a100"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and err.startswith("error: out of memory") and err.count("\n") == 1, err
