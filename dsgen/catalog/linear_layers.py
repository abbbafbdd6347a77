"""The linear layers of a decoder layer, by the module names transformers gives them.

LoRA adapts linear layers by name (PEFT's ``target_modules``) and QLoRA quantizes them
(bitsandbytes replaces every ``nn.Linear`` but the output head), so both need the projections of
one layer with their names and widths, which the parameter layout (:mod:`dsgen.catalog.model_shape`,
:func:`dsgen.estimate.model_states.parameter_shapes`) does not name.

The names are those of the families' transformers 5 modules. Routed experts of an MoE layer are
not ``nn.Linear`` modules in transformers 5 (each MoE block holds all of its experts as two stacked
parameters) nor is the router (a ``TopKRouter`` holding its own weight), so neither is a linear layer
here: PEFT's ``all-linear`` leaves them alone and bitsandbytes leaves them unquantized. A shared
expert is an ordinary MLP of linear layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dsgen.catalog.model_shape import ModelShape

# Families whose transformers modules fuse projections, with the names they use.
_FUSED_NAMES: dict[str, tuple[str, str, str, str]] = {
    # family: (fused q/k/v, attention output, MLP up, MLP down)
    "gpt2": ("c_attn", "c_proj", "c_fc", "c_proj"),
    "gpt_neox": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
    "falcon": ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"),
}


@dataclass(frozen=True)
class LinearLayer:
    """One linear projection of a decoder layer: its module name, widths, and how many layers have it."""

    name: str
    fan_in: int
    fan_out: int
    layers: int  # how many decoder layers hold this projection
    attention: bool  # part of the attention block (PEFT's usual 'attention' targets)

    @property
    def weight_elements(self) -> int:
        return self.fan_in * self.fan_out


def _attention(shape: ModelShape) -> list[tuple[str, int, int]]:
    h = shape.hidden_size
    if shape.is_mla:  # DeepseekV3Attention
        nh = shape.num_attention_heads
        q_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
        r_q, r_kv = shape.q_lora_rank, shape.kv_lora_rank
        q = [("q_a_proj", h, r_q), ("q_b_proj", r_q, nh * q_head)] if r_q else [("q_proj", h, nh * q_head)]
        return [
            *q,
            ("kv_a_proj_with_mqa", h, r_kv + shape.qk_rope_head_dim),
            ("kv_b_proj", r_kv, nh * (shape.qk_nope_head_dim + shape.v_head_dim)),
            ("o_proj", shape.attention_out_size, h),
        ]
    if shape.family in _FUSED_NAMES:
        qkv, out, _, _ = _FUSED_NAMES[shape.family]
        return [(qkv, h, shape.q_size + 2 * shape.kv_size), (out, shape.q_size, h)]
    if shape.family == "phi3":
        return [("qkv_proj", h, shape.q_size + 2 * shape.kv_size), ("o_proj", shape.q_size, h)]
    if shape.family == "bert":
        return [
            ("query", h, shape.q_size),
            ("key", h, shape.kv_size),
            ("value", h, shape.kv_size),
            ("dense", shape.q_size, h),
        ]
    return [
        ("q_proj", h, shape.q_size),
        ("k_proj", h, shape.kv_size),
        ("v_proj", h, shape.kv_size),
        ("o_proj", shape.q_size, h),
    ]


def _mlp(shape: ModelShape, width: int) -> list[tuple[str, int, int]]:
    h = shape.hidden_size
    if shape.family in _FUSED_NAMES:
        _, _, up, down = _FUSED_NAMES[shape.family]
        return [(up, h, width), (down, width, h)]
    if shape.family == "phi3":
        return [("gate_up_proj", h, 2 * width), ("down_proj", width, h)]
    if shape.family == "bert":
        return [("intermediate.dense", h, width), ("output.dense", width, h)]
    if shape.gated_mlp:
        return [("gate_proj", h, width), ("up_proj", h, width), ("down_proj", width, h)]
    return [("up_proj", h, width), ("down_proj", width, h)]


@lru_cache(maxsize=256)
def decoder_linear_layers(shape: ModelShape) -> tuple[LinearLayer, ...]:
    """Every linear layer of the decoder layers (not the embeddings or the output head), grouped by
    name and width with the number of layers holding each."""
    moe_layers = shape.moe_layers
    dense_layers = shape.num_layers - moe_layers
    found: dict[tuple[str, int, int, bool], int] = {}

    def add(projections: list[tuple[str, int, int]], layers: int, attention: bool) -> None:
        for name, fan_in, fan_out in projections:
            if layers and fan_in and fan_out:
                key = (name, fan_in, fan_out, attention)
                found[key] = found.get(key, 0) + layers

    add(_attention(shape), shape.num_layers, True)
    add(_mlp(shape, shape.intermediate_size), dense_layers, False)
    if moe_layers and shape.shared_expert_intermediate_size:
        add(_mlp(shape, shape.shared_expert_intermediate_size), moe_layers, False)
    return tuple(
        LinearLayer(name, fan_in, fan_out, layers, attention)
        for (name, fan_in, fan_out, attention), layers in found.items()
    )


def linear_layer_names(shape: ModelShape) -> tuple[str, ...]:
    """The distinct module names of the decoder's linear layers, in layer order."""
    return tuple(dict.fromkeys(layer.name for layer in decoder_linear_layers(shape)))
