"""Parallelism rules: pipeline, AutoTP, AutoEP and unmanaged gradient accumulation."""

from __future__ import annotations

from dsgen.validate.rules.context import Context, section, whole
from dsgen.validate.rules.registry import rule


def _pipeline(ctx: Context) -> bool:
    """A pipeline section means PipelineModule is used (unless it pins a single stage)."""
    block = ctx.config.get("pipeline")
    return isinstance(block, dict) and block.get("stages") != 1


def _overlap_comm(ctx: Context) -> bool | None:
    value = ctx.zero.get("overlap_comm")
    if isinstance(value, bool):
        return value
    return None if ctx.stage is None else ctx.stage == 3


@rule(
    "pipeline-zero-stage",
    "error",
    "engine",
    "Pipeline parallelism (a pipeline section) with ZeRO stage 2 or 3.",
    "PipelineEngine asserts 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'.",
)
def pipeline_zero_stage(ctx: Context) -> None:
    if _pipeline(ctx) and ctx.stage in (2, 3):
        ctx.emit(
            "pipeline-zero-stage",
            "/zero_optimization/stage",
            "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (this config has a pipeline section)",
            "use ZeRO stage 0 or 1 with pipeline parallelism, or remove the pipeline section",
        )


@rule(
    "pipeline-overlap-comm",
    "warning",
    "lint",
    "Pipeline parallelism with overlap_comm: true.",
    "Logs 'Pipeline parallelism does not support overlapped communication, will be disabled.'",
)
def pipeline_overlap_comm(ctx: Context) -> None:
    if _pipeline(ctx) and ctx.zero.get("overlap_comm") is True:
        ctx.emit(
            "pipeline-overlap-comm",
            "/zero_optimization/overlap_comm",
            "Pipeline parallelism does not support overlapped communication; DeepSpeed disables it",
            "remove overlap_comm",
        )


@rule(
    "managed-ga-conflict",
    "error",
    "engine",
    "managed_gradient_accumulation: false with overlap_comm below "
    "ZeRO-2, with pipeline parallelism, or with DeepCompile.",
    "deepspeed.initialize asserts 'managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO "
    "stage 2' (or '... is not supported with pipeline parallelism / DeepCompile').",
    since="0.19",
)
def managed_ga_conflict(ctx: Context) -> None:
    if ctx.config.get("managed_gradient_accumulation") is not False:
        return
    pointer = "/managed_gradient_accumulation"
    if ctx.stage is not None and ctx.stage < 2 and _overlap_comm(ctx):
        ctx.emit(
            "managed-ga-conflict",
            pointer,
            "managed_gradient_accumulation=False supports ZeRO overlap_comm only with ZeRO stage 2",
            "set zero_optimization.overlap_comm to false or use ZeRO stage 2",
        )
    if _pipeline(ctx):
        ctx.emit(
            "managed-ga-conflict",
            pointer,
            "managed_gradient_accumulation=False is not supported with pipeline parallelism",
            "remove managed_gradient_accumulation",
        )
    if section(ctx.config.get("compile")).get("deepcompile") is True:
        ctx.emit(
            "managed-ga-conflict",
            pointer,
            "managed_gradient_accumulation=False is not supported with DeepCompile",
            "remove managed_gradient_accumulation or disable compile.deepcompile",
        )


@rule(
    "tp-size-mismatch",
    "error",
    "engine",
    "tensor_parallel.tp.tp_size not 1 or autotp_size, or autotp_size not dividing --world-size.",
    "Engine start fails: 'tensor_parallel.tp.tp_size (x) does not match "
    "tensor_parallel.autotp_size (y)' / '{world} is not divisible by {tp}'.",
    since="0.16",
)
def tp_size_mismatch(ctx: Context) -> None:
    tp_section = section(ctx.config.get("tensor_parallel"))
    autotp = whole(tp_section.get("autotp_size"))
    if autotp is None or autotp <= 1:
        return
    inner = section(tp_section.get("tp", tp_section.get("tensor_parallel")))
    tp_size = whole(inner.get("tp_size", 1))
    if tp_size is not None and tp_size not in (1, autotp):
        key = "tp" if "tp" in tp_section else "tensor_parallel"
        ctx.emit(
            "tp-size-mismatch",
            f"/tensor_parallel/{key}/tp_size",
            f"tensor_parallel.tp.tp_size ({tp_size}) does not match tensor_parallel.autotp_size ({autotp}).",
            f"set tp_size to {autotp} or remove it",
        )
    if ctx.world_size is not None and ctx.world_size % autotp:
        ctx.emit(
            "tp-size-mismatch",
            "/tensor_parallel/autotp_size",
            f"{ctx.world_size} is not divisible by {autotp} (tensor_parallel.autotp_size)",
            "use an autotp_size that divides the world size (and the GPUs per node)",
        )


@rule(
    "autoep-conflict",
    "error",
    "engine",
    "AutoEP combined with AutoTP, or with ZeRO-3 plus quantized gradients "
    "or hpZ, or an autoep_size that does not divide --world-size.",
    "validate_autoep_config / _validate_zero3_moe_compatibility raise at engine start.",
    since="0.19",
)
def autoep_conflict(ctx: Context) -> None:
    ep = section(ctx.config.get("expert_parallel"))
    if ep.get("enabled") is not True:
        return
    pointer = "/expert_parallel/enabled"
    autotp = whole(ctx.get("tensor_parallel", "autotp_size"))
    if autotp is not None and autotp > 1:
        ctx.emit(
            "autoep-conflict",
            pointer,
            f"AutoEP cannot be combined with AutoTP (tensor_parallel.autotp_size {autotp})",
            "use one of expert_parallel or tensor_parallel",
        )
    if ctx.stage == 3:
        if ctx.zero.get("zero_quantized_gradients") is True:
            ctx.emit(
                "autoep-conflict",
                pointer,
                "AutoEP with ZeRO Stage 3 does not support zero_quantized_gradients yet.",
                "disable zero_quantized_gradients",
            )
        hpz = whole(ctx.zero.get("zero_hpz_partition_size"))
        if hpz is not None and hpz > 1:
            ctx.emit(
                "autoep-conflict",
                pointer,
                "AutoEP with ZeRO Stage 3 does not support hpZ (zero_hpz_partition_size > 1) yet.",
                "set zero_hpz_partition_size to 1",
            )
    size = whole(ep.get("autoep_size", 1))
    if ctx.world_size is not None and size is not None and size > 1 and ctx.world_size % size:
        ctx.emit(
            "autoep-conflict",
            "/expert_parallel/autoep_size",
            f"autoep_size {size} does not divide the world size {ctx.world_size}",
            "use a divisor of the world size (and of the expert count)",
        )
