"""Launchers that rewrite ``"auto"`` values before DeepSpeed sees the config.

DeepSpeed never resolves ``"auto"``: its pydantic sections drop the key (so ``"stage": "auto"``
silently means ZeRO stage 0) and its dict-based sections keep the string (so
``"train_batch_size": "auto"`` crashes in the batch arithmetic). Only the launcher layers fill them
in, each for a fixed set of keys:

* transformers ``HfTrainerDeepSpeedConfig.trainer_config_process/_finalize`` fills the batch keys,
  clipping, optimizer/scheduler params, precision flags and the hidden-size based bucket sizes
  (reference section 1.4 / 9.2);
* accelerate's ``DeepSpeedPlugin.__post_init__`` fills the ZeRO stage, offload devices and paths and
  ``stage3_gather_16bit_weights_on_model_save`` from its own config (ZeRO stage defaults to 2).
  ``TrainingArguments`` always builds that plugin, so the HF Trainer resolves these keys too.
* accelerate's ``Accelerator._prepare_deepspeed`` (without the Trainer) fills the batch triple
  from the DataLoader and its accumulation, clipping (1.0), lr and weight decay from
  ``DummyOptim``, the scheduler from ``DummyScheduler`` and the hidden-size buckets from the
  model; ``DeepSpeedPlugin.set_mixed_precision`` fills the precision flags. It never fills the
  Adam betas or epsilon.
* Lightning's ``DeepSpeedStrategy`` resolves no ``"auto"``: it sets ``gradient_accumulation_steps``
  (refusing a config that has it), ``gradient_clipping`` and the micro-batch only where absent.
"""

from __future__ import annotations

from dsgen.facts.frameworks import TARGETS, config_reader

#: Keys HF Trainer fills from TrainingArguments / the model (fill_match / fill_only).
HF_TRAINER_KEYS = frozenset(
    {
        "/train_micro_batch_size_per_gpu",
        "/gradient_accumulation_steps",
        "/train_batch_size",
        "/gradient_clipping",
        "/optimizer/params/lr",
        "/optimizer/params/betas",
        "/optimizer/params/eps",
        "/optimizer/params/weight_decay",
        "/scheduler/params/warmup_min_lr",
        "/scheduler/params/warmup_max_lr",
        "/scheduler/params/warmup_num_steps",
        "/scheduler/params/total_num_steps",
        "/fp16/enabled",
        "/bf16/enabled",
        "/amp/enabled",
        "/amp/opt_level",
        "/zero_optimization/reduce_bucket_size",
        # Filled for ZeRO-3 only; at other stages DeepSpeed drops the key and the value is unused.
        "/zero_optimization/stage3_prefetch_bucket_size",
        "/zero_optimization/stage3_param_persistence_threshold",
    }
)

#: Keys accelerate's DeepSpeedPlugin fills (plugin_to_config_mapping).
ACCELERATE_PLUGIN_KEYS = frozenset(
    {
        "/gradient_accumulation_steps",
        "/gradient_clipping",
        "/zero_optimization/stage",
        "/zero_optimization/offload_optimizer/device",
        "/zero_optimization/offload_param/device",
        "/zero_optimization/offload_optimizer/nvme_path",
        "/zero_optimization/offload_param/nvme_path",
        "/zero_optimization/stage3_gather_16bit_weights_on_model_save",
    }
)

#: Keys Accelerator._prepare_deepspeed and DeepSpeedPlugin.set_mixed_precision fill.
ACCELERATE_KEYS = (
    HF_TRAINER_KEYS - {"/optimizer/params/betas", "/optimizer/params/eps", "/amp/enabled", "/amp/opt_level"}
) | {"/zero_optimization/stage3_gather_16bit_weights_on_model_save"}

RESOLVED_AUTO: dict[str, frozenset[str]] = {
    "deepspeed": frozenset(),
    "hf-trainer": HF_TRAINER_KEYS | ACCELERATE_PLUGIN_KEYS,
    "accelerate": ACCELERATE_KEYS | ACCELERATE_PLUGIN_KEYS,
    "lightning": frozenset(),
}

LAUNCHER_NAMES = {
    "deepspeed": "plain DeepSpeed",
    "hf-trainer": "the HF Trainer",
    "accelerate": "accelerate",
    "lightning": "Lightning",
}


def check_target(target: str) -> str:
    """The program that reads ``target``'s JSON, the one the rules judge it for (trl: the HF Trainer)."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    return config_reader(target)


def resolves_auto(target: str, pointer: str) -> bool:
    """Whether ``target`` replaces an ``"auto"`` at ``pointer`` before DeepSpeed reads it."""
    return pointer in RESOLVED_AUTO[target]
