"""Remaining section rules: data efficiency, checkpointing, NVMe I/O and the vocabulary warning."""

from __future__ import annotations

from dsgen.validate.rules.context import Context, section, truthy, whole
from dsgen.validate.rules.registry import rule


@rule(
    "data-efficiency-incomplete",
    "error",
    "config",
    "Curriculum learning without curriculum_metrics, or dynamic batching without max_tokens.",
    "AssertionError: Curriculum learning is enabled, curriculum_metrics "
    "must be specified / Dynamic batching is enabled, so max_tokens must be specified.",
)
def data_efficiency_incomplete(ctx: Context) -> None:
    sampling = section(section(ctx.config.get("data_efficiency")).get("data_sampling"))
    curriculum = section(sampling.get("curriculum_learning"))
    base = "/data_efficiency/data_sampling"
    # get_scalar_param + truthiness: 1 and "0" enable it as much as true does
    if truthy(curriculum.get("enabled")) and "curriculum_metrics" not in curriculum:
        ctx.emit(
            "data-efficiency-incomplete",
            f"{base}/curriculum_learning",
            "Curriculum learning is enabled, curriculum_metrics must be specified",
            "add data_efficiency.data_sampling.curriculum_learning.curriculum_metrics",
        )
    batching = section(sampling.get("dynamic_batching"))
    if batching.get("enabled") and "max_tokens" not in batching:
        ctx.emit(
            "data-efficiency-incomplete",
            f"{base}/dynamic_batching",
            "Dynamic batching is enabled, so max_tokens must be specified",
            "add data_efficiency.data_sampling.dynamic_batching.max_tokens",
        )


@rule(
    "aio-gds-cuda",
    "warning",
    "lint",
    "aio.use_gds: true (GPUDirect Storage).",
    "DeepSpeedConfig asserts 'GDS currently only supported for CUDA accelerator' on any non-CUDA accelerator.",
    since="0.16",
)
def aio_gds_cuda(ctx: Context) -> None:
    if section(ctx.config.get("aio")).get("use_gds") is True:
        ctx.emit(
            "aio-gds-cuda",
            "/aio/use_gds",
            "GDS currently only supported for CUDA accelerator: this config "
            "fails on any other accelerator (including CPU-only test machines)",
            "set aio.use_gds to false unless every host has CUDA GPUs and GPUDirect Storage",
        )


@rule(
    "contiguous-checkpointing",
    "warning",
    "engine",
    "activation_checkpointing.contiguous_memory_optimization without number_checkpoints.",
    "deepspeed.checkpointing.configure asserts 'Must specify the number of layers "
    "with contiguous memory checkpointing' unless the code passes num_checkpoints (Megatron does).",
)
def contiguous_checkpointing(ctx: Context) -> None:
    block = section(ctx.config.get("activation_checkpointing"))
    if block.get("contiguous_memory_optimization") is True and block.get("number_checkpoints") is None:
        ctx.emit(
            "contiguous-checkpointing",
            "/activation_checkpointing/contiguous_memory_optimization",
            "contiguous memory checkpointing needs the number of checkpointed layers: DeepSpeed fails unless the "
            "training code passes num_checkpoints to deepspeed.checkpointing.configure",
            "set activation_checkpointing.number_checkpoints to the number of checkpointed layers",
        )


@rule(
    "vocabulary-size-alignment",
    "warning",
    "lint",
    "vocabulary_size not a multiple of 8.",
    "DeepSpeedConfig warns 'vocabulary size ... is not aligned to 8, may import tensor core utilization'.",
)
def vocabulary_size_alignment(ctx: Context) -> None:
    size = whole(ctx.config.get("vocabulary_size"))
    if size and size % 8:
        ctx.emit(
            "vocabulary-size-alignment",
            "/vocabulary_size",
            f"vocabulary size {size} is not aligned to 8, which hurts tensor-core utilisation",
            f"pad the vocabulary to {size + (-size) % 8}",
        )


@rule(
    "zero-section-missing",
    "error",
    "engine",
    "No zero_optimization section in a config for the HF Trainer or accelerate.",
    "accelerate's DeepSpeedPlugin (also used by the HF Trainer) raises 'Please specify the "
    "ZeRO optimization config in the DeepSpeed config.'",
)
def zero_section_missing(ctx: Context) -> None:
    if ctx.target == "deepspeed" or "zero_optimization" in ctx.config:
        return
    if section(ctx.config.get("autotuning")).get("enabled") is True:
        return  # the autotuner writes zero_optimization into every experiment config
    ctx.emit(
        "zero-section-missing",
        "",
        "Please specify the ZeRO optimization config in the DeepSpeed config "
        f"(required by accelerate's DeepSpeedPlugin, which {'the HF Trainer uses' if ctx.target == 'hf-trainer' else 'reads this file'})",
        'add "zero_optimization": {"stage": 0} (or the stage you want)',
    )
