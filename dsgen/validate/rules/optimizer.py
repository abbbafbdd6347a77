"""Optimizer and scheduler rules (all enforced by DeepSpeed only once the engine starts)."""

from __future__ import annotations

from dsgen.validate.rules.context import Context, number, section
from dsgen.validate.rules.registry import rule
from dsgen.validate.schema_findings import suggest

# torch.optim classes DeepSpeed can instantiate by name (torch 2.13); names are case-sensitive.
TORCH_OPTIMIZERS = frozenset(
    {
        "ASGD",
        "Adadelta",
        "Adafactor",
        "Adagrad",
        "Adam",
        "AdamW",
        "Adamax",
        "LBFGS",
        "Muon",
        "NAdam",
        "RAdam",
        "RMSprop",
        "Rprop",
        "SGD",
        "SparseAdam",
    }
)
DS_SCHEDULERS = frozenset({"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"})
TORCH_SCHEDULERS = frozenset(
    {
        "ChainedScheduler",
        "ConstantLR",
        "CosineAnnealingLR",
        "CosineAnnealingWarmRestarts",
        "CyclicLR",
        "ExponentialLR",
        "LambdaLR",
        "LinearLR",
        "MultiStepLR",
        "MultiplicativeLR",
        "OneCycleLR",
        "PolynomialLR",
        "ReduceLROnPlateau",
        "SequentialLR",
        "StepLR",
    }
)
# DeepSpeed optimizer names whose classes are in ZERO_SUPPORTED_OPTIMIZERS.
ZERO_SUPPORTED = frozenset({"adam", "adamw", "adagrad", "lion", "muon"})
REMOVED_1BIT = {"onebitadam": "OneBitAdam", "zerooneadam": "ZeroOneAdam", "onebitlamb": "OneBitLamb"}
SCHEDULER_REQUIRED = {
    "OneCycle": ("cycle_min_lr", "cycle_max_lr"),
    "WarmupDecayLR": ("total_num_steps",),
    "WarmupCosineLR": ("total_num_steps",),
}


def _known(ctx: Context, name: str) -> bool:
    return name.lower() in ctx.profile.deepspeed_optimizers or name in TORCH_OPTIMIZERS


@rule(
    "optimizer-unknown",
    "error",
    "engine",
    "optimizer.type is neither a DeepSpeed optimizer nor a "
    "torch.optim class (includes the 1-bit optimizers removed in 0.19.8).",
    "deepspeed.initialize asserts '<type> is not a supported DeepSpeed Optimizer'.",
)
def optimizer_unknown(ctx: Context) -> None:
    name = ctx.optimizer.get("type")
    if not isinstance(name, str) or _known(ctx, name):
        return
    if name.lower() in REMOVED_1BIT and not ctx.profile.removed_keys_are_errors:
        return
    if name.lower() in REMOVED_1BIT:
        message = (
            f"{name} is not a supported DeepSpeed Optimizer: the 1-bit optimizers were removed in DeepSpeed "
            f"{ctx.profile.release}"
        )
        hint = "use Adam/AdamW (optionally with ZeRO++ zero_quantized_gradients for compressed communication)"
    else:
        message = f"{name} is not a supported DeepSpeed Optimizer"
        guess = suggest(
            name,
            sorted(
                TORCH_OPTIMIZERS | {"Adam", "AdamW", "Adagrad", "Lamb", "Lion", "Muon", "MuAdam", "MuAdamW", "MuSGD"}
            ),
        )
        hint = f"did you mean {guess}?" if guess else "use a DeepSpeed optimizer or a torch.optim class name"
    ctx.emit("optimizer-unknown", "/optimizer/type", message, hint)


@rule(
    "untested-optimizer",
    "error",
    "engine",
    "ZeRO with an optimizer outside DeepSpeed's ZeRO-tested list "
    "(Lamb, MuAdam, SGD, ...) without zero_allow_untested_optimizer: true.",
    "deepspeed.initialize asserts 'You are using an untested ZeRO Optimizer. Please add "
    '<"zero_allow_untested_optimizer": true> in the configuration file to use it.\'',
)
def untested_optimizer(ctx: Context) -> None:
    name = ctx.optimizer.get("type")
    if not isinstance(name, str) or not _known(ctx, name) or not ctx.stage:
        return
    if name.lower() in ZERO_SUPPORTED or ctx.config.get("zero_allow_untested_optimizer") is True:
        return
    ctx.emit(
        "untested-optimizer",
        "/optimizer/type",
        f"You are using an untested ZeRO Optimizer ({name} with ZeRO stage {ctx.stage})",
        'add "zero_allow_untested_optimizer": true, or use Adam/AdamW/Adagrad/Lion',
    )


@rule(
    "lamb-static-loss-scale",
    "error",
    "engine",
    "Lamb with a static fp16 loss scale.",
    "deepspeed.initialize asserts 'DeepSpeed lamb optimizer requires dynamic loss scaling'.",
)
def lamb_static_loss_scale(ctx: Context) -> None:
    scale = number(ctx.fp16.get("loss_scale", 0))
    if ctx.optimizer_type == "lamb" and scale not in (None, 0):
        ctx.emit(
            "lamb-static-loss-scale",
            "/fp16/loss_scale",
            f"DeepSpeed lamb optimizer requires dynamic loss scaling (fp16.loss_scale is {scale})",
            "set fp16.loss_scale to 0",
        )


@rule(
    "max-grad-norm",
    "error",
    "engine",
    "optimizer.params.max_grad_norm.",
    "DeepSpeedConfig warns; deepspeed.initialize raises ValueError: 'max_grad_norm' is not supported as an "
    "optimizer parameter, please switch to using the deepspeed parameter 'gradient_clipping'.",
)
def max_grad_norm(ctx: Context) -> None:
    params = section(ctx.optimizer.get("params"))
    if ctx.has_config_optimizer and "max_grad_norm" in params:
        ctx.emit(
            "max-grad-norm",
            "/optimizer/params/max_grad_norm",
            "'max_grad_norm' is not supported as an optimizer parameter",
            f"remove it and set top-level gradient_clipping (e.g. {params['max_grad_norm']})",
        )


@rule(
    "offload-client-optimizer",
    "warning",
    "engine",
    "Optimizer offload with no optimizer in the config (so the training code's optimizer is used) and "
    "zero_force_ds_cpu_optimizer not false, at any ZeRO stage (0 too); only for --target deepspeed.",
    "deepspeed.initialize raises ZeRORuntimeException 'You are using ZeRO-Offload with a client provided "
    "optimizer ...' (runtime/engine.py, _configure_optimizer) unless the client optimizer is "
    "DeepSpeedCPUAdam/DeepSpeedCPULion. Under the HF Trainer and accelerate it runs: accelerate replaces the "
    "torch optimizer with DeepSpeed's CPU optimizer (accelerator.py _prepare_deepspeed, "
    "utils/deepspeed.py map_pytorch_optim_to_deepspeed).",
)
def offload_client_optimizer(ctx: Context) -> None:
    if ctx.has_config_optimizer or ctx.target in ("hf-trainer", "accelerate"):
        return  # at any ZeRO stage, stage 0 included: engine.zero_use_cpu_optimizer() only reads the device
    device = ctx.offload_device("offload_optimizer")
    if device not in ("cpu", "nvme") or ctx.config.get("zero_force_ds_cpu_optimizer") is False:
        return
    # Plain DeepSpeed code may pass DeepSpeedCPUAdam, which runs, or a torch optimizer, which fails:
    # the config alone cannot tell, so a warning.
    ctx.emit(
        "offload-client-optimizer",
        "/zero_optimization/offload_optimizer",
        f"optimizer offload to {device} without an optimizer section: the training code must pass "
        "DeepSpeedCPUAdam/DeepSpeedCPULion; DeepSpeed rejects any other client optimizer while "
        "zero_force_ds_cpu_optimizer is true",
        'add an "optimizer" section (e.g. AdamW), or set "zero_force_ds_cpu_optimizer": false',
    )


@rule(
    "offload-unsupported-optimizer",
    "error",
    "engine",
    "Optimizer offload with Lamb, which has no CPU implementation.",
    "DeepSpeed builds FusedLamb (a GPU kernel) whatever the offload device, so the optimizer "
    "step fails on the offloaded CPU state.",
)
def offload_unsupported_optimizer(ctx: Context) -> None:
    if ctx.optimizer_type == "lamb" and ctx.stage and ctx.offload_device("offload_optimizer") in ("cpu", "nvme"):
        ctx.emit(
            "offload-unsupported-optimizer",
            "/optimizer/type",
            "Lamb has no CPU implementation, so it cannot run with zero_optimization.offload_optimizer",
            "use Adam/AdamW (DeepSpeedCPUAdam) with offload, or turn offload off",
        )


@rule(
    "muon-reduce-scatter",
    "error",
    "engine",
    "Muon with ZeRO-3 and reduce_scatter enabled.",
    "ValueError: Muon and reduce scatter cannot be used together.",
)
def muon_reduce_scatter(ctx: Context) -> None:
    if ctx.optimizer_type == "muon" and ctx.stage == 3 and ctx.zero.get("reduce_scatter", True) is True:
        ctx.emit(
            "muon-reduce-scatter",
            "/optimizer/type",
            "Muon and reduce scatter cannot be used together (ZeRO-3 reduces with reduce_scatter by default)",
            "set zero_optimization.reduce_scatter to false",
        )


@rule(
    "scheduler-unknown",
    "error",
    "engine",
    "scheduler.type is neither a DeepSpeed nor a torch.optim.lr_scheduler class.",
    "deepspeed.initialize asserts 'DeepSpeed does not recognize LR scheduler <type>'.",
)
def scheduler_unknown(ctx: Context) -> None:
    name = section(ctx.config.get("scheduler")).get("type")
    if not isinstance(name, str) or name in DS_SCHEDULERS or name in TORCH_SCHEDULERS:
        return
    guess = suggest(name, sorted(DS_SCHEDULERS | TORCH_SCHEDULERS))
    ctx.emit(
        "scheduler-unknown",
        "/scheduler/type",
        f"DeepSpeed does not recognize LR scheduler {name}",
        f"did you mean {guess}?" if guess else "use WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest",
    )


@rule(
    "scheduler-missing-param",
    "error",
    "engine",
    "A DeepSpeed scheduler without a parameter it requires "
    "(total_num_steps for WarmupDecayLR/WarmupCosineLR, cycle_min_lr/cycle_max_lr for OneCycle).",
    "The scheduler constructor raises TypeError (missing required argument) at engine start.",
)
def scheduler_missing_param(ctx: Context) -> None:
    scheduler = section(ctx.config.get("scheduler"))
    kind = scheduler.get("type")
    required = SCHEDULER_REQUIRED.get(kind) if isinstance(kind, str) else None  # a non-string is a schema error
    if not required:
        return
    params = scheduler.get("params")
    params = params if isinstance(params, dict) else {}
    for key in required:
        if key not in params:
            ctx.emit(
                "scheduler-missing-param",
                "/scheduler/params" if "params" in scheduler else "/scheduler",
                f"{scheduler['type']} requires scheduler.params.{key}",
                f"set scheduler.params.{key}",
            )
