"""Fine-tuning rules: what TRL, PEFT and transformers do with a DeepSpeed config for a given method.

These rules need the training method (:class:`dsgen.validate.method.TrainingMethod`: LoRA, QLoRA,
freeze; DPO/KTO reference models; GRPO generation), which the JSON does not carry, so they run
only when ``validate_config(..., method=...)`` is given one (``dsgen validate --spec``). They have
their own catalogue, :data:`METHOD_RULES`, beside :data:`dsgen.validate.rules.catalogue.RULES`
(the rules about the config alone); the ids never overlap.

The same severity rule holds (``docs/validation.md``): an error only where the framework raises
(each cites the function, read in TRL 1.16, transformers 5.24, accelerate 1.15, PEFT 0.21 and
DeepSpeed 0.19.8, and ``tests/test_validate_finetuning.py`` makes the framework's own code raise);
a warning where it runs but not as the config says, or where its documentation warns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsgen.validate.findings import Finding
from dsgen.validate.rules.catalogue import RULES, RuleInfo
from dsgen.validate.rules.context import Context, flag, section, whole
from dsgen.validate.rules.parallel import managed_ga_conflict
from dsgen.validate.rules.precision import master_weights_stage
from dsgen.validate.rules.registry import Check
from dsgen.validate.rules.zero import compute_grad_norm
from dsgen.vocabulary import Objective, Phase, Severity

#: The fine-tuning rules, by id (never an id of :data:`RULES`).
METHOD_RULES: dict[str, RuleInfo] = {}
METHOD_CHECKS: list[tuple[RuleInfo, Check]] = []

#: The TRL config class of each objective TRL trains (TRL 1.16 has no PPO trainer). Every one
#: derives from ``trl/trainer/base_config.py`` ``_BaseConfig``.
TRL_CONFIG_CLASSES: dict[Objective, str] = {
    "sft": "SFTConfig",
    "dpo": "DPOConfig",
    "kto": "KTOConfig",
    "orpo": "ORPOConfig",
    "simpo": "CPOConfig",
    "reward": "RewardConfig",
    "grpo": "GRPOConfig",
}

#: DeepSpeed's checks that refuse a config at ZeRO stage 0 (and only there): TRL's reference
#: engine runs at stage 0 whenever the policy does not run at stage 3.
_STAGE0_CHECKS: tuple[tuple[str, Check], ...] = (
    ("master-weights-stage", master_weights_stage),
    ("compute-grad-norm", compute_grad_norm),
    ("managed-ga-conflict", managed_ga_conflict),
)


def method_rule(
    rule_id: str, severity: Severity, phase: Phase, summary: str, framework: str
) -> Callable[[Check], Check]:
    """Register ``func`` as the check behind the fine-tuning rule ``rule_id``."""
    if rule_id in RULES or rule_id in METHOD_RULES:
        raise ValueError(f"rule id {rule_id!r} registered twice")
    info = METHOD_RULES[rule_id] = RuleInfo(rule_id, severity, phase, summary, framework)

    def decorate(func: Check) -> Check:
        METHOD_CHECKS.append((info, func))
        return func

    return decorate


def run_method_rules(ctx: Context) -> None:
    """Run every fine-tuning rule; nothing without a method."""
    if ctx.method is None:
        return
    for _, check in METHOD_CHECKS:
        check(ctx)


def _emit(ctx: Context, rule_id: str, pointer: str, message: str, hint: str, *, phase: Phase | None = None) -> None:
    info = METHOD_RULES[rule_id]
    line, column = ctx.locate(pointer)
    ctx.findings.append(Finding(info.severity, rule_id, pointer, message, hint, line, column, phase or info.phase))


# -- TRL's reference engine ---------------------------------------------------------------------


def reference_engine_config(config: dict[str, Any], stage: int) -> dict[str, Any]:
    """The config TRL's ``prepare_deepspeed`` (``trl/models/utils.py``) gives ``deepspeed.initialize``
    for a frozen model: a copy without ``optimizer``, ``scheduler`` and
    ``zero_optimization.offload_optimizer``, at ZeRO stage 3 if the policy runs at stage 3 and at
    stage 0 otherwise. (TRL also writes its ZeRO-3 bucket sizes as dotted top-level keys, which
    DeepSpeed ignores; they are left out here.)"""
    derived = {key: value for key, value in config.items() if key not in ("optimizer", "scheduler")}
    raw = config.get("zero_optimization")
    zero = {"stage": 1 if raw else 0} if isinstance(raw, bool) else dict(section(raw))
    zero.pop("offload_optimizer", None)
    zero["stage"] = 3 if stage == 3 else 0
    derived["zero_optimization"] = zero
    return derived


def _reference_engine_role(ctx: Context) -> str | None:
    """What TRL wraps in a second DeepSpeed engine for this method, or None."""
    method = ctx.method
    assert method is not None
    if method.objective in ("dpo", "kto") and method.reference == "separate":
        return f"the reference model ({method.objective.upper()}Trainer, ref_model)"
    if method.objective in ("dpo", "kto") and method.reference == "precomputed":
        return f"the policy, to precompute the reference log-probs ({method.objective.upper()}Trainer, precompute_ref_log_probs)"
    if method.objective == "grpo" and method.reference == "separate":
        return "the reference model (GRPOTrainer with beta > 0)"
    return None


@method_rule(
    "trl-reference-engine",
    "error",
    "engine",
    "DPO/KTO with a separate or precomputed reference, or GRPO with a separate one, on a config that "
    "DeepSpeed refuses without an optimizer at ZeRO stage 0 (16-bit master weights, "
    "compute_grad_norm: false, managed_gradient_accumulation: false with overlap_comm), or with ZenFlow.",
    "trl/models/utils.py prepare_deepspeed builds the reference engine from this config without "
    "optimizer, scheduler and offload_optimizer, at stage 0 unless the policy is at stage 3: "
    "DeepSpeedConfig asserts (master weights, compute_grad_norm), deepspeed.initialize asserts "
    "(managed_gradient_accumulation), or the first forward raises AttributeError "
    "'zenflow_need_update' (runtime/zenflow/engine.py is_zenflow_update_boundary).",
)
def trl_reference_engine(ctx: Context) -> None:
    role = _reference_engine_role(ctx)
    if role is None or ctx.stage is None:
        return
    where = f"TRL wraps {role} in a second DeepSpeed engine (trl/models/utils.py prepare_deepspeed)"
    if ctx.stage != 3:
        derived = Context(
            reference_engine_config(ctx.config, ctx.stage),
            world_size=ctx.world_size,
            target=ctx.target,
            profile=ctx.profile,
            positions=ctx.positions,
        )
        for rule_id, check in _STAGE0_CHECKS:
            if ctx.applies(RULES[rule_id].since):
                check(derived)
        seen = {(f.rule_id, f.pointer, f.message) for f in ctx.findings}
        for inner in derived.findings:
            if inner.severity != "error" or (inner.rule_id, inner.pointer, inner.message) in seen:
                continue
            key = inner.pointer[1:].replace("/", ".")
            _emit(
                ctx,
                "trl-reference-engine",
                inner.pointer,
                f"{where} from this config at ZeRO stage 0, without optimizer, scheduler and offload_optimizer; "
                f"DeepSpeed refuses it there: {inner.message}",
                f"remove {key} (the policy keeps ZeRO-{ctx.stage}, the reference engine cannot), or train with "
                "ZeRO-3, whose reference engine stays at stage 3"
                + (
                    ", or use reference_model adapter-disabled (no second engine)"
                    if ctx.method and ctx.method.adapters
                    else ""
                ),
            )
    zenflow = ctx.pydantic_value(ctx.zero.get("zenflow"), None, "/zero_optimization/zenflow")
    if isinstance(zenflow, dict) and zenflow.get("update_interval", "auto") == "auto":
        _emit(
            ctx,
            "trl-reference-engine",
            "/zero_optimization/zenflow",
            f"{where} from this config without an optimizer; with ZenFlow's automatic update_interval its first "
            "forward raises AttributeError: the engine's optimizer has no attribute 'zenflow_need_update' "
            "(deepspeed/runtime/zenflow/engine.py is_zenflow_update_boundary)",
            "remove zero_optimization.zenflow, or give it a fixed update_interval (an integer)",
        )


# -- GRPO -----------------------------------------------------------------------------------------


def _global_batch(ctx: Context) -> tuple[int, str] | None:
    """The sequences per optimizer step the config states (and where), or None if unknown."""
    total = whole(ctx.config.get("train_batch_size"))
    if total is not None and total > 0:
        return total, "/train_batch_size"
    micro = whole(ctx.config.get("train_micro_batch_size_per_gpu"))
    steps = whole(ctx.config.get("gradient_accumulation_steps", 1))
    if micro and steps and ctx.world_size and micro > 0 and steps > 0:
        return micro * steps * ctx.world_size, "/train_micro_batch_size_per_gpu"
    return None


@method_rule(
    "grpo-generation-batch",
    "error",
    "engine",
    "GRPO whose global batch (train_batch_size, or micro batch x accumulation x --world-size) is not a "
    "multiple of num_generations.",
    "trl/trainer/grpo_config.py GRPOConfig.__post_init__ makes the generation batch per_device_train_batch_size "
    "x processes x gradient_accumulation_steps (the global batch; the HF Trainer makes the config's batch keys "
    "match those arguments) and raises 'generation_batch_size (B) must be divisible by num_generations (G)'.",
)
def grpo_generation_batch(ctx: Context) -> None:
    method = ctx.method
    if method is None or method.objective != "grpo" or not method.num_generations:
        return
    found = _global_batch(ctx)
    if found is None:
        return
    batch, pointer = found
    groups = method.num_generations
    if batch % groups == 0:
        return
    _emit(
        ctx,
        "grpo-generation-batch",
        pointer,
        f"global batch {batch} is not a multiple of num_generations {groups}: TRL's GRPOConfig makes the generation "
        f"batch the global batch and raises 'generation_batch_size ({batch}) must be divisible by num_generations "
        f"({groups})' (trl/trainer/grpo_config.py GRPOConfig.__post_init__)",
        f"make the global batch a multiple of {groups} (e.g. {batch + (-batch) % groups}), or set "
        "generation_batch_size / steps_per_generation in GRPOConfig to a multiple of it",
    )


# -- QLoRA ----------------------------------------------------------------------------------------


@method_rule(
    "qlora-zero3-offload-param",
    "warning",
    "lint",
    "QLoRA with ZeRO-3 parameter offload (offload_param to cpu or nvme).",
    "Runs; PEFT's DeepSpeed guide (docs/source/accelerate/deepspeed.md, Caveats 3; "
    "https://huggingface.co/docs/peft/accelerate/deepspeed) warns 'DeepSpeed Stage 3 and qlora when used with "
    "CPU offloading leads to more GPU memory usage when compared to disabling CPU offloading.'",
)
def qlora_zero3_offload_param(ctx: Context) -> None:
    if ctx.method is None or ctx.method.finetuning != "qlora" or ctx.stage != 3:
        return
    device = ctx.offload_device("offload_param")
    if device not in ("cpu", "nvme"):
        return
    _emit(
        ctx,
        "qlora-zero3-offload-param",
        ctx.pointer("zero_optimization", "offload_param"),
        f"QLoRA with ZeRO-3 and zero_optimization.offload_param on {device}: PEFT's DeepSpeed guide warns that "
        "ZeRO-3 with QLoRA and CPU offloading uses more GPU memory than without offloading "
        "(https://huggingface.co/docs/peft/accelerate/deepspeed, Caveats)",
        "remove zero_optimization.offload_param (or set its device to none); the 4-bit base is small",
    )


# -- TRL's precision default ------------------------------------------------------------------------


def _trl_config_class(ctx: Context) -> str | None:
    """The TRL config class the run uses (full-parameter SFT may as well be the plain Trainer's)."""
    method = ctx.method
    if method is None or (method.objective == "sft" and method.finetuning == "full"):
        return None
    return TRL_CONFIG_CLASSES.get(method.objective)


@method_rule(
    "trl-bf16-default",
    "warning",
    "lint",
    "A fp32 config (no fp16, bf16 absent or disabled) for a TRL trainer (--target hf-trainer).",
    "TRL's configs default bf16=True unless fp16=True (trl/trainer/base_config.py _BaseConfig.__post_init__): "
    "with no bf16 section accelerate's DeepSpeedPlugin.set_mixed_precision adds bf16.enabled=true, so the run "
    "trains in bf16; with bf16.enabled false the HF Trainer raises 'Please correct the following DeepSpeed "
    "config values that mismatch TrainingArguments values: - ds bf16.enabled=False vs hf "
    "bf16|bf16_full_eval=True' (HfTrainerDeepSpeedConfig.trainer_config_finalize) unless bf16=False is passed.",
)
def trl_bf16_default(ctx: Context) -> None:
    if ctx.target != "hf-trainer" or ctx.fp16_enabled is not False:
        return
    name = _trl_config_class(ctx)
    if name is None:
        return
    default = (
        f"TRL's {name} defaults to bf16=True unless fp16=True (trl/trainer/base_config.py _BaseConfig.__post_init__)"
    )
    if "bf16" not in ctx.config:
        _emit(
            ctx,
            "trl-bf16-default",
            "",
            f"no bf16 section: {default}, and accelerate's DeepSpeedPlugin.set_mixed_precision then adds "
            '"bf16": {"enabled": true} to this config, so the run trains in bf16, not fp32',
            f'pass bf16=False to {name} to train in fp32, or write "bf16": {{"enabled": "auto"}} and say bf16 there',
        )
        return
    raw = section(ctx.config.get("bf16")).get("enabled")
    if raw != "auto" and flag(raw) is False:
        _emit(
            ctx,
            "trl-bf16-default",
            "/bf16/enabled",
            f"bf16.enabled is false, but {default}: the HF Trainer refuses the mismatch ('Please correct the "
            "following DeepSpeed config values that mismatch TrainingArguments values: - ds bf16.enabled=False vs "
            "hf bf16|bf16_full_eval=True', HfTrainerDeepSpeedConfig.trainer_config_finalize)",
            f'pass bf16=False to {name}, or set bf16.enabled to "auto"',
            phase="engine",
        )
