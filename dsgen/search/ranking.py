"""Rank feasible plans the way an expert would choose among them.

The rule, in order (docs/how-dsgen-chooses.md):

1. **Never a dominated plan.** A plan slower *and* larger (GPU peak, host peak) than another
   feasible plan is never placed ahead of it (:func:`undominated`).
2. **Within the step-time model's error, what fails least.** Plans predicted within
   ``STEP_TIME_TIE_BAND`` of the fastest remaining plan are ties the step-time model cannot
   separate. Of those, a plan with room to spare below the safe line (GPU fill at or below
   ``dsgen.search.verdict.ROOM_LINE``) goes before one close to it, then the plan with fewer moving parts
   (offload, model parallelism, a version pin), then the simpler plan (fewer changes from a plain
   DeepSpeed run), then the faster one.

:func:`decided_by` names the part of the rule that chose the first plan, for ``explain``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import takewhile

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.plan import ZeroKnobs
from dsgen.search.evaluation import Evaluation
from dsgen.search.knob_variants import default_knobs
from dsgen.search.verdict import ROOM_LINE
from dsgen.vocabulary import CHECKPOINTING_MODES, OFFLOAD_DEVICES

# ties break toward the simpler plan: no offload, then CPU, then NVMe; no recomputation, then
# attention only, then whole layers (the vocabulary lists them simplest first)
OFFLOAD_ORDER = {device: rank for rank, device in enumerate(OFFLOAD_DEVICES)}
CHECKPOINTING_ORDER = {mode: rank for rank, mode in enumerate(CHECKPOINTING_MODES)}


def rank_key(e: Evaluation) -> tuple[float, int, int, int, int, int, int, int]:
    """Predicted step time first; equal times in a fixed order, simpler plans first, so every
    ranking is deterministic."""
    p = e.plan
    return (
        round(e.step.total_s, 9),
        OFFLOAD_ORDER[p.offload_param],
        OFFLOAD_ORDER[p.offload_optimizer],
        p.zero_stage,
        CHECKPOINTING_ORDER[p.checkpointing],
        -p.micro_batch_size,
        p.tensor_parallel_size,
        p.expert_parallel_size,
    )


def simplicity_key(e: Evaluation, base: ZeroKnobs) -> tuple[float, ...]:
    """How far a plan is from the plainest DeepSpeed run, most important first: offload (parameters,
    then optimizer, then the offloaded share), ZeRO stage, quantized ZeRO++ (qwZ/qgZ change the
    numerics), hpZ, recomputation, then how many ZeRO knobs differ from the stage's first (fastest,
    least tuned) setting, ``base`` (:func:`default_knobs`), then the long-context tricks (each one
    a change to the training script) and the Ulysses degree. Offload comes before the stage because
    it moves the step onto the host: host RAM, pinned memory and DeepSpeedCPUAdam become part of
    what can fail. Model parallelism (AutoTP, AutoEP) comes right after offload: it changes the
    model's layout on the GPUs, the data loader (TP peers share batches) and the checkpoints."""
    p = e.plan
    k = p.knobs
    tuned = sum(getattr(k, name) != getattr(base, name) for name in KNOB_FIELDS)
    return (
        OFFLOAD_ORDER[p.offload_param],
        OFFLOAD_ORDER[p.offload_optimizer],
        p.offload_ratio if p.offload_optimizer != "none" else 0.0,
        p.tensor_parallel_size * p.expert_parallel_size,
        p.zero_stage,
        int(k.quantized_weights or k.quantized_gradients),
        int(k.hpz_partition_size > 1),
        CHECKPOINTING_ORDER[p.checkpointing],
        tuned,
        sum((p.long_context.tiled_mlp, p.long_context.tiled_loss, p.long_context.checkpoint_offload)),
        p.long_context.sequence_parallel_size,
    )


#: ZeroKnobs fields counted by :func:`simplicity_key` (ZeRO++ is counted on its own).
KNOB_FIELDS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "sub_group_size",
)


#: Only the first plans of a ranking are placed by the tie rule (``solve --top`` shows at most a few);
#: the rest follow in predicted step time. Bounds the cost on a search with thousands of feasible plans.
TIE_RANKED = 32


def ties_fastest(step_s: float, fastest_s: float, band: float = STEP_TIME_TIE_BAND) -> bool:
    """Whether a plan predicted at ``step_s`` is a tie with the fastest feasible plan: the step-time
    model cannot tell them apart (:func:`rank_within_error`)."""
    return step_s <= fastest_s * (1 + band)


def dominates(a: Evaluation, b: Evaluation) -> bool:
    """``a`` is no slower and no larger than ``b`` (GPU peak, host peak), and better in one."""
    sa, sb = a.step.total_s, b.step.total_s
    ga, gb = a.memory.gpu.total, b.memory.gpu.total
    ha, hb = a.memory.cpu.total, b.memory.cpu.total
    return sa <= sb and ga <= gb and ha <= hb and (sa < sb or ga < gb or ha < hb)


def undominated(evaluations: Iterable[Evaluation]) -> list[Evaluation]:
    """The plans no other plan of ``evaluations`` dominates, in step-time order.

    A skyline pass: in step-time order only an earlier (no slower) plan can dominate a later one,
    and only one already kept need be asked (a dropped plan's dominator dominates what it would)."""
    kept: list[Evaluation] = []
    for e in sorted(evaluations, key=rank_key):
        if not any(dominates(k, e) for k in kept):
            kept = [k for k in kept if not dominates(e, k)] + [e]  # equal step times: e may beat k
    return sorted(kept, key=rank_key)


def has_room(e: Evaluation) -> bool:
    """Predicted at or below the room line (``dsgen.search.verdict.ROOM_LINE``), with room to spare below
    the safe line: below it far fewer published runs ran out of memory than above it."""
    return e.fit.fill <= ROOM_LINE


def moving_parts(e: Evaluation) -> int:
    """What can fail at launch beyond a plain DeepSpeed run: each offload (host RAM, pinned memory,
    DeepSpeedCPUAdam), model parallelism (the model's layout on the GPUs, shared batches, sharded
    checkpoints), AutoEP's transformers version bound (a version pin), and Ulysses (the data loader
    and the attention change)."""
    p = e.plan
    return (
        (p.offload_param != "none")
        + (p.offload_optimizer != "none")
        + (p.tensor_parallel_size > 1)
        + 2 * (p.expert_parallel_size > 1)
        + (p.long_context.sequence_parallel_size > 1)
    )


def choice_key(e: Evaluation, base: ZeroKnobs) -> tuple[object, ...]:
    """The order of plans within the tie band: room to spare, moving parts, simplicity, speed."""
    return (not has_room(e), moving_parts(e), simplicity_key(e, base), rank_key(e))


def _bases(evaluations: Iterable[Evaluation], shape: ModelShape) -> dict[int, ZeroKnobs]:
    return {stage: default_knobs(shape, stage) for stage in {e.plan.zero_stage for e in evaluations}}


def rank_within_error(
    evaluations: list[Evaluation], shape: ModelShape, band: float = STEP_TIME_TIE_BAND, places: int = TIE_RANKED
) -> list[Evaluation]:
    """Feasible plans in the order the solver recommends them (the module's rule).

    At each place the candidates are the remaining plans predicted within ``band`` of the fastest
    remaining one that no other remaining plan dominates (a dominator is never slower, so it is in
    the band too); the first by :func:`choice_key` takes the place. Repeated for the first
    ``places`` places (:data:`TIE_RANKED`); the rest follow in predicted step time."""
    remaining = sorted(evaluations, key=rank_key)
    bases = _bases(remaining, shape)
    ranked: list[Evaluation] = []
    while remaining and len(ranked) < places:
        limit = remaining[0].step.total_s * (1 + band)
        window = takewhile(lambda e: e.step.total_s <= limit, remaining)  # noqa: B023 (consumed at once)
        pick = min(undominated(window), key=lambda e: choice_key(e, bases[e.plan.zero_stage]))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked + remaining


def decided_by(ranked: Sequence[Evaluation], shape: ModelShape, band: float = STEP_TIME_TIE_BAND) -> str:
    """One line on which part of the rule chose ``ranked[0]`` over the fastest plan that fits."""
    if not ranked:
        return ""
    chosen = ranked[0]
    window = [e for e in ranked if ties_fastest(e.step.total_s, min(x.step.total_s for x in ranked), band)]
    front = undominated(window)
    dropped = len(window) - len(front)
    fastest = front[0]
    note = f"; {dropped} plan{'s' if dropped != 1 else ''} slower and larger than another dropped" if dropped else ""
    if fastest is chosen:
        return f"chosen as the fastest plan that fits{note}"
    why = _why_not_fastest(chosen, fastest, shape)
    return (
        f"chosen over the fastest plan ({fastest.step.total_s:.2f} s/step, within the model's {band:.0%} "
        f"step-time error) because {why}{note}"
    )


def _why_not_fastest(chosen: Evaluation, fastest: Evaluation, shape: ModelShape) -> str:
    """The first part of :func:`choice_key` on which ``chosen`` beats ``fastest``."""
    if has_room(chosen) != has_room(fastest):
        return (
            f"it has room to spare ({chosen.fit.fill:.0%} of GPU memory, at or below {ROOM_LINE:.0%}) "
            f"where the fastest is close to the safe line ({fastest.fit.fill:.0%})"
        )
    if moving_parts(chosen) != moving_parts(fastest):
        return (
            f"it has fewer moving parts ({moving_parts(chosen)} against {moving_parts(fastest)}: offload, "
            "model parallelism, version pins)"
        )
    base = _bases([chosen, fastest], shape)
    if simplicity_key(chosen, base[chosen.plan.zero_stage]) != simplicity_key(fastest, base[fastest.plan.zero_stage]):
        return (
            "it is the simpler plan (less offload, lower stage, no quantization, less recomputation, fewer tuned knobs)"
        )
    return "it is the faster of equally simple plans"
