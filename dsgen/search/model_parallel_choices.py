"""Which AutoTP and AutoEP degrees dsgen prices for a spec, and why a pinned one is refused.

DeepSpeed's own rules (release support, divisibility, AutoEP presets, the combinations it refuses)
are :mod:`dsgen.facts.model_parallel`'s; this module adds the limits of what dsgen models, each a
layout the CPU measurements of ``docs/model-parallel-measurements.md`` cover:

* AutoTP on dense decoders with a llama-style layer (separate q/k/v, o, gated MLP), where
  transformers' ``tp_plan`` shards q/k/v/gate/up by columns and o/down by rows, the untied LM
  head by vocabulary, and leaves embeddings and norms whole. The degree divides the attention
  heads, the key/value heads and the MLP width, so every rank holds the same shard (DeepSpeed
  allows uneven shards; dsgen does not propose them), and stays within a node (the tutorial's
  layout; TP's per-layer all-reduces need NVLink).
* AutoEP on mixture-of-experts models with an AutoEP preset.
* Full training with the next-token loss: adapters, quantized or frozen weights, and a second
  model in memory are not priced under model parallelism.

AutoTP with AutoEP (DeepSpeed's folding) needs a ``partition_config`` for the attention of an MoE
model; dsgen does not write one, so it proposes either, not both.
"""

from __future__ import annotations

from functools import cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.facts.model_parallel import AUTOEP_SINCE, AUTOTP_SINCE, ModelFacts, autoep_preset_for
from dsgen.facts.release import release_key
from dsgen.spec.types import Spec, Training

#: dense families whose transformers ``base_model_tp_plan`` AutoTP applies as measured on the tiny
#: Llama (q/k/v/gate/up colwise, o/down rowwise; ``LlamaForCausalLM._tp_plan`` lm_head
#: ``colwise_gather_output``).
AUTOTP_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def training_violation(training: Training) -> str | None:
    """Why model parallelism is not priced for this training, or None."""
    ft = training.finetuning
    if ft.method != "full":
        return f"dsgen prices AutoTP and AutoEP for full training, not {ft.method}"
    if ft.objective != "sft":
        return f"dsgen prices AutoTP and AutoEP for the next-token loss, not {ft.objective}"
    return None


def model_facts(shape: ModelShape) -> ModelFacts:
    """What DeepSpeed's AutoTP/AutoEP rules need to know about ``shape``."""
    experts = (shape.num_experts,) * shape.moe_layers if shape.is_moe else None
    return ModelFacts(moe_experts=experts, model_type=shape.family, kv_heads=shape.num_key_value_heads)


def release_at_least(release: str, since: str) -> bool:
    return release_key(release) >= release_key(since)


def tp_violation(model: ModelShape, tp: int, gpus_per_node: int, training: Training) -> str | None:
    """Why AutoTP at degree ``tp`` is not a plan dsgen prices for ``model``, or None (1 is always fine)."""
    if tp == 1:
        return None
    if not release_at_least(training.deepspeed_version, AUTOTP_SINCE):
        return f"AutoTP training needs DeepSpeed {AUTOTP_SINCE} or newer; training.deepspeed_version is {training.deepspeed_version}"
    if model.is_moe:
        return (
            f"{model.name} is a mixture of experts: DeepSpeed refuses its transformers tp_plan without a "
            "tensor_parallel.partition_config, which dsgen does not write; use expert_parallel_size"
        )
    if model.family not in AUTOTP_FAMILIES:
        return f"dsgen models AutoTP for {', '.join(sorted(AUTOTP_FAMILIES))} layers, not {model.family}"
    if gpus_per_node % tp:
        return f"the AutoTP degree {tp} does not divide the {gpus_per_node} GPUs of a node (TP stays within a node)"
    for what, count in (
        ("attention heads", model.num_attention_heads),
        ("key/value heads", model.num_key_value_heads),
        ("MLP width", model.intermediate_size),
    ):
        if count % tp:
            return f"the AutoTP degree {tp} does not divide the {count} {what} of {model.name}"
    return training_violation(training)


def ep_violation(model: ModelShape, ep: int, world: int, training: Training) -> str | None:
    """Why AutoEP at degree ``ep`` is not a plan dsgen prices for ``model``, or None (1 is always fine)."""
    if ep == 1:
        return None
    if not model.is_moe:
        return f"{model.name} is not a mixture of experts; AutoEP splits experts"
    if not release_at_least(training.deepspeed_version, AUTOEP_SINCE):
        return f"AutoEP needs DeepSpeed {AUTOEP_SINCE} or newer; training.deepspeed_version is {training.deepspeed_version}"
    if autoep_preset_for(model.family, training.deepspeed_version) is None:
        return f"DeepSpeed {training.deepspeed_version} has no AutoEP preset for {model.family} models"
    if model.num_experts % ep:
        return f"the AutoEP degree {ep} does not divide the {model.num_experts} experts of {model.name}"
    if world % ep:
        return f"the AutoEP degree {ep} does not divide the {world} GPUs"
    return training_violation(training)


def tensor_parallel_degrees(spec: Spec) -> tuple[int, ...]:
    """The AutoTP degrees to search, ascending: the pinned one, or 1 and every degree dsgen prices."""
    pinned = spec.constraints.tensor_parallel_size
    if pinned is not None:
        return (pinned,)
    return _tp_degrees(spec.model, spec.hardware.gpus_per_node, spec.training)


def expert_parallel_degrees(spec: Spec) -> tuple[int, ...]:
    """The AutoEP degrees to search, ascending: the pinned one, or 1 and every degree dsgen prices."""
    pinned = spec.constraints.expert_parallel_size
    if pinned is not None:
        return (pinned,)
    return _ep_degrees(spec.model, spec.hardware.world_size, spec.training)


@cache
def _tp_degrees(model: ModelShape, gpus_per_node: int, training: Training) -> tuple[int, ...]:
    # a degree divides the key/value heads, so only their divisors are candidates
    heads = model.num_key_value_heads
    return tuple(tp for tp in range(1, heads + 1) if tp_violation(model, tp, gpus_per_node, training) is None)


@cache
def _ep_degrees(model: ModelShape, world: int, training: Training) -> tuple[int, ...]:
    experts = max(model.num_experts, 1)
    return tuple(ep for ep in range(1, experts + 1) if ep_violation(model, ep, world, training) is None)
