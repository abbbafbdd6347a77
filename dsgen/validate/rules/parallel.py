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
    if ctx.deepcompile:
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


def _autoep_folding_conflicts(ctx: Context, ep: dict, autotp: int) -> list[tuple[str, str, str]]:
    """What validate_autoep_config / validate_folding_global reject once AutoTP folds into AutoEP."""
    problems: list[tuple[str, str, str]] = []
    ep_size = whole(ep.get("autoep_size", 1))
    if ep_size == 1:
        problems.append(
            (
                "/expert_parallel/autoep_size" if "autoep_size" in ep else "/expert_parallel",
                "AutoEP+AutoTP folding requires expert_parallel.autoep_size > 1 "
                f"(tensor_parallel.autotp_size is {autotp})",
                "set expert_parallel.autoep_size > 1, or tensor_parallel.autotp_size to 1",
            )
        )
    if ctx.deepcompile:
        problems.append(
            (
                "/compile/deepcompile",
                "DeepCompile with AutoEP+AutoTP folding is not supported",
                "disable compile.deepcompile or use tensor_parallel.autotp_size 1",
            )
        )
    if _pipeline(ctx):
        problems.append(
            (
                "/pipeline",
                "AutoEP+AutoTP folding currently supports pp_size=1 only (this config has a pipeline section)",
                "remove pipeline parallelism or use tensor_parallel.autotp_size 1",
            )
        )
    if ctx.config.get("use_data_before_expert_parallelism") is True:
        problems.append(
            (
                "/use_data_before_expert_parallelism",
                "use_data_before_expert_parallelism is not supported with AutoEP+AutoTP folding",
                "remove use_data_before_expert_parallelism",
            )
        )
    for which, legacy in (("offload_optimizer", "cpu_offload"), ("offload_param", "cpu_offload_param")):
        # DeepSpeed tests zero_config.<which> is not None: any block counts, even device "none".
        block = ctx.pydantic_value(ctx.zero.get(which), None, f"/zero_optimization/{which}")
        if block is not None or ctx.zero.get(legacy) is True:
            problems.append(
                (
                    ctx.pointer("zero_optimization", which if which in ctx.zero else legacy),
                    "ZeRO optimizer/parameter offload with AutoEP+AutoTP folding is not validated yet",
                    f"remove zero_optimization.{which}",
                )
            )
    if ep.get("async_split_plan") is True and ep_size is not None and ep_size > 1:
        problems.append(
            (
                "/expert_parallel/async_split_plan",
                "expert_parallel.async_split_plan does not support AutoEP+AutoTP folding yet",
                "set tensor_parallel.autotp_size to 1 or disable async_split_plan",
            )
        )
    sp = whole(ctx.config.get("sequence_parallel_size"))
    if sp is not None and sp > 1:
        # module_inject/auto_ep_folding.py validate_folding_global
        problems.append(
            (
                "/sequence_parallel_size",
                "tensor_parallel.autotp_size and Ulysses sequence parallelism are mutually exclusive for AutoEP "
                f"folding (autotp_size={autotp}, sp_size={sp})",
                "use sequence_parallel_size 1 with AutoEP+AutoTP, or tensor_parallel.autotp_size 1",
            )
        )
    if ep.get("combine_impl") == "fused_weighted_sum":
        problems.append(
            (
                "/expert_parallel/combine_impl",
                'combine_impl="fused_weighted_sum" does not support folded tensor parallelism '
                f"(tensor_parallel.autotp_size={autotp})",
                "leave combine_impl unset, or set tensor_parallel.autotp_size to 1",
            )
        )
    return problems


@rule(
    "autoep-conflict",
    "error",
    "engine",
    "AutoEP with AutoTP (autotp_size > 1) and autoep_size 1, DeepCompile, a pipeline, offload, "
    "use_data_before_expert_parallelism, async_split_plan, fused_weighted_sum or sequence_parallel_size > 1; "
    "AutoEP with ZeRO-3 plus quantized gradients, hpZ or sequence_parallel_size > 1; or an autoep_size that "
    "does not divide --world-size.",
    "validate_autoep_config / validate_folding_global / _validate_zero3_moe_compatibility raise at engine start. "
    "AutoEP+AutoTP folding itself is supported (autoep_size > 1). The Ulysses checks use the mpu's SP size, "
    "which the config's sequence_parallel_size states.",
    since="0.19",
)
def autoep_conflict(ctx: Context) -> None:
    ep = section(ctx.config.get("expert_parallel"))
    if ep.get("enabled") is not True:
        return
    pointer = "/expert_parallel/enabled"
    autotp = whole(ctx.get("tensor_parallel", "autotp_size"))
    if autotp is not None and autotp > 1:
        for where, message, hint in _autoep_folding_conflicts(ctx, ep, autotp):
            ctx.emit("autoep-conflict", where, message, hint)
    if ctx.stage == 3:
        if ctx.zero.get("zero_quantized_gradients") is True:
            ctx.emit(
                "autoep-conflict",
                pointer,
                "AutoEP with ZeRO Stage 3 does not support zero_quantized_gradients yet.",
                "disable zero_quantized_gradients",
            )
        sp = whole(ctx.config.get("sequence_parallel_size"))
        if sp is not None and sp > 1:
            # runtime/engine.py DeepSpeedEngine._validate_zero3_moe_compatibility
            ctx.emit(
                "autoep-conflict",
                "/sequence_parallel_size",
                f"AutoEP with ZeRO Stage 3 does not support sequence parallelism yet (sequence_parallel_size={sp}).",
                "use ZeRO stage 1 or 2 with AutoEP and Ulysses SP, or sequence_parallel_size 1",
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
