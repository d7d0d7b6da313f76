"""The run configuration: one schema for what `vtrain record` writes (``run.yaml``) and what `vtrain simulate`
and `vtrain validate` read.

A run config is a YAML (or JSON) mapping with these sections::

    model:       {layers: 2, hidden: 64, heads: 4, seq: 32, vocab: 512,
                  ffn_hidden: null, kv_heads: null, mlp: gelu,   # 4h | the heads | gelu; swiglu: gated
                  norm: layernorm, position: learned,   # rmsnorm | rope: LLaMA's (framework megatron)
                  bias: true, qkv_bias: null,           # the linear layers' biases | QKV's (null: as bias)
                  tie_embeddings: null,                 # output projection = word embedding (null: megatron yes)
                  dropout: null}                        # megatron's dropout runs (null: yes, its 0.1; false: p 0)
    parallelism: {tp: 2, pp: 1, dp: 1, micro_batch: 2, global_batch: 8,
                  schedule: 1f1b, virtual_stages: 1, recompute: none,   # none | selective | full
                  dp_overlap: false, dp_bucket_mb: 25, sequence_parallel: false,
                  distributed_optimizer: false}   # Megatron's: optimizer states sharded over dp (ZeRO-1)
    precision:   fp32                       # fp32 | fp16 | bf16
    framework:   reference                  # reference (vtrain record's model) | megatron (Megatron-DeepSpeed)
    fused_kernels: true                     # megatron's apex and fused kernels; false: PyTorch's (Megatron-core's
                                            # local layers without apex or Transformer Engine)
    attention:   eager                      # eager (scores in memory) | flash (PyTorch's fused attention)
    cuda_graphs: false                      # each layer's forward and backward replayed from CUDA graphs
    hardware:    {device: cpu, device_count: 2, gpus_per_node: 8, cores: 2,
                  intra_node_gbps: null, inter_node_gbps: null}   # GB/s per GPU, Gbit/s per node
    software:    {torch: 2.13.0, cuda: null, nccl: null, python: 3.11.7}
    recording:   {steps: 4, warmup: 2, seed: 1234}                 # only in recorded runs; on GPUs also
                 # peak_memory_bytes (by rank, torch.cuda.max_memory_allocated)

vTrain's own config JSON (``num_gpus, tensor_parallel_size, ...``) is accepted as is by :func:`load_run_config`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from vtrain.configfile import read_config_file
from vtrain.errors import InputError, warn_input
from vtrain.limits import (
    INTEGER_BOUNDS,
    MAX_MICRO_BATCHES,
    REAL_BOUNDS,
    integer_problem,
    real_problem,
    shown,
    string_problem,
)
from vtrain.parallel import SCHEDULES

#: activation recomputation: none; selective (Korthikanti et al.: only the attention core, the scores, softmax
#: and their product with the values, is re-run before a layer's backward); full (the whole layer)
RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("fp32", "fp16", "bf16")
#: whose kernels a run launches: vtrain record's reference model, or Megatron-DeepSpeed's fused ones
FRAMEWORKS = ("reference", "megatron")
#: each framework's kernels, as summaries say them
FRAMEWORK_KERNELS = {"reference": "the reference model's kernels", "megatron": "Megatron's kernels"}
#: how a layer's attention core runs: ``eager`` computes the s x s scores and their softmax in memory (the
#: framework's kernels: bmm + softmax, or Megatron's fused softmax); ``flash`` is one fused kernel each way,
#: PyTorch's ``scaled_dot_product_attention`` (FlashAttention), which holds no scores
ATTENTIONS = ("eager", "flash")
#: a layer's MLP: ``gelu`` (fc1 to the feed-forward width, GELU, fc2) or ``swiglu`` (fc1 to twice the width, the
#: SiLU of one half times the other, fc2: LLaMA, Mistral, Megatron's ``--swiglu``)
MLPS = ("gelu", "swiglu")
#: a layer's normalisation: ``layernorm`` (GPT's: mean and variance, a weight and a bias) or ``rmsnorm`` (LLaMA's:
#: root mean square, a weight only)
NORMS = ("layernorm", "rmsnorm")
#: where positions enter: ``learned`` (GPT's position embedding, added to the token embedding) or ``rope`` (LLaMA's
#: rotary embeddings: each layer's queries and keys rotated, no position parameters)
POSITIONS = ("learned", "rope")
#: the projects whose kernels a framework stands for, as tables and configs name them (case, ``_`` and spaces aside)
FRAMEWORK_PROJECTS = {"megatron-lm": "megatron", "megatron-deepspeed": "megatron"}


def framework_named(name: object) -> object:
    """The framework ``name`` stands for: Megatron-LM and Megatron-DeepSpeed are ``megatron``; any other value as
    given (the run config's checks say what is wrong with it). Megatron-core is not: without apex or Transformer
    Engine it runs other kernels than the fused ones ``megatron`` places."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-") if isinstance(name, str) else None
    return FRAMEWORK_PROJECTS.get(key, name) if key else name


def word_named(name: object) -> object:
    """The word of a closed set ``name`` stands for (an attention, MLP, norm or position: a table's ``Flash``,
    ``SwiGLU``, ``RMSNorm``, ``RoPE``), case and surrounding spaces aside; any other value as given (the run
    config's checks say what is wrong with it)."""
    return name.strip().lower() if isinstance(name, str) else name


#: what frameworks and tables call the precisions (PyTorch's dtypes, Lightning's ``bf16-mixed``, ...)
_PRECISION_NAMES = {"bfloat16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "float16": "fp16", "half": "fp16",
                    "16": "fp16", "16-mixed": "fp16", "fp16-mixed": "fp16", "float32": "fp32", "float": "fp32",
                    "32": "fp32", "32-true": "fp32"}


def precision_named(name: object) -> object:
    """The precision (:data:`PRECISIONS`) ``name`` stands for: ``BF16``, PyTorch's ``bfloat16``, Lightning's
    ``bf16-mixed`` and ``16-mixed``; any other value as given (the run config's checks say what is wrong with it)."""
    word = word_named(name)
    return _PRECISION_NAMES.get(word, word) if isinstance(word, str) else word


@dataclass(frozen=True)
class ModelConfig:
    """GPT decoder shape; ``ffn_hidden``, ``kv_heads``, ``mlp``, ``norm``, ``position`` and the biases say where a
    model departs from GPT-3's (a feed-forward width other than 4·hidden, grouped-query attention, a gated MLP,
    RMSNorm, rotary embeddings, linear layers without biases: LLaMA 2/3, Mistral, Qwen)."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int = 50257
    ffn_hidden: int | None = None  # the MLP's width (None: 4 x hidden)
    kv_heads: int | None = None  # key and value heads, grouped-query attention (None: as many as heads)
    mlp: str = "gelu"  # gelu | swiglu
    norm: str = "layernorm"  # layernorm | rmsnorm
    position: str = "learned"  # learned | rope
    bias: bool = True  # the linear layers' biases (QKV, attention output, fc1, fc2)
    qkv_bias: bool | None = None  # the QKV projection's bias where it differs from the others' (Qwen2's); None: bias
    #: whether the output projection is the word embedding (one matrix, its gradients summed over the first and last
    #: stages); None: the framework's way, Megatron's tied (GPT's), the reference model's own (`vtrain record`'s)
    tie_embeddings: bool | None = None
    #: whether Megatron's attention and hidden dropout run (a probability above 0: masks kept, kernels run); None:
    #: Megatron's default, 0.1 (LLaMA's recipes and configs train with none)
    dropout: bool | None = None

    def __post_init__(self) -> None:
        for name in ("mlp", "norm", "position"):  # a config's SwiGLU, RMSNorm, RoPE
            object.__setattr__(self, name, word_named(getattr(self, name)))

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the QKV projection adds a bias: ``qkv_bias``, else as the other linear layers."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def is_gpt(self) -> bool:
        """Whether its layer is GPT's but for widths and heads: layer norms, learned positions, biases."""
        return self.norm == "layernorm" and self.position == "learned" and self.bias and self.has_qkv_bias

    @property
    def ffn(self) -> int:
        """The feed-forward width: ``ffn_hidden``, else four times the hidden size."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def query_groups(self) -> int:
        """The key and value heads: ``kv_heads``, else one a query head."""
        return self.kv_heads or self.heads

    def describe(self) -> str:
        """The shape in words (``32 layers, hidden 4096, 32 heads (8 key/value), seq 4096, vocab 32000, SwiGLU
        MLP 14336 wide``); the MLP and key/value heads only where they are not GPT-3's."""
        heads = f"{self.heads} heads" + (f" ({self.query_groups} key/value)" if self.query_groups != self.heads else "")
        mlp = "" if self.mlp == "gelu" and self.ffn == 4 * self.hidden else \
            f", {'SwiGLU' if self.mlp == 'swiglu' else 'GELU'} MLP {self.ffn} wide"
        return (f"{self.layers} layers, hidden {self.hidden}, {heads}, seq {self.seq}, vocab {self.vocab}{mlp}"
                f"{self._layer_words()}")

    def _layer_words(self) -> str:
        """``, RMSNorm, rotary positions, no biases`` (or ``, biases on QKV only``): what departs from GPT's."""
        words = ["RMSNorm"] * (self.norm == "rmsnorm") + ["rotary positions"] * (self.position == "rope")
        if not self.bias:
            words.append("biases on QKV only" if self.has_qkv_bias else "no biases")
        elif not self.has_qkv_bias:
            words.append("no QKV bias")
        return "".join(f", {word}" for word in words)


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
    sequence_parallel: bool = False  # Megatron's (Korthikanti et al.): norms and dropout split the sequence by tp
    #: Megatron's distributed optimizer (ZeRO stage 1): each data-parallel rank keeps and updates 1/d of the
    #: optimizer states; gradients are reduce-scattered and the updated parameters all-gathered
    distributed_optimizer: bool = False
    #: the transformer layers each pipeline stage holds, first stage to last, where a run split them unevenly
    #: (DeepSpeed's PipelineModule balances them: BLOOM's 70 layers on 12 stages); None: an even split, as
    #: Megatron-LM requires
    stage_layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stage_layers, list):  # as a YAML or JSON config gives it
            object.__setattr__(self, "stage_layers", tuple(self.stage_layers))

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
    intra_node_gbps: float | None = None  # GB/s per GPU, as vTrain's intra_node_bandwidth
    inter_node_gbps: float | None = None  # Gbit/s per node, all its NICs (vTrain's inter_node_bandwidth x node_size)

    @property
    def nodes(self) -> int:
        """The nodes its devices fill (the last one perhaps in part)."""
        return -(-self.device_count // max(self.gpus_per_node, 1))


@dataclass(frozen=True)
class RunConfig:
    """A whole run: model, parallelism, precision, hardware, software and (for recorded runs) recording."""

    model: ModelConfig
    parallelism: ParallelConfig = field(default_factory=ParallelConfig)
    precision: str = "fp32"
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    framework: str = "reference"
    attention: str = "eager"
    cuda_graphs: bool = False  # layers replayed from CUDA graphs: one launch a layer pass, no host time between ops
    fused_kernels: bool = True  # Megatron's fused kernels (apex, its fused softmax, bias-GeLU, bias-dropout-add)
    software: dict[str, Any] = field(default_factory=dict)
    recording: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", precision_named(self.precision))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, as written to ``run.yaml``."""
        data = asdict(self)
        if self.parallelism.stage_layers is not None:
            data["parallelism"]["stage_layers"] = list(self.parallelism.stage_layers)
        return data

    @property
    def ties_embeddings(self) -> bool:
        """Whether the output projection is the word embedding: the model's ``tie_embeddings``, else Megatron's
        default (tied: ``--untie-embeddings-and-output-weights`` off) and the reference model's own head."""
        tied = self.model.tie_embeddings
        return tied if tied is not None else self.framework == "megatron"

    def with_overrides(self, **parallel: Any) -> RunConfig:
        """A copy with parallelism fields replaced (``None`` values are ignored)."""
        changes = {key: value for key, value in parallel.items() if value is not None}
        return replace(self, parallelism=replace(self.parallelism, **changes))

    def constraint_errors(self) -> list[str]:
        """Every constraint the config breaks, one sentence each (empty when consistent)."""
        m, p, h = self.model, self.parallelism, self.hardware
        errors = self.value_errors()
        if errors:
            return errors
        if p.schedule not in SCHEDULES:
            errors.append(f"schedule must be one of {', '.join(SCHEDULES)} (got {shown(p.schedule)})")
        if p.recompute not in RECOMPUTE:
            errors.append(f"recompute must be one of {', '.join(RECOMPUTE)} (got {shown(p.recompute)})")
        if self.precision not in PRECISIONS:
            errors.append(f"precision must be one of {', '.join(PRECISIONS)} (got {shown(self.precision)})")
        if self.framework not in FRAMEWORKS:
            errors.append(f"framework must be one of {', '.join(FRAMEWORKS)} (got {shown(self.framework)})")
        if self.attention not in ATTENTIONS:
            errors.append(f"attention must be one of {', '.join(ATTENTIONS)} (got {shown(self.attention)})")
        elif self.attention == "flash" and self.precision == "fp32" and h.device.lower() != "cpu":
            errors.append("attention flash needs precision fp16 or bf16 on GPUs (FlashAttention has no fp32 kernels: "
                          "PyTorch runs another attention kernel for fp32)")
        if h.device_count != p.world_size:
            errors.append(f"tp*dp*pp = {p.tp}*{p.dp}*{p.pp} = {p.world_size} does not equal the number of "
                          f"devices ({h.device_count})")
        if m.heads % p.tp:
            errors.append(f"heads ({m.heads}) is not divisible by tp ({p.tp})")
        if m.hidden % m.heads:
            errors.append(f"hidden ({m.hidden}) is not divisible by heads ({m.heads})")
        if m.hidden % p.tp:
            errors.append(f"hidden ({m.hidden}) is not divisible by tp ({p.tp})")
        errors += _architecture_errors(self)
        errors += _stage_layers_errors(m, p)
        if p.global_batch % (p.dp * p.micro_batch):
            errors.append(f"global batch ({p.global_batch}) is not divisible by dp*micro_batch "
                          f"({p.dp}*{p.micro_batch})")
        if p.virtual_stages > 1 and p.schedule != "interleaved":
            errors.append(f"virtual_stages={p.virtual_stages} needs schedule interleaved (got {p.schedule})")
        if p.virtual_stages > 1 and p.pp == 1:
            errors.append(f"virtual_stages={p.virtual_stages} needs pp >= 2: one stage has no other to interleave "
                          "its chunks with (Megatron refuses it; with one virtual stage interleaved is 1F1B)")
        if self.cuda_graphs and h.device.lower() == "cpu":
            errors.append("cuda_graphs needs a GPU: CUDA graphs replay device work (the device is cpu)")
        if p.sequence_parallel and self.framework != "megatron":
            errors.append("sequence_parallel is Megatron's: it needs framework megatron (got "
                          f"{shown(self.framework)})")
        if not self.fused_kernels and self.framework != "megatron":
            errors.append("fused_kernels false is Megatron's (its layers without apex and its fused kernels): it needs "
                          f"framework megatron (got {shown(self.framework)})")
        if p.distributed_optimizer and self.framework != "megatron":
            errors.append("distributed_optimizer is Megatron's: it needs framework megatron (got "
                          f"{shown(self.framework)})")
        if p.sequence_parallel and m.seq % p.tp:
            errors.append(f"sequence_parallel needs seq ({m.seq}) divisible by tp ({p.tp})")
        if p.schedule == "interleaved" and p.pp > 1 and p.micro_batches % p.pp:
            errors.append(f"interleaved 1F1B needs micro-batches ({p.micro_batches}) divisible by pp ({p.pp})")
        return errors

    def model_errors(self) -> list[str]:
        """The constraints the config breaks whatever its parallelism: those of its model, precision, framework,
        attention and device (what no plan of it can fix)."""
        alone = replace(self, parallelism=ParallelConfig(global_batch=self.parallelism.global_batch),
                        hardware=replace(self.hardware, device_count=1))
        return alone.constraint_errors()

    def value_errors(self) -> list[str]:
        """Every field of the wrong type or outside its physical bounds (:mod:`vtrain.limits`), one sentence
        each; with none, the number of micro-batches per replica against its bound."""
        errors = [problem for section in (self.model, self.parallelism, self.hardware)
                  for problem in _section_problems(section)]
        for name in ("precision", "attention"):
            if not isinstance(getattr(self, name), str):
                errors.append(string_problem(name, getattr(self, name)))
        for name in ("cuda_graphs", "fused_kernels"):
            if not isinstance(getattr(self, name), bool):
                errors.append(f"{name} must be true or false (got {shown(getattr(self, name))})")
        for name in ("software", "recording"):
            if not isinstance(getattr(self, name), dict):
                errors.append(f"{name} must be a mapping (got {shown(getattr(self, name))})")
        if not errors and self.parallelism.micro_batches > MAX_MICRO_BATCHES:
            errors.append(f"{self.parallelism.micro_batches:,} micro-batches per replica (global_batch / "
                          f"(dp * micro_batch)); at most {MAX_MICRO_BATCHES:,} are simulated")
        return errors

    def validate(self, source: str | Path | None = None) -> RunConfig:
        """Raise :class:`InputError` naming the first broken constraint; return self when consistent."""
        errors = self.constraint_errors()
        if errors:
            raise InputError(f"inconsistent run config: {errors[0]}", source)
        return self


def _architecture_errors(config: RunConfig) -> list[str]:
    """How the model's MLP and key/value heads do not fit its heads or its tensor parallelism."""
    m, tp, errors = config.model, config.parallelism.tp, []
    if m.mlp not in MLPS:
        errors.append(f"mlp must be one of {', '.join(MLPS)} (got {shown(m.mlp)})")
    if m.norm not in NORMS:
        errors.append(f"norm must be one of {', '.join(NORMS)} (got {shown(m.norm)})")
    if m.position not in POSITIONS:
        errors.append(f"position must be one of {', '.join(POSITIONS)} (got {shown(m.position)})")
    if m.tie_embeddings and config.framework == "reference":
        errors.append("tie_embeddings is Megatron's (framework megatron): vtrain record's reference model has its own "
                      "output projection")
    if not errors and not m.is_gpt and config.framework != "megatron":
        errors.append("RMSNorm, rotary positions and bias-free layers are placed with Megatron's kernels (framework "
                      f"megatron): vtrain record's reference model has GPT's layer (got framework "
                      f"{shown(config.framework)})")
    if m.heads % m.query_groups:
        errors.append(f"heads ({m.heads}) is not divisible by kv_heads ({m.query_groups})")
    elif m.query_groups % tp:
        errors.append(f"kv_heads ({m.query_groups}) is not divisible by tp ({tp}): each rank holds whole key and "
                      "value heads")
    if m.ffn % tp:
        errors.append(f"ffn_hidden ({m.ffn}) is not divisible by tp ({tp})")
    return errors


def _stage_layers_errors(m: ModelConfig, p: ParallelConfig) -> list[str]:
    """How the layers do not split over the pipeline stages: evenly over pp*virtual_stages, or as ``stage_layers``
    says (one entry a stage, summing to the layers; an uneven split is not interleaved)."""
    if p.stage_layers is None:
        if m.layers % (p.pp * p.virtual_stages) == 0:
            return []
        split = balanced_stage_layers(m.layers, p.pp)
        hint = ("; if the run split them unevenly, say how (a run config's stage_layers, a table's stage layers "
                f"column): {list(split)} is DeepSpeed's PipelineModule split (partition_method type:transformer)"
                if p.virtual_stages == 1 and min(split) > 0 else "")  # a stage without layers is not modelled
        return [f"layers ({m.layers}) is not divisible by pp*virtual_stages ({p.pp}*{p.virtual_stages}){hint}"]
    errors = []
    if len(p.stage_layers) != p.pp:
        errors.append(f"stage_layers has {len(p.stage_layers)} entries for {p.pp} pipeline stages (pp)")
    elif sum(p.stage_layers) != m.layers:
        errors.append(f"stage_layers sums to {sum(p.stage_layers)} layers, the model has {m.layers}")
    if p.virtual_stages > 1:
        errors.append("stage_layers with virtual_stages > 1: an uneven split of interleaved chunks is not modelled")
    return errors


def balanced_stage_layers(layers: int, stages: int) -> tuple[int, ...]:
    """DeepSpeed's PipelineModule split of ``layers`` transformer layers over ``stages`` (``partition_method``
    ``type:transformer``, Megatron-DeepSpeed's GPT default): the smallest largest stage, ``ceil(layers / stages)``,
    filled from the first stage on, so the last stages hold the remainder (70 layers on 12 stages: eleven of 6, one
    of 4)."""
    most = -(-layers // stages)
    split, left = [], layers
    for _ in range(stages):
        split.append(min(most, left))
        left -= split[-1]
    return tuple(split)


def _stage_layers_problem(value: Any) -> str | None:
    """Why a ``stage_layers`` value is no list of layer counts (None when it is one)."""
    low, high = INTEGER_BOUNDS["layers"]
    if not isinstance(value, (list, tuple)) or not value or len(value) > INTEGER_BOUNDS["pp"][1]:
        return f"stage_layers must be a list of layer counts, one a pipeline stage (got {shown(value)})"
    if any(isinstance(n, bool) or not isinstance(n, int) or not low <= n <= high for n in value):
        return f"stage_layers must hold whole numbers of layers from {low} to {high} (got {shown(value)})"
    return None


def _section_problems(section: Any) -> list[str]:
    """The fields of one section (model, parallelism, hardware) with a wrong type or out of bounds: bounded
    fields by :mod:`vtrain.limits`, the others by their annotation (``None`` allowed where it is the default)."""
    problems = []
    for spec in fields(section):
        value = getattr(section, spec.name)
        kind = str(spec.type).split(" |")[0]
        if value is None and spec.default is None:
            continue
        if spec.name == "stage_layers":
            problem = _stage_layers_problem(value)
        elif spec.name in INTEGER_BOUNDS:
            problem = integer_problem(spec.name, value)
        elif spec.name in REAL_BOUNDS:
            problem = real_problem(spec.name, value)
        elif kind == "bool":
            problem = None if isinstance(value, bool) else f"{spec.name} must be true or false (got {shown(value)})"
        elif kind == "int":
            whole = isinstance(value, int) and not isinstance(value, bool)
            problem = None if whole else f"{spec.name} must be a whole number (got {shown(value)})"
        elif kind == "str":
            problem = None if isinstance(value, str) else string_problem(spec.name, value)
        else:
            problem = None
        if problem:
            problems.append(problem)
    return problems


def _build(cls: type, data: Any, section: str, source: str | Path) -> Any:
    if not isinstance(data, dict):
        raise InputError(f"{section} must be a mapping of field: value (got {type(data).__name__})", source)
    known = {f.name for f in fields(cls)}
    unknown = set(map(str, data)) - known
    if unknown:
        raise InputError(f"unknown field(s) in {section}: {', '.join(sorted(unknown))}", source)
    try:
        return cls(**data)
    except TypeError as exc:  # a required field is missing
        raise InputError(f"bad {section} section: {exc}", source) from None


def run_config_from_dict(data: dict[str, Any], source: str | Path = "<config>",
                         command_line: Collection[str] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from vtrain's schema, vTrain's config JSON or a Hugging Face model's
    ``config.json`` (whose line of what was assumed leaves out the settings ``command_line`` names, of ``seq``,
    ``precision``, ``framework`` and ``attention``: the command line gives them)."""
    if not isinstance(data, dict):
        raise InputError("a run config must be a mapping", source)
    if "tensor_parallel_size" in data or "num_gpus" in data:
        return _checked(_from_vtrain_json(data, source), source)
    if _is_hf_mapping(data):
        config, placed_otherwise = _from_hf_config(data, source, command_line)
        unrunnable = _checked(config, source).model_errors()
        if unrunnable:
            raise InputError(f"inconsistent run config: {unrunnable[0]}", source)
        if placed_otherwise:
            warn_input(placed_otherwise, source)  # after the checks: a config refused is one line
        return config
    if "model" not in data:
        raise InputError("not a run config: no 'model' section (and not a vTrain config)", source)
    unknown = set(map(str, data)) - {f.name for f in fields(RunConfig)}
    if unknown:
        raise InputError(f"unknown section(s): {', '.join(sorted(unknown))}", source)
    for name in ("software", "recording"):
        if not isinstance(data.get(name) or {}, dict):
            raise InputError(f"{name} must be a mapping (got {type(data[name]).__name__})", source)
    config = RunConfig(
        model=_build(ModelConfig, data["model"], "model", source),
        parallelism=_build(ParallelConfig, _or_empty(data.get("parallelism")), "parallelism", source),
        precision=data.get("precision", "fp32"),
        hardware=_build(HardwareConfig, _or_empty(data.get("hardware")), "hardware", source),
        framework=framework_named(data.get("framework", "reference")),
        attention=word_named(data.get("attention", "eager")),
        cuda_graphs=data.get("cuda_graphs", False),
        fused_kernels=data.get("fused_kernels", True),
        software=dict(data.get("software") or {}),
        recording=dict(data.get("recording") or {}),
    )
    config = _checked(config, source)
    _say_defaults_on_a_gpu(data, config, source)
    return config


#: settings a run config may leave out whose defaults are those of `vtrain record`'s CPU runs: key -> (default's
#: description, what a Megatron-LM run on GPUs would say)
_RECORDING_DEFAULTS = {
    "framework": ("reference (vtrain record's GPT: PyTorch's operators, torch's Adam)", "framework: megatron"),
    "precision": ("fp32", "precision: bf16"),
    "attention": ("eager", "attention: flash"),
}


def _say_defaults_on_a_gpu(data: dict[str, Any], config: RunConfig, source: str | Path) -> None:
    """One warning line for a run on a GPU whose config leaves out its framework, precision or attention: their
    defaults are `vtrain record`'s CPU runs' (whose run.yaml leaves them out), not a GPU training run's (before,
    a Megatron run written without them was planned as the reference model in fp32, silently). Not for an
    inconsistent config, refused anyway: bad input is one line."""
    if config.hardware.device.lower() in ("cpu", "host") or config.constraint_errors():
        return
    left = [key for key in _RECORDING_DEFAULTS if key not in data]
    if left:
        taken = "; ".join(f"{key} {_RECORDING_DEFAULTS[key][0]}" for key in left)
        warn_input(f"{', '.join(left)} not given, so {taken} (a Megatron-LM run says "
                   f"{', '.join(_RECORDING_DEFAULTS[key][1] for key in left)})", source)


def _checked(config: RunConfig, source: str | Path) -> RunConfig:
    """``config`` when every field has the right type and lies within bounds; else the first problem."""
    errors = config.value_errors()
    if errors:
        raise InputError(f"bad run config: {errors[0]}", source)
    return config


def _or_empty(section: Any) -> Any:
    """An empty section (``parallelism:`` with nothing under it) is no section."""
    return {} if section is None else section


#: the keys of vTrain's config JSON that vtrain reads (others are said, and ignored)
VTRAIN_KEYS = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "max_length", "vocab_size", "tensor_parallel_size",
    "pipeline_parallel_size", "data_parallel_size", "micro_batch_size", "global_batch_size", "use_checkpoint",
    "use_gradient_bucket", "ddp_bucket_size", "pipeline_scheduling", "framework", "gpu_name", "num_gpus", "node_size",
    "intra_node_bandwidth", "inter_node_bandwidth"})


def _per_node(per_gpu: float | None, gpus_per_node: int) -> float | None:
    """A node's network (Gbit/s) from a GPU's NIC rate."""
    return None if per_gpu is None else per_gpu * gpus_per_node


def _from_vtrain_json(data: dict[str, Any], source: str | Path) -> RunConfig:
    """Map vTrain's config keys onto the run-config schema (vocab defaults to 50257, fp16 and Megatron's kernels
    as in vTrain, which models Megatron-LM runs). vTrain's link rates are a GPU's: ``intra_node_bandwidth`` its
    NVLink GB/s (300 for an A100), ``inter_node_bandwidth`` its NIC's Gbit/s (200: one HDR InfiniBand port, as
    each A100 of a DGX node has), so a node's network is ``inter_node_bandwidth x node_size``. Keys vtrain does not
    read are said (a misspelt key would otherwise fall back to its default without a word)."""
    unread = sorted(map(str, set(data) - VTRAIN_KEYS))
    if unread:
        warn_input(f"vTrain config keys vtrain does not read, ignored: {', '.join(unread)}", source)
    try:
        scheduling = str(data.get("pipeline_scheduling", "1f1b")).lower().replace("-", "")
        schedule = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved": "interleaved"}.get(scheduling, scheduling)
        return RunConfig(
            model=ModelConfig(
                layers=_whole(data["num_layers"]), hidden=_whole(data["hidden_size"]),
                heads=_whole(data["num_attention_heads"]), seq=_whole(data["max_length"]),
                vocab=_whole(data.get("vocab_size", 50257)),
            ),
            parallelism=ParallelConfig(
                tp=_whole(data["tensor_parallel_size"]), pp=_whole(data["pipeline_parallel_size"]),
                dp=_whole(data["data_parallel_size"]), micro_batch=_whole(data["micro_batch_size"]),
                global_batch=_whole(data["global_batch_size"]), schedule=schedule,
                recompute="full" if _flag(data.get("use_checkpoint", False)) else "none",
                dp_overlap=_flag(data.get("use_gradient_bucket", False)),
                dp_bucket_mb=_real(data.get("ddp_bucket_size", 25.0)),
            ),
            precision="fp16",
            framework=str(framework_named(data.get("framework", "megatron"))),
            hardware=HardwareConfig(
                device=str(data.get("gpu_name", "A100")),
                device_count=_whole(data["num_gpus"]) if data.get("num_gpus") is not None else  # 0 is refused
                _whole(data["tensor_parallel_size"]) * _whole(data["pipeline_parallel_size"])
                * _whole(data["data_parallel_size"]),
                gpus_per_node=_whole(data.get("node_size", 8)),
                intra_node_gbps=_optional_float(data.get("intra_node_bandwidth")),
                inter_node_gbps=_per_node(_optional_float(data.get("inter_node_bandwidth")),
                                          _whole(data.get("node_size", 8))),
            ),
        )
    except KeyError as exc:
        raise InputError(f"vTrain config is missing {exc.args[0]!r}", source) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"vTrain config has a bad value: {exc}", source) from None


#: Hugging Face ``model_type``s whose decoder layer vtrain places: LLaMA's family (RMSNorm, rotary embeddings,
#: SwiGLU, grouped-query attention) and GPT-2's (the reference layer)
HF_LLAMA_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "granite", "phi3"})
HF_GPT_TYPES = frozenset({"gpt2", "gpt_bigcode"})
#: LLaMA's family members whose QKV projection always adds a bias (no key says it) / whose norm is a layer norm
#: (OLMo's first: without parameters, a layer norm's kernels all the same)
_HF_QKV_BIAS_TYPES = frozenset({"qwen2"})
_HF_LAYER_NORM_TYPES = frozenset({"olmo"})
#: a sequence a config's longest context gives beyond which it is said to be most likely not the pretraining length
#: (Qwen2.5's 131,072, Mistral's 32,768; LLaMA 2's 4,096 and LLaMA 3's 8,192 were their pretraining lengths)
LONG_CONTEXT = 8192
#: keys of a Hugging Face config that make it a mixture of experts (not modelled)
_HF_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _from_hf_config(data: dict[str, Any], source: str | Path,
                    command_line: Collection[str] = ()) -> tuple[RunConfig, str]:
    """The model of a Hugging Face ``config.json`` (LLaMA's family, its layer :func:`_hf_llama_layer`, or GPT-2's;
    the output projection the word embedding where ``tie_word_embeddings`` says, by default GPT-2's and not LLaMA's,
    as ``transformers`` reads them), trained as Megatron-LM trains it, in the config's ``torch_dtype`` (bf16 unless
    it says float16: float32 is how weights are saved, not trained, said), on the sequence it was pretrained at
    (:func:`_pretraining_length`); no parallelism (a plan sweeps it, ``--global-batch`` sets the batch). With it,
    the warning to give: what was assumed (but what ``command_line`` gives), and what its layer has that vtrain
    places otherwise (sliding-window attention); empty when there is nothing to say."""
    kind = data.get("model_type")
    if any(_more_than_one(data.get(key)) for key in _HF_EXPERT_KEYS):
        raise InputError(f"a Hugging Face {shown(kind)} config of a mixture of experts: not modelled", source)
    if not isinstance(kind, str) or kind not in HF_LLAMA_TYPES | HF_GPT_TYPES:
        known = ", ".join(sorted(HF_LLAMA_TYPES | HF_GPT_TYPES))
        raise InputError(f"a Hugging Face config of model_type {shown(kind)}: vtrain places {known}", source)
    llama = kind in HF_LLAMA_TYPES
    names = (("num_hidden_layers", "hidden_size", "num_attention_heads", "max_position_embeddings") if llama
             else ("n_layer", "n_embd", "n_head", "n_positions"))
    try:
        layers, hidden, heads, longest = (_whole(data[name]) for name in names)
        seq, seq_key = _pretraining_length(data, longest)
        model = ModelConfig(layers=layers, hidden=hidden, heads=heads, seq=seq,
                            vocab=_whole(data["vocab_size"] if llama else data.get("vocab_size", 50257)),
                            ffn_hidden=_whole(data["intermediate_size"]) if llama else _gpt2_width(data, hidden),
                            kv_heads=_whole(_given(data, "num_key_value_heads", heads)) if llama else
                            _bigcode_kv_heads(data, kind),
                            mlp="swiglu" if llama else "gelu", **(_hf_llama_layer(data, kind) if llama else {}),
                            tie_embeddings=_flag(_given(data, "tie_word_embeddings", not llama)))
    except KeyError as exc:
        raise InputError(f"Hugging Face {kind} config is missing {exc.args[0]!r}", source) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"Hugging Face {kind} config has a bad value: {exc}", source) from None
    given_dtype = data.get("torch_dtype", data.get("dtype"))  # transformers 4.56 renamed it
    head_dim = data.get("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise InputError(f"Hugging Face {kind} config: head_dim {shown(head_dim)} is not hidden_size / "
                         f"num_attention_heads ({hidden // heads}): heads of another width are not modelled", source)
    dtype = {"float16": "fp16", "bfloat16": "bf16"}.get(str(given_dtype), "bf16")
    unread = "" if given_dtype in (None, "float16", "bfloat16") else (
        f" (its weights were saved in {shown(given_dtype)}, which is not how it trained: --precision fp32 trains in "
        "it)" if given_dtype == "float32" else f" (torch_dtype {shown(given_dtype)})")
    placed = _hf_placed(data, llama)
    window = data.get("sliding_window")
    if (isinstance(window, int) and not isinstance(window, bool) and 0 < window < seq
            and data.get("use_sliding_window") is not False):
        placed += f"its sliding-window attention ({window} tokens) is placed as attention over the whole sequence; "
    attention = "flash" if llama else "eager"
    long = "; the longest context it serves: most models pretrain shorter" if seq > LONG_CONTEXT and \
        seq_key in ("max_position_embeddings", "n_positions") else ""
    assumed = {"seq": f"sequence {seq} ({seq_key}{long}; --seq trains at another length)",
               "precision": f"{dtype}{unread}", "framework": "Megatron's kernels",
               "attention": _ATTENTION_SAID[attention]}
    said = ", ".join(text for setting, text in assumed.items() if setting not in command_line)
    said = f"a Hugging Face {kind} config: {placed}{said}".removesuffix(": ").removesuffix("; ") \
        if placed or said else ""
    return RunConfig(model=model, precision=dtype, framework="megatron", attention=attention,
                     hardware=HardwareConfig(device="A100")), said


#: the activations a Hugging Face config names that vtrain's MLPs run: SiLU for LLaMA's gated MLP, GELU (its tanh
#: approximations too) for GPT-2's
_HF_SILU = frozenset({"silu", "swish"})
_HF_GELU = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "quick_gelu"})


def _bigcode_kv_heads(data: dict[str, Any], kind: str) -> int | None:
    """GPT-2's family's key/value heads: one where a ``gpt_bigcode`` config (StarCoder, SantaCoder) has multi-query
    attention (``multi_query``, by default true), else every head (None). StarCoder's was read with 48: 18.5B
    parameters for its 15.5B, 13 % slower."""
    return 1 if kind == "gpt_bigcode" and _flag(_given(data, "multi_query", True)) else None


def _more_than_one(value: Any) -> bool:
    """Whether a config's count (of experts) is more than one, written as a number or as text (``"8"``, ``8.0``)."""
    try:
        return not isinstance(value, bool) and value is not None and float(value) > 1
    except (TypeError, ValueError):
        return False


def _gpt2_width(data: dict[str, Any], hidden: int) -> int | None:
    """GPT-2's MLP width: ``n_inner`` where given (None, its default, is 4 x hidden)."""
    inner = data.get("n_inner")
    return None if inner is None or _whole(inner) == 4 * hidden else _whole(inner)


def _hf_placed(data: dict[str, Any], llama: bool) -> str:
    """What of a Hugging Face config's layer vtrain places otherwise, to be said: an activation of the MLP other
    than its own (SwiGLU's SiLU, GPT-2's GELU: placed as it, the same GEMMs), and LLaMA's MLP biases without the
    attention's (vtrain's layers have both or neither: none)."""
    key, known, simulated = (("hidden_act", _HF_SILU, "SiLU") if llama else
                             ("activation_function", _HF_GELU, "GELU"))
    act = data.get(key)
    placed = f"its MLP's {shown(act)} is placed as {simulated} (the same GEMMs); " if act is not None and \
        str(act) not in known else ""
    if llama and data.get("mlp_bias") is True and data.get("attention_bias") is not True:
        placed += "its MLP's biases (mlp_bias) are placed as none, as its attention's; "
    return placed


def _hf_llama_layer(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """The layer of LLaMA's family: RMSNorm (OLMo's first a layer norm), rotary positions, linear layers with biases
    where ``attention_bias`` and ``mlp_bias`` both say so (LLaMA's and Mistral's: none), a QKV bias where
    ``attention_bias`` says so (Qwen2's always), dropout where ``attention_dropout`` is above 0 (by default none)."""
    attention_bias = _flag(_given(data, "attention_bias", False))
    return {"norm": "layernorm" if kind in _HF_LAYER_NORM_TYPES else "rmsnorm", "position": "rope",
            "bias": attention_bias and _flag(_given(data, "mlp_bias", False)),
            "qkv_bias": attention_bias or kind in _HF_QKV_BIAS_TYPES,
            "dropout": _real(_given(data, "attention_dropout", 0.0)) > 0}


def _pretraining_length(data: dict[str, Any], longest: int) -> tuple[int, str]:
    """The sequence a Hugging Face model was pretrained at, and the key that says it: a config whose rotary
    embeddings were stretched to a longer context (LLaMA 3.1's ``rope_scaling``: 131,072 positions, pretrained at
    8,192; Qwen2.5's YaRN) keeps the pretraining length as ``rope_scaling.original_max_position_embeddings`` (Phi-3's
    long-context models at the top level); otherwise the longest it takes, ``max_position_embeddings``
    (``n_positions`` for GPT-2's family)."""
    scaling = data.get("rope_scaling")
    for key, original in (("rope_scaling.original_max_position_embeddings",
                           scaling.get("original_max_position_embeddings") if isinstance(scaling, dict) else None),
                          ("original_max_position_embeddings", data.get("original_max_position_embeddings"))):
        length = _whole(original) if original is not None else longest
        if length < longest:
            return length, key
    return longest, "max_position_embeddings" if "max_position_embeddings" in data else "n_positions"


def _given(data: dict[str, Any], key: str, default: Any) -> Any:
    """``data[key]``, or ``default`` where it is absent or null (a present 0 stays 0: the checks refuse it)."""
    value = data.get(key)
    return default if value is None else value


def _whole(value: Any) -> int:
    """A vTrain config's integer: a whole number (``2`` or ``2.0``), never a fraction silently truncated."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise ValueError(f"{shown(value)} is not a whole number")
    return int(value)


def _flag(value: Any) -> bool:
    """A vTrain config's switch: true/false (or 1/0), never a string such as ``"false"`` read as true."""
    if isinstance(value, bool) or value in (0, 1) and isinstance(value, int):
        return bool(value)
    raise ValueError(f"{shown(value)} is not true or false")


def _real(value: Any) -> float:
    """A vTrain config's real number: a JSON number, never a string (``"25"``) or a switch (``true`` read as
    1.0) silently converted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{shown(value)} is not a number")
    return float(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else _real(value)


def load_run_config(path: str | Path) -> RunConfig:
    """Read a run config (``run.yaml``, any YAML/JSON in vtrain's schema, vTrain's config JSON or a Hugging Face
    model's ``config.json``; a folder's ``run.yaml``, else its ``config.json``: a model's folder)."""
    return load_given_run(path)[0]


def load_given_run(path: str | Path, command_line: Collection[str] = ()) -> tuple[RunConfig, bool]:
    """:func:`load_run_config`'s run config, read once, and whether it gives a model without a plan of its own (a
    Hugging Face model's ``config.json``, as :func:`run_config_from_dict` tells them apart, or a published
    architecture's name: :func:`named_run`); what is said of a model's assumed settings leaves out those
    ``command_line`` gives."""
    named = named_run(path, command_line)
    if named is not None:
        return named, True
    path = _config_file(path)
    data = read_config_file(path, "run config")
    return run_config_from_dict(data, path, command_line), isinstance(data, dict) and _is_hf_mapping(data)


def named_run(name: str | Path, command_line: Collection[str] = ()) -> RunConfig | None:
    """The run of a published architecture (:mod:`vtrain.architectures`) where ``name`` is no file but one's name:
    its model in its precision with Megatron's kernels, no parallelism (a plan sweeps it, ``--global-batch`` sets
    the batch), with a warning saying whose shape it is; None where ``name`` is a file or names none. A name of
    neither is an error that lists the names vtrain knows, unless it looks like a file's (a suffix or a folder)."""
    path = Path(name)
    if _exists(path):
        return None
    from vtrain.architectures import architecture, known_names

    meant_as_path = _a_path(str(name))
    found = None if meant_as_path else architecture(str(name))
    if found is None:
        if path.suffix or len(path.parts) > 1 or meant_as_path:
            return None  # a missing file: read_config_file says so
        raise InputError(f"no such file, nor a model vtrain knows by name ({known_names()})", name)
    read_as = " (no such file or folder: read as a repository's name)" if len(path.parts) > 1 else ""
    kernels = [text for setting, text in (("framework", "Megatron's kernels"),
                                          ("attention", _ATTENTION_SAID[found.attention]))
               if setting not in command_line]
    trained = " ".join(([] if "precision" in command_line else [f"in {found.precision}"])
                       + ([f"with {' and '.join(kernels)}"] if kernels else []))
    warn_input(f"{found.name} as published{read_as} ({found.source}): {found.model.describe()}"
               + (f"; trained here {trained}" if trained else ""), name)
    return RunConfig(model=found.model, precision=found.precision, framework="megatron", attention=found.attention,
                     hardware=HardwareConfig(device="A100"))


def _a_path(name: str) -> bool:
    """Whether a name that is no file is meant as one all the same: absolute, from the current or home folder
    (``./``, ``../``, ``~``), deeper than a Hugging Face repository's ``org/model``, or in a folder that exists. A
    mistyped path to a user's own model (``/data/ft/Llama-2-70b-hf``) was simulated as the published model."""
    path = Path(name)
    return path.is_absolute() or name.startswith(("./", "../", "~", ".\\", "..\\")) or len(path.parts) > 2 or (
        len(path.parts) > 1 and path.parent.is_dir())


#: how a model without a run of its own runs its attention (vtrain.architectures.Architecture.attention), said
_ATTENTION_SAID = {"flash": "FlashAttention (--attention eager for the scores in memory)",
                   "eager": "eager attention (--attention flash for FlashAttention)"}


def _config_file(path: str | Path) -> Path:
    """The file a run config path names: itself, or a folder's ``run.yaml`` (a trace folder), else its
    ``config.json`` where it has one and no ``run.yaml`` (a Hugging Face model's folder)."""
    path = Path(path)
    if not path.is_dir():
        return path
    described, model = path / "run.yaml", path / "config.json"
    return model if model.is_file() and not described.exists() else described


def _exists(path: Path) -> bool:
    """Whether ``path`` names something on disk (a name too long for a file name names nothing)."""
    try:
        return path.exists()
    except OSError:
        return False


def _is_hf_mapping(data: dict[str, Any]) -> bool:
    return "model_type" in data and "model" not in data and "tensor_parallel_size" not in data \
        and "num_gpus" not in data


class DescribedRun(NamedTuple):
    """The ``run.yaml`` beside a trace set (:func:`described_run`): its config, or why it does not load."""

    config: RunConfig | None
    source: str | None  # the run.yaml's path, where there is one
    problem: str | None  # the one-line error of a run.yaml that does not load (config is then None)


def described_run(trace_dir: str | Path) -> DescribedRun:
    """The run config ``vtrain record`` wrote beside a trace set (``run.yaml``), checked. A trace set is read without
    one (traces made outside vtrain have none), so a ``run.yaml`` that does not load (another version's keys, a
    hand edit; a folder, a pipe or a broken link by that name) is not an error here: the caller says what it does
    without it."""
    described = Path(trace_dir) / "run.yaml"
    if not described.is_file():
        if described.exists() or described.is_symlink():  # never opened: a pipe would block
            return DescribedRun(None, str(described), f"{described}: not a file (a folder, a pipe or a broken link), "
                                                      f"not read")
        return DescribedRun(None, None, None)
    try:
        return DescribedRun(load_run_config(described).validate(described), str(described), None)
    except InputError as exc:
        return DescribedRun(None, str(described), str(exc))


def save_run_config(config: RunConfig, path: str | Path) -> None:
    """Write ``run.yaml`` atomically."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    tmp.replace(path)
