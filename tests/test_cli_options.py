"""Options that several commands share are one definition (vtrain/cli/options.py): same flag, default, bounds and
help in `vtrain cluster` and `vtrain size`."""

from __future__ import annotations

import typer

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
