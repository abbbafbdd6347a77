"""Gradients alive while one transformer layer runs backward, and the loss backward's working set.

A layer's saved tensors are counted by :mod:`dsgen.estimate.activations`; this module adds what
its backward allocates on top of them before they are released. Every plan pays it: with
checkpointing the layer is rebuilt first and these gradients come on top of the rebuilt tensors
(one layer's working set, ``ActivationEstimate.recompute_working_set``); without it they are the
backward's working set beside the saved activations. ``bench/backward_peak_accuracy.py`` measures
both against the peak bytes a real backward holds on CPU. docs/memory-model.md ("Rebuilt
layer's backward") gives the sources.
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.activations import liger_rmsnorm, liger_swiglu, rmsnorm_fp32_upcast, upcast_rmsnorm
from dsgen.units import FP32


def mlp_saved_bytes(shape: ModelShape, e: int, liger: bool) -> int:
    """Bytes per token a dense MLP saves for backward beyond its input (4·e·f gated, 2·e·f GELU;
    3·e·f with Liger's SwiGLU)."""
    if liger:
        return liger_swiglu(e, shape.intermediate_size)
    return (4 if shape.gated_mlp else 2) * e * shape.intermediate_size


def _attention_backward(shape: ModelShape, e: int, sp: int, attention: str) -> int:
    """Bytes per local token of gradients alive while one layer's attention runs backward (fused
    kernels): the layer output's gradient on the residual path ``e·h``; the attention output's
    gradient ``e·q`` (under Ulysses the head-sharded one: the all-to-all's input is freed once it
    has run); dq, dk and dv (k and v replicated to one head per rank when there are fewer
    key/value heads than ``p``); the kernel's own backward buffers (:func:`_kernel_workspace`)."""
    q = shape.q_size
    kv = max(shape.num_key_value_heads, sp) * shape.head_dim
    return e * shape.hidden_size + e * q + e * (q + 2 * kv) + _kernel_workspace(shape, e, sp, attention)


def _kernel_workspace(shape: ModelShape, e: int, sp: int, attention: str) -> int:
    """Bytes per local token the attention kernel allocates for its backward.

    Grouped-query attention here means a rank's query heads outnumber its key/value heads
    (``heads != max(kv_heads, p)``). FlashAttention-2 (``csrc/flash_attn/flash_api.cpp``
    ``mha_bwd``): ``dq_accum`` (fp32, q-wide), ``softmax_d`` (fp32, one per head) and, for
    grouped-query attention, ``dk_expanded`` and ``dv_expanded`` (16-bit, over every query head,
    summed into dk and dv at the end). FlashAttention-3 (``hopper/flash_api.cpp`` ``mha_bwd``):
    ``dq_accum``, ``softmax_d`` and ``softmax_lse_log2`` (fp32), and for grouped-query attention
    ``dk_accum`` and ``dv_accum`` (fp32, over the key/value heads only). SDPA is priced with
    FlashAttention-2's accumulators and without the expansion (what it does for grouped-query
    attention depends on its backend; ``bench/backward_peak_accuracy.py`` measures the CPU one)."""
    q, heads = shape.q_size, shape.num_attention_heads
    kv_heads = max(shape.num_key_value_heads, sp)
    grouped = kv_heads != heads
    if attention == "flash3":
        return FP32 * (q + 2 * heads + (2 * kv_heads * shape.head_dim if grouped else 0))
    return FP32 * (q + heads) + (2 * e * q if grouped and attention == "flash" else 0)


def _freed_before_attention(shape: ModelShape, e: int, sp: int, liger: bool, mlp_saved: int) -> int:
    """Bytes per token of one layer's saved tensors released before its attention runs backward:
    the MLP's, the post-attention norm's (transformers: fp32 input, rstd, normalised value and
    output; Liger: input, rstd and output) and, under Ulysses, the output projection's
    sequence-sharded input."""
    h = shape.hidden_size
    norm = liger_rmsnorm(h, 1, e, output_saved=True) if liger else rmsnorm_fp32_upcast(h, e)
    return mlp_saved + norm + (e * shape.q_size if sp > 1 else 0)


def _norm_backward(shape: ModelShape, e: int) -> int:
    """Bytes per token beyond the rebuilt layer while its post-attention RMSNorm (transformers'
    fp32 upcast) runs backward, the MLP's saved tensors freed: the residual gradient ``e·h`` and
    five fp32 ``h``-wide temporaries (the product rule's two gradients through ``x·rsqrt``, the
    mean's and the square's backward and its doubling), less the norm's output and normalised
    value (saved for the MLP and the weight multiply, released once those ran backward) and its
    consumed rstd. Measured exactly in fp32 and bf16 (``bench/backward_peak_accuracy.py``); the
    high point of a TiledMLP layer, whose MLP phase is small."""
    h = shape.hidden_size
    return e * h + 5 * FP32 * h - 2 * e * h - FP32


def _mlp_backward(shape: ModelShape, e: int, liger: bool) -> int:
    """Bytes per token of gradients alive while an untiled gated MLP runs backward: the residual
    gradient ``e·h``, down_proj's input gradient ``e·f`` and, with transformers' MLP, the
    gradients of the SiLU output and of up before the product's inputs are freed ``e·f`` more
    (Liger's SwiGLU backward writes them into its saved gate and up: ``swiglu_backward``)."""
    return e * shape.hidden_size + (1 if liger else 2) * e * shape.intermediate_size


def layer_backward_bytes(
    shape: ModelShape,
    e: int,
    tokens: int,
    sp: int,
    liger: bool,
    attention: str,
    tiled_shard_tokens: int | None = None,
) -> int:
    """Gradient bytes one layer's backward holds at its high point, over ``tokens`` local tokens.

    The MLP runs backward first, while every saved tensor of the layer is still alive; then the
    post-attention norm, the MLP's saved tensors freed; then the attention, once the MLP's and the
    norm's saved tensors are freed: the largest of the three working sets counts.

    ``tiled_shard_tokens``: the layer's MLP is DeepSpeed's ``TiledMLP``, which saves only its
    input and rebuilds one shard of that many tokens at a time (with transformers' MLP even under
    Liger: ArcticTraining's ``LigerModelFactory`` turns Liger's SwiGLU off when TiledMLP patches
    the MLP), beside the residual gradient and the input gradient it fills
    (``x_grad = torch.zeros_like(x)``). MoE blocks are not priced here (the MoE layer
    inventory carries their expert working set).
    """
    h = shape.hidden_size
    if tiled_shard_tokens is not None:
        mlp_saved = 0
        # one shard rebuilt and running backward, as an untiled MLP does over all tokens, except
        # that the shard's output (held by TiledMLP.backward's ``output``) takes the residual
        # gradient's place: that gradient and x_grad span every token
        mlp = 2 * tokens * e * h + tiled_shard_tokens * (
            mlp_saved_bytes(shape, e, False) + _mlp_backward(shape, e, False)
        )
    elif shape.is_moe:
        mlp_saved = mlp_saved_bytes(shape, e, liger)
        mlp = 0
    else:
        mlp_saved = mlp_saved_bytes(shape, e, liger)
        mlp = tokens * _mlp_backward(shape, e, liger)
    # measured for transformers' RMSNorm; an MoE block frees its experts' saved tensors (far more
    # than a dense MLP's) before the norm runs backward
    priced_norm = upcast_rmsnorm(shape) and not liger and not shape.is_moe
    norm = tokens * (_norm_backward(shape, e) - mlp_saved) if priced_norm else 0
    freed = _freed_before_attention(shape, e, sp, liger, mlp_saved)
    return max(mlp, norm, tokens * (_attention_backward(shape, e, sp, attention) - freed))


def loss_backward_bytes(shape: ModelShape, dtype_bytes: int, tokens: int, logits_released: bool) -> int:
    """Beyond the saved fp32 log-softmax, the loss backward holds its fp32 output gradient and
    its input gradient (``ForCausalLMLoss`` upcasts the logits), and, when the loop still holds
    the model's output (``out = model(...); engine.backward(out.loss)``), the 16-bit logits. The
    HF Trainer's ``compute_loss`` returns the loss alone, so they are freed before backward."""
    return tokens * shape.vocab_size * ((0 if logits_released else dtype_bytes) + 2 * FP32)
