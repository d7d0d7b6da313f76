"""What a command's run argument names (`vtrain simulate RUN`, `vtrain plan RUN`, `vtrain validate --config RUN`): a
run config (vtrain's YAML/JSON, vTrain's config JSON), a Hugging Face ``config.json`` or a published architecture's
name (a model without a run of its own), or a Megatron-LM training log (the run it logged, and the time it
measured)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from vtrain.errors import warn_input
from vtrain.fit.device import profile_gpu
from vtrain.runconfig import RunConfig, load_given_run

if TYPE_CHECKING:
    from vtrain.tables.store import Profile


class GivenRun(NamedTuple):
    """A run argument's run config, whether it gives only a model (no GPUs, no batch of its own), and whether it
    is a log's run (whose GPU the log does not say)."""

    config: RunConfig
    model_only: bool
    logged: bool = False


def given_run(path: str | Path, profile: Profile | None = None, device: str | None = None,
              command_line: Collection[str] = ()) -> GivenRun:
    """The run ``path`` names: a Megatron log's last run (with a warning line saying which, and what it measured),
    on ``device``, else the profile's GPU (:func:`~vtrain.fit.device.profile_gpu`), as ``validate
    --measurements`` predicts a log's runs; else :func:`~vtrain.runconfig.load_given_run`'s, a model without a run
    of its own (a name, a Hugging Face config) on ``device``, else the profile's GPU; what such a model's line says
    was assumed leaves out the settings ``command_line`` gives (``seq``, ``precision``, ``framework``,
    ``attention``)."""
    gpu = device or (profile_gpu(profile) if profile is not None else None)
    logged = _logged_run(Path(path), gpu)
    if logged is not None:
        return GivenRun(logged, model_only=False, logged=True)
    config, model_only = load_given_run(path, command_line)
    if model_only and gpu:
        config = replace(config, hardware=replace(config.hardware, device=gpu))
    elif model_only and profile is not None:
        _unknown_gpu_warning(profile, config, path)
    return GivenRun(config, model_only)


def _unknown_gpu_warning(profile: Profile, config: RunConfig, path: str | Path) -> None:
    """A warning when a model without a run of its own goes on its default GPU because the profile's traces ran on
    a device vtrain does not know (its kernels are that device's, the rest is timed on the default's datasheet)."""
    traced = str((profile.metadata.get("device") or {}).get("name") or "")
    if traced and traced.lower() not in ("cpu", "host"):
        warn_input(f"the profile {profile.source or ''} was traced on {traced!r}, a GPU vtrain does not know: the "
                   f"run goes on an {config.hardware.device}, whose datasheet times what the profile did not "
                   f"measure (--device names the GPU)", path)


#: the suffixes of run configs (vtrain's YAML, vTrain's and Hugging Face's JSON): never read as a log
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def _logged_run(path: Path, device: str | None) -> RunConfig | None:
    """The last run of a Megatron log as its run config (None when ``path`` is no such log); its measured time said
    on one warning line; a run the log describes but vtrain does not simulate is an error saying why."""
    if path.suffix.lower() in _CONFIG_SUFFIXES or not _is_file(path):
        return None  # a run config, a model's config.json, a trace folder, a name: spared importing the readers
    from vtrain.errors import InputError
    from vtrain.importers._read import read_text
    from vtrain.importers.measurements import measurement_config, read_measurements_text, row_problem
    from vtrain.importers.megatron_log import is_megatron_log, unreadable_log

    try:
        text = read_text(path)
    except (InputError, OSError):  # not text, unreadable: load_run_config says what it is
        return None
    if why := unreadable_log(text):
        raise InputError(why, path)
    if not is_megatron_log(text):
        return None
    runs = read_measurements_text(path, text)
    row = runs.row(runs.height - 1, named=True)
    which = f"its last of {runs.height} runs" if runs.height > 1 else "the run it logs"
    problem = row_problem(row)
    if problem:
        raise InputError(f"{which}: {problem}", path)
    warn_input(f"a Megatron log: {which}, measured {row['iteration_ms']:,.1f} ms an iteration (the median of its "
               f"logged intervals but the first)", path)
    return measurement_config(row, **({"device": device} if device else {}))


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file (a name too long for a file name is none: Python 3.11's pathlib raises)."""
    try:
        return path.is_file()
    except OSError:
        return False
