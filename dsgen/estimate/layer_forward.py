"""The forward working set of one whole-layer-checkpointed transformer layer.

A checkpointed layer runs forward without building a graph (``CheckpointFunction.forward`` calls
the layer under ``torch.no_grad()``), so each intermediate lives only until the next operator
that needs it has run. The most bytes held at once, beyond the layer's input (which the model's
loop still holds), is what the GPU needs in forward on top of the model states and buffers. It
matters when checkpoint offload fills host RAM layer by layer: a GPU that cannot run one layer's
forward runs out in the first layer, before the host has taken more than one checkpoint
(:attr:`dsgen.search.evaluation.Evaluation.fit`).

The stages are those of transformers' decoder layer (``LlamaDecoderLayer`` and the families
written like it) with ``UlyssesSPAttentionHF`` as the attention core; each is counted per local
token and the largest wins. ``bench/backward_peak_accuracy.py`` (one process, SP = 1, fp32 and
bf16) and ``bench/long_context_accuracy.py`` (2 ranks, Ulysses SP = 2) measure them on CPU;
docs/memory-model.md ("A checkpointed layer's forward") gives the sources.
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.activations import INT64, upcast_rmsnorm
from dsgen.units import FP32


def _attention_stage(shape: ModelShape, e: int, sp: int, liger: bool) -> int:
    """Bytes per local token at the attention's high point, beyond the layer input.

    The normed input and the projected q, k, v stay alive (locals of the attention's forward)
    until the attention returns. Without Ulysses the high point is transformers'
    ``apply_rotary_pos_emb``: ``q * cos``, ``rotate_half(q) * sin`` and their sum beside q, or k's
    three beside the rotated q (Liger's rotary kernel writes q and k in place, so only the core's
    output and its contiguous copy follow). Under Ulysses it is ``_partition_global_sequence``:
    the head-sharded q, k and v over the full sequence (k and v replicated to one head per rank
    when there are fewer key/value heads than ``p``), the core's output, the all-to-all's result
    and its contiguous copy, and the ``position_ids`` gathered from every rank
    (``dist.all_gather`` into ``p`` buffers, then ``torch.cat``)."""
    h, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    projections = e * (h + q + 2 * kv)
    if sp > 1:
        kv_sharded = max(shape.num_key_value_heads, sp) * shape.head_dim
        return projections + e * (4 * q + 2 * kv_sharded) + 2 * sp * INT64
    rotary = shape.learned_position_embeddings == 0 and not shape.is_mla and not liger
    if not rotary:
        return projections + 2 * e * q
    # q's three rotary tensors, then k's beside the rotated q (q itself is the function's argument)
    return projections + e * max(3 * q, q + 3 * kv)


def _qk_norm_stage(shape: ModelShape, e: int) -> int:
    """Bytes per local token while the q norm (Qwen3's per-head RMSNorm) upcasts q to fp32: the
    normed input and the projected q, the fp32 copy and ``x * rsqrt(variance)`` beside it, and the
    per-head variance and rsqrt. None in fp32 (``.to(torch.float32)`` returns the tensor itself)."""
    if shape.qk_norm == "none" or e == FP32:
        return 0
    q = shape.q_size
    return e * (shape.hidden_size + q) + 2 * FP32 * q + 2 * FP32 * shape.num_attention_heads


def _mlp_stage(shape: ModelShape, e: int, tokens: int, tiled_shard_tokens: int | None) -> int:
    """Bytes over ``tokens`` local tokens while the MLP runs: the residual sum and its norm, and a
    gated MLP's ``act(gate)``, ``up`` and their product (a GELU MLP's ``fc1`` output and its
    activation). DeepSpeed's ``TiledMLP.forward`` runs one shard at a time and collects the shard
    outputs, then concatenates them: the higher of the last shard (outputs of the others beside
    it) and the concatenation (every shard output and the result). MoE blocks are not priced (a
    lower bound for them)."""
    h, f = shape.hidden_size, shape.intermediate_size
    if shape.is_moe:
        return 2 * e * h * tokens
    width = (3 if shape.gated_mlp else 2) * f
    if tiled_shard_tokens is None:
        return e * (2 * h + width) * tokens
    last_shard = e * (2 * h * tokens + h * (tokens - tiled_shard_tokens) + width * tiled_shard_tokens)
    return max(4 * e * h * tokens, last_shard)


def _norm_stage(shape: ModelShape, e: int) -> int:
    """Bytes per local token while the post-attention RMSNorm runs (transformers' fp32 upcast):
    the residual sum, and two fp32 ``h``-wide tensors at once (the upcast input and its square, or
    the normalised value and the 16-bit result with its weighted copy) and the per-row variance
    and rsqrt."""
    if not upcast_rmsnorm(shape):
        return 0
    return e * shape.hidden_size + 2 * FP32 * shape.hidden_size + 2 * FP32


def layer_forward_bytes(
    shape: ModelShape, e: int, tokens: int, sp: int, liger: bool, tiled_shard_tokens: int | None = None
) -> int:
    """Bytes one whole-layer-checkpointed layer's forward holds at its high point beyond its input,
    over ``tokens`` local tokens; ``tiled_shard_tokens`` as in
    :func:`dsgen.estimate.layer_backward.layer_backward_bytes`. Liger's RMSNorm keeps no fp32 copy
    (its norm stage is not the high point). Multi-head latent attention and learned-position
    families get their projections and the core's output only: a lower bound."""
    per_token = max(
        _attention_stage(shape, e, sp, liger),
        _qk_norm_stage(shape, e) if not liger else 0,
        _norm_stage(shape, e) if not liger else 0,
    )
    return max(per_token * tokens, _mlp_stage(shape, e, tokens, tiled_shard_tokens))
