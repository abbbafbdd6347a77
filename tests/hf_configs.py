"""A dsgen model shape written back as the config.json its transformers family reads.

The inverse of :mod:`dsgen.catalog.hf_config`, for tests that build the real transformers model
of a preset (on the meta device) and count what it, or a library wrapping it, holds.
"""

from __future__ import annotations

from typing import Any

from dsgen.catalog.model_shape import ModelShape


def hf_config_dict(shape: ModelShape) -> dict[str, Any]:
    """Write a preset back as the config.json its family uses (the inverse of the reader)."""
    family = shape.family
    if family == "gpt2":
        return {
            "model_type": "gpt2",
            "n_layer": shape.num_layers,
            "n_embd": shape.hidden_size,
            "n_head": shape.num_attention_heads,
            "n_inner": shape.intermediate_size,
            "vocab_size": shape.vocab_size,
            "n_positions": shape.learned_position_embeddings,
            "tie_word_embeddings": shape.tie_word_embeddings,
            "resid_pdrop": shape.dropout,
            "embd_pdrop": shape.dropout,
            "attn_pdrop": shape.dropout,
        }
    common = {
        "model_type": family,
        "num_hidden_layers": shape.num_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "intermediate_size": shape.intermediate_size,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "tie_word_embeddings": shape.tie_word_embeddings,
    }
    if family == "bert":
        return {
            **common,
            "type_vocab_size": shape.token_type_embeddings,
            "hidden_dropout_prob": shape.dropout,
            "attention_probs_dropout_prob": shape.dropout,
        }
    if family == "gpt_neox":
        return {
            **common,
            "attention_bias": shape.attention_bias,
            "attention_dropout": shape.dropout,
            "hidden_dropout": shape.dropout,
        }
    config = {
        **common,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "attention_dropout": shape.dropout,
        "sliding_window": shape.sliding_window or None,
    }
    if family == "llama":
        config.update(attention_bias=shape.attention_bias, mlp_bias=shape.mlp_bias)
    if family == "gemma2":
        config.update(attention_bias=shape.attention_bias, hidden_activation="gelu_pytorch_tanh")
    if family == "mixtral":
        config.update(num_local_experts=shape.num_experts, num_experts_per_tok=shape.experts_per_token)
    if family == "phi3":
        config.update(resid_pdrop=shape.dropout, embd_pdrop=shape.dropout)
    return config
