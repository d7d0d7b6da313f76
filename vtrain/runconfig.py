"""The run configuration: one schema for what `vtrain record` writes (``run.yaml``) and what `vtrain simulate`
and `vtrain validate` read.

A run config is a YAML (or JSON) mapping with these sections::

    model:       {layers: 2, hidden: 64, heads: 4, seq: 32, vocab: 512}
    parallelism: {tp: 2, pp: 1, dp: 1, micro_batch: 2, global_batch: 8,
                  schedule: 1f1b, virtual_stages: 1, recompute: none,
                  dp_overlap: false, dp_bucket_mb: 25}
    precision:   fp32                       # fp32 | fp16 | bf16
    framework:   reference                  # reference (vtrain record's model) | megatron (Megatron-DeepSpeed)
    hardware:    {device: cpu, device_count: 2, gpus_per_node: 8, cores: 2,
                  intra_node_gbps: null, inter_node_gbps: null}   # GB/s and Gbit/s, as in vTrain
    software:    {torch: 2.13.0, cuda: null, nccl: null, python: 3.11.7}
    recording:   {steps: 4, warmup: 2, seed: 1234}                 # only in recorded runs

vTrain's own config JSON (``num_gpus, tensor_parallel_size, ...``) is accepted as is by :func:`load_run_config`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from vtrain.errors import InputError

SCHEDULES = ("1f1b", "gpipe", "interleaved")
RECOMPUTE = ("none", "full")
PRECISIONS = ("fp32", "fp16", "bf16")
#: whose kernels a run launches: vtrain record's reference model, or Megatron-DeepSpeed's fused ones
FRAMEWORKS = ("reference", "megatron")


@dataclass(frozen=True)
class ModelConfig:
    """GPT decoder shape."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 50257


@dataclass(frozen=True)
class ParallelConfig:
    """3D parallelism and schedule."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    dp_overlap: bool = False
    dp_bucket_mb: float = 25.0

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per iteration on each data-parallel replica."""
        return self.global_batch // (self.dp * self.micro_batch)


@dataclass(frozen=True)
class HardwareConfig:
    """Where the run ran (or is to run)."""

    device: str = "cpu"
    device_count: int = 1
    gpus_per_node: int = 8
    cores: int | None = None
    intra_node_gbps: float | None = None  # GB/s, as vTrain's intra_node_bandwidth
    inter_node_gbps: float | None = None  # Gbit/s, as vTrain's inter_node_bandwidth


@dataclass(frozen=True)
class RunConfig:
    """A whole run: model, parallelism, precision, hardware, software and (for recorded runs) recording."""

    model: ModelConfig
    parallelism: ParallelConfig = field(default_factory=ParallelConfig)
    precision: str = "fp32"
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    framework: str = "reference"
    software: dict[str, Any] = field(default_factory=dict)
    recording: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, as written to ``run.yaml``."""
        return asdict(self)

    def with_overrides(self, **parallel: Any) -> RunConfig:
        """A copy with parallelism fields replaced (``None`` values are ignored)."""
        changes = {key: value for key, value in parallel.items() if value is not None}
        return replace(self, parallelism=replace(self.parallelism, **changes))

    def constraint_errors(self) -> list[str]:
        """Every constraint the config breaks, one sentence each (empty when consistent)."""
        m, p, h = self.model, self.parallelism, self.hardware
        errors: list[str] = []
        for name, value in (("layers", m.layers), ("hidden", m.hidden), ("heads", m.heads), ("seq", m.seq),
                            ("vocab", m.vocab), ("tp", p.tp), ("pp", p.pp), ("dp", p.dp),
                            ("micro_batch", p.micro_batch), ("global_batch", p.global_batch),
                            ("virtual_stages", p.virtual_stages)):
            if value < 1:
                errors.append(f"{name} must be >= 1 (got {value})")
        if errors:
            return errors
        if p.schedule not in SCHEDULES:
            errors.append(f"schedule must be one of {', '.join(SCHEDULES)} (got {p.schedule!r})")
        if p.recompute not in RECOMPUTE:
            errors.append(f"recompute must be one of {', '.join(RECOMPUTE)} (got {p.recompute!r})")
        if self.precision not in PRECISIONS:
            errors.append(f"precision must be one of {', '.join(PRECISIONS)} (got {self.precision!r})")
        if self.framework not in FRAMEWORKS:
            errors.append(f"framework must be one of {', '.join(FRAMEWORKS)} (got {self.framework!r})")
        if h.device_count != p.world_size:
            errors.append(f"tp*dp*pp = {p.tp}*{p.dp}*{p.pp} = {p.world_size} does not equal the number of "
                          f"devices ({h.device_count})")
        if m.heads % p.tp:
            errors.append(f"heads ({m.heads}) is not divisible by tp ({p.tp})")
        if m.hidden % m.heads:
            errors.append(f"hidden ({m.hidden}) is not divisible by heads ({m.heads})")
        if m.hidden % p.tp:
            errors.append(f"hidden ({m.hidden}) is not divisible by tp ({p.tp})")
        if m.layers % (p.pp * p.virtual_stages):
            errors.append(f"layers ({m.layers}) is not divisible by pp*virtual_stages "
                          f"({p.pp}*{p.virtual_stages})")
        if p.global_batch % (p.dp * p.micro_batch):
            errors.append(f"global batch ({p.global_batch}) is not divisible by dp*micro_batch "
                          f"({p.dp}*{p.micro_batch})")
        if p.virtual_stages > 1 and p.schedule != "interleaved":
            errors.append(f"virtual_stages={p.virtual_stages} needs schedule interleaved (got {p.schedule})")
        if p.schedule == "interleaved" and p.pp > 1 and p.micro_batches % p.pp:
            errors.append(f"interleaved 1F1B needs micro-batches ({p.micro_batches}) divisible by pp ({p.pp})")
        return errors

    def validate(self, source: str | Path | None = None) -> RunConfig:
        """Raise :class:`InputError` naming the first broken constraint; return self when consistent."""
        errors = self.constraint_errors()
        if errors:
            raise InputError(f"inconsistent run config: {errors[0]}", source)
        return self


def _build(cls: type, data: dict[str, Any], section: str, source: str | Path) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise InputError(f"unknown field(s) in {section}: {', '.join(sorted(unknown))}", source)
    try:
        return cls(**data)
    except TypeError as exc:  # a required field is missing
        raise InputError(f"bad {section} section: {exc}", source) from None


def run_config_from_dict(data: dict[str, Any], source: str | Path = "<config>") -> RunConfig:
    """Build a :class:`RunConfig` from vtrain's schema or from vTrain's config JSON."""
    if not isinstance(data, dict):
        raise InputError("a run config must be a mapping", source)
    if "tensor_parallel_size" in data or "num_gpus" in data:
        return _from_vtrain_json(data, source)
    if "model" not in data:
        raise InputError("not a run config: no 'model' section (and not a vTrain config)", source)
    unknown = set(data) - {f.name for f in fields(RunConfig)}
    if unknown:
        raise InputError(f"unknown section(s): {', '.join(sorted(unknown))}", source)
    return RunConfig(
        model=_build(ModelConfig, data["model"] or {}, "model", source),
        parallelism=_build(ParallelConfig, data.get("parallelism") or {}, "parallelism", source),
        precision=str(data.get("precision", "fp32")),
        hardware=_build(HardwareConfig, data.get("hardware") or {}, "hardware", source),
        framework=str(data.get("framework", "reference")),
        software=dict(data.get("software") or {}),
        recording=dict(data.get("recording") or {}),
    )


def _from_vtrain_json(data: dict[str, Any], source: str | Path) -> RunConfig:
    """Map vTrain's config keys onto the run-config schema (vocab defaults to 50257, fp16 and Megatron's kernels
    as in vTrain, which models Megatron-LM runs)."""
    try:
        scheduling = str(data.get("pipeline_scheduling", "1f1b")).lower().replace("-", "")
        schedule = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved": "interleaved"}.get(scheduling, scheduling)
        return RunConfig(
            model=ModelConfig(
                layers=int(data["num_layers"]), hidden=int(data["hidden_size"]),
                heads=int(data["num_attention_heads"]), seq=int(data["max_length"]),
                vocab=int(data.get("vocab_size", 50257)),
            ),
            parallelism=ParallelConfig(
                tp=int(data["tensor_parallel_size"]), pp=int(data["pipeline_parallel_size"]),
                dp=int(data["data_parallel_size"]), micro_batch=int(data["micro_batch_size"]),
                global_batch=int(data["global_batch_size"]), schedule=schedule,
                recompute="full" if data.get("use_checkpoint", False) else "none",
                dp_overlap=bool(data.get("use_gradient_bucket", False)),
                dp_bucket_mb=float(data.get("ddp_bucket_size", 25.0)),
            ),
            precision="fp16",
            framework=str(data.get("framework", "megatron")),
            hardware=HardwareConfig(
                device=str(data.get("gpu_name", "A100")),
                device_count=int(data.get("num_gpus", 0)) or int(data["tensor_parallel_size"])
                * int(data["pipeline_parallel_size"]) * int(data["data_parallel_size"]),
                gpus_per_node=int(data.get("node_size", 8)),
                intra_node_gbps=_optional_float(data.get("intra_node_bandwidth")),
                inter_node_gbps=_optional_float(data.get("inter_node_bandwidth")),
            ),
        )
    except KeyError as exc:
        raise InputError(f"vTrain config is missing {exc.args[0]!r}", source) from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"vTrain config has a bad value: {exc}", source) from None


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def load_run_config(path: str | Path) -> RunConfig:
    """Read a run config (``run.yaml``, any YAML/JSON in vtrain's schema, or vTrain's config JSON)."""
    path = Path(path)
    if path.is_dir():
        path = path / "run.yaml"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("no such run config", path) from None
    except OSError as exc:
        raise InputError(f"cannot read run config: {exc.strerror}", path) from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"run config is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{str(exc).splitlines()[0]}", path) from None
    return run_config_from_dict(data, path)


def save_run_config(config: RunConfig, path: str | Path) -> None:
    """Write ``run.yaml`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    tmp.replace(path)
