"""What each enumerated field may hold, written once as a ``Literal`` type.

mypy checks every assignment against these types; the value tuples beside them are derived with
``typing.get_args``, so a value list is never written a second time. Tuple order is meaningful
where noted (the solver's tie-breaks read it).
"""

from __future__ import annotations

from typing import Literal, get_args

#: A training precision DeepSpeed runs (``bf16``/``fp16`` are mixed precision with fp32 masters).
Precision = Literal["bf16", "fp16", "fp32"]
#: The spec's ``training.precision``: a precision, or ``auto`` for the best one the GPU supports.
PrecisionChoice = Literal["auto", Precision]
#: Where ZeRO offloads optimizer states or parameters; simplest first (ties prefer it).
OffloadDevice = Literal["none", "cpu", "nvme"]
#: What backward recomputes: nothing; only the attention function (Korthikanti et al. 2022);
#: every layer (gradient checkpointing). Simplest first (ties prefer it).
Checkpointing = Literal["none", "selective", "full"]
#: Whose model-state accounting prices memory: dsgen's, or DeepSpeed's own estimator.
Accounting = Literal["dsgen", "deepspeed-estimator"]
#: Which parameters train (``training.finetuning``): every one; low-rank adapters on a 16-bit base
#: (LoRA, Hu et al. 2021) or on a quantized one (QLoRA, Dettmers et al. 2023); the last layers only.
FineTuningMethod = Literal["full", "lora", "qlora", "freeze"]
#: The training objective (``training.objective``): supervised, paired preference (DPO, ORPO,
#: SimPO, reward models), unpaired preference (KTO), or online RL with generation (GRPO, PPO).
Objective = Literal["sft", "dpo", "kto", "orpo", "simpo", "reward", "grpo", "ppo"]
#: How a preference or RL objective gets its reference log-probabilities (``training.reference_model``).
ReferenceModel = Literal["auto", "separate", "adapter-disabled", "precomputed", "none"]
#: Who generates GRPO/PPO completions (``training.generation.engine``).
GenerationEngine = Literal["transformers", "vllm-colocate", "vllm-server"]
#: How frozen weights are quantized (``training.quantization.type``).
QuantizationType = Literal["nf4", "fp4", "int8", "gptq", "awq"]
#: The part of a training step a GPU memory figure belongs to (generation: GRPO/PPO only).
StepPhase = Literal["forward_backward", "optimizer_step", "generation"]
#: How bad a validation finding is.
Severity = Literal["error", "warning"]
#: When DeepSpeed itself fails on a finding: ``config`` = ``DeepSpeedConfig(...)`` raises,
#: ``engine`` = ``deepspeed.initialize`` or the first steps raise, ``lint`` = DeepSpeed accepts the
#: config and silently does something the author probably did not mean.
Phase = Literal["config", "engine", "lint"]

#: transformers' ``attn_implementation`` for each of the spec's attention kernels (``training.attention``):
#: FlashAttention-2, FlashAttention-3 (Hopper only), PyTorch SDPA, and the eager score matrix.
HF_ATTN_IMPLEMENTATION = {"flash": "flash_attention_2", "flash3": "flash_attention_3", "sdpa": "sdpa", "eager": "eager"}

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
PRECISION_CHOICES: tuple[PrecisionChoice, ...] = get_args(PrecisionChoice)
OFFLOAD_DEVICES: tuple[OffloadDevice, ...] = get_args(OffloadDevice)
CHECKPOINTING_MODES: tuple[Checkpointing, ...] = get_args(Checkpointing)
ACCOUNTINGS: tuple[Accounting, ...] = get_args(Accounting)
STEP_PHASES: tuple[StepPhase, ...] = get_args(StepPhase)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
PHASES: tuple[Phase, ...] = get_args(Phase)
FINETUNING_METHODS: tuple[FineTuningMethod, ...] = get_args(FineTuningMethod)
OBJECTIVES: tuple[Objective, ...] = get_args(Objective)
REFERENCE_MODELS: tuple[ReferenceModel, ...] = get_args(ReferenceModel)
GENERATION_ENGINES: tuple[GenerationEngine, ...] = get_args(GenerationEngine)
QUANTIZATION_TYPES: tuple[QuantizationType, ...] = get_args(QuantizationType)
