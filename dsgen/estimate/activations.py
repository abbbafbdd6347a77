"""Bytes autograd holds for backward after one micro-batch's forward pass, per architecture family.

Each family's formula is an inventory of the tensors its Hugging Face ``transformers``
implementation saves for backward (``ctx.save_for_backward`` of every op), counted once per
storage, as the saved-tensor-hook measurement in ``bench/activation_accuracy.py`` counts them.
Terms are bytes per token per layer unless stated; ``e`` is the bytes of the compute dtype.
See docs/memory-model.md for the derivation of each line.

Conventions: ``h`` hidden size, ``q`` = heads x head_dim, ``kv`` = kv_heads x head_dim, ``f``
intermediate size, ``nh`` heads, ``V`` vocabulary, ``s`` sequence length, ``b`` micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.catalog.model_shape import ModelShape

FP32 = 4


@dataclass(frozen=True)
class ActivationEstimate:
    """Saved activations for one micro-batch (bytes), split where the solver needs the parts."""

    per_layer: int  # one transformer layer without checkpointing
    layers: int  # all layers as held at the end of forward (checkpointed or not)
    outside_layers: int  # embeddings, final norm, loss
    recompute_working_set: int  # one layer's activations, rebuilt during backward when checkpointing

    @property
    def total(self) -> int:
        return self.layers + self.outside_layers


def _rmsnorm_fp32_upcast(h: int, e: int, consumer_saves_output: bool = True) -> int:
    """Llama-style RMSNorm: x upcast to fp32 (saved by pow and mul), rsqrt per token, the
    normalised value cast back (saved by the weight multiply) and, usually, the output saved by
    the next linear. In fp32 the casts are no-ops but the same number of storages remain."""
    return FP32 * h + FP32 + e * h + (e * h if consumer_saves_output else 0)


def _gemma_rmsnorm(h: int, e: int, consumer_saves_output: bool) -> int:
    """Gemma RMSNorm computes ``norm(x.float()) * (1 + w)`` in fp32: fp32 x, rsqrt, fp32 normed."""
    return FP32 * h + FP32 + FP32 * h + (e * h if consumer_saves_output else 0)


def _attention_core(shape: ModelShape, e: int, attention: str, fused_qkv_storage: int = 0) -> tuple[int, int]:
    """(bytes per token, bytes per token per key position) of the attention block after the
    q/k/v projections and before the output projection's input.

    flash: q, k, v, output and the fp32 log-sum-exp; the output is reshaped in place so the
    output projection saves the same storage. sdpa: same, but the output is transposed into a
    new contiguous tensor for the output projection. eager: q, repeated k and v, the fp32
    softmax (and its 16-bit copy), and the merged output.
    """
    q, kv, nh = shape.q_size, shape.kv_size, shape.num_attention_heads
    v_storage = fused_qkv_storage or e * kv
    lse = FP32 * nh
    if attention == "flash":
        return e * q + e * kv + v_storage + e * q + lse, 0
    if attention == "sdpa":
        return e * q + e * kv + v_storage + e * q + lse + e * q, 0
    # eager: matmul(q, k^T) saves q and k (k repeated to all heads), softmax saves its fp32 output,
    # the cast back to the compute dtype is saved by matmul(probs, v) together with repeated v.
    linear = e * q + e * q + e * q + e * q  # q, k repeated, v repeated, merged output
    if shape.num_key_value_heads == shape.num_attention_heads:
        linear = e * q + e * kv + v_storage + e * q
    quadratic = nh * (FP32 + (e if e < FP32 else 0))
    return linear, quadratic


def _llama_like(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    h, f = shape.hidden_size, shape.intermediate_size
    fused = e * (shape.q_size + 2 * shape.kv_size) if shape.family == "phi3" else 0
    attn_lin, attn_quad = _attention_core(shape, e, attention, fused)
    norms = 2 * _rmsnorm_fp32_upcast(h, e)
    if shape.is_moe:
        k, experts = shape.experts_per_token, shape.num_experts
        router = e * experts + FP32 * experts  # router logits, fp32 routing softmax
        mlp = router + k * (2 * e * h + 4 * e * f)
    elif shape.family == "phi3":
        mlp = 2 * e * f + e * f + e * f  # fused gate_up storage, activation output, product
    else:
        mlp = 4 * e * f  # gate, activation output, up, product
    return norms + attn_lin + mlp, attn_quad


def _gemma2(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention)
    norms = 2 * _gemma_rmsnorm(h, e, True) + 2 * _gemma_rmsnorm(h, e, False)
    return norms + attn_lin + 4 * e * f, attn_quad


def _layernorm(h: int, e: int) -> int:
    """native_layer_norm saves its input plus fp32 mean and rstd per token."""
    return e * h + 2 * FP32


def _dropout_mask(h: int, p: float) -> int:
    return h if p > 0 else 0  # one bool byte per element


def _gpt2(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention, fused_qkv_storage=3 * e * h)
    # the fused c_attn output holds q, k and v: count its storage once, not q and k again
    attn_lin -= e * shape.q_size + e * shape.kv_size
    gelu_new = 4 * e * f  # x, tanh output, 0.5*x, (1 + tanh): the python tanh-GELU formula
    per_token = (
        _layernorm(h, e) + e * h  # ln_1 input, its output saved by c_attn
        + attn_lin
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e) + e * h  # ln_2
        + gelu_new + e * f  # GELU internals, GELU output saved by c_proj
        + _dropout_mask(h, shape.dropout)
    )
    return per_token, attn_quad


def _gpt_neox(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention, fused_qkv_storage=3 * e * h)
    # parallel residual: both layer norms read the same x, stored once
    per_token = _layernorm(h, e) + 2 * FP32 + 2 * e * h + attn_lin + 2 * e * f
    return per_token, attn_quad


def _bert(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention)
    per_token = (
        e * h  # layer input, saved by the q/k/v projections
        + attn_lin
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e)  # attention output LayerNorm input (residual sum)
        + 2 * e * f  # intermediate: GELU input and output
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e)  # output LayerNorm input
    )
    return per_token, attn_quad


def _per_layer(shape: ModelShape, e: int, attention: str) -> tuple[int, int]:
    family = shape.family
    if family == "gemma2":
        return _gemma2(shape, e, attention)
    if family == "gpt2":
        return _gpt2(shape, e, attention)
    if family == "gpt_neox":
        return _gpt_neox(shape, e, attention)
    if family == "bert":
        return _bert(shape, e, attention)
    return _llama_like(shape, e, attention)


def _outside_layers(shape: ModelShape, e: int) -> int:
    """Bytes per token saved outside the transformer layers: embeddings, final norm, loss."""
    h, v = shape.hidden_size, shape.vocab_size
    ids = 8  # int64 token ids kept for the embedding backward
    loss = FP32 * v  # log_softmax output of the fp32 cross-entropy
    if shape.family == "bert":
        embed = _layernorm(h, e) + _dropout_mask(h, shape.dropout) + e * h
        head = e * h + e * h + _layernorm(h, e) + e * h  # MLM transform: dense in, GELU in, LN, decoder in
        return ids + embed + head + loss
    if shape.family in ("gpt2",):
        embed = _dropout_mask(h, shape.dropout)
        return ids + embed + _layernorm(h, e) + e * h + loss
    if shape.family == "gpt_neox":
        return ids + _layernorm(h, e) + e * h + loss
    rope = 2 * e * shape.head_dim  # cos and sin, shared by all layers
    if shape.family == "gemma2":
        return ids + rope + _gemma_rmsnorm(h, e, True) + e * v + loss  # + softcapped logits (tanh output)
    return ids + rope + _rmsnorm_fp32_upcast(h, e) + loss


def estimate_activations(
    shape: ModelShape,
    *,
    micro_batch_size: int,
    sequence_length: int,
    dtype_bytes: int,
    attention: str,
    checkpointing: bool,
) -> ActivationEstimate:
    """Saved activations of one micro-batch (see module docstring)."""
    b, s, e = micro_batch_size, sequence_length, dtype_bytes
    linear, quadratic = _per_layer(shape, e, attention)
    per_layer = b * s * (linear + quadratic * s)
    if checkpointing:
        layers = shape.num_layers * b * s * e * shape.hidden_size  # each layer's input only
    else:
        layers = shape.num_layers * per_layer
    outside = b * s * _outside_layers(shape, e)
    return ActivationEstimate(
        per_layer=per_layer,
        layers=layers,
        outside_layers=outside,
        recompute_working_set=per_layer if checkpointing else 0,
    )
