"""A DeepSpeed config (``"auto"`` already resolved) plus a spec -> the :class:`Plan` it runs.

Every knob the memory and step-time models read comes from the config when it sets it, else from
DeepSpeed 0.19.8's own default; each :class:`Setting` says which, citing the DeepSpeed source
(docs/doctor.md has the full table). The spec supplies what a config cannot say: the model,
hardware, sequence length, attention kernel, whether the script checkpoints activations and which
ALST tricks its code applies (tiled MLP, tiled loss, checkpoint offload).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from dsgen.doctor.batch import Batch, Parallel
from dsgen.doctor.keys import MISSING, get
from dsgen.facts.release import release_key
from dsgen.plan import LongContext, ModelParallel, Plan, ZeroKnobs
from dsgen.search.long_context import TRICKS, long_context_choices
from dsgen.spec.types import Spec
from dsgen.vocabulary import PRECISIONS, Checkpointing, OffloadDevice, Precision

ZERO_CONFIG = "deepspeed/runtime/zero/config.py DeepSpeedZeroConfig"
OFFLOAD_CONFIG = "deepspeed/runtime/zero/offload_config.py"
SP_COMMUNICATION_KEY = "seq_parallel_communication_data_type"  # a top-level key, read under Ulysses only

# (config key under zero_optimization, ZeroKnobs field, DeepSpeed 0.19.8 default, where it is set)
KNOB_KEYS: tuple[tuple[str, str, Any, str], ...] = (
    ("reduce_bucket_size", "reduce_bucket_size", 500_000_000, f"{ZERO_CONFIG}.reduce_bucket_size"),
    ("allgather_bucket_size", "allgather_bucket_size", 500_000_000, f"{ZERO_CONFIG}.allgather_bucket_size"),
    ("contiguous_gradients", "contiguous_gradients", True, f"{ZERO_CONFIG}.contiguous_gradients"),
    ("stage3_prefetch_bucket_size", "prefetch_bucket_size", 50_000_000, f"{ZERO_CONFIG}.prefetch_bucket_size"),
    (
        "stage3_param_persistence_threshold",
        "param_persistence_threshold",
        100_000,
        f"{ZERO_CONFIG}.param_persistence_threshold",
    ),
    ("stage3_max_live_parameters", "max_live_parameters", 1_000_000_000, f"{ZERO_CONFIG}.max_live_parameters"),
    ("stage3_max_reuse_distance", "max_reuse_distance", 1_000_000_000, f"{ZERO_CONFIG}.max_reuse_distance"),
    ("sub_group_size", "sub_group_size", 1_000_000_000, f"{ZERO_CONFIG}.sub_group_size"),
    ("zero_hpz_partition_size", "hpz_partition_size", 1, f"{ZERO_CONFIG}.zero_hpz_partition_size"),
    ("zero_quantized_weights", "quantized_weights", False, f"{ZERO_CONFIG}.zero_quantized_weights"),
    ("zero_quantized_gradients", "quantized_gradients", False, f"{ZERO_CONFIG}.zero_quantized_gradients"),
    (
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        False,
        f"{ZERO_CONFIG}.gather_16bit_weights_on_model_save",
    ),
)
# The same knobs under the names DeepSpeed's pydantic model also accepts (aliases without the prefix).
ALIASES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
}
#: The first release whose offload blocks default to ``pin_memory: true`` (``offload_config.py``):
#: deepspeedai/DeepSpeed#8207 ("pinned offload buffers by default", commit 7dfa67a), in 0.19.5;
#: 0.14.5, 0.16.9 and 0.18.9 default to false.
PINNED_OFFLOAD_DEFAULT_SINCE: tuple[int, ...] = (0, 19, 5)
# Offload buffers the memory model sizes at these defaults (offload_config.py field defaults).
OFFLOAD_BUFFER_DEFAULTS: tuple[tuple[str, Any, str], ...] = (
    ("offload_param.buffer_count", 5, f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadParamConfig.buffer_count"),
    ("offload_param.buffer_size", 100_000_000, f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadParamConfig.buffer_size"),
    ("offload_param.max_in_cpu", 1_000_000_000, f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadParamConfig.max_in_cpu"),
    ("offload_optimizer.buffer_count", 4, f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadOptimizerConfig.buffer_count"),
    ("offload_optimizer.ratio", 1.0, f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadOptimizerConfig.ratio"),
)


@dataclass(frozen=True)
class Setting:
    """One knob the prediction used: its value and where it came from."""

    key: str
    value: Any
    source: str  # config | auto | default | spec | trainer
    note: str = ""


@dataclass(frozen=True)
class ConfigPlan:
    """The plan a config runs, every setting behind it, and what the doctor noticed on the way."""

    plan: Plan
    settings: tuple[Setting, ...]
    notes: tuple[str, ...]
    parallel: Parallel


def _num(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def precision_of(config: Mapping[str, Any]) -> tuple[Precision, str]:
    """(precision, key that decided it). bf16 (or its alias bfloat16) wins over fp16, as in
    deepspeed/runtime/precision_config.py get_bfloat16_config / get_float16_config (DeepSpeedConfig
    refuses both at once); neither means fp32."""
    for key in ("bf16.enabled", "bfloat16.enabled"):
        if get(config, key) is True:
            return "bf16", key
    if get(config, "fp16.enabled") is True:
        return "fp16", "fp16.enabled"
    return "fp32", "default (fp16.enabled and bf16.enabled false)"


def _device(block: Any) -> OffloadDevice:
    if isinstance(block, Mapping):
        device = block.get("device", "none")
        if device == "cpu" or device == "nvme":
            return device
    return "none"


def config_to_plan(
    config: Mapping[str, Any],
    spec: Spec,
    batch: Batch,
    parallel: Parallel,
    checkpointing: Checkpointing,
    checkpointing_source: str,
) -> ConfigPlan:
    """The Plan of ``config`` (already ``"auto"``-resolved) with a valid ``batch``."""
    settings: list[Setting] = []
    notes: list[str] = []
    zero = config.get("zero_optimization")
    zero = zero if isinstance(zero, Mapping) else {}

    precision, decided = precision_of(config)
    settings.append(Setting("precision", precision, "config" if "." in decided else "default", decided))
    stage = _num(zero.get("stage", 0))
    stage = stage if stage in (0, 1, 2, 3) else 0
    settings.append(
        Setting("zero_optimization.stage", stage, "config" if "stage" in zero else "default", f"{ZERO_CONFIG}.stage")
    )

    offload_optimizer = _device(zero.get("offload_optimizer"))
    if offload_optimizer == "none" and zero.get("cpu_offload") is True:
        offload_optimizer = "cpu"
        notes.append("zero_optimization.cpu_offload is the deprecated spelling of offload_optimizer.device: cpu")
    if stage == 0 and offload_optimizer != "none":
        notes.append("offload_optimizer needs ZeRO stage 1 or higher; at stage 0 it is not used")
        offload_optimizer = "none"
    if stage in (1, 2) and offload_optimizer == "nvme":
        notes.append("ZeRO-1/2 swap optimizer states only to CPU memory: offload_optimizer nvme is priced as cpu")
        offload_optimizer = "cpu"
    offload_param = _device(zero.get("offload_param"))
    if offload_param != "none" and stage != 3:
        notes.append(f"offload_param ({offload_param}) works only with ZeRO-3; at stage {stage} DeepSpeed ignores it")
        offload_param = "none"
    settings.append(
        Setting(
            "zero_optimization.offload_optimizer.device",
            offload_optimizer,
            _src(zero, "offload_optimizer"),
            f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadOptimizerConfig.device",
        )
    )
    settings.append(
        Setting(
            "zero_optimization.offload_param.device",
            offload_param,
            _src(zero, "offload_param"),
            f"{OFFLOAD_CONFIG} DeepSpeedZeroOffloadParamConfig.device",
        )
    )

    ratio = 1.0
    ratio_value = get(zero, "offload_optimizer.ratio")
    if isinstance(ratio_value, int | float) and not isinstance(ratio_value, bool) and offload_optimizer == "cpu":
        ratio = float(ratio_value)
        if ratio < 1 and stage != 3:
            notes.append("offload_optimizer.ratio < 1 (partial offload) is a ZeRO-3 feature; priced as full offload")
            ratio = 1.0
    for key, default, where in OFFLOAD_BUFFER_DEFAULTS:
        value = get(zero, key)
        settings.append(
            Setting(
                f"zero_optimization.{key}",
                default if value is MISSING else value,
                "default" if value is MISSING else "config",
                where,
            )
        )
        if value is not MISSING and value != default and key != "offload_optimizer.ratio":
            notes.append(
                f"zero_optimization.{key} = {value}: the memory model sizes offload swap buffers at DeepSpeed's default {default}"
            )

    knob_values: dict[str, Any] = {}
    for key, field, default, where in KNOB_KEYS:
        raw = zero.get(key, MISSING)
        if raw is MISSING and key in ALIASES:
            raw = zero.get(ALIASES[key], MISSING)
        number = raw if isinstance(default, bool) else _num(raw)
        if raw is MISSING or number is None or (isinstance(default, bool) and not isinstance(raw, bool)):
            knob_values[field] = default
            settings.append(Setting(f"zero_optimization.{key}", default, "default", where))
        else:
            knob_values[field] = number
            settings.append(Setting(f"zero_optimization.{key}", number, "config", where))
    overlap = zero.get("overlap_comm")
    if isinstance(overlap, bool):
        knob_values["overlap_comm"] = overlap
        settings.append(Setting("zero_optimization.overlap_comm", overlap, "config", f"{ZERO_CONFIG}.overlap_comm"))
    else:
        knob_values["overlap_comm"] = stage == 3
        settings.append(
            Setting(
                "zero_optimization.overlap_comm",
                stage == 3,
                "default",
                f"{ZERO_CONFIG}.overlap_comm_valid (True only at stage 3)",
            )
        )
    if knob_values["hpz_partition_size"] < 1:
        knob_values["hpz_partition_size"] = 1
    pins = (
        ("offload_optimizer", "pin_optimizer_offload", offload_optimizer),
        ("offload_param", "pin_param_offload", offload_param),
    )
    for block, field, device in pins:
        knob_values[field], source = _pin_memory(zero, block, spec.training.deepspeed_version)
        if device == "none":
            continue
        settings.append(
            Setting(
                f"zero_optimization.{block}.pin_memory",
                knob_values[field],
                source,
                f"{OFFLOAD_CONFIG} pin_memory (DeepSpeed {spec.training.deepspeed_version})",
            )
        )
    knobs = ZeroKnobs(**knob_values)

    assert batch.micro_batch_size is not None and batch.gradient_accumulation_steps is not None
    dp = parallel.data_parallel
    sp = 1
    ulysses_only = parallel.tensor_parallel == 1 and parallel.pipeline_parallel == 1
    if parallel.sequence_parallel > 1 and ulysses_only:
        # Ulysses: each rank holds s / sp tokens (dsgen.estimate.sequence_parallel) and ZeRO partitions
        # over every rank, the sequence-data-parallel group (engine.py: dp_process_group=seq_data_parallel_group)
        sp = parallel.sequence_parallel
        dp = parallel.world_size
    layout = _model_parallel(config, spec, parallel)
    if layout.active:
        # AutoTP / AutoEP as dsgen prices them (dsgen.estimate.sharding): the plan keeps every GPU,
        # ZeRO's groups follow from the degrees
        dp = parallel.world_size
    elif parallel.tensor_parallel > 1 or parallel.pipeline_parallel > 1 or parallel.sequence_parallel > 1:
        notes.append(
            f"the memory model does not split the model over tensor/pipeline/sequence parallel ranks "
            f"(tp {parallel.tensor_parallel}, pp {parallel.pipeline_parallel}, sp {parallel.sequence_parallel}); "
            f"it prices ZeRO over {dp} data-parallel ranks, an upper bound"
        )
    settings.append(
        Setting(
            "train_micro_batch_size_per_gpu",
            batch.micro_batch_size,
            "config",
            "deepspeed/runtime/config.py _set_batch_related_parameters",
        )
    )
    settings.append(
        Setting(
            "gradient_accumulation_steps",
            batch.gradient_accumulation_steps,
            "config",
            "deepspeed/runtime/config.py _set_batch_related_parameters",
        )
    )
    settings.append(Setting("activation checkpointing", checkpointing, "spec", checkpointing_source))
    long_context = _long_context(config, spec, sp, checkpointing, settings, notes)

    _compare_with_spec(spec, precision, stage, offload_optimizer, offload_param, batch, notes)
    plan = Plan(
        precision=precision,
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        checkpointing=checkpointing,
        micro_batch_size=batch.micro_batch_size,
        gradient_accumulation_steps=batch.gradient_accumulation_steps,
        data_parallel_size=dp,
        knobs=knobs,
        offload_ratio=ratio,
        long_context=long_context,
        model_parallel=layout,
    )
    return ConfigPlan(plan=plan, settings=tuple(settings), notes=tuple(notes), parallel=parallel)


def _model_parallel(config: Mapping[str, Any], spec: Spec, parallel: Parallel) -> ModelParallel:
    """The config's AutoTP or AutoEP degree where dsgen prices it (dsgen.search.model_parallel_choices:
    the layouts the CPU measurements cover, without pipeline or Ulysses parallelism); otherwise
    none, and the note above says the estimate is an upper bound."""
    from dsgen.doctor.model_parallel_findings import layout_of
    from dsgen.search.model_parallel_choices import ep_violation, tp_violation

    layout = layout_of(config, spec, parallel.world_size)
    tp = parallel.tensor_parallel
    ep = layout.ep if layout is not None and layout.autoep else 1
    if parallel.pipeline_parallel > 1 or parallel.sequence_parallel > 1 or (tp > 1 and ep > 1):
        return ModelParallel()
    hw, training = spec.hardware, spec.training
    if tp > 1 and tp_violation(spec.model, tp, hw.gpus_per_node, training) is None:
        return ModelParallel(tensor_parallel_size=tp)
    if ep > 1 and ep_violation(spec.model, ep, parallel.world_size, training) is None:
        return ModelParallel(expert_parallel_size=ep)
    return ModelParallel()


def _long_context(
    config: Mapping[str, Any],
    spec: Spec,
    sp: int,
    checkpointing: Checkpointing,
    settings: list[Setting],
    notes: list[str],
) -> LongContext:
    """The config's Ulysses degree with the ALST tricks the training code applies, which no config
    file carries: the spec's pins (``constraints.tiled_mlp``, ``tiled_loss``, ``checkpoint_offload``;
    unpinned, the code is taken not to apply them), and, under Ulysses, the config's
    ``seq_parallel_communication_data_type`` (DeepSpeed's default fp32: ``runtime/config.py``,
    ``get_communication_data_type``)."""
    choices = long_context_choices(spec, sp, checkpointing)
    if not choices:  # checkpoint offload pinned, but the script does not checkpoint whole layers
        notes.append("constraints.checkpoint_offload is ignored: it needs whole-layer activation checkpointing")
        choices = long_context_choices(
            replace(spec, constraints=replace(spec.constraints, checkpoint_offload=False)), sp, checkpointing
        )
    chosen = choices[0]
    for name in TRICKS:
        if getattr(spec.constraints, name) is not None:
            settings.append(Setting(name, getattr(chosen, name), "spec", f"spec constraints.{name}"))
    if sp == 1:
        return replace(chosen, communication_dtype="fp32")
    given = config.get(SP_COMMUNICATION_KEY)
    dtype = given.lower() if isinstance(given, str) and given.lower() in PRECISIONS else "fp32"
    settings.append(
        Setting(
            SP_COMMUNICATION_KEY,
            dtype,
            "config" if given is not None else "default",
            "deepspeed/runtime/config.py get_communication_data_type (engine.py reduces in it under SP)",
        )
    )
    return replace(chosen, communication_dtype=cast(Precision, dtype))


def _pin_memory(zero: Mapping[str, Any], block: str, release: str) -> tuple[bool, str]:
    """``zero_optimization.<block>.pin_memory`` and where it came from: the config's boolean, else
    the release's default (``training.deepspeed_version``, :data:`PINNED_OFFLOAD_DEFAULT_SINCE`)."""
    value = get(zero, f"{block}.pin_memory")
    if isinstance(value, bool):
        return value, "config"
    return pins_offload_by_default(release), "default"


def pins_offload_by_default(release: str) -> bool:
    """Whether ``release`` pins offloaded tensors when the config does not say (deepspeedai/DeepSpeed#8207)."""
    return release_key(release) >= PINNED_OFFLOAD_DEFAULT_SINCE


def _src(zero: Mapping[str, Any], key: str) -> str:
    return "config" if key in zero else "default"


def _compare_with_spec(
    spec: Spec, precision: str, stage: int, offload_optimizer: str, offload_param: str, batch: Batch, notes: list[str]
) -> None:
    """Where the spec pins something the config decides differently, the config wins: say so."""
    c = spec.constraints
    pins = (
        ("training.precision", spec.training.precision if spec.training.precision != "auto" else None, precision),
        ("constraints.zero_stage", c.zero_stage, stage),
        ("constraints.offload_optimizer", c.offload_optimizer, offload_optimizer),
        ("constraints.offload_param", c.offload_param, offload_param),
        ("constraints.micro_batch_size", c.micro_batch_size, batch.micro_batch_size),
        ("constraints.gradient_accumulation_steps", c.gradient_accumulation_steps, batch.gradient_accumulation_steps),
    )
    for key, pinned, actual in pins:
        if pinned is not None and pinned != actual:
            notes.append(f"the spec pins {key}: {pinned}, but the config runs {actual}; the doctor sizes the config")
    if not spec.hardware.gpu.bf16 and precision == "bf16":
        notes.append(f"{spec.hardware.gpu.name} has no bf16 support; DeepSpeed will fail or run bf16 in emulation")
