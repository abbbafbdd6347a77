"""What a model-parallel plan (DeepSpeed AutoTP, AutoEP) adds to a bundle, and the targets that cannot run it.

Both are switched on by the DeepSpeed JSON alone: ``deepspeed.initialize`` turns AutoTP training on
when ``tensor_parallel.autotp_size`` > 0 and the engine shards the model
(``deepspeed/__init__.py`` ``initialize``; ``runtime/engine.py`` ``_configure_tensor_parallel``), and
the engine replaces the MoE blocks when ``expert_parallel.enabled`` (``runtime/engine.py``
``_configure_expert_parallel``). transformers 5.24 and Accelerate 1.15 have no argument of their own
for either; they read the JSON (``Trainer.get_tp_size``, ``Accelerator._prepare_deepspeed``).
What no file carries (the data every rank of a TP group must share, the optimizer AutoEP needs,
the transformers release AutoEP initializes with) becomes a note, and a target whose code cannot
run the layout is refused, each with the code that decides it (docs/targets.md, "Model
parallelism"; measured in docs/model-parallel-measurements.md).
"""

from __future__ import annotations

from dsgen.errors import DsgenError
from dsgen.estimate.optimizers import is_client_optimizer
from dsgen.facts.frameworks import target_violation
from dsgen.facts.model_parallel import autoep_preset_for
from dsgen.plan import Plan
from dsgen.spec.types import Spec

#: The transformers releases DeepSpeed 0.19.8's AutoEP starts with. Every AutoEP preset needs
#: transformers 5 (``min_transformers_version`` in ``module_inject/auto_ep_presets/``). From 5.23.0
#: ``deepspeed.initialize`` fails with "TypeError: _CanRecordRegistry.get() takes 2 positional
#: arguments but 3 were given": ``auto_ep_presets/base.py`` ``_install_instance_transformers_output_recorders``
#: calls ``registry.get(key, default)`` on ``_CAN_RECORD_REGISTRY``, which 5.23.0 turned from a plain
#: dict into a class whose ``get`` takes one argument (``transformers/utils/output_capturing.py``).
#: Every release from 5.18.0 to 5.22.2 was run with both tiny MoE models on 2 CPU ranks and trains
#: (docs/model-parallel-measurements.md); 5.17 and older were not run.
AUTOEP_TRANSFORMERS_PIN = "transformers>=5.18,<5.23"

#: The DeepSpeed config key that makes a save gather the AutoTP shards: Accelerate's
#: ``get_state_dict`` (which ``Trainer.save_model`` calls) consolidates an ``autotp_size`` > 1 model
#: only when ``engine.zero_gather_16bit_weights_on_model_save()`` is true and raises ValueError
#: otherwise (``accelerate/accelerator.py``); the Trainer then writes a DeepSpeed checkpoint instead
#: of the model. DeepSpeed 0.19.8 reads the field at every ZeRO stage under either spelling
#: (``runtime/zero/config.py``: ``gather_16bit_weights_on_model_save`` with alias
#: ``stage3_gather_16bit_weights_on_model_save``); this one is the spelling Accelerate's
#: DeepSpeedPlugin reads back and the ZeRO-3 block already writes. DeepSpeed's blog
#: ``blogs/huggingface-tp``: "Ensure gather_16bit_weights_on_model_save is set to true".
SAVE_GATHER_KEY = "stage3_gather_16bit_weights_on_model_save"

#: Frameworks whose DataLoader gives every rank of a TP group the same batches: Accelerate >= 1.6
#: divides the process index and count by ``autotp_size`` when it prepares a DataLoader under
#: DeepSpeed (``data_loader.py`` ``prepare_data_loader``, "Processes with the same DP rank will
#: receive the same batch"), and the HF Trainer prepares its DataLoader through Accelerate.
TP_AWARE_LOADERS = ("hf-trainer", "accelerate")


def model_parallel_ds_keys(spec: Spec, plan: Plan) -> dict[str, object]:
    """Top-level DeepSpeed keys: ``tensor_parallel`` under AutoTP, ``expert_parallel`` under AutoEP
    (with the preset DeepSpeed's registry maps the model's ``model_type`` to)."""
    keys: dict[str, object] = {}
    if plan.tensor_parallel_size > 1:
        keys["tensor_parallel"] = {"autotp_size": plan.tensor_parallel_size}
    if plan.expert_parallel_size > 1:
        block: dict[str, object] = {"enabled": True, "autoep_size": plan.expert_parallel_size}
        preset = autoep_preset_for(spec.model.family, spec.training.deepspeed_version)
        if preset is not None:
            block["preset_model"] = preset
        keys["expert_parallel"] = block
    return keys


def model_parallel_zero_keys(plan: Plan) -> dict[str, object]:
    """Keys the ``zero_optimization`` block adds: under AutoTP below ZeRO-3, :data:`SAVE_GATHER_KEY`
    (the ZeRO-3 block writes it from the plan's knobs)."""
    if plan.tensor_parallel_size > 1 and plan.zero_stage < 3:
        return {SAVE_GATHER_KEY: True}
    return {}


def model_parallel_templates(spec: Spec, plan: Plan) -> dict[str, object]:
    """The templates' ``model_parallel`` variable (docs/templates.md)."""
    return {
        "tensor_parallel_size": plan.tensor_parallel_size,
        "expert_parallel_size": plan.expert_parallel_size,
        "ds_keys": model_parallel_ds_keys(spec, plan),
        "zero_keys": model_parallel_zero_keys(plan),
    }


def check_model_parallel_target(spec: Spec, plan: Plan, target: str) -> None:
    """Refuse a model-parallel plan that ``target`` cannot run (:func:`target_violation`), and an
    AutoEP plan whose optimizer the script would build: AutoEP needs DeepSpeed to build it from the
    config, so the expert parameters get their own expert-data-parallel groups (DeepSpeedExamples
    ``training/expert_parallel/README.md``: "AutoEP runs must let DeepSpeed build the optimizer from
    the JSON config (no client optimizer)"; ZeRO-1/2 otherwise stop at "None of the param groups are
    marked as MoE", ``runtime/zero/stage_1_and_2.py`` ``_configure_moe_settings``)."""
    found = target_violation(target, plan.tensor_parallel_size, plan.expert_parallel_size, plan.zero_stage)
    if found is not None:
        why, hint = found
        raise DsgenError(why, path="output.target", hint=hint)
    optimizer = spec.training.optimizer
    if plan.expert_parallel_size > 1 and is_client_optimizer(optimizer):
        built = (
            optimizer.type
            if optimizer.implementation == "deepspeed"
            else f"{optimizer.type} ({optimizer.implementation})"
        )
        raise DsgenError(
            f"the plan uses AutoEP (expert_parallel_size {plan.expert_parallel_size}), which needs DeepSpeed to build "
            f"the optimizer from the config, but {built} is built by the training script",
            path="training.optimizer",
            hint="use an optimizer DeepSpeed builds (training.optimizer.implementation: deepspeed, e.g. adamw), or "
            "pin constraints.expert_parallel_size: 1",
        )


def needs_config_optimizer(plan: Plan) -> bool:
    """Whether the config must carry DeepSpeed's optimizer for a framework target (AutoEP)."""
    return plan.expert_parallel_size > 1


def batch_note(plan: Plan, target: str) -> str:
    """The two batch counts of an AutoTP plan: the samples a step consumes and DeepSpeed's
    ``train_batch_size``, which counts every TP peer (``deepspeed.initialize`` builds its config
    without an mpu, so ``runtime/config.py`` ``_batch_assertion`` multiplies by every rank)."""
    tp = plan.tensor_parallel_size
    micro, accumulation = plan.micro_batch_size, plan.gradient_accumulation_steps
    text = (
        f"count the samples of an optimizer step as micro {micro} x accumulation {accumulation} x "
        f"{plan.data_parallel_size} GPUs / TP {tp} = {plan.global_batch_size}, not as DeepSpeed's train_batch_size "
        f"{plan.deepspeed_train_batch_size} (micro x accumulation x GPUs: deepspeed.initialize checks it without an "
        "mpu, so every TP peer counts)"
    )
    if target == "hf-trainer":
        text += f"; the Trainer logs {plan.global_batch_size} as its total train batch size (Trainer.get_tp_size)"
    return text


def model_parallel_notes(spec: Spec, plan: Plan, target: str) -> list[str]:
    """What the training script must do for the plan's AutoTP / AutoEP that no file carries."""
    notes: list[str] = []
    tp, ep = plan.tensor_parallel_size, plan.expert_parallel_size
    group = f"every rank of a TP group ({tp} consecutive ranks) the same batches"
    if tp > 1 and target == "hf-trainer":
        notes.append(
            f"keep the Trainer's own sampler, which gives {group} (Accelerate >= 1.6 shards by rank // autotp_size); "
            "a sampler of your own must shard by that rank too"
        )
    elif tp > 1 and target == "accelerate":
        notes.append(
            f"pass the training DataLoader to accelerator.prepare, which gives {group} (Accelerate >= 1.6 shards by "
            "rank // autotp_size); a sampler of your own must shard by that rank too"
        )
    elif tp > 1:
        notes.append(
            f'give {group} (AutoTP\'s first forward checks: "Data inconsistency within the TP group"): pass '
            "training_data= to deepspeed.initialize, or shard the data by deepspeed.utils.groups.get_data_parallel_rank() "
            f"(rank // {tp}) of get_data_parallel_world_size(), not by the global rank"
        )
    if tp > 1:
        notes.append(batch_note(plan, target))
    if ep > 1:
        # a flat list: AutoEP splits the parameters into dense and expert groups by each group's
        # "name" (deepspeed/moe/utils.py split_params_into_different_moe_groups_for_optimizer), and
        # weight-decay groups without one fail with KeyError: 'name' (docs/model-parallel-measurements.md)
        flat = {
            "deepspeed": "deepspeed.initialize(model=model, model_parameters=model.parameters(), config=...)",
            "accelerate": "accelerate.utils.DummyOptim(model.parameters())",
        }
        why = (
            "AutoEP needs DeepSpeed to build it, so the expert parameters get their own expert-data-parallel groups "
            "(DeepSpeedExamples training/expert_parallel)"
        )
        if target == "hf-trainer":
            notes.append(f"keep the config's optimizer block (build no optimizer in the script): {why}")
        else:
            notes.append(
                f"let DeepSpeed build the optimizer from the config's optimizer block, given a flat parameter list "
                f"({flat.get(target, flat['deepspeed'])}; parameter groups without a 'name' key fail with KeyError: "
                f"'name'): {why}"
            )
        notes.append(
            f"pip install '{AUTOEP_TRANSFORMERS_PIN}': DeepSpeed 0.19.8's AutoEP fails in deepspeed.initialize on "
            "transformers 5.23 and later (TypeError: _CanRecordRegistry.get() takes 2 positional arguments but 3 were "
            "given, deepspeed/module_inject/auto_ep_presets/base.py); 5.18.0 to 5.22.2 run it"
        )
    return notes
