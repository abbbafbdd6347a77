"""The typed, validated spec: what the user asked for, with presets resolved.

These frozen dataclasses are the solver's whole input. Nothing downstream reads YAML or looks
up presets again, which keeps the estimate and solver code pure. Their defaults are the spec
schema's (:mod:`dsgen.spec.defaults`), so each is written once, where editors show it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import Location
from dsgen.facts.frameworks import config_reader, runs_own_script
from dsgen.spec.defaults import spec_default
from dsgen.spec.yaml_source import locate
from dsgen.units import GIB
from dsgen.vocabulary import (
    Checkpointing,
    FineTuningMethod,
    GenerationEngine,
    Objective,
    OffloadDevice,
    Precision,
    PrecisionChoice,
    QuantizationType,
    ReferenceModel,
)


@dataclass(frozen=True)
class NvmeSpec:
    """A local NVMe drive DeepSpeed may offload to (ZeRO-Infinity): where it is, how big, how fast."""

    path: str
    capacity_gib: float
    bandwidth_gbps: float = spec_default("hardware.nvme.bandwidth_gbps")

    @property
    def capacity_bytes(self) -> int:
        return int(self.capacity_gib * GIB)


@dataclass(frozen=True)
class Hardware:
    """The cluster one run gets: a GPU type, how many per node and nodes, host RAM and links."""

    gpu: GpuSpec
    gpus_per_node: int = spec_default("hardware.gpus_per_node")
    nodes: int = spec_default("hardware.nodes")
    cpu_memory_gib: float = spec_default("hardware.cpu_memory_gib")
    inter_node_bandwidth_gbps: float = spec_default("hardware.inter_node_bandwidth_gbps")
    cpu_optimizer_gparams_per_s: float = spec_default("hardware.cpu_optimizer_gparams_per_s")
    nvme: NvmeSpec | None = None
    # True when the spec left cpu_memory_gib to the schema's default: a host verdict then rests on a
    # node size the user never stated, and every message about host RAM says so
    cpu_memory_assumed: bool = False

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def cpu_memory_bytes(self) -> int:
        return int(self.cpu_memory_gib * GIB)


@dataclass(frozen=True)
class Optimizer:
    """The optimizer the user trains with; its type decides the bytes of state per parameter."""

    type: str = spec_default("training.optimizer.type")
    implementation: str = spec_default("training.optimizer.implementation")  # deepspeed | torch | torch-fused
    lr: float = spec_default("training.optimizer.lr")
    weight_decay: float = spec_default("training.optimizer.weight_decay")
    betas: tuple[float, float] = tuple(spec_default("training.optimizer.betas"))
    eps: float = spec_default("training.optimizer.eps")
    momentum: float = spec_default("training.optimizer.momentum")


@dataclass(frozen=True)
class Scheduler:
    """The learning-rate schedule rendered into the config (it does not change memory or speed)."""

    type: str = spec_default("training.scheduler.type")
    warmup_steps: int = spec_default("training.scheduler.warmup_steps")
    total_steps: int = spec_default("training.scheduler.total_steps")


@dataclass(frozen=True)
class Lora:
    """PEFT's LoraConfig as the spec writes it: which linear layers get adapters, and their rank."""

    rank: int = spec_default("training.lora.rank")
    alpha: float = spec_default("training.lora.alpha")
    dropout: float = spec_default("training.lora.dropout")
    target_modules: str | tuple[str, ...] = spec_default("training.lora.target_modules")  # a keyword or names


@dataclass(frozen=True)
class Quantization:
    """How QLoRA stores the frozen linear layers (bitsandbytes, or a GPTQ/AWQ checkpoint)."""

    bits: int = spec_default("training.quantization.bits")
    type: QuantizationType = spec_default("training.quantization.type")
    double_quant: bool = spec_default("training.quantization.double_quant")
    block_size: int = spec_default("training.quantization.block_size")


@dataclass(frozen=True)
class Freeze:
    """Freeze-tuning: the last ``trainable_layers`` decoder layers and the named modules train."""

    trainable_layers: int = spec_default("training.freeze.trainable_layers")
    trainable: tuple[str, ...] = tuple(spec_default("training.freeze.trainable"))


@dataclass(frozen=True)
class Generation:
    """GRPO/PPO generation: completions per prompt, their lengths and who generates them."""

    num_generations: int = spec_default("training.generation.num_generations")
    max_prompt_length: int = spec_default("training.generation.max_prompt_length")
    max_completion_length: int = spec_default("training.generation.max_completion_length")
    engine: GenerationEngine = spec_default("training.generation.engine")
    vllm_gpu_memory_utilization: float = spec_default("training.generation.vllm_gpu_memory_utilization")
    vllm_gpus: int = spec_default("training.generation.vllm_gpus")

    @property
    def sequence_length(self) -> int:
        """Tokens of one completion's training sequence: its prompt and what was generated."""
        return self.max_prompt_length + self.max_completion_length


@dataclass(frozen=True)
class FineTuning:
    """What trains and against what: the method, its adapters or quantization or frozen part, the
    objective and where its reference log-probabilities come from. The default is full training
    with the next-token loss, the one kind of run dsgen priced before (nothing about it changes)."""

    method: FineTuningMethod = spec_default("training.finetuning")
    lora: Lora = Lora()
    quantization: Quantization = Quantization()
    freeze: Freeze = Freeze()
    objective: Objective = spec_default("training.objective")
    reference_model: ReferenceModel = spec_default("training.reference_model")
    generation: Generation = Generation()

    @property
    def adapters(self) -> bool:
        return self.method in ("lora", "qlora")

    @property
    def is_default(self) -> bool:
        return self == FineTuning()


@dataclass(frozen=True)
class Training:
    """What one optimizer step is: sequence length, batch, precision, attention kernel, optimizer."""

    sequence_length: int
    global_batch_size: int | None = None  # sequences per optimizer step ...
    tokens_per_step: int | None = None  # ... or tokens per step: exactly one is set
    precision: PrecisionChoice = spec_default("training.precision")
    attention: str = spec_default("training.attention")
    liger_kernel: bool = spec_default("training.liger_kernel")  # Liger-Kernel's fused kernels and loss
    packed_samples: bool = spec_default("training.packed_samples")  # every sequence full length (dsgen.search.verdict)
    deepspeed_version: str = spec_default("training.deepspeed_version")  # a release, 0.X.Y (normalize_release)
    gradient_clipping: float = spec_default("training.gradient_clipping")
    mfu: float | None = None
    optimizer: Optimizer = Optimizer()
    scheduler: Scheduler = Scheduler()
    finetuning: FineTuning = FineTuning()


@dataclass(frozen=True)
class Constraints:
    """Pins on search dimensions; ``None`` means the solver chooses."""

    zero_stage: int | None = None
    offload_optimizer: OffloadDevice | None = None
    offload_param: OffloadDevice | None = None
    activation_checkpointing: Checkpointing | None = None  # the spec writes false | true | selective
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    memory_headroom: float = spec_default("constraints.memory_headroom")
    allow_batch_rounding: str = spec_default("constraints.allow_batch_rounding")  # none | nearest
    zeropp: str | None = None  # none | hpz | full; None (auto): hpZ allowed, no quantization
    sequence_parallel_size: int | None = None  # Ulysses degree (dsgen.estimate.sequence_parallel)
    tiled_mlp: bool | None = None  # DeepSpeed TiledMLP
    tiled_loss: bool | None = None  # TiledFusedLogitsLoss / Liger fused linear cross-entropy
    checkpoint_offload: bool | None = None  # checkpointed layer inputs in host RAM
    seq_parallel_communication_data_type: Precision = spec_default("constraints.seq_parallel_communication_data_type")
    tensor_parallel_size: int | None = None  # AutoTP degree (dsgen.search.model_parallel_choices)
    expert_parallel_size: int | None = None  # AutoEP degree

    @property
    def fully_pinned(self) -> bool:
        """Every classic search dimension pinned: the solver reports exactly this plan."""
        optimizer_pinned = self.offload_optimizer is not None or self.zero_stage == 0
        param_pinned = self.offload_param is not None or (self.zero_stage is not None and self.zero_stage < 3)
        return (
            self.zero_stage is not None
            and optimizer_pinned
            and param_pinned
            and self.activation_checkpointing is not None
            and self.micro_batch_size is not None
        )

    @property
    def long_context_searchable(self) -> bool:
        """Whether a long-context search could add plans: something is unpinned, and not every
        classic dimension is pinned (a fully pinned spec reports exactly its plan)."""
        unpinned = None in (self.sequence_parallel_size, self.tiled_mlp, self.tiled_loss, self.checkpoint_offload)
        return unpinned and not self.fully_pinned


@dataclass(frozen=True)
class Output:
    """Where and in which flavour ``dsgen new`` writes the rendered config."""

    target: str = spec_default("output.target")
    path: str = spec_default("output.path")
    launcher: str | None = None  # None: the target's default (dsgen.targets.DEFAULT_LAUNCHER)

    @property
    def logits_released(self) -> bool:
        """Whether the target's training loop drops the model's output before backward: the HF
        Trainer's ``compute_loss`` returns the loss alone (``tests/test_loss_transient.py``
        watches its logits die before ``accelerator.backward``). The other targets run the
        user's loop, which commonly keeps ``outputs`` until backward."""
        return config_reader(self.target) == "hf-trainer"  # TRL's trainers are the HF Trainer's

    @property
    def trainer_saves_model(self) -> bool:
        """Whether each checkpoint also saves the model through the HF Trainer's ``save_model``,
        which builds a 16-bit state dict on the host (dsgen.estimate.checkpoint_save). Lightning
        saves through DeepSpeed's ``save_checkpoint`` alone (``strategies/deepspeed.py``
        ``DeepSpeedStrategy.save_checkpoint``); the other targets run the user's loop, priced as
        saving with ``save_checkpoint`` (``accelerator.save_state`` does)."""
        return config_reader(self.target) == "hf-trainer"  # TRL's trainers are the HF Trainer's


@dataclass(frozen=True)
class Spec:
    """The whole validated spec with presets resolved: the solver's only input."""

    model: ModelShape
    hardware: Hardware
    training: Training
    constraints: Constraints = Constraints()
    output: Output = Output()
    source: str | None = None  # the spec file, for messages
    key_lines: tuple[tuple[str, int], ...] = ()  # (dotted key path, line) for later error messages
    key_overrides: tuple[tuple[str, Location], ...] = ()  # (dotted key path, where it was set instead)
    notes: tuple[str, ...] = ()  # what the loader replaced in the user's defaults, said in the output

    @property
    def long_context_searchable(self) -> bool:
        """Whether the solver may add the ALST dimensions it is free to choose: the constraints
        leave one open (:attr:`Constraints.long_context_searchable`) and the target can run them."""
        return self.constraints.long_context_searchable and not runs_own_script(self.output.target)

    def names(self, prefix: str) -> bool:
        """Whether the user wrote ``prefix`` (or a key under it) in the spec, a --set or a sweep."""
        keys = [key for key, _ in self.key_lines] + [key for key, _ in self.key_overrides]
        return any(key == prefix or key.startswith(prefix + ".") for key in keys)

    def location(self, path: str) -> Location:
        """Where ``path`` was written: on the command line or in a sweep if it or an ancestor was
        set there, else in the spec file (its own line or its nearest ancestor's)."""
        lines = {tuple(key.split(".")): line for key, line in self.key_lines}
        overrides = {tuple(key.split(".")): where for key, where in self.key_overrides}
        return locate(path.split("."), lines, overrides, self.source)
