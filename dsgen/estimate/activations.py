"""Bytes autograd holds for backward after one micro-batch's forward pass, per architecture family.

Each family's formula is an inventory of the tensors its Hugging Face ``transformers``
implementation saves for backward (``ctx.save_for_backward`` of every op), counted once per
storage, as the saved-tensor-hook measurement in ``bench/activation_accuracy.py`` counts them.
Terms are bytes per token per layer unless stated; ``e`` is the bytes of the compute dtype.
See docs/memory-model.md for the derivation of each line.

What the inventory assumes (each measured by the bench): the model runs in its training dtype
without autocast (DeepSpeed bf16/fp16/fp32), is called as ``model(input_ids, labels=...)`` with
the config's own ``use_cache`` (so decoders' k and v reach attention as the KV cache's ``torch.cat``
copies), without a padding mask (so sdpa and flash attention run their fused kernels, with
native GQA), and checkpointing is transformers' ``gradient_checkpointing_enable()`` (non-reentrant
``torch.utils.checkpoint`` around each layer).

Conventions: ``h`` hidden size, ``q`` = heads x head_dim, ``kv`` = kv_heads x head_dim, ``f``
intermediate size, ``nh`` heads, ``V`` vocabulary, ``s`` sequence length, ``b`` micro-batch,
``E`` experts, ``k`` experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.units import FP32

INT64 = 8


@dataclass(frozen=True)  # one per candidate plan
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


def _layernorm(h: int, e: int) -> int:
    """native_layer_norm saves its input plus the per-token mean and rstd (fp32 on GPUs; the CPU
    kernel keeps them in the input dtype, 4 bytes less per token)."""
    return e * h + 2 * FP32


def _dropout_mask(n: int, p: float) -> int:
    """A training dropout over ``n`` elements: the CUDA fused kernel (``native_dropout``) saves
    only its bool mask, one byte per element; its output is saved, if at all, by its consumer."""
    return n if p > 0 else 0


def _attention_core(
    shape: ModelShape,
    e: int,
    attention: str,
    micro_batch: int,
    *,
    fused_qkv_storage: int = 0,
    output_copy: bool = False,
    softmax_fp32: bool = True,
    softcap: bool = False,
    selective: bool = False,
) -> tuple[int, int]:
    """(bytes per token, bytes per token per key position) of the attention block after the
    q/k/v projections, including the input of the output projection.

    flash and sdpa (the fused kernels; GQA handled natively, so k and v stay kv-sized): q, k, v,
    the output and the fp32 log-sum-exp. The kernels allocate the output in the memory layout of
    q; when q reaches them laid out (b, s, heads, head_dim), as after llama's rotary or as views of
    a projection, the output projection saves that same storage; when q is contiguous
    (b, heads, s, head_dim), as after the ``torch.cat`` of a partial rotary (gpt_neox, phi3),
    ``transpose(1, 2).contiguous()`` copies it (``output_copy``). ``fused_qkv_storage``: q is a
    view of a fused projection's output, which then stays alive whole (gpt2; in eager too at
    micro-batch 1).

    eager: ``matmul(q, k^T)`` saves q and k, repeated to all heads when grouped (``repeat_kv``
    copies, except a single kv head at micro-batch 1, where the broadcast stays a view); the
    softmax saves its output per key position, fp32 when upcast, plus the 16-bit copy that
    ``matmul(probs, v)`` saves with v; the merged output is saved by the output projection.
    ``softcap`` adds the tanh output Gemma-2 saves for its logit soft-capping. With attention
    dropout, the dropout's bool mask is saved and ``matmul(probs, v)`` saves the dropped
    probabilities instead of the softmax output's 16-bit copy. flash and sdpa drop inside the
    kernel and keep only its RNG state.

    ``selective`` (selective recomputation, Korthikanti et al. 2022): the attention function runs
    under ``torch.utils.checkpoint``, so only its inputs q, k and v (kv-sized: the repeat for
    grouped heads happens inside) and its output, saved by the output projection, remain; the
    scores, softmax, dropout mask, log-sum-exp and any copies are rebuilt in backward.
    """
    q, kv, nh = shape.q_size, shape.kv_size, shape.num_attention_heads
    out = e * q
    q_storage = fused_qkv_storage or e * q
    if selective:
        return q_storage + 2 * e * kv + out, 0
    if attention != "eager":  # flash, sdpa
        return q_storage + 2 * e * kv + out + FP32 * nh + (e * q if output_copy else 0), 0
    grouped = shape.num_key_value_heads < nh
    kv_view = shape.num_key_value_heads == 1 and micro_batch == 1
    k_or_v = e * q if grouped and not kv_view else e * kv
    linear = q_storage + 2 * k_or_v + out
    softmax_out = FP32 if softmax_fp32 else e
    if shape.dropout > 0:
        quadratic = nh * (softmax_out + _dropout_mask(1, shape.dropout) + e)  # softmax, mask, dropped probs
    else:
        quadratic = nh * (softmax_out + (e if softmax_out != e else 0))  # softmax, its 16-bit copy
    if softcap:
        quadratic += nh * e
    return linear, quadratic


def _llama_like(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """llama, mistral, qwen2, mixtral and phi3: two RMSNorms, attention, gated MLP (or MoE block).

    Gated MLP: gate output (saved by SiLU), SiLU output and up output (saved by their product),
    the product (saved by down_proj): ``4·e·f``. phi3 fuses gate/up into one ``2·e·f`` storage
    that both the SiLU and the product save: the same ``4·e·f``. phi3's rotary ends in a
    ``torch.cat`` that leaves q contiguous, so the flash/sdpa output is copied for o_proj, and
    phi3 alone has residual dropouts (two masks).

    Mixtral MoE block (transformers' grouped-mm experts): the fp32 routing softmax ``4·E``, the
    top-k indices ``8·k``, the renormalised fp32 weights and their sum ``4·k + 4``; per routed
    copy of a token: its gathered input ``e·h``, the gate/up output ``2·e·f``, the SiLU output and
    the product ``2·e·f``, the down output saved by the weighting multiply ``e·h``, the fp32
    weight ``4``, three int64 index vectors (gather, weight gather, scatter) ``24``.
    """
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(
        shape, e, attention, micro_batch, output_copy=shape.family == "phi3", selective=selective
    )
    norms = 2 * _rmsnorm_fp32_upcast(h, e)
    if shape.family == "phi3":
        norms += 2 * _dropout_mask(h, shape.dropout)  # resid_attn_dropout, resid_mlp_dropout
    if shape.is_moe:
        k, experts = shape.experts_per_token, shape.num_experts
        router = FP32 * experts + INT64 * k + FP32 * k + FP32
        mlp = router + k * (2 * e * h + 4 * e * f + FP32 + 3 * INT64)
    else:
        mlp = 4 * e * f
    return norms + attn_lin + mlp, attn_quad


def _gemma2(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """Four Gemma RMSNorms (input and pre-feedforward feed linears; the post-attention and
    post-feedforward ones feed the residual add), attention with logit soft-capping in eager
    (every released Gemma-2 config sets ``attn_logit_softcapping``), the tanh-GELU gated MLP
    ``4·e·f`` (gate saved by GELU, GELU output, up, product)."""
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention, micro_batch, softcap=True, selective=selective)
    norms = 2 * _gemma_rmsnorm(h, e, True) + 2 * _gemma_rmsnorm(h, e, False)
    return norms + attn_lin + 4 * e * f, attn_quad


def _gpt2(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """ln_1 (its input and its output, saved by c_attn), attention, ln_2 likewise, the python
    tanh-GELU (``gelu_new``) and two dropout masks.

    flash/sdpa keep the fused c_attn output ``3·e·h`` alive through the q view, next to the
    KV cache's k and v copies; eager copies q for its batched matmul, so c_attn's output is freed,
    except at micro-batch 1, where folding (1, heads) into the matmul's batch is a view. GPT-2
    runs the eager softmax in the compute dtype. ``gelu_new`` saves x, the tanh output, ``0.5·x``
    and ``1 + tanh`` (``4·e·f``), and c_proj saves the GELU output (``e·f``).
    """
    h, f = shape.hidden_size, shape.intermediate_size
    # selective: q reaches the checkpointed attention function as a view of c_attn's output
    fused = 3 * e * h if attention != "eager" or micro_batch == 1 or selective else 0
    attn_lin, attn_quad = _attention_core(
        shape, e, attention, micro_batch, fused_qkv_storage=fused, softmax_fp32=False, selective=selective
    )
    gelu_new = 4 * e * f
    per_token = (
        _layernorm(h, e)
        + e * h  # ln_1 input, its output saved by c_attn
        + attn_lin
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e)
        + e * h  # ln_2
        + gelu_new
        + e * f  # GELU internals, GELU output saved by c_proj
        + _dropout_mask(h, shape.dropout)
    )
    return per_token, attn_quad


def _gpt_neox(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """Parallel residual: both LayerNorms read the same x (stored once, two mean/rstd pairs), each
    output saved by its linear; attention on the partial-rotary ``torch.cat`` q and k (contiguous,
    so the flash/sdpa output is copied for the dense projection); exact GELU input and output
    ``2·e·f``; post-attention and post-MLP dropout masks."""
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention, micro_batch, output_copy=True, selective=selective)
    per_token = _layernorm(h, e) + 2 * FP32 + 2 * e * h + attn_lin + 2 * e * f
    per_token += 2 * _dropout_mask(h, shape.dropout)  # post-attention and post-MLP dropout
    return per_token, attn_quad


def _bert(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """Layer input (saved by the q/k/v projections), q, k and v (separate projections), the
    softmax in the compute dtype, the attention output, the post-attention LayerNorm's input and
    its output (saved by the intermediate dense), exact GELU input and output ``2·e·f``, the output
    LayerNorm's input, two dropout masks."""
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(shape, e, attention, micro_batch, softmax_fp32=False, selective=selective)
    per_token = (
        e * h  # layer input, saved by the q/k/v projections
        + attn_lin
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e)
        + e * h  # attention output LayerNorm: input (residual sum) and output
        + 2 * e * f  # intermediate: GELU input and output
        + _dropout_mask(h, shape.dropout)
        + _layernorm(h, e)  # output LayerNorm input
    )
    return per_token, attn_quad


@lru_cache(maxsize=1024)
def _per_layer(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool = False) -> tuple[int, int]:
    family = shape.family
    if family == "gemma2":
        return _gemma2(shape, e, attention, micro_batch, selective)
    if family == "gpt2":
        return _gpt2(shape, e, attention, micro_batch, selective)
    if family == "gpt_neox":
        return _gpt_neox(shape, e, attention, micro_batch, selective)
    if family == "bert":
        return _bert(shape, e, attention, micro_batch, selective)
    return _llama_like(shape, e, attention, micro_batch, selective)


@lru_cache(maxsize=4096)
def _outside_layers(
    shape: ModelShape, e: int, attention: str, checkpointing: bool, b: int, s: int, selective: bool = False
) -> int:
    """Bytes (for the whole micro-batch) saved outside the transformer layers.

    Per token: int64 token ids (embedding backward) and, for causal LMs, the shifted int64 labels
    (BERT's MLM loss reads the input ids' own storage), the final norm, and the log-softmax output
    of the loss: fp32 for causal LMs (``ForCausalLMLoss`` upcasts the logits), the compute dtype
    for BERT's MLM ``CrossEntropyLoss``. Gemma-2 adds its soft-capped logits' tanh output; GPT-2,
    gpt_neox and BERT an embedding dropout mask.
    Per sequence position (shared by the batch): rotary cos/sin ``2·e·head_dim``, GPT-2's position
    ids, BERT's token-type ids. With checkpointing, the layers' keyword arguments live in the
    checkpoints' recompute closures: the position ids and, for eager decoders, the 4-D additive
    causal mask ``b·s²·e`` (two for Gemma-2: full and sliding window). Selective recomputation
    keeps both too: the mask is an input of every checkpointed attention call (one storage) and
    the decoders pass the position ids on to the attention function as a keyword.
    """
    h, v, tokens = shape.hidden_size, shape.vocab_size, b * s
    if shape.family == "bert":
        embed = _layernorm(h, e) + _dropout_mask(h, shape.dropout)
        head = e * h + e * h + _layernorm(h, e) + e * h  # MLM transform: dense in, GELU in, LN, decoder in
        return tokens * (INT64 + embed + head + e * v) + s * INT64
    ids = 2 * INT64  # token ids, shifted labels
    loss = FP32 * v
    if shape.family == "gpt2":
        per_token = ids + _dropout_mask(h, shape.dropout) + _layernorm(h, e) + e * h + loss
        per_position = INT64  # position ids of the learned position embedding
    elif shape.family == "gpt_neox":
        per_token = ids + _dropout_mask(h, shape.dropout) + _layernorm(h, e) + e * h + loss
        per_position = 2 * e * shape.head_dim  # rotary cos/sin
    elif shape.family == "gemma2":
        per_token = ids + _gemma_rmsnorm(h, e, True) + e * v + loss  # + the soft-capped logits' tanh output
        per_position = 2 * e * shape.head_dim
    else:
        per_token = ids + _rmsnorm_fp32_upcast(h, e) + loss
        per_position = 2 * e * shape.head_dim
    total = tokens * per_token + s * per_position
    if checkpointing or selective:
        if shape.family != "gpt2":  # (BERT returned above)
            total += s * INT64  # position ids passed to every layer (decoders: on to attention too)
        if attention == "eager":
            masks = 2 if shape.family == "gemma2" else 1
            total += masks * b * s * s * e
    return total


def estimate_activations(
    shape: ModelShape,
    *,
    micro_batch_size: int,
    sequence_length: int,
    dtype_bytes: int,
    attention: str,
    checkpointing: bool,
    selective: bool = False,
) -> ActivationEstimate:
    """Saved activations of one micro-batch (see module docstring).

    ``checkpointing``: every layer under ``torch.utils.checkpoint`` (only its input is kept).
    ``selective`` (ignored with ``checkpointing``): only the attention function is recomputed.
    """
    b, s, e = micro_batch_size, sequence_length, dtype_bytes
    selective = selective and not checkpointing
    linear, quadratic = _per_layer(shape, e, attention, b)
    per_layer = b * s * (linear + quadratic * s)
    if checkpointing:
        layers = shape.num_layers * b * s * e * shape.hidden_size  # each layer's input only
        rebuilt = per_layer
    elif selective:
        kept_linear, _ = _per_layer(shape, e, attention, b, selective=True)
        kept = b * s * kept_linear
        layers = shape.num_layers * kept
        rebuilt = per_layer - kept  # one layer's attention internals, rebuilt in its backward
        per_layer = kept
    else:
        layers = shape.num_layers * per_layer
        rebuilt = 0
    outside = _outside_layers(shape, e, attention, checkpointing, b, s, selective)
    return ActivationEstimate(
        per_layer=per_layer,
        layers=layers,
        outside_layers=outside,
        recompute_working_set=rebuilt,
    )
