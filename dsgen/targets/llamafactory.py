"""The llamafactory target: LLaMA-Factory's training YAML for the plan, started by
``llamafactory-cli train llamafactory.yaml`` beside the HF Trainer's DeepSpeed JSON.

LLaMA-Factory parses the YAML with ``get_train_args`` (``src/llamafactory/hparams/parser.py``), which
refuses a key none of its argument classes names, and trains with the HF Trainer's and TRL's
subclasses, so the JSON is the hf-trainer target's (:func:`dsgen.facts.frameworks.config_reader`).
The keys (LLaMA-Factory 0.9.5):

* the method and objective: ``stage`` (``pref_loss`` for ORPO and SimPO), ``finetuning_type``, the
  ``lora_*`` keys, ``quantization_bit`` (``hparams/finetuning_args.py``, ``model_args.py``), the
  inverse of what ``dsgen doctor --llamafactory`` reads (:mod:`dsgen.doctor.method_files`);
* the plan's trainer arguments: ``training_args.json``'s, except checkpointing, which LLaMA-Factory's
  loader turns on itself unless ``disable_gradient_checkpointing`` (``use_reentrant_gc`` picks the
  kind), and Liger, which is ``enable_liger_kernel``; the attention is ``flash_attn``;
* ``cutoff_len``, the sequence the plan was priced for;
* placeholders for the model, the dataset, its chat template and the output folder.
"""

from __future__ import annotations

from typing import Any

from dsgen.facts.frameworks import LLAMAFACTORY_PREF_LOSS, LLAMAFACTORY_STAGES
from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.targets.finetuning_files import peft_config
from dsgen.targets.model_parallel import model_parallel_notes
from dsgen.targets.own_script import PLACEHOLDER, Section, check_own_script, model_source, refusal

#: ``flash_attn`` for each spec attention (``extras/constants.py`` ``AttentionFunction``).
LLAMAFACTORY_ATTENTION = {"flash": "fa2", "flash3": "fa3", "sdpa": "sdpa", "eager": "disabled"}

#: The trainer arguments LLaMA-Factory sets its own way (see the module docstring).
OWN_WAY = ("gradient_checkpointing", "gradient_checkpointing_kwargs", "use_liger_kernel", "liger_kernel_config")


def stage_of(objective: str) -> tuple[str, str | None]:
    """(``stage``, ``pref_loss``) for a spec objective: the stage of its own name where there is
    one (``sft``, not ``pt``), else the one that trains it (``rm``; ``dpo`` with a ``pref_loss``)."""
    pref_loss = next((loss for loss, trained in LLAMAFACTORY_PREF_LOSS.items() if trained == objective), None)
    if pref_loss is not None:
        return "dpo", pref_loss
    if objective in LLAMAFACTORY_STAGES:
        return objective, None
    return next(stage for stage, trained in LLAMAFACTORY_STAGES.items() if trained == objective), None


def check_llamafactory(spec: Spec, plan: Plan) -> None:
    """Refuse, naming the key, what LLaMA-Factory's training cannot run as planned."""
    finetuning = spec.training.finetuning
    hint = "use --target trl or hf-trainer"
    if finetuning.objective not in set(LLAMAFACTORY_STAGES.values()) | set(LLAMAFACTORY_PREF_LOSS.values()):
        raise refusal(
            spec,
            "training.objective",
            f"objective {finetuning.objective}: LLaMA-Factory has no stage for it "
            f"(stage: {', '.join(LLAMAFACTORY_STAGES)})",
            hint,
        )
    if finetuning.objective == "ppo":
        raise refusal(
            spec,
            "training.objective",
            "objective ppo: LLaMA-Factory's PPO stage loads its reward model its own way "
            "(reward_model_type), which dsgen does not price",
            hint,
        )
    if finetuning.method == "freeze" and finetuning.freeze.trainable:
        raise refusal(
            spec,
            "training.freeze.trainable",
            "training.freeze.trainable names modules by their path; LLaMA-Factory's freeze_extra_modules "
            "takes module names beside the last layers, which dsgen does not translate",
            "leave training.freeze.trainable empty, or use --target hf-trainer",
        )
    check_own_script(spec, plan, "llamafactory", "LLaMA-Factory")


def _method(spec: Spec, plan: Plan) -> dict[str, Any]:
    finetuning = spec.training.finetuning
    stage, pref_loss = stage_of(finetuning.objective)
    method: dict[str, Any] = {"stage": stage, "do_train": True}
    if pref_loss is not None:
        method["pref_loss"] = pref_loss
    if finetuning.adapters:
        lora = finetuning.lora
        targets = peft_config(spec)["target_modules"]  # "attention" as the model's projection names
        method.update(
            finetuning_type="lora",
            lora_rank=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            lora_target="all" if targets == "all-linear" else ",".join(targets),
        )
    elif finetuning.method == "freeze":
        method.update(finetuning_type="freeze", freeze_trainable_layers=finetuning.freeze.trainable_layers)
    else:
        method["finetuning_type"] = "full"
    quantization = finetuning.quantization
    if finetuning.method == "qlora" and quantization.type in ("nf4", "fp4", "int8"):
        method.update(quantization_method="bnb", quantization_bit=quantization.bits)
        if quantization.type != "int8":
            method.update(quantization_type=quantization.type, double_quantization=quantization.double_quant)
    return method


def llamafactory_sections(spec: Spec, plan: Plan, training_args: dict[str, Any]) -> tuple[Section, ...]:
    """The blocks of ``llamafactory.yaml``: what to fill in, the method, the plan, the data."""
    required = {
        "model_name_or_path": model_source(spec),
        "dataset": f"{PLACEHOLDER}dataset names from your dataset_info.json, comma-separated",
        "template": f"{PLACEHOLDER}the model's chat template (LLaMA-Factory's template name)",
        "output_dir": f"{PLACEHOLDER}where checkpoints and the trained model go",
    }
    trainer = {key: value for key, value in training_args.items() if key not in OWN_WAY}
    if plan.checkpointing == "full":
        trainer["use_reentrant_gc"] = plan.long_context.checkpoint_offload  # as training_args.json's kwargs
    else:
        trainer["disable_gradient_checkpointing"] = True
    trainer["flash_attn"] = LLAMAFACTORY_ATTENTION[spec.training.attention]
    if spec.training.liger_kernel:
        trainer["enable_liger_kernel"] = True
    return (
        Section("Fill these in", required),
        Section("The method and objective", _method(spec, plan)),
        Section("The plan: batch split, precision, checkpointing, optimizer (training_args.json's values)", trainer),
        Section("The data", {"cutoff_len": spec.training.sequence_length}),
    )


def llamafactory_notes(spec: Spec, plan: Plan) -> list[str]:
    """What to know before starting it: the placeholders and the command."""
    nodes = spec.hardware.nodes
    start = "FORCE_TORCHRUN=1 llamafactory-cli train llamafactory.yaml"
    if nodes > 1:
        start = f"NNODES={nodes} NODE_RANK=<this node's rank> MASTER_ADDR=<node 0> MASTER_PORT=29500 " + start
    notes = [
        f"fill in the values of llamafactory.yaml that start with {PLACEHOLDER.strip()}",
        f"start it from this directory on every node: {start}",
    ]
    notes.extend(model_parallel_notes(spec, plan, "hf-trainer"))  # LLaMA-Factory's trainers are the HF Trainer's
    return notes


def plan_keys(plan: Plan, ds_config: str) -> dict[str, Any]:
    """What a plan decides in a LLaMA-Factory YAML (``dsgen new --from llamafactory`` sets these
    and keeps every other key): the batch split, the checkpointing and the DeepSpeed JSON."""
    keys: dict[str, Any] = {
        "per_device_train_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "deepspeed": ds_config,
        "disable_gradient_checkpointing": plan.checkpointing != "full",
        "bf16": plan.precision == "bf16",
        "fp16": plan.precision == "fp16",
    }
    return keys


def with_plan(text: str, keys: dict[str, Any]) -> tuple[str, list[str]]:
    """``text`` (a LLaMA-Factory YAML) with each of ``keys`` set: a top-level ``key: value`` line is
    rewritten in place, its comment kept; a key the file lacks is appended, unless its value is
    false, which is LLaMA-Factory's default for each of these. Every other line stays byte for byte.
    Returns the new text and the keys whose value changed (as ``key: old -> new``)."""
    import re

    import yaml

    old = yaml.safe_load(text) or {}
    lines = text.splitlines(keepends=True)
    changed: list[str] = []
    missing = dict(keys)
    for index, line in enumerate(lines):
        match = re.match(r"^([A-Za-z_][\w.-]*):[ \t]*(.*?)([ \t]+#.*)?(\r?\n)?$", line)
        if match is None or match.group(1) not in missing:
            continue
        key = match.group(1)
        value = missing.pop(key)
        written = yaml.safe_dump({key: value}, default_flow_style=True, width=1_000_000).strip()[1:-1]
        lines[index] = written + (match.group(3) or "") + (match.group(4) or "")
        if old.get(key) != value:
            changed.append(f"{key}: {old.get(key)} -> {value}")
    missing = {key: value for key, value in missing.items() if value is not False}  # False: the default
    if missing:
        tail = "" if not lines or lines[-1].endswith("\n") else "\n"
        block = "".join(f"{yaml.safe_dump({k: v}, width=1_000_000)}" for k, v in missing.items())
        lines.append(f"{tail}\n### set by dsgen\n{block}")
        changed += [f"{key}: (unset) -> {value}" for key, value in missing.items()]
    return "".join(lines), changed
