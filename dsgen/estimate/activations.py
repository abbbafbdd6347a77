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

from dsgen.catalog.model_shape import TRAIT_FAMILIES, ModelShape
from dsgen.units import FP32

INT64 = 8

#: Families whose Liger-Kernel patch (``liger_kernel/transformers/monkey_patch.py``:
#: ``apply_liger_kernel_to_llama`` / ``_mistral`` / ``_qwen2`` / ``_qwen3``) swaps RMSNorm, the
#: gated MLP, RoPE and the loss for its Triton kernels and keeps the layer layout inventoried here.
LIGER_FAMILIES: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def liger_modelled(shape: ModelShape) -> bool:
    """Whether Liger-Kernel's memory is modelled for ``shape``: a dense model of :data:`LIGER_FAMILIES`."""
    return shape.family in LIGER_FAMILIES and not shape.is_moe


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


def rmsnorm_fp32_upcast(h: int, e: int, consumer_saves_output: bool = True) -> int:
    """Llama-style RMSNorm: x upcast to fp32 (saved by pow and mul), rsqrt per token, the
    normalised value cast back (saved by the weight multiply) and, usually, the output saved by
    the next linear. In fp32 the casts are no-ops but the same number of storages remain."""
    return FP32 * h + FP32 + e * h + (e * h if consumer_saves_output else 0)


def liger_rmsnorm(width: int, rows: int, e: int, output_saved: bool) -> int:
    """``LigerRMSNormFunction`` (``liger_kernel/ops/rms_norm.py``) saves its input ``X`` and the
    fp32 ``RSTD`` per row, no fp32 copy nor normalised value; its output is saved only by a
    consuming linear. The input is a storage of its own except a checkpointed layer's input
    (see :func:`estimate_activations`)."""
    return e * width + FP32 * rows + (e * width if output_saved else 0)


def liger_swiglu(e: int, f: int) -> int:
    """``LigerSiLUMulFunction`` (``liger_kernel/ops/swiglu.py``) saves the gate and up outputs and
    recomputes the SiLU in backward; down_proj saves the product: ``3·e·f`` against ``4·e·f``."""
    return 3 * e * f


def _gemma_rmsnorm(h: int, e: int, consumer_saves_output: bool) -> int:
    """Gemma RMSNorm computes ``norm(x.float()) * (1 + w)`` in fp32: fp32 x, rsqrt, fp32 normed."""
    return FP32 * h + FP32 + FP32 * h + (e * h if consumer_saves_output else 0)


def upcast_rmsnorm(shape: ModelShape) -> bool:
    """The layer's norms are transformers' Llama-style RMSNorm (input upcast to fp32)."""
    return shape.family not in _OWN_NORM_FAMILIES


def _rebuilt_layer_correction(shape: ModelShape, e: int, liger: bool) -> int:
    """Per token, how a checkpointed layer rebuilt in backward differs from its forward inventory.

    Plus its output ``e·h``: transformers checkpoints with ``torch.utils.checkpoint``'s reentrant
    ``CheckpointFunction`` (its default), whose ``backward`` reruns the layer and holds the
    ``outputs`` while autograd runs backward through them. Minus the first norm's saved input
    when that storage is the checkpoint itself (counted with the layer inputs): Liger's RMSNorm
    saves ``X`` (``e·h``); transformers' fp32 upcast is a no-op in fp32 training (``4·h``). Both
    measured by ``bench/backward_peak_accuracy.py``.
    """
    h = shape.hidden_size
    if liger:
        first_norm_input = e * h
    elif e == FP32 and upcast_rmsnorm(shape):
        first_norm_input = FP32 * h
    else:
        first_norm_input = 0
    return e * h - first_norm_input


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


def _llama_like(
    shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool, liger: bool = False
) -> tuple[int, int]:
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

    ``liger``: Liger's RMSNorm and SwiGLU (:func:`liger_rmsnorm`, :func:`liger_swiglu`); its
    RoPE rotates q and k in place (``LigerRopeFunction`` saves only cos and sin), so attention
    saves the same q and k storages as with transformers' rotary.
    """
    h, f = shape.hidden_size, shape.intermediate_size
    attn_lin, attn_quad = _attention_core(
        shape, e, attention, micro_batch, output_copy=shape.family == "phi3", selective=selective
    )
    if liger:
        return 2 * liger_rmsnorm(h, 1, e, True) + attn_lin + liger_swiglu(e, f), attn_quad
    norms = 2 * rmsnorm_fp32_upcast(h, e)
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


# ---- today's decoders (issue 17): one inventory driven by the shape's traits ----------------------
# Families whose RMSNorm multiplies by the weight in fp32 and casts after (olmo2 ``(w * x).to(dtype)``,
# gpt_oss, Gemma's ``x * (1 + w)``): the normalised value is saved in fp32, not the compute dtype.
_FP32_WEIGHT_NORM = frozenset({"olmo2", "olmo3", "gpt_oss", "gemma3_text"})
# Families whose two norms come after attention and after the MLP (Olmo2DecoderLayer): the layer
# input and the residual sum are what the projections save, and the norm outputs feed residual adds.
_POST_NORM = frozenset({"olmo2", "olmo3"})
# Families whose first norm is not transformers' fp32-upcast RMSNorm over the layer input
# (LayerNorm, Gemma's RMSNorm, fp32-weight norms, post-norm layers): :func:`_rebuilt_layer_correction`
# leaves their first norm's saved tensors as the inventory counts them.
_OWN_NORM_FAMILIES = frozenset({"gpt2", "bert", "gpt_neox", "gemma2"}) | _FP32_WEIGHT_NORM | _POST_NORM
# Families with a second rotary table (other base) for their sliding-window layers.
_LOCAL_ROPE = frozenset({"gemma3_text", "olmo3"})
# MoE routers (the tensors before the experts, per token): deepseek_v3 and glm4_moe score in fp32 on
# an fp32 copy of the input with a sigmoid, gather the top-k scores and renormalise them, and weight
# each routed copy in fp32; the Qwen/OLMoE blocks take an fp32 softmax and weight in the compute dtype.
_SIGMOID_ROUTER = frozenset({"deepseek_v3", "deepseek_v2", "glm4_moe"})


def _norm(width: int, rows: int, e: int, fp32_weight: bool, output_saved: bool) -> int:
    """One RMSNorm over ``width`` values in ``rows`` groups (q/k norms per head have one per head):
    the fp32 upcast input, the fp32 rsqrt per group, the normalised value (fp32 when the weight
    multiply runs in fp32) and, when a linear consumes it, the output in the compute dtype."""
    return FP32 * width + FP32 * rows + (FP32 if fp32_weight else e) * width + (e * width if output_saved else 0)


def _mla_attention(shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool) -> tuple[int, int]:
    """DeepseekV3Attention: q_a_proj output through q_a_layernorm (saved by q_b_proj), the
    compressed kv through kv_a_layernorm (saved by kv_b_proj), q and k as the ``torch.cat`` of
    their no-rope and rotary parts (all heads, qk_nope + qk_rope wide), v as a view of kv_b_proj's
    output (which stays alive whole: nope + v per head), the output (heads x v_head_dim) saved by
    o_proj. eager adds the fp32 softmax and its 16-bit copy; flash/sdpa the fp32 log-sum-exp. In
    eager at micro-batch > 1 the batched matmul copies the strided v (heads x v_head_dim) and
    kv_b_proj's output is freed."""
    nh = shape.num_attention_heads
    q_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
    r_q, r_kv = shape.q_lora_rank, shape.kv_lora_rank
    lora = (_norm(r_q, 1, e, False, True) if r_q else 0) + _norm(r_kv, 1, e, False, True)
    if e == FP32:  # the no-op upcast leaves the norm holding kv_a's whole output, rope part included
        lora += FP32 * shape.qk_rope_head_dim
    q = k = e * nh * q_head
    v = e * nh * (shape.qk_nope_head_dim + shape.v_head_dim)
    out = e * nh * shape.v_head_dim
    if selective:
        return lora + q + k + v + out, 0
    if attention != "eager":
        return lora + q + k + v + out + FP32 * nh, 0
    if micro_batch > 1:
        v = e * nh * shape.v_head_dim
    return lora + q + k + v + out, nh * (FP32 + (e if e != FP32 else 0))  # fp32: the softmax output is the copy


def _moe_block(shape: ModelShape, e: int) -> int:
    """The sparse block per token: router, the experts_per_token routed copies, shared expert(s).

    Router (Qwen3MoeTopKRouter and kin): fp32 softmax ``4·E``, top-k indices ``8·k``; the
    DeepSeek/GLM router adds the fp32 copy of its input ``4·h``, the gathered scores and their
    renormalisation ``4·k + 4``; gpt_oss takes the top-k of biased logits and a 16-bit softmax over
    them ``e·k``. Per routed copy (grouped-mm experts): gathered input ``e·h``, gate/up output
    ``2·e·f``, activation output and product ``2·e·f``, down output saved by the weighting
    multiply ``e·h``, the weight (fp32 for DeepSeek/GLM, the compute dtype otherwise) and three
    int64 index vectors; gpt_oss's clamped, alpha-scaled GLU saves five ``e·f`` tensors after
    gate/up (sigmoid, clamped gate, up + 1, their product, the down input) and four indices.
    Shared expert: a dense gated MLP ``4·e·f_shared``; qwen2_moe's sigmoid gate saves the shared
    output and the gate ``e·h + e``."""
    h, k, experts, f = shape.hidden_size, shape.experts_per_token, shape.num_experts, shape.expert_intermediate_size
    if shape.family == "gpt_oss":
        router = INT64 * k + e * k
        per_copy = 2 * e * h + 7 * e * f + e + 4 * INT64
    elif shape.family in _SIGMOID_ROUTER:
        router = (FP32 * h if e != FP32 else 0) + FP32 * experts + INT64 * k + FP32 * k + FP32
        per_copy = 2 * e * h + 4 * e * f + FP32 + 3 * INT64
    else:
        router = FP32 * experts + INT64 * k
        per_copy = 2 * e * h + 4 * e * f + e + 3 * INT64
    shared = 4 * e * shape.shared_expert_intermediate_size
    if shape.shared_expert_gate:
        shared += e * h + e
    return router + k * per_copy + shared


def _modern(
    shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool, moe: bool, s: int, liger: bool = False
) -> tuple[int, int]:
    """A decoder layer of today's families, term by term from its traits (see docs/memory-model.md).

    Norms: two pre-norms (llama), four sandwich norms (Gemma: the input and pre-feedforward
    outputs feed linears), or two post-norms (OLMo 2: the projections save the layer input and the
    residual sum instead). q/k norms: one RMSNorm per head (Qwen3, Gemma 3) or over all heads
    (OLMo 2), their rotary outputs are the q and k attention saves. Attention: MLA, gpt_oss's eager
    attention with sinks (the logits concatenated with one sink column per head: int64 max indices
    and a 16-bit softmax over s + 1 columns), or the standard core. MLP: dense gated (or plain
    GELU) MLP, or the MoE block for MoE layers.

    ``liger`` (dense Qwen3): Liger's RMSNorm for the two pre-norms and the q/k norms (the q/k
    norms' input, the projection output, becomes a saved storage; their output is what Liger's
    in-place RoPE rotates and attention saves), and Liger's SwiGLU."""
    h, fp32w = shape.hidden_size, shape.family in _FP32_WEIGHT_NORM
    if liger:
        attn_lin, attn_quad = _attention_core(shape, e, attention, micro_batch, selective=selective)
        if shape.qk_norm != "none":
            per_head = shape.qk_norm == "head"
            nq, nkv = (shape.num_attention_heads, shape.num_key_value_heads) if per_head else (1, 1)
            attn_lin += liger_rmsnorm(shape.q_size, nq, e, False) + liger_rmsnorm(shape.kv_size, nkv, e, False)
        norms = shape.norms_per_layer * liger_rmsnorm(h, 1, e, True)
        return norms + attn_lin + liger_swiglu(e, shape.intermediate_size), attn_quad
    if shape.family in _POST_NORM:
        norms = 2 * _norm(h, 1, e, fp32w, False) + 2 * e * h
    elif shape.norms_per_layer == 4:
        norms = 2 * _norm(h, 1, e, fp32w, True) + 2 * _norm(h, 1, e, fp32w, False)
    else:
        norms = shape.norms_per_layer * _norm(h, 1, e, fp32w, True)
    if shape.is_mla:
        attn_lin, attn_quad = _mla_attention(shape, e, attention, micro_batch, selective)
    else:
        attn_lin, attn_quad = _attention_core(shape, e, attention, micro_batch, selective=selective)
        if shape.qk_norm != "none":
            per_head = shape.qk_norm == "head"
            nq, nkv = (shape.num_attention_heads, shape.num_key_value_heads) if per_head else (1, 1)
            attn_lin += _norm(shape.q_size, nq, e, fp32w, False) + _norm(shape.kv_size, nkv, e, fp32w, False)
        if shape.attention_sinks and attention == "eager" and not selective:
            nh = shape.num_attention_heads
            attn_lin += INT64 * nh + e * nh  # max indices, the sink column of the softmax
            attn_quad = nh * e  # the softmax runs in the compute dtype; its output is what matmul saves
    if moe:
        mlp = _moe_block(shape, e)
    elif shape.gated_mlp:
        mlp = 4 * e * shape.intermediate_size
    else:
        mlp = 2 * e * shape.intermediate_size
    return norms + attn_lin + mlp, attn_quad


def _has_modern_traits(shape: ModelShape) -> bool:
    """An inline ``architecture`` of an older family with MLA or MoE fields the older formulas lack."""
    return shape.is_mla or bool(
        shape.moe_intermediate_size or shape.shared_expert_intermediate_size or shape.dense_layers
    )


def _sliding_mask(shape: ModelShape, s: int) -> bool:
    """Whether sdpa's sliding-window layers get an explicit mask: only when the sequence is longer
    than the window (shorter, the window is the causal mask and transformers skips it)."""
    return bool(shape.sliding_window_layers) and s > shape.sliding_window and not shape.is_mla


def _sliding_sdpa_extra(shape: ModelShape, e: int, attention: str, b: int, s: int, selective: bool) -> int:
    """sdpa on a sliding-window layer longer than its window gets an explicit mask: transformers
    then repeats k and v to every head (no native GQA with a mask) and the kernel saves the mask as
    a (b, 1, s, s) tensor of the compute dtype, one per layer. Bytes for the whole micro-batch."""
    if attention != "sdpa" or not _sliding_mask(shape, s):
        return 0
    # repeat_kv of a single kv head is an expand + reshape that stays a view: nothing is copied
    repeat = 2 * e * (shape.q_size - shape.kv_size) * b * s if shape.num_key_value_heads > 1 else 0
    return shape.sliding_window_layers * (repeat + b * s * s * e)


@lru_cache(maxsize=1024)
def _per_layer(
    shape: ModelShape, e: int, attention: str, micro_batch: int, selective: bool = False, liger: bool = False
) -> tuple[int, int]:
    family = shape.family
    if family == "gemma2":
        return _gemma2(shape, e, attention, micro_batch, selective)
    if family == "gpt2":
        return _gpt2(shape, e, attention, micro_batch, selective)
    if family == "gpt_neox":
        return _gpt_neox(shape, e, attention, micro_batch, selective)
    if family == "bert":
        return _bert(shape, e, attention, micro_batch, selective)
    return _llama_like(shape, e, attention, micro_batch, selective, liger)


def _liger_loss(shape: ModelShape, e: int) -> int:
    """Per token, what Liger's fused linear cross-entropy leaves for backward in place of the
    final norm's output, the shifted labels and the fp32 log-softmax
    (``LigerFusedLinearCrossEntropyFunction.forward`` computes the input's gradient chunk by chunk
    inside forward and saves ``grad_input``; its whole-vocabulary ``grad_weight`` is
    :func:`liger_loss_weight_gradient`): the token ids, the final norm's input and fp32 rstd, and
    the input's gradient."""
    return INT64 + liger_rmsnorm(shape.hidden_size, 1, e, False) + e * shape.hidden_size


def liger_loss_weight_gradient(shape: ModelShape, e: int) -> int:
    """``grad_weight``: Liger's fused loss accumulates the LM head's gradient (``zeros_like(weight)``,
    the weight's dtype) in forward and keeps it until backward hands it on."""
    return shape.vocab_size * shape.hidden_size * e


def liger_loss_transient(shape: ModelShape, e: int, tokens: int) -> int:
    """The logits chunk Liger's fused loss forms (its gradient is written in place):
    ``chunk_size = next_power_of_2(ceil(BT / ceil(V / H)))`` rows of ``V`` logits in the input's
    dtype, about ``BT·H`` elements (``fused_linear_cross_entropy_forward``), and the fp32 per-token
    loss ``loss_1d``."""
    inc_factor = -(-shape.vocab_size // shape.hidden_size)
    rows = -(-tokens // inc_factor)
    chunk = min(tokens, 1 << (rows - 1).bit_length())
    return chunk * shape.vocab_size * e + FP32 * tokens


@lru_cache(maxsize=4096)
def _outside_layers(
    shape: ModelShape,
    e: int,
    attention: str,
    checkpointing: bool,
    b: int,
    s: int,
    selective: bool = False,
    liger: bool = False,
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
    elif liger:
        per_token = _liger_loss(shape, e)
        per_position = 2 * e * shape.head_dim
    else:
        per_token = ids + rmsnorm_fp32_upcast(h, e) + loss
        per_position = 2 * e * shape.head_dim
    total = tokens * per_token + s * per_position + (liger_loss_weight_gradient(shape, e) if liger else 0)
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
    liger: bool = False,
) -> ActivationEstimate:
    """Saved activations of one micro-batch (see module docstring).

    ``checkpointing``: every layer under ``torch.utils.checkpoint`` (only its input is kept).
    ``selective`` (ignored with ``checkpointing``): only the attention function is recomputed.
    ``liger``: the model runs Liger-Kernel's kernels and fused loss (:data:`LIGER_FAMILIES`). A
    rebuilt layer's first Liger norm saves the layer's input, which is the checkpoint itself.
    """
    b, s, e = micro_batch_size, sequence_length, dtype_bytes
    selective = selective and not checkpointing
    liger = liger and liger_modelled(shape)
    if shape.family in TRAIT_FAMILIES or _has_modern_traits(shape):
        return _estimate_modern(shape, b, s, e, attention, checkpointing, selective, liger)
    linear, quadratic = _per_layer(shape, e, attention, b, liger=liger)
    per_layer = b * s * (linear + quadratic * s)
    if checkpointing:
        layers = shape.num_layers * b * s * e * shape.hidden_size  # each layer's input only
        rebuilt = per_layer + b * s * _rebuilt_layer_correction(shape, e, liger)
    elif selective:
        kept_linear, _ = _per_layer(shape, e, attention, b, selective=True, liger=liger)
        kept = b * s * kept_linear
        layers = shape.num_layers * kept
        rebuilt = per_layer - kept  # one layer's attention internals, rebuilt in its backward
        per_layer = kept
    else:
        layers = shape.num_layers * per_layer
        rebuilt = 0
    outside = _outside_layers(shape, e, attention, checkpointing, b, s, selective, liger)
    return ActivationEstimate(
        per_layer=per_layer,
        layers=layers,
        outside_layers=outside,
        recompute_working_set=rebuilt,
    )


def _estimate_modern(
    shape: ModelShape, b: int, s: int, e: int, attention: str, checkpointing: bool, selective: bool, liger: bool
) -> ActivationEstimate:
    """:func:`estimate_activations` for today's decoders: dense and MoE layers differ, and so may
    sliding-window layers under sdpa; the largest layer is the one rebuilt in backward."""
    moe_layers = shape.moe_layers
    dense_layers = shape.num_layers - moe_layers
    kinds = [(count, moe) for count, moe in ((dense_layers, False), (moe_layers, True)) if count]
    full = {
        moe: b * s * (lin + quad * s)
        for moe, (lin, quad) in ((m, _modern(shape, e, attention, b, False, m, s, liger)) for _, m in kinds)
    }
    sliding = _sliding_sdpa_extra(shape, e, attention, b, s, False)
    largest = max(full.values()) + (sliding // shape.num_layers if sliding else 0)
    if checkpointing:
        layers = shape.num_layers * b * s * e * shape.hidden_size
        rebuilt = largest + b * s * _rebuilt_layer_correction(shape, e, liger)
        per_layer = largest
    elif selective:
        kept = {moe: b * s * _modern(shape, e, attention, b, True, moe, s, liger)[0] for _, moe in kinds}
        layers = sum(count * kept[moe] for count, moe in kinds)
        rebuilt = max(full[moe] - kept[moe] for _, moe in kinds)
        per_layer = max(kept.values())
    else:
        layers = sum(count * full[moe] for count, moe in kinds) + sliding
        rebuilt = 0
        per_layer = largest
    outside = _outside_modern(shape, e, attention, checkpointing, b, s, selective, liger)
    return ActivationEstimate(per_layer=per_layer, layers=layers, outside_layers=outside, recompute_working_set=rebuilt)


def _outside_modern(
    shape: ModelShape, e: int, attention: str, checkpointing: bool, b: int, s: int, selective: bool, liger: bool
) -> int:
    """Outside the layers: token ids and shifted labels, the final norm (its output saved by the
    LM head), the fp32 log-softmax of the loss; per position the rotary cos/sin (fp32 for the OLMo
    families, which rotate in fp32; the rope part of the head for MLA); with checkpointing the
    position ids and, for eager attention, one b x s x s mask per mask type (full and sliding)
    held by the checkpoints' recompute closures."""
    h, v, tokens = shape.hidden_size, shape.vocab_size, b * s
    fp32w = shape.family in _FP32_WEIGHT_NORM
    per_token = _liger_loss(shape, e) if liger else 2 * INT64 + _norm(h, 1, e, fp32w, True) + FP32 * v
    if shape.is_mla:  # DeepSeek-V3's interleaved rope: fp32 cos/sin over half the rope width
        per_position = 2 * FP32 * (shape.qk_rope_head_dim // 2)
    else:
        per_position = 2 * (FP32 if shape.family in _POST_NORM else e) * shape.head_dim
        if shape.family in _LOCAL_ROPE and 0 < shape.sliding_window_layers < shape.num_layers:
            per_position *= 2  # a second rotary table for the sliding-window layers
    total = tokens * per_token + s * per_position + (liger_loss_weight_gradient(shape, e) if liger else 0)
    if checkpointing or selective:
        total += s * INT64
        if attention == "eager":
            masks = 2 if shape.sliding_window_layers and shape.sliding_window_layers < shape.num_layers else 1
            total += masks * b * s * s * e
        elif attention == "sdpa" and _sliding_mask(shape, s):
            total += s * s  # the sliding layers' boolean mask, (1, 1, s, s) for any batch (full layers run is_causal)
    return total
