"""Mixed-precision rules: fp16 vs bf16, loss scaling, master weights, dtype overrides."""

from __future__ import annotations

from dsgen.validate.rules.context import Context, lax_number, section, truthy
from dsgen.validate.rules.registry import rule
from dsgen.vocabulary import Phase

# DeepSpeed's DtypeEnum spellings -> canonical name.
DTYPE_NAMES = {
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
    "int8": "int8",
    "torch.int8": "int8",
}


@rule(
    "fp16-bf16-both",
    "error",
    "config",
    "fp16.enabled and bf16.enabled are both true.",
    "AssertionError: bfloat16 and fp16 modes cannot be simultaneously enabled.",
)
def fp16_bf16_both(ctx: Context) -> None:
    if ctx.fp16_enabled and ctx.bf16_enabled:
        ctx.emit(
            "fp16-bf16-both",
            f"/{ctx.bf16_key}/enabled",
            "bfloat16 and fp16 modes cannot be simultaneously enabled",
            "enable bf16 on Ampere or newer GPUs, fp16 on Volta/Turing; disable the other",
        )


@rule(
    "fp16-dynamic-loss-scale",
    "error",
    "config",
    "Dynamic fp16 loss scaling (loss_scale 0) with loss_scale_window or min_loss_scale <= 0.",
    "pydantic raises 'fp16.loss_scale_window must be > 0 when dynamic loss scaling is enabled' (0.19); "
    "older releases divide by zero during training.",
)
def fp16_dynamic_loss_scale(ctx: Context) -> None:
    fp16 = ctx.fp16
    if ctx.fp16_enabled is not True or lax_number(fp16.get("loss_scale", 0)) != 0:
        return
    phase: Phase = "config" if ctx.applies("0.19") else "engine"
    for key in ("loss_scale_window", "min_loss_scale"):
        value = lax_number(fp16.get(key))  # pydantic turns "0" into 0
        if value is not None and value <= 0:
            ctx.emit(
                "fp16-dynamic-loss-scale",
                f"/fp16/{key}",
                f"fp16.{key} must be > 0 when dynamic loss scaling is enabled (loss_scale=0)",
                f"use the default fp16.{key} ({1000 if key == 'loss_scale_window' else 1}) or set a static loss_scale",
                phase=phase,
            )


@rule(
    "master-weights-stage",
    "error",
    "config",
    "fp16/bf16 master weights and grads without ZeRO stage 1-3.",
    "AssertionError: Fp16_master_weights_and_grads is only supported with ZeRO Stage 1, 2, or 3.",
)
def master_weights_stage(ctx: Context) -> None:
    if ctx.stage != 0:
        return
    candidates = [("fp16", ctx.fp16, "fp16_master_weights_and_grads", "Fp16_master_weights_and_grads")]
    if ctx.applies("0.19"):
        candidates.append((ctx.bf16_key, ctx.bf16, "bf16_master_weights_and_grads", "Bf16_master_weights_and_grads"))
    for section_key, block, key, label in candidates:
        if block.get(key) is True:
            ctx.emit(
                "master-weights-stage",
                f"/{section_key}/{key}",
                f"{label} is only supported with ZeRO Stage 1, 2, or 3.",
                "set zero_optimization.stage to 1-3",
            )


@rule(
    "bf16-optimizer-states",
    "error",
    "config",
    "bf16_optimizer_states without ZeRO 1-3 or without bf16_master_weights_and_grads.",
    "AssertionError: bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3 / requires "
    "bf16_master_weights_and_grads to be enabled.",
    since="0.19",
)
def bf16_optimizer_states(ctx: Context) -> None:
    if ctx.bf16.get("bf16_optimizer_states") is not True:
        return
    pointer = f"/{ctx.bf16_key}/bf16_optimizer_states"
    if ctx.stage == 0:
        ctx.emit(
            "bf16-optimizer-states",
            pointer,
            "bf16_optimizer_states is only supported with ZeRO Stage 1, 2, or 3.",
            "set zero_optimization.stage to 1-3",
        )
    elif ctx.bf16.get("bf16_master_weights_and_grads") is not True:
        ctx.emit(
            "bf16-optimizer-states",
            pointer,
            "bf16_optimizer_states requires bf16_master_weights_and_grads to be enabled.",
            f"set {ctx.bf16_key}.bf16_master_weights_and_grads to true",
        )


@rule(
    "master-weights-offload",
    "error",
    "engine",
    "16-bit master weights without CPU optimizer offload and "
    "DeepSpeedCPUAdam, or fp16 and bf16 master weights together.",
    "deepspeed.initialize raises 'Master weights feature requires ZeRO-2 Offload with DeepSpeedCPUAdam' "
    "(or '... are mutually exclusive').",
)
def master_weights_offload(ctx: Context) -> None:
    fp16_master = ctx.fp16.get("fp16_master_weights_and_grads") is True
    bf16_master = ctx.applies("0.19") and ctx.bf16.get("bf16_master_weights_and_grads") is True
    if not (fp16_master or bf16_master) or ctx.stage in (0, None):
        return
    if fp16_master and bf16_master:
        ctx.emit(
            "master-weights-offload",
            f"/{ctx.bf16_key}/bf16_master_weights_and_grads",
            "fp16_master_weights_and_gradients and bf16_master_weights_and_gradients are mutually exclusive.",
            "keep the one matching the enabled precision",
        )
        return
    device = ctx.offload_device("offload_optimizer")
    if bf16_master and ctx.bf16.get("bf16_optimizer_states") is True and device == "none":
        return  # bf16 optimizer states on the GPU need no CPU optimizer
    pointer = "/fp16/fp16_master_weights_and_grads" if fp16_master else f"/{ctx.bf16_key}/bf16_master_weights_and_grads"
    cpu_adam = ctx.optimizer_type in ("adam", "adamw")  # with offload DeepSpeed builds DeepSpeedCPUAdam
    if device == "none" or (ctx.has_config_optimizer and not cpu_adam):
        label = "ZeRO-3" if ctx.stage == 3 else f"ZeRO-{ctx.stage if ctx.stage == 1 else 2}"
        ctx.emit(
            "master-weights-offload",
            pointer,
            f"Master weights feature requires {label} Offload with DeepSpeedCPUAdam (offload_optimizer.device is "
            f"{device}, optimizer type is {ctx.optimizer.get('type')})",
            'set zero_optimization.offload_optimizer {"device": "cpu"} and optimizer type Adam or AdamW',
        )


def _dtype(value: object) -> str | None:
    return DTYPE_NAMES.get(value) if isinstance(value, str) else None


@rule(
    "param-dtype-mismatch",
    "error",
    "engine",
    "data_types.param_dtype differs from the enabled fp16/bf16 mode.",
    "deepspeed.initialize raises 'data_types.param_dtype=... conflicts with the enabled precision mode'.",
    since="0.19",
)
def param_dtype_mismatch(ctx: Context) -> None:
    wanted = _dtype(section(ctx.config.get("data_types")).get("param_dtype"))
    if wanted is None or ctx.model_dtype is None or wanted == ctx.model_dtype:
        return
    ctx.emit(
        "param-dtype-mismatch",
        "/data_types/param_dtype",
        f"data_types.param_dtype is {wanted} but the enabled precision mode is {ctx.model_dtype}",
        "set the matching fp16/bf16 enabled flag or remove data_types.param_dtype",
    )


@rule(
    "grad-accum-dtype",
    "error",
    "engine",
    "data_types.grad_accum_dtype differs from the model dtype without ZeRO.",
    "deepspeed.initialize raises NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype.",
)
def grad_accum_dtype(ctx: Context) -> None:
    wanted = _dtype(section(ctx.config.get("data_types")).get("grad_accum_dtype"))
    if wanted is None or ctx.model_dtype is None or ctx.stage != 0 or wanted == ctx.model_dtype:
        return
    ctx.emit(
        "grad-accum-dtype",
        "/data_types/grad_accum_dtype",
        f"unsupported mix of model dtype {ctx.model_dtype} and grad_accum_dtype {wanted} without ZeRO",
        "use ZeRO stage 1 or higher, or drop data_types.grad_accum_dtype",
    )


@rule(
    "autocast-quantized-weights",
    "error",
    "engine",
    "torch_autocast together with ZeRO++ quantized weights.",
    "deepspeed.initialize raises 'Cannot enable both torch autocast and zero quantized weights'.",
    since="0.19",
)
def autocast_quantized_weights(ctx: Context) -> None:
    autocast = section(ctx.config.get("torch_autocast"))
    if truthy(autocast.get("enabled")) and ctx.zero.get("zero_quantized_weights") is True:
        ctx.emit(
            "autocast-quantized-weights",
            "/torch_autocast/enabled",
            "Cannot enable both torch autocast and zero quantized weights",
            "disable torch_autocast or zero_optimization.zero_quantized_weights",
        )


@rule(
    "autocast-dtype-missing",
    "warning",
    "lint",
    "torch_autocast enabled without a dtype.",
    "DeepSpeed has no default autocast dtype in code (the docs claim bfloat16).",
    since="0.19",
)
def autocast_dtype_missing(ctx: Context) -> None:
    autocast = section(ctx.config.get("torch_autocast"))
    if truthy(autocast.get("enabled")) and "dtype" not in autocast:
        ctx.emit(
            "autocast-dtype-missing",
            "/torch_autocast",
            "torch_autocast is enabled without a dtype",
            'set torch_autocast.dtype, e.g. "bfloat16"',
        )
