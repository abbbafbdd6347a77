"""What each target's templates are given: the values a framework fills itself become ``"auto"``,
the optimizer and scheduler appear only where someone asked for them, and what no file can carry
becomes a note.

Sources (transformers 5.24, accelerate 1.15, lightning 2.6, read in their code):

* HF Trainer: ``HfTrainerDeepSpeedConfig.trainer_config_process`` fills the batch triple,
  ``gradient_clipping``, ``optimizer.params`` lr/betas/eps/weight_decay, the scheduler's warmup
  lrs and ``fp16``/``bf16`` ``enabled`` from ``TrainingArguments``; ``trainer_config_finalize``
  fills ``reduce_bucket_size`` (h^2) and, at ZeRO-3, ``stage3_prefetch_bucket_size`` (0.9 h^2) and
  ``stage3_param_persistence_threshold`` (10 h), and the scheduler's step counts. Every value
  that is not ``"auto"`` must match ``TrainingArguments`` or the Trainer refuses to start.
* Accelerate: ``DeepSpeedPlugin.set_mixed_precision`` fills ``fp16``/``bf16`` ``enabled`` from
  the config's ``mixed_precision``; ``Accelerator._prepare_deepspeed`` fills the hidden-size
  buckets from the model. Its other fills (micro-batch from the DataLoader, clipping 1.0) would
  not be the plan's values, so those stay concrete.
* Lightning: ``DeepSpeedStrategy._format_batch_size_and_grad_accum_config`` refuses a config
  with ``gradient_accumulation_steps`` (it sets it from ``accumulate_grad_batches``) and sets
  ``gradient_clipping`` from ``gradient_clip_val`` when absent; those two keys are left out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsgen.estimate.optimizers import CLIENT_IMPLEMENTATIONS, client_optimizer_call, is_client_optimizer
from dsgen.facts.frameworks import config_reader
from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.targets.deepspeed_blocks import COSINE_MIN_RATIO, optimizer_block, scheduler_block
from dsgen.targets.finetuning_files import finetuning_notes
from dsgen.targets.llamafactory import check_llamafactory, llamafactory_notes
from dsgen.targets.long_context import attention_note, check_target, liger_note, long_context_notes
from dsgen.targets.model_parallel import check_model_parallel_target, model_parallel_notes, needs_config_optimizer
from dsgen.targets.trl_cli import check_trl, trl_notes

#: TrainingArguments ``optim`` for the optimizers the training script builds itself.
HF_CLIENT_OPTIM = {"adafactor": "adafactor", "adamw-8bit": "adamw_bnb_8bit"}
#: TrainingArguments ``optim`` for torch.optim classes (``training.optimizer.implementation: torch``
#: or ``torch-fused``).
HF_TORCH_OPTIM = {
    ("adamw", "torch"): "adamw_torch",
    ("adamw", "torch-fused"): "adamw_torch_fused",
    ("sgd", "torch"): "sgd",
    ("adagrad", "torch"): "adagrad",
}

#: TrainingArguments ``lr_scheduler_type`` for each spec scheduler (DeepSpeed's equivalent in
#: dsgen.targets.deepspeed_blocks.scheduler_block: WarmupLR, WarmupDecayLR to 0, WarmupCosineLR to 0.1 x lr).
HF_SCHEDULER = {
    "none": "constant",
    "warmup": "constant_with_warmup",
    "warmup_decay": "linear",
    "warmup_cosine": "cosine_with_min_lr",
}

LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}
ACCELERATE_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}

#: Keys Lightning sets itself and refuses to see twice (gradient accumulation) or fills (clipping).
LIGHTNING_OMITS = frozenset({"/gradient_accumulation_steps", "/gradient_clipping"})


#: How a script ends on each target whose framework leaves the process group alive. Lightning
#: needs no line: it registers ``torch.distributed.destroy_process_group`` with atexit itself
#: (lightning/fabric/utilities/distributed.py, ``_init_dist_connection``). Neither the HF Trainer
#: nor ``deepspeed.initialize`` tears the group down, and a rank that exits with a gloo group alive
#: can abort in interpreter shutdown (SIGABRT, "terminate called without an active exception")
#: after training finished, which torchrun and the scheduler report as a failed job.
TEARDOWN = {
    "hf-trainer": "end the script with trainer.accelerator.wait_for_everyone(); trainer.accelerator.end_training() "
    "(destroys the process group; a rank exiting with it alive can abort after training)",
    "accelerate": "end the script with accelerator.wait_for_everyone(); accelerator.end_training() "
    "(destroys the process group; a rank exiting with it alive can abort after training)",
    "deepspeed": "end the script with deepspeed.comm.barrier(); deepspeed.comm.destroy_process_group() "
    "(a rank exiting with the process group alive can abort after training)",
}


def hf_bucket_fill(hidden_size: int, zero_stage: int) -> dict[str, int]:
    """The bucket sizes ``trainer_config_finalize`` (and Accelerate) write for ``"auto"``."""
    fill = {"/zero_optimization/reduce_bucket_size": hidden_size * hidden_size}
    if zero_stage == 3:
        fill["/zero_optimization/stage3_prefetch_bucket_size"] = int(0.9 * hidden_size * hidden_size)
        fill["/zero_optimization/stage3_param_persistence_threshold"] = 10 * hidden_size
    return fill


def _plan_buckets(plan: Plan) -> dict[str, int]:
    return {
        "/zero_optimization/reduce_bucket_size": plan.knobs.reduce_bucket_size,
        "/zero_optimization/stage3_prefetch_bucket_size": plan.knobs.prefetch_bucket_size,
        "/zero_optimization/stage3_param_persistence_threshold": plan.knobs.param_persistence_threshold,
    }


def auto_pointers(spec: Spec, plan: Plan, target: str) -> frozenset[str]:
    """JSON pointers rendered as ``"auto"`` for ``target``.

    A bucket is ``"auto"`` only where the framework would fill the very value the plan was priced
    with; a bucket dsgen tuned to another size stays concrete.
    """
    if target in ("deepspeed", "lightning"):
        return frozenset()
    pointers: set[str] = {"/bf16/enabled", "/fp16/enabled"}
    planned = _plan_buckets(plan)
    if plan.zero_stage > 0:
        fill = hf_bucket_fill(spec.model.hidden_size, plan.zero_stage)
        pointers |= {p for p, value in fill.items() if planned[p] == value}
    if target == "hf-trainer":
        # Under AutoTP the JSON leaves train_batch_size out (templates/deepspeed/ds_config.json.j2):
        # trainer_config_process would fill args.world_size x per_device_train_batch_size x
        # gradient_accumulation_steps, every rank (transformers/integrations/deepspeed.py), which is
        # what DeepSpeed 0.19.8 derives and asserts without an mpu (Plan.deepspeed_train_batch_size);
        # Trainer.get_tp_size divides only its own count of samples per step by autotp_size.
        pointers |= {
            "/train_batch_size",
            "/train_micro_batch_size_per_gpu",
            "/gradient_accumulation_steps",
            "/gradient_clipping",
            "/optimizer/params/lr",
            "/optimizer/params/betas",
            "/optimizer/params/eps",
            "/optimizer/params/weight_decay",
        }
    return frozenset(pointers)


def omitted_pointers(target: str) -> frozenset[str]:
    return LIGHTNING_OMITS if target == "lightning" else frozenset()


def _with_autos(block: dict[str, Any], autos: frozenset[str], prefix: str) -> dict[str, Any]:
    params = block["params"]
    if params is None:
        return block
    filled = {k: ("auto" if f"{prefix}/params/{k}" in autos else v) for k, v in params.items()}
    return {**block, "params": filled}


def optimizer_for(spec: Spec, plan: Plan, target: str, autos: frozenset[str]) -> dict[str, Any]:
    """The optimizer section: DeepSpeed's as today; for a framework only when the spec names the
    optimizer or the plan offloads it (ZeRO-Offload steps with DeepSpeed's own CPU Adam, which
    DeepSpeed builds only from the config). ``type`` None means no section."""
    block = optimizer_block(spec)
    if target == "deepspeed":
        return block
    # AutoEP needs DeepSpeed to build the optimizer (dsgen.targets.model_parallel)
    wanted = spec.names("training.optimizer") or plan.offload_optimizer != "none" or needs_config_optimizer(plan)
    if is_client_optimizer(spec.training.optimizer) or not wanted:
        # the framework builds the optimizer and tells ZeRO to accept it (HF and Accelerate do
        # this themselves; Lightning does not)
        return {"type": None, "params": None, "untested": True}
    return _with_autos(block, autos, "/optimizer")


def scheduler_for(spec: Spec, target: str, optimizer: dict[str, Any]) -> dict[str, Any] | None:
    """The scheduler section: DeepSpeed's as today; the HF Trainer builds the one named in
    training_args.json; Accelerate and Lightning take DeepSpeed's only beside DeepSpeed's optimizer."""
    if target == "deepspeed":
        return scheduler_block(spec)
    if target == "hf-trainer" or optimizer["type"] is None or not spec.names("training.scheduler"):
        return None
    return scheduler_block(spec)


def hf_scheduler(spec: Spec) -> dict[str, Any] | None:
    """TrainingArguments scheduler keys for the schedule the spec asked for (None: not asked)."""
    if not spec.names("training.scheduler"):
        return None
    sched = spec.training.scheduler
    out: dict[str, Any] = {"lr_scheduler_type": HF_SCHEDULER[sched.type], "lr_scheduler_kwargs": None}
    out["warmup_steps"] = sched.warmup_steps if sched.type != "none" else None
    if sched.type == "warmup_cosine":
        out["lr_scheduler_kwargs"] = {"min_lr_rate": COSINE_MIN_RATIO}
    out["max_steps"] = (
        max(sched.total_steps, sched.warmup_steps) if spec.names("training.scheduler.total_steps") else None
    )
    return out


def defaults_applied(spec: Spec, target: str) -> list[str]:
    """Training behaviour dsgen's defaults add to a DeepSpeed-target config the spec did not ask for."""
    if target != "deepspeed":
        return []
    notes = []
    o, s = spec.training.optimizer, spec.training.scheduler
    if not spec.names("training.optimizer") and not is_client_optimizer(o):
        notes.append(f"optimizer {o.type} lr {o.lr:g} (dsgen default; set training.optimizer)")
    if not spec.names("training.scheduler") and s.type != "none":
        notes.append(
            f"scheduler {s.type}: warmup {s.warmup_steps} of {s.total_steps} steps "
            "(dsgen default; set training.scheduler, type none for a constant rate)"
        )
    if not spec.names("training.gradient_clipping"):
        notes.append(
            f"gradient_clipping {spec.training.gradient_clipping:g} (dsgen default; set training.gradient_clipping)"
        )
    return notes


def script_notes(spec: Spec, plan: Plan, target: str, optimizer: dict[str, Any]) -> list[str]:
    """What the training script must do that the target's files cannot carry."""
    notes = []
    micro = plan.micro_batch_size
    if target in ("accelerate", "lightning"):
        notes.append(f"give the training DataLoader batch_size={micro} (the plan's micro-batch per GPU)")
    attention = attention_note(spec)
    if attention:
        notes.append(attention)
    if spec.training.liger_kernel:
        notes.append(liger_note(spec, plan, target))
    if plan.checkpointing == "full" and target in ("accelerate", "lightning", "deepspeed"):
        notes.append(
            "enable gradient checkpointing: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            f"{{'use_reentrant': {plan.long_context.checkpoint_offload}}})"  # the offload patches the reentrant one
        )
    if plan.checkpointing == "selective":
        notes.append(
            "recompute only the attention function in backward (selective recomputation, not "
            "gradient_checkpointing): wrap the attention function in torch.utils.checkpoint"
        )
    if plan.zero_stage == 3:
        how = {
            "hf-trainer": "create TrainingArguments before from_pretrained so transformers builds the model under deepspeed.zero.Init",
            "accelerate": "create the Accelerator before from_pretrained (zero3_init_flag makes it build the model under deepspeed.zero.Init)",
            "lightning": "build the model in LightningModule.configure_model so Lightning creates it under deepspeed.zero.Init",
            "deepspeed": "build the model under deepspeed.zero.Init(config_dict_or_path=ds_config.json)",
        }[target]
        notes.append(how)
        if spec.model.num_experts > 0:
            notes.append(
                "mark the MoE block as a ZeRO-3 leaf: deepspeed.utils.set_z3_leaf_modules(model, [<the model's sparse MoE block class>])"
            )
    if is_client_optimizer(spec.training.optimizer) and target != "hf-trainer":
        notes.append(f"build the optimizer in the script: {client_optimizer_call(spec.training.optimizer, 'params')}")
    if target in ("accelerate", "lightning") and optimizer["type"] is None and spec.names("training.scheduler"):
        s = spec.training.scheduler
        notes.append(f"build the {s.type} schedule (warmup {s.warmup_steps} of {s.total_steps} steps) in the script")
    notes.extend(long_context_notes(spec, plan, target))  # Ulysses SP, TiledMLP, tiled loss, checkpoint offload
    notes.extend(model_parallel_notes(spec, plan, target))  # AutoTP's shared batches, AutoEP's optimizer
    notes.extend(finetuning_notes(spec, plan, target))  # PEFT, quantization, TRL
    if target == "accelerate" and optimizer["type"] is not None:
        # the config has DeepSpeed's scheduler exactly when the spec named one (scheduler_for)
        dummies = "DummyOptim and DummyScheduler" if spec.names("training.scheduler") else "DummyOptim"
        notes.append(f"pass accelerate.utils.{dummies} to accelerator.prepare: the config names them")
    if target in TEARDOWN:
        notes.append(TEARDOWN[target])
    return notes


@dataclass(frozen=True)
class TargetContext:
    """Everything a target's templates see besides the plan and spec themselves."""

    target: str
    launcher: str
    autos: frozenset[str]
    omits: frozenset[str]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None
    hf_optim: str | None
    hf_scheduler: dict[str, Any] | None
    notes: tuple[str, ...]
    defaults: tuple[str, ...]

    def auto(self) -> Callable[[str, Any], Any]:
        return lambda pointer, value: "auto" if pointer in self.autos else value

    def emits(self) -> Callable[[str], bool]:
        return lambda pointer: pointer not in self.omits


def target_context(spec: Spec, plan: Plan, target: str, launcher: str) -> TargetContext:
    """What ``target``'s templates see. The trl and llamafactory targets' JSON is the HF Trainer's
    (:func:`dsgen.facts.frameworks.config_reader`); their frameworks' scripts replace the user's, so
    their notes are what is left to do before launching, and what those cannot run is refused."""
    reader = config_reader(target)
    if target == "trl":
        check_trl(spec, plan)
    if target == "llamafactory":
        check_llamafactory(spec, plan)
    check_target(plan, reader)  # Ulysses SP needs a framework that passes DeepSpeed an mpu
    check_model_parallel_target(spec, plan, reader)  # AutoTP / AutoEP need a framework that can feed them
    autos = auto_pointers(spec, plan, reader)
    optimizer = optimizer_for(spec, plan, reader, autos)
    kind = spec.training.optimizer.type
    hf_optim = HF_CLIENT_OPTIM.get(kind) if reader == "hf-trainer" else None
    if reader == "hf-trainer" and spec.training.optimizer.implementation in CLIENT_IMPLEMENTATIONS:
        hf_optim = HF_TORCH_OPTIM.get((kind, spec.training.optimizer.implementation))
    own_notes = {"trl": trl_notes, "llamafactory": llamafactory_notes}.get(target)
    notes = own_notes(spec, plan) if own_notes is not None else script_notes(spec, plan, reader, optimizer)
    return TargetContext(
        target=target,
        launcher=launcher,
        autos=autos,
        omits=omitted_pointers(reader),
        optimizer=optimizer,
        scheduler=scheduler_for(spec, reader, optimizer),
        hf_optim=hf_optim,
        hf_scheduler=hf_scheduler(spec) if reader == "hf-trainer" else None,
        notes=tuple(notes),
        defaults=tuple(defaults_applied(spec, reader)),
    )
