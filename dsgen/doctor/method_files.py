"""The fine-tuning method and objective a run's own files state, as spec overrides.

PEFT's ``adapter_config.json`` says the adapters (``LoraConfig.to_dict``: ``peft_type``, ``r``,
``lora_alpha``, ``lora_dropout``, ``target_modules``) and TRL's config, passed as
``--training-args``, says the objective by the fields only its class has. Reading them is one step
before pricing: the doctor loads the spec with these ``--set`` overrides, so what the files say
wins over the spec and every later stage sees one spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.inputs import read_json_object

#: A field only one TRL config class has, and the objective it names (TRL 1.16's config classes:
#: GRPOConfig, KTOConfig, CPOConfig, RewardConfig, ORPOConfig, DPOConfig), checked in this order.
TRL_OBJECTIVE_FIELDS: tuple[tuple[str, str], ...] = (
    ("num_generations", "grpo"),
    ("desirable_weight", "kto"),
    ("cpo_alpha", "simpo"),
    ("simpo_gamma", "simpo"),
    ("center_rewards_coefficient", "reward"),
    ("precompute_ref_log_probs", "dpo"),
)


def _number(data: dict[str, Any], key: str, file: Path, low: float, high: float | None = None) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < low
        or (high is not None and value >= high)
    ):
        bound = f"at least {low}" + (f" and below {high}" if high is not None else "")
        raise DsgenError(f"{file}: {key} must be a number {bound}, got {value!r}")
    return float(value)


def peft_overrides(path: str | Path, spec_method: str) -> list[str]:
    """``--set`` overrides for the LoRA adapters an ``adapter_config.json`` describes. The method
    stays ``qlora`` when the spec says so (the file does not record the base model's quantization)."""
    file = Path(path)
    data = read_json_object(file, "PEFT adapter config")
    kind = data.get("peft_type")
    if kind != "LORA":
        raise DsgenError(f"{file}: peft_type {kind!r}: dsgen prices LoRA adapters (peft_type LORA)")
    rank = data.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise DsgenError(f"{file}: r must be a positive integer, got {rank!r}")
    overrides = [f"training.finetuning={'qlora' if spec_method == 'qlora' else 'lora'}", f"training.lora.rank={rank}"]
    alpha = _number(data, "lora_alpha", file, 0)
    if alpha is not None:
        overrides.append(f"training.lora.alpha={alpha}")
    dropout = _number(data, "lora_dropout", file, 0, 1)
    if dropout is not None:
        overrides.append(f"training.lora.dropout={dropout}")
    targets = data.get("target_modules")
    if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        overrides.append(f"training.lora.target_modules={json.dumps(sorted(targets))}")
    elif isinstance(targets, str) and targets in ("all-linear",):
        overrides.append("training.lora.target_modules=all-linear")
    elif targets is not None:
        raise DsgenError(
            f"{file}: target_modules {targets!r}: dsgen reads a list of module names or 'all-linear'",
            hint="write the module names the regular expression matches, e.g. [q_proj, v_proj]",
        )
    return overrides


def trl_overrides(args: dict[str, Any]) -> list[str]:
    """``--set`` overrides for the objective a TRL config states (none for plain TrainingArguments)."""
    objective = next((name for key, name in TRL_OBJECTIVE_FIELDS if key in args), None)
    if objective is None:
        return []
    overrides = [f"training.objective={objective}"]
    if objective in ("dpo", "kto") and args.get("precompute_ref_log_probs") is True:
        overrides.append("training.reference_model=precomputed")
    if objective == "grpo":
        generations = args.get("num_generations")
        if isinstance(generations, int) and not isinstance(generations, bool) and generations >= 1:
            overrides.append(f"training.generation.num_generations={generations}")
        completion = args.get("max_completion_length")
        if isinstance(completion, int) and not isinstance(completion, bool) and completion >= 1:
            overrides.append(f"training.generation.max_completion_length={completion}")
        if args.get("use_vllm") is True:
            mode = args.get("vllm_mode", "colocate")
            overrides.append(f"training.generation.engine={'vllm-colocate' if mode == 'colocate' else 'vllm-server'}")
            share = args.get("vllm_gpu_memory_utilization")
            if isinstance(share, (int, float)) and not isinstance(share, bool):
                overrides.append(f"training.generation.vllm_gpu_memory_utilization={share}")
    return overrides


#: LLaMA-Factory's ``stage`` and the objective it trains (``src/llamafactory/train/tuner.py``);
#: ``pt`` is next-token training like ``sft``. A ``dpo`` stage's ``pref_loss`` picks ORPO or SimPO.
LLAMAFACTORY_STAGES = {"pt": "sft", "sft": "sft", "dpo": "dpo", "kto": "kto", "rm": "reward", "ppo": "ppo"}
LLAMAFACTORY_PREF_LOSS = {"orpo": "orpo", "simpo": "simpo"}


def llamafactory_inputs(path: str | Path) -> tuple[list[str], dict[str, Any]]:
    """(spec overrides, Trainer arguments) from a LLaMA-Factory training YAML: the method
    (``finetuning_type``, ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_target``,
    ``quantization_bit``, ``freeze_trainable_layers``), the objective (``stage``, ``pref_loss``),
    and what it passes to the HF Trainer (``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``cutoff_len`` as the sequence, ``bf16``/``fp16``). Defaults are
    LLaMA-Factory's (``hparams/finetuning_args.py``: rank 8, alpha 2 x rank, dropout 0, target all)."""
    from dsgen.spec.yaml_source import load_yaml, read_source

    file = Path(path)
    data, source = load_yaml(read_source(file, "LLaMA-Factory YAML"), str(file))
    if not isinstance(data, dict):
        raise DsgenError(f"{file}: a LLaMA-Factory training YAML is a mapping of its arguments")

    def fail(key: str, message: str) -> DsgenError:
        return DsgenError(f"{key}: {message}", path=key, location=source.location((key,)))

    def integer(key: str, default: int | None = None, low: int = 1) -> int | None:
        value = data.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise fail(key, f"must be an integer of at least {low}, got {value!r}")
        return value

    stage = data.get("stage", "sft")
    if stage not in LLAMAFACTORY_STAGES:
        raise fail("stage", f"must be one of {', '.join(LLAMAFACTORY_STAGES)}, got {stage!r}")
    objective = (
        LLAMAFACTORY_PREF_LOSS.get(data.get("pref_loss", ""), LLAMAFACTORY_STAGES[stage])
        if stage == "dpo"
        else LLAMAFACTORY_STAGES[stage]
    )
    kind = data.get("finetuning_type", "lora")
    if kind not in ("lora", "freeze", "full"):
        raise fail("finetuning_type", f"dsgen prices lora, freeze and full, got {kind!r}")
    bits = integer("quantization_bit")
    if bits is not None and bits not in (4, 8):
        raise fail("quantization_bit", f"dsgen prices 4- and 8-bit bitsandbytes quantization, got {bits}")
    overrides = [f"training.objective={objective}"]
    if kind == "lora":
        overrides.append(f"training.finetuning={'qlora' if bits else 'lora'}")
        rank = integer("lora_rank", 8)
        assert rank is not None
        overrides.append(f"training.lora.rank={rank}")
        alpha = data.get("lora_alpha") or 2 * rank
        overrides.append(f"training.lora.alpha={alpha}")
        dropout = data.get("lora_dropout", 0.0)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise fail("lora_dropout", f"must be a number from 0 to below 1, got {dropout!r}")
        overrides.append(f"training.lora.dropout={dropout}")
        target = data.get("lora_target", "all")
        if not isinstance(target, str) or not target.strip():
            raise fail("lora_target", f"must be 'all' or comma-separated module names, got {target!r}")
        names = [name.strip() for name in target.split(",") if name.strip()]
        overrides.append("training.lora.target_modules=" + ("all-linear" if names == ["all"] else json.dumps(names)))
        if bits:
            overrides.append(f"training.quantization.bits={bits}")
            overrides.append(f"training.quantization.type={'nf4' if bits == 4 else 'int8'}")
    elif kind == "freeze":
        layers = integer("freeze_trainable_layers", 2)
        overrides += ["training.finetuning=freeze", f"training.freeze.trainable_layers={layers}"]
    else:
        overrides.append("training.finetuning=full")
    args: dict[str, Any] = {}
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        value = integer(key)
        if value is not None:
            args[key] = value
    cutoff = integer("cutoff_len", 2048)
    args["max_length"] = cutoff
    for key in ("bf16", "fp16"):
        if key in data:
            args[key] = bool(data[key])
    return overrides, args
