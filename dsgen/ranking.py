"""Rank feasible plans within the step-time model's measured error: near-ties go to the simpler plan."""

from __future__ import annotations

from functools import partial
from itertools import takewhile

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from dsgen.evaluation import Evaluation
from dsgen.knob_variants import default_knobs
from dsgen.plan import ZeroKnobs
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


def _within(limit: float, e: Evaluation) -> bool:
    return e.step.total_s <= limit


def rank_within_error(
    evaluations: list[Evaluation], shape: ModelShape, band: float = STEP_TIME_TIE_BAND, places: int = TIE_RANKED
) -> list[Evaluation]:
    """Feasible plans in the order the solver recommends them, respecting the model's own error.

    Plans predicted within ``band`` (relative) of the fastest remaining plan are ties the step-time
    model cannot separate (docs/throughput-model.md, "Ranking within the model's error"); of those
    the simplest (:func:`simplicity_key`) goes first, the faster of equally simple ones on top.
    Repeated for the first ``places`` places (:data:`TIE_RANKED`)."""
    remaining = sorted(evaluations, key=rank_key)
    bases = {stage: default_knobs(shape, stage) for stage in {e.plan.zero_stage for e in remaining}}
    ranked: list[Evaluation] = []
    while remaining and len(ranked) < places:
        window = takewhile(partial(_within, remaining[0].step.total_s * (1 + band)), remaining)  # by time
        pick = min(window, key=lambda e: (simplicity_key(e, bases[e.plan.zero_stage]), rank_key(e)))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked + remaining
