"""What a training objective adds beside the policy's own model states: preference pairs, a
reference model, PPO's value and reward models, and GRPO/PPO generation.

Each term is priced as TRL builds it (read in the installed TRL and cited per function); OpenRLHF's
placement flags are not modelled. docs/memory-model.md, "Objectives".
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.parameter_layout import parameter_tensors, persistent_parameters
from dsgen.estimate.trainable import FrozenBytes, ParameterSplit, frozen_bytes
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning
from dsgen.units import FP32
from dsgen.vocabulary import Objective, ReferenceModel

#: Objectives whose every sample is a chosen and a rejected sequence, run through the model as one
#: concatenated batch (TRL's DPOTrainer ``concatenated_forward``; ORPO, SimPO (CPOTrainer) and the
#: RewardTrainer likewise run both sequences of a pair in each micro-batch).
PAIRED_OBJECTIVES: frozenset[Objective] = frozenset({"dpo", "orpo", "simpo", "reward"})
#: Objectives that read reference log-probabilities: DPO and KTO always, PPO for its KL penalty.
#: GRPO does only with beta > 0 (TRL's default beta is 0.0 since 0.17: no reference model loaded).
REFERENCE_OBJECTIVES: frozenset[Objective] = frozenset({"dpo", "kto", "ppo"})
GENERATION_OBJECTIVES: frozenset[Objective] = frozenset({"grpo", "ppo"})


def sequences_per_sample(objective: Objective) -> int:
    """Sequences each sample of the micro-batch runs through the model: 2 for paired objectives."""
    return 2 if objective in PAIRED_OBJECTIVES else 1


def reference_source(finetuning: FineTuning) -> ReferenceModel:
    """Where the reference log-probabilities come from, ``auto`` resolved: a LoRA/QLoRA policy
    with its adapter disabled (TRL's DPOTrainer with ``ref_model=None`` and a PEFT model: "the
    adapter is disabled for the reference pass"), else a separate frozen copy, for the objectives
    that read them; none for the others."""
    chosen = finetuning.reference_model
    if chosen != "auto":
        return chosen
    if finetuning.objective not in REFERENCE_OBJECTIVES:
        return "none"
    return "adapter-disabled" if finetuning.adapters else "separate"


def _frozen_copy(shape: ModelShape, policy: ParameterSplit) -> ParameterSplit:
    """A frozen copy of the base model as the policy holds it (quantized too, for QLoRA)."""
    if policy.quantized:
        return ParameterSplit(
            trainable_shapes=(), frozen=policy.frozen, quantized=policy.quantized, quantization=policy.quantization
        )
    return ParameterSplit(trainable_shapes=(), frozen=parameter_tensors(shape))


def frozen_model_bytes(shape: ModelShape, policy: ParameterSplit, plan: Plan) -> int:
    """GPU bytes of one frozen copy of the model (a separate reference model, PPO's reward model).

    TRL prepares it as a second DeepSpeed engine (``trl/models/utils.py``, ``prepare_deepspeed``):
    under ZeRO-3 a stage-3 engine that shards it over the same ranks; otherwise a stage-0 engine,
    so every GPU holds the whole copy in the training dtype. No optimizer is built for it. TRL 1.16
    writes its ZeRO-3 sizes (persistence threshold 10·hidden) as dotted top-level keys, which
    DeepSpeed ignores: the engine keeps the config's own threshold (measured on 2 CPU ranks).
    """
    ranks = plan.data_parallel_size
    copy = _frozen_copy(shape, policy)
    if plan.zero_stage == 3:
        threshold = plan.knobs.param_persistence_threshold
        held: FrozenBytes = frozen_bytes(copy, plan.dtype_bytes, 3, ranks, threshold)
    else:
        held = frozen_bytes(copy, plan.dtype_bytes, 0, ranks, 0)
    return held.resident + held.partitions


@dataclass(frozen=True)
class ObjectiveMemory:
    """GPU bytes one rank holds for the objective, beside the policy's model states and activations."""

    reference: int = 0  # a separate reference model (and PPO's reward model)
    value: int = 0  # PPO's value model: a second trained copy's model states
    generation: int = 0  # while generating: the KV cache (transformers) or vLLM's share of the GPU
    generation_gather: int = 0  # ZeRO-3: the whole model gathered to generate or to sync vLLM
    vllm_reserved: int = 0  # vllm-colocate: the share of the GPU vLLM keeps through training too


def generation_batch(plan: Plan) -> int:
    """Completions one rank generates at once: TRL's GRPO generates a whole generation batch,
    ``per_device_train_batch_size × steps_per_generation`` (steps_per_generation defaults to the
    gradient accumulation steps: ``GRPOConfig.__post_init__``), then trains on it micro-batch by
    micro-batch."""
    return plan.micro_batch_size * plan.gradient_accumulation_steps


def kv_cache_bytes(shape: ModelShape, plan: Plan, sequences: int, tokens: int) -> int:
    """The KV cache ``model.generate`` holds for ``sequences`` of ``tokens``: keys and values of
    every layer in the training dtype (MLA caches its expanded keys and values in transformers)."""
    if shape.is_mla:
        per_token = shape.num_attention_heads * (shape.qk_nope_head_dim + shape.qk_rope_head_dim + shape.v_head_dim)
    else:
        per_token = 2 * shape.kv_size
    return plan.dtype_bytes * shape.num_layers * per_token * sequences * tokens


def objective_memory(
    shape: ModelShape,
    plan: Plan,
    finetuning: FineTuning,
    policy: ParameterSplit,
    trained_states: int,
    gpu_capacity: int,
) -> ObjectiveMemory:
    """Every objective term of ``plan`` on one GPU. ``trained_states``: the policy's own trained
    model-state bytes on the GPU (PPO's value model holds as much again)."""
    objective = finetuning.objective
    reference = frozen_model_bytes(shape, policy, plan) if reference_source(finetuning) == "separate" else 0
    value = 0
    if objective == "ppo":  # TRL's PPOTrainer: a value model trained beside the policy, a frozen reward model
        reference += frozen_model_bytes(shape, policy, plan)
        value = trained_states
    if objective not in GENERATION_OBJECTIVES:
        return ObjectiveMemory(reference=reference, value=value)
    generation = finetuning.generation
    gather = 0
    if plan.zero_stage == 3:
        # unwrap_model_for_generation(gather_deepspeed3_params=True) gathers every parameter for
        # model.generate (trl/models/utils.py); syncing a PEFT model to vLLM gathers all of them too
        # (GRPOTrainer._move_model_to_vllm). A whole 16-bit model, less the tensors ZeRO-3 already
        # keeps whole on every rank (param_persistence_threshold), which GatheredParameters leaves be:
        # measured exactly on a real GRPOTrainer step (tests/test_grpo_measured.py).
        persistent = persistent_parameters(shape, plan.knobs.param_persistence_threshold)
        whole = plan.dtype_bytes * (sum(parameter_tensors(shape)) - persistent)
        gather = whole if generation.engine == "transformers" or finetuning.adapters else 0
    if generation.engine == "transformers":
        sequences = generation_batch(plan)
        cache = kv_cache_bytes(shape, plan, sequences, generation.sequence_length)
        logits = FP32 * sequences * shape.vocab_size  # the last position's logits, in fp32 for sampling
        return ObjectiveMemory(reference, value, cache + logits, gather)
    if generation.engine == "vllm-colocate":
        reserved = int(generation.vllm_gpu_memory_utilization * gpu_capacity)
        return ObjectiveMemory(reference, value, 0, gather, reserved)
    return ObjectiveMemory(reference, value, 0, gather)
