"""Parameters of a multimodal checkpoint outside its language model (vision tower and projector).

A ``config.json`` with a ``text_config`` describes a whole multimodal model: training it holds every
parameter (model states, ZeRO partitions), so the count dsgen plans with is the whole model's.
The vision tower is counted module by module from ``vision_config`` in the layout transformers
builds; only towers listed in ``_TOWERS`` are known, any other is a clear error naming the
model_type rather than a silently smaller model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dsgen.catalog.model_shape import ModelShape

if TYPE_CHECKING:
    from dsgen.catalog.hf_config import _Config


def _siglip(v: dict[str, Any], cfg: _Config) -> int:
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


def _gemma3(cfg: _Config, text: ModelShape) -> int:
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


def _int(v: dict[str, Any], key: str, default: int, cfg: _Config) -> int:
    value = v.get(key, default)
    if type(value) is not int or value < 1:
        raise cfg.error(key, f"vision_config.{key}: expected a positive integer, got {value!r}")
    return value


_TOWERS = {"gemma3": _gemma3}


def non_text_parameters(cfg: _Config, model_type: str, text: ModelShape) -> int:
    tower = _TOWERS.get(model_type)
    if tower is None:
        raise cfg.error(
            "vision_config",
            f"the vision tower of {model_type!r} is not one dsgen can count (known: {', '.join(sorted(_TOWERS))})",
            hint="point hf_config at the language model's config (the text_config), or use model.architecture",
        )
    return tower(cfg, text)
