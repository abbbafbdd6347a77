"""The trl target: a config for TRL's own command line beside the HF Trainer's DeepSpeed JSON, so
that a fine-tune launches with no training script (``trl sft|dpo|kto|grpo|reward --config``).

TRL's CLI parses the YAML into its script's dataclasses and hands every key they do not name to
``accelerate launch`` (TRL 1.16: ``trl/cli/commands/training.py`` ``TrainingCommand.run``,
``trl/scripts/<objective>.py`` ``make_parser``: ``ScriptArguments``, the objective's config, a
``TrainingArguments`` subclass, ``ModelConfig`` and ``DatasetMixtureConfig``). What the file holds:

* the trainer's arguments: the hf-trainer target's ``training_args.json``, rendered from the same
  template, and the objective's (:func:`dsgen.targets.finetuning_files.trl_config`);
* the adapter and the quantization under ``ModelConfig``'s names for the values of
  ``peft_config.json`` and ``quantization_config.json``: TRL builds the same ``LoraConfig`` and
  ``BitsAndBytesConfig`` from them (``trl/trainer/utils.py`` ``get_peft_config``,
  ``get_quantization_config``, whose compute dtype is ``dtype``);
* the model, the dataset and the output directory, as placeholders the user fills
  (:data:`PLACEHOLDER`), except a model the spec names by its Hugging Face id.

TRL's scripts do what the other targets leave to the user's script: they build the arguments
before the model (so ZeRO-3 builds it under ``zero.Init``), wrap it with PEFT, prepare a 4-bit
model, create the reference model and end the process group (``trainer.end()``). What they cannot
do is refused by name (:func:`check_trl`, :mod:`dsgen.targets.own_script`).
"""

from __future__ import annotations

from typing import Any

from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.targets.finetuning_files import TORCH_DTYPE, peft_config, quantization_config, trl_config
from dsgen.targets.model_parallel import model_parallel_notes
from dsgen.targets.own_script import PLACEHOLDER, Section, check_own_script, model_source, refusal
from dsgen.vocabulary import HF_ATTN_IMPLEMENTATION

#: The objectives TRL's CLI trains, each its own command (TRL 1.16: ``trl/cli/commands/__init__.py``
#: ``get_commands``; ORPO and CPO/SimPO live in ``trl.experimental`` and have none).
TRL_COMMANDS = ("sft", "dpo", "kto", "grpo", "reward")

#: ``peft_config.json``'s keys under ModelConfig's names (``bias`` is "none" in both).
LORA_KEYS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "task_type": "lora_task_type",
}
#: ``quantization_config.json``'s keys under ModelConfig's names (the compute dtype is ``dtype``).
QUANTIZATION_KEYS = {
    "load_in_4bit": "load_in_4bit",
    "load_in_8bit": "load_in_8bit",
    "bnb_4bit_quant_type": "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant": "use_bnb_nested_quant",
    "bnb_4bit_quant_storage": "bnb_4bit_quant_storage",
}


def trl_command(spec: Spec) -> str:
    """The ``trl`` subcommand that trains the spec's objective (:func:`check_trl` refuses the rest)."""
    return spec.training.finetuning.objective


def check_trl(spec: Spec, plan: Plan) -> None:
    """Refuse, naming the key, what TRL's stock scripts cannot run."""
    finetuning = spec.training.finetuning
    hint = "use --target hf-trainer and a training script of your own"
    if finetuning.objective not in TRL_COMMANDS:
        raise refusal(
            spec,
            "training.objective",
            f"objective {finetuning.objective}: TRL's CLI has no command for it (trl {' | '.join(TRL_COMMANDS)})",
            hint,
        )
    if finetuning.method == "freeze":
        raise refusal(
            spec,
            "training.finetuning",
            "finetuning freeze: TRL's CLI trains every parameter or a LoRA adapter; it cannot freeze layers",
            hint,
        )
    check_own_script(spec, plan, "trl", "TRL")


def trl_sections(spec: Spec, plan: Plan, training_args: dict[str, Any]) -> tuple[Section, ...]:
    """The blocks of ``trl_config.yaml``: what to fill in, the plan's trainer arguments, the
    objective's, and the model's loading (adapter and quantization included)."""
    finetuning = spec.training.finetuning
    objective = finetuning.objective
    required: dict[str, Any] = {
        "model_name_or_path": model_source(spec),
        "dataset_name": f"{PLACEHOLDER}a Hugging Face dataset id (or a datasets: list of local files instead)",
        "output_dir": f"{PLACEHOLDER}where checkpoints and the trained model go",
    }
    if objective == "grpo":
        required["reward_funcs"] = [f"{PLACEHOLDER}a reward function's dotted import path, or one of TRL's"]
    model: dict[str, Any] = {
        "dtype": TORCH_DTYPE[plan.precision],
        "attn_implementation": HF_ATTN_IMPLEMENTATION[spec.training.attention],
    }
    if finetuning.adapters:
        model["use_peft"] = True
        model.update({LORA_KEYS[key]: value for key, value in peft_config(spec).items() if key in LORA_KEYS})
    if finetuning.method == "qlora":
        quantization = quantization_config(spec, plan) or {}
        model.update({QUANTIZATION_KEYS[k]: v for k, v in quantization.items() if k in QUANTIZATION_KEYS})
    sections = [
        Section("Fill these in (launch.sh refuses to start while one says REQUIRED)", required),
        Section(
            "The plan: batch split, precision, checkpointing, optimizer (training_args.json's values)", training_args
        ),
        Section(f"The {objective} objective", trl_config(spec, plan)),
        Section("The model: how it is loaded, its adapter and its quantization", model),
    ]
    return tuple(section for section in sections if section.values)


def trl_notes(spec: Spec, plan: Plan) -> list[str]:
    """What to know before launching: what TRL's scripts leave to the user."""
    notes = [f"fill in the values of trl_config.yaml that start with {PLACEHOLDER.strip()}"]
    if spec.training.finetuning.objective == "grpo":
        generation = spec.training.finetuning.generation
        if generation.engine == "vllm-server":
            notes.append("start the vLLM server first, on GPUs of its own: trl vllm-serve --model <the same model>")
    notes.extend(model_parallel_notes(spec, plan, "hf-trainer"))  # TRL's trainers are the HF Trainer's
    return notes
