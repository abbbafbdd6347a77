"""The fine-tuning files of the hf-trainer bundle: PEFT's, bitsandbytes' and TRL's keyword arguments.

``peft_config.json`` is ``peft.LoraConfig(**...)``, ``quantization_config.json`` is
``transformers.BitsAndBytesConfig(**...)`` and ``trl_config.json`` holds what the objective's TRL
config adds to ``training_args.json``: ``<TRL config class>(**training_args, **trl_config)``. Each
value is written in one file only; tests load every file with the installed peft, transformers and
TRL. What no file can carry (``get_peft_model``, ``prepare_model_for_kbit_training``, building the
arguments before ``from_pretrained``) goes into the script notes (:func:`finetuning_notes`).
"""

from __future__ import annotations

from typing import Any

from dsgen.catalog.linear_layers import decoder_linear_layers
from dsgen.errors import DsgenError
from dsgen.estimate.objectives import reference_source
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Spec

PEFT_FILE = "peft_config.json"
QUANTIZATION_FILE = "quantization_config.json"
TRL_FILE = "trl_config.json"
FINETUNING_FILES = (PEFT_FILE, QUANTIZATION_FILE, TRL_FILE)

#: The TRL config class each objective trains with (TRL 1.16: ORPO and CPO live in trl.experimental).
TRL_CONFIG_CLASS: dict[str, str] = {
    "sft": "trl.SFTConfig",
    "dpo": "trl.DPOConfig",
    "kto": "trl.KTOConfig",
    "orpo": "trl.experimental.orpo.ORPOConfig",
    "simpo": "trl.experimental.cpo.CPOConfig",
    "reward": "trl.RewardConfig",
    "grpo": "trl.GRPOConfig",
}
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def peft_config(spec: Spec) -> dict[str, Any]:
    """``LoraConfig`` keyword arguments; ``attention`` written as the model's projection names."""
    lora = spec.training.finetuning.lora
    targets: str | list[str]
    if lora.target_modules == "all-linear":
        targets = "all-linear"
    elif lora.target_modules == "attention":
        targets = list(dict.fromkeys(layer.name for layer in decoder_linear_layers(spec.model) if layer.attention))
    else:
        targets = list(lora.target_modules)
    return {
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": targets,
        "bias": "none",
        "task_type": "SEQ_CLS" if spec.training.finetuning.objective == "reward" else "CAUSAL_LM",
    }


def quantization_config(spec: Spec, plan: Plan) -> dict[str, Any] | None:
    """``BitsAndBytesConfig`` keyword arguments (None for GPTQ/AWQ checkpoints, which carry their
    own). Under ZeRO-3 the 4-bit weights are packed into the compute dtype
    (``bnb_4bit_quant_storage``) so that ZeRO-3 can partition them (PEFT's DeepSpeed guide)."""
    q = spec.training.finetuning.quantization
    dtype = TORCH_DTYPE[plan.precision]
    if q.type == "int8":
        return {"load_in_8bit": True}
    if q.type not in ("nf4", "fp4"):
        return None
    config: dict[str, Any] = {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": q.type,
        "bnb_4bit_use_double_quant": q.double_quant,
        "bnb_4bit_compute_dtype": dtype,
    }
    if plan.zero_stage == 3:
        config["bnb_4bit_quant_storage"] = dtype
    return config


def trl_config(spec: Spec, plan: Plan) -> dict[str, Any]:
    """What the objective's TRL config sets beyond ``training_args.json``."""
    finetuning = spec.training.finetuning
    objective = finetuning.objective
    if objective not in TRL_CONFIG_CLASS:
        raise DsgenError(
            f"objective {objective}: TRL has no trainer for it (TRL 1.16 removed PPOTrainer); "
            "the hf-trainer target cannot write its config",
            path="training.objective",
            hint="price it with dsgen solve, and launch it with OpenRLHF; or use objective grpo",
        )
    config: dict[str, Any] = {}
    if objective != "grpo":
        config["max_length"] = spec.training.sequence_length
    if objective == "sft":
        config["packing"] = spec.training.packed_samples
    if objective in ("dpo", "kto"):
        config["precompute_ref_log_probs"] = reference_source(finetuning) == "precomputed"
    if objective == "simpo":
        config.update({"loss_type": "simpo", "cpo_alpha": 0.0})
    if objective == "grpo":
        generation = finetuning.generation
        config.update(
            {
                "num_generations": generation.num_generations,
                "max_completion_length": generation.max_completion_length,
                "steps_per_generation": plan.gradient_accumulation_steps,
                "beta": 0.0 if reference_source(finetuning) == "none" else 0.04,
                "use_vllm": generation.engine != "transformers",
            }
        )
        if generation.engine != "transformers":
            config["vllm_mode"] = "colocate" if generation.engine == "vllm-colocate" else "server"
        if generation.engine == "vllm-colocate":
            config["vllm_gpu_memory_utilization"] = generation.vllm_gpu_memory_utilization
    return config


def finetuning_files(spec: Spec, plan: Plan) -> dict[str, dict[str, Any]]:
    """The hf-trainer bundle's fine-tuning files (none for full training with the SFT loss)."""
    finetuning = spec.training.finetuning
    if finetuning.is_default:
        return {}
    files: dict[str, dict[str, Any]] = {TRL_FILE: trl_config(spec, plan)}
    if finetuning.adapters:
        files[PEFT_FILE] = peft_config(spec)
    if finetuning.method == "qlora":
        quantization = quantization_config(spec, plan)
        if quantization is not None:
            files[QUANTIZATION_FILE] = quantization
    return files


def finetuning_notes(spec: Spec, plan: Plan, target: str) -> list[str]:
    """What the training script must do for the method and objective that no file carries."""
    finetuning: FineTuning = spec.training.finetuning
    if finetuning.is_default:
        return []
    notes: list[str] = []
    if finetuning.method == "qlora":
        q = finetuning.quantization
        if q.type in ("nf4", "fp4", "int8"):
            load = (
                f"BitsAndBytesConfig(**json.load(open('{QUANTIZATION_FILE}')))"
                if target == "hf-trainer"
                else "a BitsAndBytesConfig"
            )
            notes.append(
                f"load the model with quantization_config={load} and dtype={TORCH_DTYPE[plan.precision]}, "
                "then call peft.prepare_model_for_kbit_training(model)"
            )
        else:
            notes.append(f"load the {q.type.upper()} checkpoint (its config.json carries the quantization)")
    if finetuning.method == "freeze":
        layers = finetuning.freeze.trainable_layers
        extra = ", ".join(finetuning.freeze.trainable)
        notes.append(
            f"freeze every parameter but the last {layers} decoder layers{' and ' + extra if extra else ''} "
            "(param.requires_grad_(False)) before the optimizer is built"
        )
    if finetuning.adapters:
        config = f"LoraConfig(**json.load(open('{PEFT_FILE}')))" if target == "hf-trainer" else "a LoraConfig"
        notes.append(
            f"wrap the model with peft.get_peft_model(model, {config}) (or pass peft_config= to the TRL trainer)"
        )
        if plan.checkpointing == "full":
            notes.append(
                "with gradient checkpointing on a frozen base, call model.enable_input_require_grads() "
                "so the checkpointed layers' inputs carry gradients to the adapters"
            )
    if target == "hf-trainer":
        config_class = TRL_CONFIG_CLASS.get(finetuning.objective)
        if config_class is not None:
            notes.append(
                f"build the arguments as {config_class}(**json.load(open('training_args.json')), "
                f"**json.load(open('{TRL_FILE}'))) before from_pretrained, so transformers sees the DeepSpeed config"
            )
    if reference_source(finetuning) == "separate":
        notes.append(
            "pass the reference model to the trainer (ref_model=...): TRL prepares it as a second DeepSpeed engine"
        )
    if reference_source(finetuning) == "adapter-disabled":
        notes.append("pass ref_model=None: TRL disables the adapter for the reference pass (no second copy)")
    return notes
