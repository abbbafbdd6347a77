"""The batch triple: train_batch_size = micro batch x accumulation steps x data-parallel size.

DeepSpeed derives the missing keys with floor division and then asserts the relation
(``DeepSpeedConfig._set_batch_related_parameters`` / ``_batch_assertion``, reference section 5).
With ``--world-size`` this module replays that arithmetic exactly, so the verdict and the message
match DeepSpeed's. Without it, a config is only wrong if *no* data-parallel size can satisfy it.
"""

from __future__ import annotations

from typing import Any

from dsgen.validate.rules.context import Context, number, whole
from dsgen.validate.rules.registry import rule

TB, MB, GA = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"
BATCH_KEYS = (TB, MB, GA)

_MISSING = object()
_AUTO = object()
_BAD = object()


def _values(ctx: Context) -> dict[str, object]:
    """Each batch key as a number, _MISSING, _AUTO (a launcher fills it) or _BAD (schema reports it)."""
    out: dict[str, object] = {}
    for key in BATCH_KEYS:
        value = ctx.config.get(key)
        if value is None:
            out[key] = _MISSING
        elif value == "auto":
            out[key] = _AUTO if ctx.target != "deepspeed" and _resolves(ctx, key) else _BAD
        elif number(value) is not None and value > 0:
            out[key] = value
        else:
            out[key] = _BAD
    return out


def _resolves(ctx: Context, key: str) -> bool:
    from dsgen.validate.targets import resolves_auto

    return resolves_auto(ctx.target, "/" + key)


def data_parallel_size(ctx: Context) -> int | None:
    """The W of the batch invariant: ``--world-size`` is the number of data-parallel ranks.

    DeepSpeedConfig itself uses world / sequence_parallel_size without an mpu, the mpu's data-parallel
    size with Megatron-style TP/PP, and the full world size with AutoTP; callers pass that number.
    """
    return ctx.world_size


@rule(
    "batch-missing",
    "error",
    "config",
    "Neither train_batch_size nor train_micro_batch_size_per_gpu is set.",
    "AssertionError: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided.",
)
def batch_missing(ctx: Context) -> None:
    values = _values(ctx)
    if values[TB] is _MISSING and values[MB] is _MISSING:
        ctx.emit(
            "batch-missing",
            "",
            "Either train_batch_size or train_micro_batch_size_per_gpu needs to be "
            "provided (DeepSpeed cannot derive the batch size)",
            "set train_micro_batch_size_per_gpu and gradient_accumulation_steps (dsgen recommends all "
            "three batch keys)",
        )


@rule(
    "batch-mismatch",
    "error",
    "config",
    "The batch keys do not satisfy train_batch_size = "
    "micro batch x gradient accumulation x data-parallel size (for --world-size, or for any size).",
    "DeepSpeedConfig derives the missing keys with floor division and asserts the relation "
    "('Check batch related parameters ...' or '... has to be greater than 0').",
)
def batch_mismatch(ctx: Context) -> None:
    values = _values(ctx)
    if any(v is _BAD for v in values.values()) or (values[TB] is _MISSING and values[MB] is _MISSING):
        return
    world = data_parallel_size(ctx)
    if any(v is _AUTO for v in values.values()):
        _check_feasible(ctx, values, world)
    elif world is not None:
        _replay(ctx, values, world)
    else:
        _check_any_world(ctx, values)


Number = int | float


def fill_batch_triple(
    tb: Number | None, mb: Number | None, ga: Number | None, world: Number
) -> tuple[Number | None, Number | None, Number | None]:
    """The batch keys a config leaves out, filled in as DeepSpeed 0.19.8 does
    (``runtime/config.py`` ``_set_batch_related_parameters``): floor divisions, which stay floats
    when the world size is one (sequence parallelism divides it). With neither
    ``train_batch_size`` nor the micro-batch nothing is filled; DeepSpeed then fails."""
    if tb is not None and mb is not None and ga is None:
        ga = (tb // mb) // world
    elif tb is not None and ga is not None and mb is None:
        mb = (tb // world) // ga
    elif mb is not None and ga is not None and tb is None:
        tb = mb * ga * world
    elif tb is not None and mb is None and ga is None:
        ga, mb = 1, tb // world
    elif mb is not None and tb is None and ga is None:
        tb, ga = mb * world, 1
    return tb, mb, ga


def _anchor(values: dict[str, object]) -> str:
    for key in BATCH_KEYS:
        if values[key] is not _MISSING:
            return "/" + key
    return ""


def _replay(ctx: Context, values: dict[str, Any], world: float | int, any_world: bool = False) -> None:
    """DeepSpeed's derivation and assertions, in DeepSpeed's order and with its messages."""
    given = [None if values[k] is _MISSING else values[k] for k in BATCH_KEYS]
    tb, mb, ga = fill_batch_triple(given[0], given[1], given[2], world)
    problem = None
    if not tb > 0:  # type: ignore[operator]
        problem = f"Train batch size: {tb} has to be greater than 0"
    elif not mb > 0:  # type: ignore[operator]
        problem = f"Micro batch size per gpu: {mb} has to be greater than 0"
    elif not ga > 0:  # type: ignore[operator]
        problem = f"Gradient accumulation steps: {ga} has to be greater than 0"
    elif tb != mb * ga * world:  # type: ignore[operator]
        problem = (
            f"train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size: "
            f"{tb} != {mb} * {ga} * {world}"
        )
    if problem:
        where = "for every data-parallel size" if any_world else f"with {_world_text(ctx, world)}"
        ctx.emit(
            "batch-mismatch",
            _anchor(values),
            f"{problem} ({where})",
            _suggest(values, world) if not any_world else _BASE + "; pass --world-size for a concrete fix",
        )


def _world_text(ctx: Context, world: float | int) -> str:
    sp = whole(ctx.config.get("sequence_parallel_size"))
    if sp is not None and sp > 1:
        # DeepSpeedConfig.__init__ (runtime/config.py): world_size = dist.get_world_size() / sequence_parallel_size
        return f"data-parallel size {world}, i.e. {_times(world, sp)} ranks / sequence_parallel_size {sp}"
    return f"data-parallel size {world}"


def _times(world: float | int, sp: int) -> str:
    ranks = world * sp
    return str(int(ranks)) if float(ranks).is_integer() else str(ranks)


_BASE = (
    "DeepSpeed needs train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
    "data-parallel size"
)


def _suggest(values: dict[str, object], world: float | int) -> str:
    world_int = whole(world)
    tb, mb, ga = (whole(values[k]) if values[k] is not _MISSING else None for k in BATCH_KEYS)
    base = _BASE
    if world_int is None or world_int < 1:
        return base
    if mb is None:
        mb = max(1, (tb or world_int) // world_int)
    if ga is None or (tb is not None and tb % (mb * world_int) == 0):
        ga = max(1, (tb or mb * world_int) // (mb * world_int))
    return f"{base}, e.g. {mb * ga * world_int} = {mb} x {ga} x {world_int}"


def _check_any_world(ctx: Context, values: dict[str, Any]) -> None:
    """Without --world-size: report only what no data-parallel size can fix."""
    tb, mb, ga = (None if values[k] is _MISSING else values[k] for k in BATCH_KEYS)
    if tb is not None and mb is not None and ga is not None:
        tb_i, mb_i, ga_i = whole(tb), whole(mb), whole(ga)
        if tb_i is None or mb_i is None or ga_i is None or tb_i % (mb_i * ga_i) == 0:
            return
        ctx.emit(
            "batch-mismatch",
            "/" + TB,
            f"train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps = {mb} x {ga}, so no data-parallel size satisfies "
            f"train_batch_size = micro batch x accumulation x world size",
            _fix_for_triple(mb_i, ga_i, tb_i),
        )
    elif tb is not None and (mb is not None or ga is not None):
        # A data-parallel size of 1 is the most permissive one for these combinations.
        _replay(ctx, values, 1, any_world=True)


def _fix_for_triple(mb: int, ga: int, tb: int) -> str:
    world = max(1, round(tb / (mb * ga)))
    return (
        f"for {world} data-parallel ranks use train_batch_size {mb * ga * world}, or pass --world-size "
        "to check against a specific size"
    )


def _check_feasible(ctx: Context, values: dict[str, object], world: float | int | None) -> None:
    """With launcher-filled "auto" keys: can any fill-in satisfy the relation with the fixed numbers?"""
    tb = values[TB]
    if tb in (_MISSING, _AUTO):
        return
    tb_i = whole(tb)
    factors = [values[MB], values[GA], world]
    known = [whole(f) for f in factors if f not in (_MISSING, _AUTO, None)]
    if tb_i is None or None in known:
        return
    product = 1
    for factor in known:
        product *= factor  # type: ignore[operator]
    free = len(known) < 3
    if tb_i % product == 0 and (free or tb_i == product):
        return
    parts = [f"{name}={whole(v)}" for name, v in ((MB, values[MB]), (GA, values[GA])) if v not in (_MISSING, _AUTO)]
    if world is not None:
        parts.append(f"data-parallel size={world}")
    ctx.emit(
        "batch-mismatch",
        "/" + TB,
        f"train_batch_size {tb} cannot equal micro batch x accumulation x data-parallel size with "
        f'{", ".join(parts)}, whatever the launcher fills in for the "auto" keys',
        'set train_batch_size to "auto" too, or make it a multiple of the fixed factors',
    )


@rule(
    "autotp-train-batch-size",
    "warning",
    "lint",
    "train_batch_size given together with AutoTP (tensor_parallel.autotp_size > 1).",
    "DeepSpeedConfig computes the batch with the full world size, while AutoTP's data-parallel size is "
    "world / autotp_size; nothing re-checks it.",
)
def autotp_train_batch_size(ctx: Context) -> None:
    autotp = whole(ctx.get("tensor_parallel", "autotp_size"))
    if autotp is None or autotp <= 1 or number(ctx.config.get(TB)) is None:
        return
    ctx.emit(
        "autotp-train-batch-size",
        "/" + TB,
        f"with AutoTP (autotp_size {autotp}) DeepSpeedConfig checks train_batch_size against the full world "
        f"size, but the real data-parallel size is world / {autotp}",
        "give train_micro_batch_size_per_gpu and gradient_accumulation_steps and leave train_batch_size out",
    )
