"""The long-context search dimensions: which Ulysses degrees and ALST tricks a spec allows.

The solver (:mod:`dsgen.search.solver`) asks here for the values of its four long-context dimensions;
the rules that exclude a value are DeepSpeed's own (:func:`dsgen.estimate.sequence_parallel.sp_violation`
names where DeepSpeed raises for each).
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.sequence_parallel import sp_violation
from dsgen.facts.release import release_key
from dsgen.plan import LongContext
from dsgen.spec.types import Spec
from dsgen.vocabulary import Checkpointing, Precision

TRICKS = ("tiled_loss", "tiled_mlp", "checkpoint_offload")

#: The first DeepSpeed release with every piece of ALST dsgen plans: ``UlyssesSPAttentionHF``,
#: ``TiledMLP`` (deepspeed/runtime/sequence_parallel/ulysses_sp.py, deepspeedai/DeepSpeed#7268,
#: 0.17.0) and ``TiledFusedLogitsLoss`` (0.17.4). ArcticTraining, whose patch offloads the
#: checkpoints, builds on those releases too.
ALST_SINCE: tuple[int, ...] = (0, 17, 4)


def alst_available(release: str) -> bool:
    """Whether a DeepSpeed release (a spec's ``training.deepspeed_version``) has ALST."""
    return release_key(release) >= ALST_SINCE


def sequence_parallel_degrees(spec: Spec, search: bool = False) -> tuple[int, ...]:
    """The Ulysses degrees to search, ascending: the pinned one, or every divisor of the GPU
    count DeepSpeed accepts for this model, attention and sequence (1 always). ``search=False``
    (every other dimension pinned): ``auto`` means off, so a fully pinned plan stays that plan."""
    pinned = spec.constraints.sequence_parallel_size
    if pinned is not None or not search or not alst_available(spec.training.deepspeed_version):
        return (pinned or 1,)
    return _degrees(spec.model, spec.hardware.world_size, spec.training.sequence_length, spec.training.attention)


@cache  # a property of the model, GPU count, sequence and attention; asked once per solve
def _degrees(model: ModelShape, world: int, sequence_length: int, attention: str) -> tuple[int, ...]:
    # a degree divides the query heads (UlyssesSPAttentionHF), so only their divisors are candidates:
    # the loop is over the heads, never over a (possibly huge) GPU count
    heads = model.num_attention_heads
    return tuple(
        sp
        for sp in range(1, heads + 1)
        if heads % sp == 0 and sp_violation(model, sp, world, sequence_length, attention) is None
    )


def long_context_choices(spec: Spec, sp: int, checkpointing: Checkpointing, search: bool = False) -> list[LongContext]:
    """Every combination of the three tricks the spec allows at Ulysses degree ``sp``, fewest
    tricks first (so a subset is always priced before its supersets). TiledMLP needs a dense MLP;
    checkpoint offload needs whole-layer checkpointing; with Liger's fused loss there is no
    logits tensor left to tile. ``search=False``, or a DeepSpeed release without ALST: ``auto``
    means off."""
    c = spec.constraints
    auto = [False, True] if search and alst_available(spec.training.deepspeed_version) else [False]
    options = {
        "tiled_loss": [c.tiled_loss] if c.tiled_loss is not None else auto,
        "tiled_mlp": [c.tiled_mlp] if c.tiled_mlp is not None else auto,
        "checkpoint_offload": [c.checkpoint_offload] if c.checkpoint_offload is not None else auto,
    }
    if spec.model.is_moe:
        options["tiled_mlp"] = [False]
    if spec.training.liger_kernel:  # Liger's fused linear cross-entropy already tiles the loss
        options["tiled_loss"] = [False]
    if checkpointing != "full":
        options["checkpoint_offload"] = [v for v in options["checkpoint_offload"] if not v]
    # the reduction dtype is DeepSpeed's to read only under Ulysses (engine.py)
    dtype: Precision = c.seq_parallel_communication_data_type if sp > 1 else "fp32"
    choices = [
        LongContext(sp, tiled_mlp=mlp, tiled_loss=loss, checkpoint_offload=offload, communication_dtype=dtype)
        for loss in options["tiled_loss"]
        for mlp in options["tiled_mlp"]
        for offload in options["checkpoint_offload"]
    ]
    return sorted(choices, key=lambda lc: sum(getattr(lc, name) for name in TRICKS))


def tricks_within(smaller: LongContext, larger: LongContext) -> bool:
    """Whether ``larger`` uses every trick ``smaller`` uses (and the same Ulysses degree)."""
    return all(
        getattr(larger, f.name) >= getattr(smaller, f.name) for f in fields(LongContext) if f.name in TRICKS
    ) and (smaller.sequence_parallel_size == larger.sequence_parallel_size)
