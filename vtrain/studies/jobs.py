"""Reading a cluster's job list (``JOBS.yaml``), strictly.

::

    jobs:
      - {name: gpt-13b, layers: 40, hidden: 5120, heads: 40, seq: 2048, tokens: 2.0e9, arrival_h: 0, gpus: 32}
      - {name: gpt-1.3b, layers: 24, hidden: 2048, heads: 16, seq: 2048, vocab: 51200, tokens: 5.0e9,
         arrival_h: 1.5, deadline_h: 6, gpus: 8, global_batch: 512}

A job may name a published architecture instead of giving its shape (``{name: chat, model: llama-2-70b, tokens:
2.0e10, arrival_h: 0, gpus: 64}``: :mod:`vtrain.architectures`): it gives the model keys the job leaves out
(layers to vocabulary; the job's own win). ``vocab`` (default 51200), ``deadline_h`` (hours after arrival),
``gpus`` (what the job asks for; the baseline policy needs it), ``global_batch`` (sequences per iteration, default
512) and a LLaMA-like layer's ``kv_heads``, ``ffn_hidden``, ``mlp``, ``norm``, ``position``, ``bias``, ``qkv_bias``,
``tie_embeddings`` and ``dropout`` (as a run config's model section says them) are optional.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from vtrain.architectures import architecture, known_names
from vtrain.configfile import read_config_file
from vtrain.errors import InputError
from vtrain.limits import MAX_JOB_HOURS, MAX_TOKENS, integer_problem, shown
from vtrain.runconfig import ModelConfig, RunConfig
from vtrain.studies.cluster import Job
from vtrain.studies.throughput import Workload

DEFAULT_VOCAB = 51200
DEFAULT_GLOBAL_BATCH = 512
_REQUIRED = ("name", "layers", "hidden", "heads", "seq", "tokens", "arrival_h")
_OPTIONAL = ("model", "vocab", "deadline_h", "gpus", "global_batch", "kv_heads", "ffn_hidden", "mlp", "norm",
             "position", "bias", "qkv_bias", "tie_embeddings", "dropout")
#: the keys that say the job's model, as a run config's model section names them
_MODEL_KEYS = ("layers", "hidden", "heads", "seq", "vocab", "kv_heads", "ffn_hidden", "mlp", "norm", "position", "bias",
               "qkv_bias", "tie_embeddings", "dropout")
#: what an out-of-range value likely is, by key
_HIGH_WHY = {"arrival_h": ": hours, ten years at most (a Unix timestamp is in seconds)",
             "deadline_h": ": hours after the arrival, ten years at most",
             "tokens": ": the largest runs train on about 1.5e13"}
#: more jobs than this is not a study one runs on a laptop (each job is swept on every allocation size)
MAX_JOBS = 200


def read_jobs(path: Path, framework: str = "megatron") -> list[Job]:
    """The jobs of ``path``, each a model ``framework`` places; :class:`InputError` naming the file and the first
    problem."""
    data = read_config_file(path, "jobs file")
    if isinstance(data, dict) and "jobs" in data and set(data) != {"jobs"}:  # named, as a run config names them
        others = ", ".join(repr(str(key)) for key in data if key != "jobs")
        raise InputError(f"unknown top-level key(s) {others}: a jobs file is a mapping with one key, jobs: a list "
                         f"of jobs (the cluster is given by cluster's flags: --gpus, --gpus-per-node, ...)", path)
    if not isinstance(data, dict) or set(data) != {"jobs"} or not isinstance(data["jobs"], list):
        raise InputError("a jobs file is a mapping with one key, jobs: a list of jobs", path)
    entries = data["jobs"]
    if not entries:
        raise InputError("no jobs", path)
    if len(entries) > MAX_JOBS:
        raise InputError(f"{len(entries)} jobs (at most {MAX_JOBS})", path)
    jobs = [_job(entry, index, path, framework) for index, entry in enumerate(entries)]
    names = [job.name for job in jobs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputError(f"job names must be unique: {', '.join(duplicates)}", path)
    return jobs


def _job(entry: Any, index: int, path: Path, framework: str) -> Job:
    where = f"job {index + 1}"
    if not isinstance(entry, dict):
        raise InputError(f"{where} is not a mapping", path)
    entry = _with_architecture(entry, where, path)
    missing = [key for key in _REQUIRED if key not in entry]
    unknown = sorted(set(map(str, entry)) - set(_REQUIRED) - set(_OPTIONAL))
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)}", path)
    if unknown:
        raise InputError(f"{where}: unknown key {', '.join(unknown)} (known: {', '.join(_REQUIRED + _OPTIONAL)})",
                         path)
    name = entry["name"]
    if not isinstance(name, str) or not name.strip():
        raise InputError(f"{where}: name must be a non-empty string", path)
    where = f"job {name!r}"
    entry = {"vocab": DEFAULT_VOCAB, "global_batch": DEFAULT_GLOBAL_BATCH, **entry}
    for key in ("layers", "hidden", "heads", "seq", "vocab", "global_batch"):
        problem = integer_problem(key, entry[key])
        if problem:
            raise InputError(f"{where}: {problem}", path)
    model = ModelConfig(**{key: entry[key] for key in _MODEL_KEYS if key in entry})
    problems = RunConfig(model=model, framework=framework).model_errors()
    if problems:
        raise InputError(f"{where}: {problems[0]}", path)
    if entry.get("gpus") is not None:
        problem = integer_problem("device_count", entry["gpus"])
        if problem:
            raise InputError(f"{where}: gpus: {problem}", path)
    tokens = _number(entry["tokens"], "tokens", where, path, positive=True, high=MAX_TOKENS)
    arrival = _number(entry["arrival_h"], "arrival_h", where, path, positive=False, high=MAX_JOB_HOURS)
    deadline = entry.get("deadline_h")
    if deadline is not None:
        deadline = _number(deadline, "deadline_h", where, path, positive=True, high=MAX_JOB_HOURS)
    return Job(name=name, workload=Workload(model, entry["global_batch"]), tokens=tokens, arrival_h=arrival,
               deadline_h=deadline, gpus=entry.get("gpus"))


def _with_architecture(entry: dict[str, Any], where: str, path: Path) -> dict[str, Any]:
    """A job's keys with the model keys its ``model`` (a published architecture's name) gives where the job has
    none; unchanged without one; an :class:`InputError` for a name vtrain does not know."""
    named = entry.get("model")
    if named is None:
        return entry
    found = architecture(named) if isinstance(named, str) else None
    if found is None:
        raise InputError(f"{where}: model {shown(named)} is not one vtrain knows by name ({known_names()})", path)
    given = {key: getattr(found.model, key) for key in _MODEL_KEYS if getattr(found.model, key) is not None}
    return {**given, **{key: value for key, value in entry.items() if key != "model"}}


def _number(value: Any, key: str, where: str, path: Path, positive: bool, high: float) -> float:
    """``value`` as a finite number, at least 0 (above 0 when ``positive``) and at most ``high``; an
    :class:`InputError` naming the job and key otherwise."""
    if isinstance(value, str):  # YAML 1.1 reads 2.0e9 (no exponent sign) as a string; YAML 1.2 as a number
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{where}: {key} must be a finite number (got {value!r})", path)
    if value < 0 or (positive and value == 0):
        raise InputError(f"{where}: {key} must be {'above' if positive else 'at least'} 0 (got {value!r})", path)
    if value > high:
        raise InputError(f"{where}: {key} must be at most {high:,g} (got {value!r}){_HIGH_WHY.get(key, '')}", path)
    return float(value)
