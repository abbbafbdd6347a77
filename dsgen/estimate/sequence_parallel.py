"""Per-rank memory of Arctic Long Sequence Training: Ulysses SP, tiled MLP, tiled loss, checkpoint offload.

DeepSpeed 0.19.8's ``deepspeed/runtime/sequence_parallel/ulysses_sp.py`` and the ALST paper
(Bekman et al., arXiv 2506.13996) define the four pieces; docs/memory-model.md ("Long context")
derives every term below from that source. In short, with ``p`` the Ulysses degree and ``s/p`` the
tokens one rank holds:

- ``UlyssesSPDataLoaderAdapter`` gives each rank ``s/p`` consecutive tokens (and ``shift_labels``),
  so every activation outside attention is the one-GPU inventory of a ``s/p``-token sequence
  (:func:`dsgen.estimate.activations.estimate_activations` at that length).
- ``UlyssesSPAttentionHF`` all-to-alls q, k and v to ``heads/p`` heads over the full sequence
  before the core attention, and the output back. The kernel therefore saves its own q, k, v and
  output (contiguous, head-sharded, full sequence: the same bytes per rank as ``s/p`` tokens of all
  heads), and the output projection saves a second, sequence-sharded copy of the output. When
  there are fewer key/value heads than ``p`` they are replicated (``kv_replication_factor``) to one
  per rank, so k and v cost ``max(kv_heads, p) / kv_heads`` times as much.
- The wrapper passes no attention mask to non-flex kernels (``uattn_wrapper``), and eager attention
  is refused (``register_with_transformers``: "requires a 4D attention_mask (O(n²) memory)").
- ``TiledMLP`` saves only the MLP input (which the norm's output already is) and recomputes the
  MLP shard by shard in backward: ``ceil(s/p / hidden_size)`` shards, as DeepSpeed's docstring and
  ALST tutorial compute them.
- ``TiledFusedLogitsLoss`` runs the loss backward inside its forward, tile by tile, keeping only
  the gradient of its input: no fp32 log-softmax is saved and no full logits exist.
- Checkpoint offload (ArcticTraining's ``CheckpointFunctionWithCPUOffload``) moves every
  checkpointed layer input to host RAM in forward; in backward the GPU holds the one brought
  back for the layer being rebuilt.

Every byte count is a Python int, so a 2**24-token sequence stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.activations import (
    INT64,
    ActivationEstimate,
    estimate_activations,
    liger_loss_transient,
)
from dsgen.estimate.layer_backward import layer_backward_bytes, loss_backward_bytes, mlp_saved_bytes
from dsgen.estimate.layer_forward import layer_forward_bytes
from dsgen.plan import LongContext, Plan, simplest_plan
from dsgen.spec.types import Training
from dsgen.units import FP32, GIB
from dsgen.vocabulary import Checkpointing, Precision

#: ArcticTraining's tiled-loss tile: about 1 GiB of fp32 logits per tile.
LOSS_TILE_BYTES = GIB

#: Families whose transformers attention passes ``position_ids`` and rotary q/k of ``head_dim``
#: through ``ALL_ATTENTION_FUNCTIONS``, which is what ``UlyssesSPAttentionHF`` intercepts.
_NO_ULYSSES = frozenset({"gpt2", "bert"})


def supports_ulysses(shape: ModelShape) -> str | None:
    """Why ``shape`` cannot run under ``UlyssesSPAttentionHF`` (None when it can).

    The wrapper asserts ``position_ids`` in every attention call (GPT-2's learned positions pass
    none), reads one ``head_dim`` for q, k and v (multi-head latent attention has three), and is
    for decoders (``register_with_transformers`` registers a causal wrapper).
    """
    if shape.encoder_only or shape.family in _NO_ULYSSES or shape.learned_position_embeddings:
        return f"{shape.family} passes no position_ids to its attention (UlyssesSPAttentionHF asserts them)"
    if shape.is_mla:
        return (
            "multi-head latent attention has different q/k and v head sizes (UlyssesSPAttentionHF takes one head_dim)"
        )
    return None


def sp_violation(shape: ModelShape, sp: int, world: int, sequence_length: int, attention: str) -> str | None:
    """The first DeepSpeed rule a Ulysses degree ``sp`` breaks, with where DeepSpeed raises."""
    if sp == 1:
        return None
    if world % sp:
        return f"sequence_parallel_size {sp} does not divide the {world} GPUs (parallel_state_sp.initialize_sequence_parallel asserts it)"
    why = supports_ulysses(shape)
    if why:
        return why
    heads, kv = shape.num_attention_heads, shape.num_key_value_heads
    if heads % sp:
        return f"{heads} query heads are not divisible by sequence_parallel_size {sp} (UlyssesSPAttentionHF.__init__ raises)"
    if kv % sp and sp % kv:
        return (
            f"{kv} key/value heads neither divide nor are divisible by sequence_parallel_size {sp} "
            "(UlyssesSPAttentionHF.__init__ raises)"
        )
    if attention == "eager":
        return "eager attention is refused under Ulysses SP (UlyssesSPAttentionHF.register_with_transformers raises: it needs a 4D mask)"
    if sequence_length % sp:
        return (
            f"the sequence of {sequence_length} tokens does not split over sequence_parallel_size {sp} "
            "(UlyssesSPDataLoaderAdapter.refill raises)"
        )
    return None


def tiled_mlp_shards(shape: ModelShape, local_tokens: int) -> int:
    """``ceil(seqlen / hidden_size)``: the shard count of DeepSpeed's ``TiledMLP`` example and tutorial."""
    return max(1, -(-local_tokens // shape.hidden_size))


def loss_tiles(shape: ModelShape, micro_batch: int, local_tokens: int) -> int:
    """Tiles of the tiled loss: about :data:`LOSS_TILE_BYTES` of fp32 logits each."""
    return max(1, -(-micro_batch * local_tokens * shape.vocab_size * FP32 // LOSS_TILE_BYTES))


@dataclass(frozen=True)  # one per candidate plan with long-context choices
class LongContextMemory:
    """What the ALST choices change in one rank's memory (bytes)."""

    activations: ActivationEstimate  # on the GPU at the end of forward
    transient: int  # the loss tile or full logits, or one recomputed layer / MLP shard
    buffers: int  # all-to-all staging and the fp32 SP gradient-reduction copy
    host_per_rank: int  # offloaded checkpoints in host RAM
    # a whole-layer-checkpointed layer's forward: its input and its working set (layer_forward.py);
    # 0 when layers are not checkpointed whole (their forward saves what ``activations`` counts)
    layer_forward: int = 0


def _attention_delta(shape: ModelShape, e: int, sp: int) -> int:
    """Bytes per local token Ulysses adds inside attention: replicated k/v heads and the
    kernel's own output beside the output projection's sequence-sharded copy."""
    if sp == 1:
        return 0
    kv = shape.num_key_value_heads
    replicated = 2 * e * shape.head_dim * (max(kv, sp) - kv)
    output_copy = 0 if shape.family in ("phi3", "gpt_neox") else e * shape.q_size  # those copy already
    return replicated + output_copy


def long_context_memory(
    shape: ModelShape, plan: Plan, training: Training, logits_released: bool = False
) -> LongContextMemory:
    """Per-rank activation memory of any plan, with what its long-context choices change (see the
    module docstring; without them, ``p = 1`` and nothing tiled or offloaded); ``logits_released``
    as in :func:`dsgen.estimate.memory.estimate_memory`.

    All but the gradient-reduction copy is memoised on what it reads (:func:`_long_context_memory`):
    the solver prices each micro-batch and checkpointing mode of a model under many ZeRO stages,
    knobs, offloads and accumulation steps, none of which change its activations."""
    lc = plan.long_context
    activations = _long_context_memory(
        shape,
        lc,
        plan.precision,
        plan.checkpointing,
        plan.micro_batch_size,
        training.sequence_length,
        training.attention,
        training.liger_kernel,
        logits_released,
    )
    reduction = sp_reduction_bytes(shape, plan) if lc.sequence_parallel_size > 1 else 0
    if not reduction:
        return activations
    return LongContextMemory(
        activations=activations.activations,
        transient=activations.transient,
        buffers=activations.buffers + reduction,
        host_per_rank=activations.host_per_rank,
        layer_forward=activations.layer_forward,
    )


@lru_cache(maxsize=4096)
def _long_context_memory(
    shape: ModelShape,
    long_context: LongContext,
    precision: Precision,
    checkpointing: Checkpointing,
    micro_batch_size: int,
    sequence_length: int,
    attention: str,
    liger_kernel: bool,
    logits_released: bool,
) -> LongContextMemory:
    """:func:`long_context_memory` without :func:`sp_reduction_bytes` (the one term that reads the
    ZeRO stage and its bucket), for every plan with these fields: the plan priced has the rest
    (stage, knobs, offloads, accumulation, data and model parallelism: the rank's ``shape``
    already says what AutoTP/AutoEP leave it) at their simplest, as none of them is read here; of
    the training section, the sequence length, the attention kernel and Liger."""
    plan = simplest_plan(
        precision,
        checkpointing=checkpointing,
        micro_batch_size=micro_batch_size,
        data_parallel_size=long_context.sequence_parallel_size,
        long_context=long_context,
    )
    return _plan_long_context_memory(shape, plan, sequence_length, attention, liger_kernel, logits_released)


def _plan_long_context_memory(
    shape: ModelShape, plan: Plan, sequence_length: int, attention: str, liger_kernel: bool, logits_released: bool
) -> LongContextMemory:
    lc = plan.long_context
    sp = lc.sequence_parallel_size
    b, e = plan.micro_batch_size, plan.dtype_bytes
    s_local = sequence_length // sp
    tokens = b * s_local
    full = plan.checkpointing == "full"
    base = estimate_activations(
        shape,
        micro_batch_size=b,
        sequence_length=s_local,
        dtype_bytes=e,
        attention=attention,
        checkpointing=full,
        selective=plan.checkpointing == "selective",
        liger=liger_kernel,
    )
    per_token = _attention_delta(shape, e, sp)
    tiled = lc.tiled_mlp and not shape.is_moe
    shard = None
    if tiled:
        per_token -= mlp_saved_bytes(shape, e, liger_kernel)  # what the layer inventory counted
        shard = -(-tokens // tiled_mlp_shards(shape, s_local))
    backward = layer_backward_bytes(shape, e, tokens, sp, liger_kernel, attention, shard)
    layer_delta = tokens * per_token
    if full:
        layers = base.layers
        rebuilt = base.recompute_working_set + layer_delta
        per_layer = base.per_layer + layer_delta
    else:
        layers = base.layers + shape.num_layers * layer_delta
        rebuilt = base.recompute_working_set
        per_layer = base.per_layer + layer_delta
    host = 0
    if lc.checkpoint_offload and full:
        # every layer's input goes to the host in forward; in backward one comes back at a time,
        # next to the layer rebuilt from it
        checkpoint = tokens * e * shape.hidden_size
        host = shape.num_layers * checkpoint
        layers = 0
        rebuilt += checkpoint
    outside = base.outside_layers
    vocab = shape.vocab_size
    if liger_kernel:  # Liger's fused loss is in the base inventory (no logits saved)
        logits = liger_loss_transient(shape, e, tokens)
    elif lc.tiled_loss:
        # no saved fp32 log-softmax nor shifted labels; the saved input gradient replaces the
        # final norm's output that the LM head would have saved (same size)
        outside -= tokens * (FP32 * vocab + INT64)
        tile = -(-tokens // loss_tiles(shape, b, s_local))
        logits = tile * vocab * (e + 2 * FP32)
    else:
        logits = loss_backward_bytes(shape, e, tokens, logits_released)
    acts = ActivationEstimate(
        per_layer=per_layer, layers=layers, outside_layers=outside, recompute_working_set=rebuilt + backward
    )
    forward = 0
    if full:
        forward = tokens * e * shape.hidden_size + layer_forward_bytes(
            shape, e, tokens, sp, liger_kernel, shard
        )
    return LongContextMemory(
        activations=acts,
        transient=max(logits, acts.recompute_working_set),
        buffers=all_to_all_bytes(shape, plan, s_local),  # + sp_reduction_bytes: long_context_memory
        host_per_rank=host,
        layer_forward=forward,
    )


def all_to_all_bytes(shape: ModelShape, plan: Plan, local_sequence: int) -> int:
    """Staging of one all-to-all beyond the tensors attention then saves: ``_combine_local_sequences``
    exchanges q, k and v one after the other, each through a contiguous send copy
    (``rearrange(...).contiguous()``, after ``repeat_interleave`` for replicated kv heads) and the
    receive buffer of ``_dim_zero_all_to_all``, so at most the largest of the three is in flight
    twice; the received tensors themselves are the kernel's saved q, k, v (in the activations)."""
    sp = plan.sequence_parallel_size
    if sp == 1:
        return 0
    widest = max(shape.q_size, max(shape.num_key_value_heads, sp) * shape.head_dim)
    return 2 * plan.dtype_bytes * plan.micro_batch_size * local_sequence * widest


def sp_reduction_bytes(shape: ModelShape, plan: Plan) -> int:
    """The copy of one reduce bucket in the reduction dtype: with SP the engine reduces gradients in
    ``seq_parallel_communication_data_type`` (``engine.py``: ``self.communication_data_type =
    self._config.seq_parallel_communication_data_type``; DeepSpeed's default ``"fp32"``,
    ``runtime/constants.py``), and ZeRO casts each bucket to it before reducing
    (``stage_1_and_2.py`` / ``stage3.py``: ``tensor.to(self.communication_data_type)``); none when it
    is the training dtype (ALST's recipes set ``bf16``)."""
    lc = plan.long_context
    if lc.sequence_parallel_size == 1 or plan.zero_stage == 0 or lc.communication_dtype == plan.precision:
        return 0
    return lc.communication_bytes * min(plan.knobs.reduce_bucket_size, shape.parameter_count())
