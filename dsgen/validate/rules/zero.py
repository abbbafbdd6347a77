"""ZeRO rules: offload placement, NVMe paths, stage-specific keys and ZeRO communication knobs."""

from __future__ import annotations

from dsgen.validate.rules.context import ZERO_ALIASES, Context, flag, number, section, whole
from dsgen.validate.rules.registry import rule

#: both spellings of the 16-bit gather on save (runtime/zero/config.py: the field and its alias)
SAVE_GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save")


def _deepcompile(ctx: Context) -> bool:
    return ctx.deepcompile


def _zenflow_set(ctx: Context) -> bool:
    """DeepSpeed's zero_config.zenflow is not None (pydantic drops "auto", leaving None)."""
    return ctx.pydantic_value(ctx.zero.get("zenflow"), None, "/zero_optimization/zenflow") is not None


def deepcompile_offloads_parameters(ctx: Context) -> bool:
    """Whether DeepCompile takes the config's parameter offload: ``DeepSpeedEngine.get_deepcompile_backend``
    (DeepSpeed 0.19.8 ``runtime/engine.py``) sets ``compile_config.offload_parameters`` only when
    ``zero_optimization`` holds both an ``offload_optimizer`` and an ``offload_param`` block (the
    legacy ``cpu_offload*`` flags do not count) and both devices are ``cpu``; at stage 0 it falls back
    to the torch compiler first."""
    return (
        _deepcompile(ctx)
        and ctx.stage in (1, 2)
        and "offload_optimizer" in ctx.zero
        and "offload_param" in ctx.zero
        and ctx.offload_device("offload_param") == "cpu"
        and ctx.offload_device("offload_optimizer") == "cpu"
    )


@rule(
    "offload-param-below-stage3",
    "warning",
    "lint",
    "zero_optimization.offload_param with ZeRO stage 0-2, unless DeepCompile takes it (stage 1-2 with "
    "offload_param and offload_optimizer both on the cpu).",
    "Not checked: parameter offload is only implemented by ZeRO-3, so the block is silently ignored. Under "
    "DeepCompile, DeepSpeedEngine.get_deepcompile_backend turns it into compile_config.offload_parameters only "
    "when both offloads are on the cpu; otherwise it is ignored as well.",
)
def offload_param_below_stage3(ctx: Context) -> None:
    device = ctx.offload_device("offload_param")
    if ctx.stage is None or ctx.stage == 3 or device not in ("cpu", "nvme"):
        return
    if deepcompile_offloads_parameters(ctx):
        return
    key = "offload_param" if "offload_param" in ctx.zero else "cpu_offload_param"
    if _deepcompile(ctx) and ctx.stage >= 1:
        ctx.emit(
            "offload-param-below-stage3",
            ctx.pointer("zero_optimization", key),
            f"parameter offload to {device} has no effect with ZeRO stage {ctx.stage} under DeepCompile: DeepSpeed "
            "hands it to DeepCompile only when offload_param and offload_optimizer are both on the cpu",
            "put offload_param and offload_optimizer both on the cpu, use zero_optimization.stage 3, "
            "or remove offload_param",
        )
        return
    ctx.emit(
        "offload-param-below-stage3",
        ctx.pointer("zero_optimization", key),
        f"parameter offload to {device} has no effect with ZeRO stage {ctx.stage}: only stage 3 offloads parameters",
        "use zero_optimization.stage 3, or remove offload_param",
    )


@rule(
    "offload-optimizer-without-zero",
    "warning",
    "lint",
    "zero_optimization.offload_optimizer with ZeRO disabled (stage 0).",
    "Nothing is offloaded, but the device is not ignored: engine.zero_use_cpu_optimizer() still builds the "
    "CPU optimizer (DeepSpeedCPUAdam/CPUAdagrad/CPULion) for a config Adam/Adagrad/Lion while the parameters "
    "stay on the accelerator, so its step asserts 'CPUAdam param is on cuda:0 and must be 'cpu''; a client "
    "optimizer raises ZeRORuntimeException (see offload-client-optimizer).",
)
def offload_optimizer_without_zero(ctx: Context) -> None:
    device = ctx.offload_device("offload_optimizer")
    if ctx.stage != 0 or device not in ("cpu", "nvme"):
        return
    key = "offload_optimizer" if "offload_optimizer" in ctx.zero else "cpu_offload"
    ctx.emit(
        "offload-optimizer-without-zero",
        ctx.pointer("zero_optimization", key),
        f"optimizer offload to {device} does not work with ZeRO disabled (stage 0): nothing is offloaded, but "
        "DeepSpeed still picks its CPU optimizer, which needs the parameters on the CPU",
        "use ZeRO stage 1-3, or remove offload_optimizer",
    )


@rule(
    "nvme-without-path",
    "error",
    "engine",
    "Offload device nvme without nvme_path, with ZeRO stage 3.",
    "Accepted by DeepSpeedConfig; ZeRO-3 then fails in os.path.join(None, ...) (TypeError) and zero.Init "
    "raises 'nvme_path in DeepSpeed Config cannot be None'. ZeRO-1/2 never read nvme_path (they run any "
    "offload device as CPU offload, see nvme-offload-below-stage3).",
)
def nvme_without_path(ctx: Context) -> None:
    if ctx.stage != 3:
        return  # only ZeRO-3 swaps to NVMe; below it the device means CPU offload or nothing
    for which in ("offload_param", "offload_optimizer"):
        if ctx.offload_device(which) != "nvme":
            continue
        block = section(ctx.zero.get(which))
        path = ctx.pydantic_value(block.get("nvme_path"), None, f"/zero_optimization/{which}/nvme_path")
        if not (isinstance(path, str) and path.strip()):
            ctx.emit(
                "nvme-without-path",
                ctx.pointer("zero_optimization", which, "device"),
                f"zero_optimization.{which}.device is nvme but nvme_path is not set",
                f'set zero_optimization.{which}.nvme_path to a directory on a local NVMe drive, e.g. "/local_nvme"',
            )


@rule(
    "nvme-offload-below-stage3",
    "warning",
    "lint",
    "offload_optimizer.device nvme with ZeRO stage 1 or 2.",
    "ZeRO-1/2 treat any offload device as CPU offload; NVMe swapping is only implemented by ZeRO-3.",
)
def nvme_offload_below_stage3(ctx: Context) -> None:
    if ctx.stage in (1, 2) and ctx.offload_device("offload_optimizer") == "nvme":
        ctx.emit(
            "nvme-offload-below-stage3",
            "/zero_optimization/offload_optimizer/device",
            f"ZeRO stage {ctx.stage} offloads optimizer state to CPU memory, not NVMe",
            'use "device": "cpu" (same behaviour) or ZeRO stage 3 for NVMe',
        )


@rule(
    "stage3-key-below-stage3",
    "warning",
    "lint",
    "ZeRO-3-only settings (stage3_* and their alternate spellings) with stage 0-2.",
    "Silently ignored below stage 3.",
)
def stage3_key_below_stage3(ctx: Context) -> None:
    if ctx.stage is None or ctx.stage == 3:
        return
    names = [key for key in ctx.zero if key in ZERO_ALIASES or key in ZERO_ALIASES.values()]
    autotp = whole(ctx.get("tensor_parallel", "autotp_size"))
    if autotp is not None and autotp > 1:
        # under AutoTP the gather on save is read at every stage: Accelerate's get_state_dict (the HF
        # Trainer's save_model) consolidates the TP shards only when it is true (accelerator.py)
        names = [key for key in names if key not in SAVE_GATHER_KEYS]
    if names:
        ctx.emit(
            "stage3-key-below-stage3",
            ctx.pointer("zero_optimization", names[0]),
            f"{', '.join(names)} apply only to ZeRO stage 3; this config uses stage {ctx.stage}",
            "remove them, or set zero_optimization.stage to 3",
        )


@rule(
    "partial-offload",
    "error",
    "config",
    "offload_optimizer.ratio < 1 without ZeRO-3, or with an optimizer other than Adam/AdamW.",
    "Assertion failed, Partial offloading only supported for ZeRO Stage 3 "
    "(config time); 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam' at engine start.",
)
def partial_offload(ctx: Context) -> None:
    block = ctx.zero.get("offload_optimizer")
    ratio = number(section(block).get("ratio", 1.0))
    if not isinstance(block, dict) or ratio is None or ratio >= 1.0 or ctx.stage is None:
        return
    pointer = "/zero_optimization/offload_optimizer/ratio"
    if ctx.stage != 3:
        ctx.emit(
            "partial-offload",
            pointer,
            "Partial offloading only supported for ZeRO Stage 3 "
            f"(offload_optimizer.ratio is {ratio}, stage is {ctx.stage})",
            "use stage 3 or ratio 1.0",
        )
    elif ctx.has_config_optimizer and ctx.optimizer_type not in ("adam", "adamw"):
        ctx.emit(
            "partial-offload",
            pointer,
            "Hybrid Optimizer Only Supports DeepSpeedCPUAdam (partial offload "
            f"with optimizer type {ctx.optimizer.get('type')})",
            "use optimizer type Adam or AdamW",
            phase="engine",
        )


@rule(
    "compute-grad-norm",
    "error",
    "config",
    "compute_grad_norm: false outside ZeRO 1/2, or with gradient clipping, ZenFlow or optimizer offload.",
    "compute_grad_norm=false is supported only with ZeRO Stage 1 or 2 (config time); the other "
    "combinations raise at engine start.",
    since="0.19",
)
def compute_grad_norm(ctx: Context) -> None:
    if ctx.zero.get("compute_grad_norm") is not False or ctx.stage is None:
        return
    pointer = "/zero_optimization/compute_grad_norm"
    if ctx.stage not in (1, 2):
        ctx.emit(
            "compute-grad-norm",
            pointer,
            "compute_grad_norm=false is supported only with ZeRO Stage 1 or 2",
            "remove compute_grad_norm or use ZeRO stage 1/2",
        )
        return
    clipping = ctx.config.get("gradient_clipping", 1.0)
    problems = []
    if number(clipping) is not None and clipping != 0:
        problems.append(("requires gradient_clipping=0", "set gradient_clipping to 0"))
    if _zenflow_set(ctx):
        problems.append(("does not support ZenFlow", "remove zenflow"))
    if ctx.offload_device("offload_optimizer") in ("cpu", "nvme"):
        problems.append(("does not support optimizer offload", "remove offload_optimizer"))
    grad_accum = section(ctx.config.get("data_types")).get("grad_accum_dtype")
    if (
        ctx.stage == 1
        and ctx.model_dtype == "bf16"
        and grad_accum in ("fp32", "float32", "float", "torch.float32")
        and ctx.offload_device("offload_optimizer") != "cpu"
    ):
        problems.append(
            (
                "does not support ZeRO Stage 1 with BF16 parameters and FP32 gradient accumulation",
                "use ZeRO stage 2 or drop data_types.grad_accum_dtype",
            )
        )
    for text, hint in problems:
        ctx.emit(
            "compute-grad-norm", pointer, f"zero_optimization.compute_grad_norm=false {text}", hint, phase="engine"
        )


def _reduce_scatter_applies(ctx: Context) -> bool:
    """ZeRO-2 (with op mean) and ZeRO-3 with reduce_scatter (the default) forbid pre-scaling."""
    if ctx.zero.get("reduce_scatter", True) is not True:
        return False
    op = ctx.config.get("gradient_allreduce_op", "mean")
    if ctx.stage == 2:
        return not (isinstance(op, str) and op.lower() == "sum")
    return ctx.stage == 3


@rule(
    "prescale-gradients-zero",
    "error",
    "engine",
    "prescale_gradients: true with ZeRO 2/3 reduce-scatter.",
    "Accepted by DeepSpeedConfig; the ZeRO optimizer asserts 'pre-scale gradients is not yet supported with "
    "ZeRO-2/3 with reduce scatter enabled'.",
)
def prescale_gradients_zero(ctx: Context) -> None:
    if ctx.config.get("prescale_gradients") is True and _reduce_scatter_applies(ctx):
        ctx.emit(
            "prescale-gradients-zero",
            "/prescale_gradients",
            f"pre-scale gradients is not yet supported with ZeRO-{ctx.stage} with reduce scatter enabled",
            "set prescale_gradients to false (or zero_optimization.reduce_scatter to false)",
        )


@rule(
    "predivide-factor-zero",
    "error",
    "engine",
    "gradient_predivide_factor != 1.0 with ZeRO 2/3 reduce-scatter.",
    "The ZeRO optimizer asserts 'gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2/3 with "
    "reduce scatter enabled'.",
)
def predivide_factor_zero(ctx: Context) -> None:
    factor = number(ctx.config.get("gradient_predivide_factor"))
    if factor is not None and factor != 1.0 and _reduce_scatter_applies(ctx):
        ctx.emit(
            "predivide-factor-zero",
            "/gradient_predivide_factor",
            f"gradient_predivide_factor != 1.0 is not yet supported with ZeRO-{ctx.stage} with reduce scatter enabled",
            "remove gradient_predivide_factor",
        )


@rule(
    "allgather-bucket-odd",
    "error",
    "engine",
    "Odd allgather_bucket_size with ZeRO 1/2.",
    "The ZeRO-1/2 optimizer asserts 'allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2'.",
)
def allgather_bucket_odd(ctx: Context) -> None:
    size = whole(ctx.zero.get("allgather_bucket_size"))
    if ctx.stage in (1, 2) and size is not None and size % 2:
        ctx.emit(
            "allgather-bucket-odd",
            "/zero_optimization/allgather_bucket_size",
            f"allgather_bucket_size must be a multiple of 2 (it is {size})",
            f"use {size + 1}",
        )


@rule(
    "legacy-stage1",
    "error",
    "engine",
    "zero_optimization.legacy_stage1: true.",
    "deepspeed.initialize raises 'The deprecated version of ZeRO Stage 1 is not supported in deepspeed >= 0.5.9'.",
)
def legacy_stage1(ctx: Context) -> None:
    if ctx.zero.get("legacy_stage1") is True:
        ctx.emit(
            "legacy-stage1",
            "/zero_optimization/legacy_stage1",
            "The deprecated version of ZeRO Stage 1 is not supported in deepspeed >= 0.5.9",
            "remove legacy_stage1",
        )


@rule(
    "zenflow-offload",
    "error",
    "engine",
    "ZenFlow without CPU optimizer offload, or ZenFlow offload without overlap_comm.",
    "ZenFlow raises 'Zenflow must be used with cpu offload' / 'offload selective optimizer "
    "should be used with overlap_comm'.",
    since="0.19",
)
def zenflow_offload(ctx: Context) -> None:
    zenflow = ctx.zero.get("zenflow")
    if not isinstance(zenflow, dict):
        return
    if ctx.stage in (1, 2) and ctx.offload_device("offload_optimizer") == "none":
        ctx.emit(
            "zenflow-offload",
            "/zero_optimization/zenflow",
            "Zenflow must be used with cpu offload",
            'set zero_optimization.offload_optimizer {"device": "cpu"}',
        )
    overlap = ctx.zero.get("overlap_comm")
    overlap_on = overlap if isinstance(overlap, bool) else ctx.stage == 3
    if zenflow.get("offload") is True and not overlap_on:
        ctx.emit(
            "zenflow-offload",
            "/zero_optimization/zenflow/offload",
            "offload selective optimizer should be used with overlap_comm",
            "set zero_optimization.overlap_comm true",
        )


@rule(
    "hpz-world-size",
    "error",
    "engine",
    "zero_hpz_partition_size (at most the world size) does not divide --world-size.",
    "utils/groups.py _create_zero_param_parallel_group clamps the group to min(hpz, world size), then "
    "_ensure_divisibility raises '{world} is not divisible by {hpz}'. An hpZ size above the world size "
    "is clamped and runs (a warning).",
)
def hpz_world_size(ctx: Context) -> None:
    hpz = whole(ctx.zero.get("zero_hpz_partition_size"))
    if ctx.world_size is None or hpz is None or hpz <= 1 or ctx.world_size % hpz == 0:
        return
    if hpz > ctx.world_size:
        ctx.emit(
            "hpz-world-size",
            "/zero_optimization/zero_hpz_partition_size",
            f"zero_hpz_partition_size {hpz} is larger than the world size {ctx.world_size}: DeepSpeed clamps "
            f"the secondary partition to {ctx.world_size} ranks",
            "use the number of GPUs per node",
            severity="warning",
            phase="lint",
        )
        return
    ctx.emit(
        "hpz-world-size",
        "/zero_optimization/zero_hpz_partition_size",
        f"{ctx.world_size} is not divisible by {hpz} (zero_hpz_partition_size)",
        "use a divisor of the world size, ideally the number of GPUs per node",
    )


@rule(
    "allreduce-sum-conflict",
    "error",
    "config",
    'gradient_allreduce_op "sum" with ZeRO-3, ZenFlow or DeepCompile.',
    "ValueError: gradient_allreduce_op='sum' is not supported with ZeRO stage 3 / ZenFlow / DeepCompile.",
    since="0.19",
)
def allreduce_sum_conflict(ctx: Context) -> None:
    op = ctx.config.get("gradient_allreduce_op")
    if not (isinstance(op, str) and op.lower() == "sum"):
        return
    if ctx.stage == 3:
        reason = "ZeRO stage 3"
    elif _zenflow_set(ctx):
        reason = "ZenFlow"
    elif _deepcompile(ctx):
        reason = "DeepCompile"
    else:
        return
    ctx.emit(
        "allreduce-sum-conflict",
        "/gradient_allreduce_op",
        f"gradient_allreduce_op='sum' is not supported with {reason}",
        'use "mean"',
    )


@rule(
    "elastic-checkpoint-stage3",
    "warning",
    "lint",
    "zero_optimization.elastic_checkpoint with ZeRO-3.",
    "Logs 'ZeRO-3 elastic checkpointing is deprecated and no longer supported'.",
)
def elastic_checkpoint_stage3(ctx: Context) -> None:
    if ctx.stage == 3 and flag(ctx.zero.get("elastic_checkpoint")):
        ctx.emit(
            "elastic-checkpoint-stage3",
            "/zero_optimization/elastic_checkpoint",
            "ZeRO-3 elastic checkpointing is deprecated and no longer supported",
            "use Universal Checkpointing (checkpoint.load_universal)",
        )
