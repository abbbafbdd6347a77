"""AutoTP / AutoEP rules per release, read from :mod:`dsgen.facts.model_parallel` (the one list the solver
and the doctor also read), and the batch world under AutoTP.

A config does not name the model, so the rules that need it (expert counts, AutoEP model types,
an MoE model's partition_config, KV heads) stay in the pure module. The rules that
:mod:`dsgen.validate.rules.parallel` already checks (``tp-size-mismatch``, ``autoep-conflict``)
are not repeated here. A profile stands for the release it was read from (0.14.5, 0.16.9, 0.19.8),
so the 0.19.2 .. 0.19.4 boundaries only matter to callers that know the exact release.
"""

from __future__ import annotations

from dsgen.facts.model_parallel import Layout, Violation, tp_batch, violations
from dsgen.validate.rules.batch import fill_batch_triple
from dsgen.validate.rules.context import Context, number, section, truthy, whole
from dsgen.validate.rules.registry import rule

_HINTS = {
    "autotp-release": "use DeepSpeed >= 0.16.4 for AutoTP training, or remove tensor_parallel",
    "autotp-zero3-release": "use ZeRO stage 1 or 2 with AutoTP on this release, or DeepSpeed >= 0.19.4",
    "autoep-release": "use DeepSpeed >= 0.19.2 for AutoEP, or remove expert_parallel",
    "autotp-ulysses": "use either tensor_parallel.autotp_size or sequence_parallel_size, not both",
}


def _layout(ctx: Context) -> Layout | None:
    """The config's layout at the profile's release; None without AutoTP or AutoEP, or when the sizes
    are not whole numbers (the schema reports those)."""
    tp = whole(section(ctx.config.get("tensor_parallel")).get("autotp_size", 0))
    ep_block = section(ctx.config.get("expert_parallel"))
    autoep = truthy(ep_block.get("enabled"))  # parse_autoep_config: dict.get, then `if not config.enabled`
    ep = whole(ep_block.get("autoep_size", 1))
    sp = whole(ctx.config.get("sequence_parallel_size", 1))
    if tp is None or ep is None or sp is None or (tp <= 1 and not autoep):
        return None
    return Layout(
        tp=tp,
        ep=ep,
        autoep=autoep,
        sp=sp,
        zero_stage=ctx.stage if ctx.stage is not None else 0,  # unknown stage: the stage-3 rules stay silent
        release=ctx.profile.release,
    )


def _violations(ctx: Context, rule_id: str) -> list[Violation]:
    layout = _layout(ctx)
    return [] if layout is None else [v for v in violations(layout) if v.rule == rule_id]


def _emit(ctx: Context, found: Violation) -> None:
    pointer = ctx.pointer(*found.field.split("."))
    ctx.emit(found.rule, pointer, f"{found.message} [{found.source}]", _HINTS[found.rule])


@rule(
    "autotp-release",
    "warning",
    "lint",
    "tensor_parallel.autotp_size > 1 for a release before 0.16.4 (the 0.14 profile).",
    "DeepSpeedConfig reads tensor_parallel only from 0.16.4 (runtime/config.py); older releases ignore it and "
    "run plain data parallel with the whole model on every rank.",
)
def autotp_release(ctx: Context) -> None:
    for found in _violations(ctx, "autotp-release"):
        _emit(ctx, found)


@rule(
    "autotp-zero3-release",
    "error",
    "engine",
    "AutoTP (tensor_parallel.autotp_size > 1) with ZeRO stage 3 for a release before 0.19.4 (the 0.16 profile).",
    "DeepSpeedEngine._configure_tensor_parallel_states asserts 'Currently, the compatibility between 'autotp' and "
    "'zero_stage = 3' has not been validated' (0.16.4 .. 0.19.3); 0.19.4 supports it.",
    since="0.16",
)
def autotp_zero3_release(ctx: Context) -> None:
    for found in _violations(ctx, "autotp-zero3-release"):
        _emit(ctx, found)


@rule(
    "autoep-release",
    "warning",
    "lint",
    "expert_parallel.enabled for a release before 0.19.2 (the 0.14 and 0.16 profiles).",
    "AutoEP first ships in 0.19.2 (module_inject/auto_ep_config.py); older releases ignore expert_parallel and "
    "every rank holds every expert.",
)
def autoep_release(ctx: Context) -> None:
    for found in _violations(ctx, "autoep-release"):
        _emit(ctx, found)


@rule(
    "autotp-ulysses",
    "error",
    "engine",
    "AutoTP (tensor_parallel.autotp_size > 1) with Ulysses sequence_parallel_size > 1, without AutoEP.",
    "DeepSpeedEngine._configure_tensor_parallel_states replaces the Ulysses mpu with AutoTP's groups, and the "
    "first forward asserts 'Data inconsistency within the TP group' (the sequence shards differ). With AutoEP, "
    "validate_folding_global raises instead (autoep-conflict).",
    since="0.16",
)
def autotp_ulysses(ctx: Context) -> None:
    if ctx.profile.at_least("0.19") and truthy(section(ctx.config.get("expert_parallel")).get("enabled")):
        return  # autoep-conflict reports validate_folding_global's message (AutoEP: 0.19 profile only)
    for found in _violations(ctx, "autotp-ulysses"):
        _emit(ctx, found)


@rule(
    "autotp-batch-world",
    "error",
    "config",
    "With AutoTP and --world-size, train_batch_size = micro batch x accumulation x (world / autotp_size): the "
    "data-parallel count, where DeepSpeed asserts the full world.",
    "DeepSpeedConfig._batch_assertion (runtime/config.py) checks train_batch_size against dist.get_world_size() "
    "(no mpu: AutoTP does not divide it) and raises 'train_batch_size is not equal to micro_batch_per_gpu * "
    "gradient_acc_step * world_size'. The accepted value counts each sample autotp_size times.",
    since="0.16",
)
def autotp_batch_world(ctx: Context) -> None:
    tp = whole(section(ctx.config.get("tensor_parallel")).get("autotp_size"))
    world = ctx.world_size
    if tp is None or tp <= 1 or world is None or world % tp:
        return
    given = [
        ctx.config.get(key)
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    ]
    values = [whole(v) if number(v) is not None else None for v in given]
    if any(v is not None and v <= 0 for v in values) or any(
        v is not None and values[i] is None for i, v in enumerate(given)
    ):
        return  # "auto", strings, fractions, non-positive: the batch rules report those
    tb, mb, ga = values
    if tb is None or (mb is None and ga is None):
        return
    if _consistent(tb, mb, ga, world) or not _consistent(tb, mb, ga, world // tp):
        return
    _, mb_dp, ga_dp = fill_batch_triple(tb, mb, ga, world // tp)
    assert mb_dp is not None and ga_dp is not None
    batch = tp_batch(int(mb_dp), int(ga_dp), world, tp=tp)
    ctx.emit(
        "autotp-batch-world",
        "/train_batch_size",
        f"train_batch_size {tb} = {int(mb_dp)} x {int(ga_dp)} x {batch.data_parallel} counts the "
        f"{batch.data_parallel} data-parallel ranks, but with AutoTP (autotp_size {tp}) DeepSpeedConfig asserts it "
        f"against all {world} ranks: train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
        f"world_size ({tb} != {int(mb_dp)} * {int(ga_dp)} * {world})",
        f"set train_batch_size to {batch.train_batch_size} (or leave it out): DeepSpeed counts each sample once per "
        f"rank of its TP group, so a step consumes {batch.samples_per_step} distinct samples while DeepSpeed "
        f"reports {batch.train_batch_size}",
    )


def _consistent(tb: int, mb: int | None, ga: int | None, world: int) -> bool:
    """DeepSpeed's derivation and assertion (_set_batch_related_parameters, _batch_assertion) pass."""
    tb2, mb2, ga2 = fill_batch_triple(tb, mb, ga, world)
    if tb2 is None or mb2 is None or ga2 is None:
        return False
    return tb2 > 0 and mb2 > 0 and ga2 > 0 and tb2 == mb2 * ga2 * world
