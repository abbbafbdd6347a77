"""The parameter tensors of a model, in ``model.parameters()`` order.

ZeRO-1/2 partition the flat concatenation of these tensors in this order and ZeRO-3 each tensor on
its own, so both the model-state accounting (:mod:`dsgen.estimate.model_states`) and the
fine-tuning split (:mod:`dsgen.estimate.trainable`) start from this layout.
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

from dsgen.catalog.model_shape import TRAIT_FAMILIES, ModelShape

Shape = tuple[int, ...]


def _linear(fan_in: int, fan_out: int, bias: bool) -> tuple[Shape, ...]:
    return ((fan_out, fan_in), (fan_out,)) if bias else ((fan_out, fan_in),)


@lru_cache(maxsize=256)
def parameter_shapes(shape: ModelShape) -> tuple[Shape, ...]:
    """Shapes of the model's parameter tensors in ``model.parameters()`` order.

    The order is the module registration order of the family's transformers implementation
    (transformers 5; tied output weights appear once, as ``parameters()`` de-duplicates them).
    ZeRO-1/2 partition the flat concatenation of these tensors in this order, so the order decides
    which tensors straddle a partition boundary; ZeRO-3 partitions each tensor on its own. The
    dimensions themselves matter only to optimizers that factor their state (Adafactor).
    """
    if shape.family in TRAIT_FAMILIES:  # issue 17: today's decoders, laid out from their traits
        return shape.parameter_shapes()
    h, q, kv, f = shape.hidden_size, shape.q_size, shape.kv_size, shape.intermediate_size
    qkv = q + 2 * kv
    ab, aob, mb = shape.attention_bias, shape.attention_out_bias, shape.mlp_bias
    norm: tuple[Shape, ...] = ((h,), (h,)) if shape.norm == "layernorm" else ((h,),)
    tensors: list[Shape] = [(shape.vocab_size, h)]
    if shape.learned_position_embeddings:
        tensors.append((shape.learned_position_embeddings, h))
    if shape.token_type_embeddings:
        tensors.append((shape.token_type_embeddings, h))
    if shape.embedding_norm:
        tensors += norm

    family = shape.family
    layer: tuple[Shape, ...]
    if family == "gpt2":  # ln_1, c_attn (fused qkv), c_proj, ln_2, c_fc, c_proj
        layer = (*norm, *_linear(h, qkv, ab), *_linear(q, h, aob), *norm, *_linear(h, f, mb), *_linear(f, h, mb))
    elif family == "gpt_neox":  # both norms first, then query_key_value, dense, dense_h_to_4h, dense_4h_to_h
        layer = (*norm, *norm, *_linear(h, qkv, ab), *_linear(q, h, aob), *_linear(h, f, mb), *_linear(f, h, mb))
    elif family == "bert":  # query, key, value, output.dense, LayerNorm, intermediate, output.dense, LayerNorm
        attention = (*_linear(h, q, ab), *_linear(h, kv, ab), *_linear(h, kv, ab), *_linear(q, h, aob))
        layer = (*attention, *norm, *_linear(h, f, mb), *_linear(f, h, mb), *norm)
    elif family == "phi3":  # o_proj is registered before qkv_proj; fused gate_up_proj
        layer = (
            *_linear(q, h, aob),
            *_linear(h, qkv, ab),
            *_linear(h, 2 * f, mb),
            *_linear(f, h, mb),
            *norm * shape.norms_per_layer,
        )
    else:  # llama, mistral, qwen2, gemma2, mixtral: q, k, v, o, then the MLP, then the norms
        attention = (*_linear(h, q, ab), *_linear(h, kv, ab), *_linear(h, kv, ab), *_linear(q, h, aob))
        if shape.is_moe:  # router, then all experts as two stacked tensors (transformers >= 5)
            e = shape.num_experts
            mlp: tuple[Shape, ...] = ((e, h), (e, 2 * f, h), (e, h, f))
        else:
            gate_up = _linear(h, f, mb) * (2 if shape.gated_mlp else 1)
            mlp = (*gate_up, *_linear(f, h, mb))
        layer = (*attention, *mlp, *norm * shape.norms_per_layer)
    tensors += layer * shape.num_layers

    if shape.final_norm:
        tensors += norm
    if not shape.tie_word_embeddings and not shape.encoder_only:
        tensors.append((shape.vocab_size, h))
    if shape.pooler:
        tensors += _linear(h, h, True)
    return tuple(tensors)


@lru_cache(maxsize=256)
def parameter_tensors(shape: ModelShape) -> tuple[int, ...]:
    """Element counts of the model's parameter tensors in ``model.parameters()`` order."""
    return tuple(prod(s) for s in parameter_shapes(shape))


@lru_cache(maxsize=256)
def persistent_parameters(shape: ModelShape, threshold: int) -> int:
    """Parameters ZeRO-3 keeps whole on every rank: tensors with at most ``threshold`` elements
    (DeepSpeed's ``param_persistence_threshold``, compared with ``<=``)."""
    return sum(n for n in parameter_tensors(shape) if n <= threshold)
