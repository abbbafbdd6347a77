"""Parameters of a multimodal checkpoint outside its language model (vision tower and projector).

A ``config.json`` with a ``text_config`` describes a whole multimodal model: training it holds every
parameter (model states, ZeRO partitions), so the count dsgen plans with is the whole model's.
The vision tower is counted module by module from ``vision_config`` in the layout transformers
builds; only towers listed in ``_TOWERS`` are known, any other is a clear error naming the
model_type rather than a silently smaller model.
"""

from __future__ import annotations

from typing import Any

from dsgen.catalog.config_file import ConfigFile
from dsgen.catalog.model_shape import ModelShape


def _siglip(v: dict[str, Any], cfg: ConfigFile) -> int:
    """transformers' SiglipVisionModel (siglip/modeling_siglip.py): Conv2d patch embedding with
    bias, learned position table, pre-LayerNorm encoder layers (q/k/v/out with biases, fc1/fc2 with
    biases, two LayerNorms), post LayerNorm and, with ``vision_use_head``, the attention-pooling head."""
    h = _int(v, "hidden_size", 768, cfg)
    f = _int(v, "intermediate_size", 3072, cfg)
    layers = _int(v, "num_hidden_layers", 12, cfg)
    patch = _int(v, "patch_size", 16, cfg)
    image = _int(v, "image_size", 224, cfg)
    channels = _int(v, "num_channels", 3, cfg)
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    params = channels * patch * patch * h + h + (image // patch) ** 2 * h + layers * layer + 2 * h
    if v.get("vision_use_head", True):
        params += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)
    return params


def _gemma3(cfg: ConfigFile, text: ModelShape) -> int:
    """SigLIP tower (``vision_use_head`` false in Gemma3Config's default) and
    Gemma3MultiModalProjector: ``mm_input_projection_weight`` (vision x text hidden) and an RMSNorm."""
    v = dict(cfg.data.get("vision_config") or {})
    v.setdefault("vision_use_head", False)
    v.setdefault("hidden_size", 1152)
    v.setdefault("intermediate_size", 4304)
    v.setdefault("num_hidden_layers", 27)
    v.setdefault("patch_size", 14)
    v.setdefault("image_size", 896)
    hv = _int(v, "hidden_size", 1152, cfg)
    return _siglip(v, cfg) + hv * text.hidden_size + hv


def _qwen3_vl(cfg: ConfigFile, text: ModelShape) -> int:
    """Qwen3VLVisionModel (qwen3_vl/modeling_qwen3_vl.py): Conv3d patch embedding with bias, a
    learned position table, ``depth`` pre-LayerNorm blocks (fused qkv and proj with biases, fc1/fc2
    with biases), the patch merger (LayerNorm over the hidden size, then two linears on the
    ``spatial_merge_size²``-merged width) and one post-shuffle merger per deepstack layer."""
    v = dict(cfg.data.get("vision_config") or {})
    h = _int(v, "hidden_size", 1152, cfg)
    f = _int(v, "intermediate_size", 4304, cfg)
    depth = _int(v, "depth", 27, cfg)
    patch, temporal = _int(v, "patch_size", 16, cfg), _int(v, "temporal_patch_size", 2, cfg)
    channels = _int(v, "in_channels", 3, cfg)
    merged = h * _int(v, "spatial_merge_size", 2, cfg) ** 2
    out = _int(v, "out_hidden_size", 3584, cfg)
    deepstack = v.get("deepstack_visual_indexes", [8, 16, 24])
    if not isinstance(deepstack, list):
        raise cfg.error("vision_config", f"vision_config.deepstack_visual_indexes: expected a list, got {deepstack!r}")
    block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    merger_linears = (merged * merged + merged) + (merged * out + out)
    params = channels * temporal * patch * patch * h + h + _int(v, "num_position_embeddings", 2304, cfg) * h
    params += depth * block + (2 * h + merger_linears) + len(deepstack) * (2 * merged + merger_linears)
    return params


def _llama4(cfg: ConfigFile, text: ModelShape) -> int:
    """Llama4VisionModel (llama4/modeling_llama4.py): the unfold patch embedding's linear (no
    bias), class embedding, learned positions for every patch plus the class token, pre and post
    LayerNorms, encoder layers (q/k/v/o and fc1/fc2 with biases, two LayerNorms), the pixel-shuffle
    MLP (``Llama4VisionMLP2``: fc1 intermediate -> projector_input_dim, fc2 projector_output_dim
    square, no biases), and ``Llama4MultiModalProjector`` (vision_output_dim -> text hidden)."""
    v = dict(cfg.data.get("vision_config") or {})
    h = _int(v, "hidden_size", 768, cfg)
    f = _int(v, "intermediate_size", 5632, cfg)
    layers = _int(v, "num_hidden_layers", 34, cfg)
    patch, image = _int(v, "patch_size", 14, cfg), _int(v, "image_size", 448, cfg)
    channels = _int(v, "num_channels", 3, cfg)
    p_in, p_out = _int(v, "projector_input_dim", 4096, cfg), _int(v, "projector_output_dim", 4096, cfg)
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    params = channels * patch * patch * h + h + ((image // patch) ** 2 + 1) * h + 2 * 2 * h + layers * layer
    params += f * p_in + p_out * p_out + _int(v, "vision_output_dim", 7680, cfg) * text.hidden_size
    return params


def _int(v: dict[str, Any], key: str, default: int, cfg: ConfigFile) -> int:
    value = v.get(key, default)
    if type(value) is not int or value < 1:
        raise cfg.error(key, f"vision_config.{key}: expected a positive integer, got {value!r}")
    return value


_TOWERS = {"gemma3": _gemma3, "qwen3_vl": _qwen3_vl, "llama4": _llama4}


def non_text_parameters(cfg: ConfigFile, model_type: str, text: ModelShape) -> int:
    tower = _TOWERS.get(model_type)
    if tower is None:
        raise cfg.error(
            "vision_config",
            f"the vision tower of {model_type!r} is not one dsgen can count (known: {', '.join(sorted(_TOWERS))})",
            hint="point hf_config at the language model's config (the text_config), or use model.architecture",
        )
    return tower(cfg, text)
