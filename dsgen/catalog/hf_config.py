"""Read a local Hugging Face ``config.json`` into a :class:`ModelShape`.

Only the local file is read; nothing is ever downloaded (dsgen must work on air-gapped clusters and
must not import ``transformers``, which alone takes seconds to import). Each supported
``model_type`` has its own key names and its own defaults, and a key missing from ``config.json``
takes the default the ``transformers`` config class gives it, so the shape (and its parameter count)
is the model ``transformers`` would build from the same file. The architecture sizes themselves
(layers, hidden size, heads, feed-forward size, vocabulary) are required: a config without them is
not a model config, and silently using a class default would describe some other model.

Every problem is a :class:`DsgenError` naming the file and the key, e.g.
``config.json: hidden_size: missing``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from dsgen.catalog.config_file import ConfigFile
from dsgen.catalog.model_shape import ModelShape
from dsgen.catalog.vision import non_text_parameters
from dsgen.errors import DsgenError, Location
from dsgen.inputs import read_text

#: Most layers a model may have (the spec schema's bound on model.architecture.num_layers).
MAX_LAYERS = 10_000


# ---- decoders, read by their traits ---------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """What one model_type's transformers implementation hard-codes (not in config.json), and the
    defaults its config class gives the keys that matter. Everything else is read from the keys
    themselves, so one reader serves every decoder; an unknown model_type gets ``_ASSUMED``."""

    family: str
    kv_heads: int | None = None  # default num_key_value_heads; None = num_attention_heads
    max_positions: int = 4096
    tie: bool = False
    head_dim: int | None = None  # default head_dim; None = hidden_size // num_attention_heads
    floor_head_dim: bool = False  # hidden_size // heads even when it does not divide (glm4_moe does)
    activation: str = "silu"
    norm: str = "rmsnorm"
    norm_bias: bool = True
    norms_per_layer: int = 2
    qk_norm: str = "none"
    qk_norm_key: str | None = None  # a boolean key that switches the q/k norms on (glm4_moe, use_qk_norm)
    gated: bool = True
    # (key, what it puts a bias on: "qkv", "o", "mlp", "expert"), read in order, later keys override
    bias_keys: tuple[tuple[str, str], ...] = (("attention_bias", "qkv o"), ("mlp_bias", "mlp"))
    hard_bias: str = ""  # biases transformers always builds (qwen2: "qkv")
    parallel: bool = False
    sinks: bool = False
    router_bias: bool = False
    shared_gate: bool = False
    shared_expert_is_expert: bool = False  # llama4: one shared expert as wide as a routed one
    dense_width_key: str = "intermediate_size"  # width of dense MLPs
    expert_width_key: str = "moe_intermediate_size"  # width of routed experts (falls back to intermediate_size)
    moe: bool = False  # a MoE model type: the expert count has a class default
    experts: int = 8
    experts_per_token: int = 2
    dropout_keys: tuple[str, ...] = ("attention_dropout",)
    sliding_pattern: int = 0  # without layer_types: every n-th layer is global, the others slide (0: all slide)


_LLAMA = _Layout("llama", max_positions=2048)
_QWEN3 = _Layout("qwen3", kv_heads=32, max_positions=32768, head_dim=128, qk_norm="head")
_DEEPSEEK = _Layout("deepseek_v3", max_positions=4096, moe=True, experts=256, experts_per_token=8)
_LAYOUTS: dict[str, _Layout] = {
    "llama": _LLAMA,
    "mistral": _Layout("mistral", kv_heads=8, max_positions=131072, bias_keys=()),
    "mixtral": _Layout("mixtral", kv_heads=8, max_positions=131072, bias_keys=(), moe=True),
    "qwen2": _Layout("qwen2", kv_heads=32, max_positions=32768, bias_keys=(), hard_bias="qkv"),
    "gemma2": _Layout(
        "gemma2",
        kv_heads=4,
        max_positions=8192,
        tie=True,
        head_dim=256,
        activation="gelu_pytorch_tanh",
        norms_per_layer=4,
        bias_keys=(("attention_bias", "qkv o"),),
        sliding_pattern=2,
    ),
    "phi3": _Layout(
        "phi3", max_positions=4096, bias_keys=(), dropout_keys=("resid_pdrop", "embd_pdrop", "attention_dropout")
    ),
    "qwen3": _QWEN3,
    "qwen3_vl_text": replace(_QWEN3, family="qwen3", kv_heads=32, max_positions=128000),
    "qwen3_moe": replace(
        _QWEN3, family="qwen3_moe", kv_heads=4, head_dim=None, moe=True, experts=128, experts_per_token=8
    ),
    "qwen2_moe": _Layout(
        "qwen2_moe",
        kv_heads=16,
        max_positions=32768,
        bias_keys=(("qkv_bias", "qkv"),),
        hard_bias="qkv",  # Qwen2MoeConfig.qkv_bias defaults to True
        shared_gate=True,
        moe=True,
        experts=60,
        experts_per_token=4,
    ),
    "gemma3_text": _Layout(
        "gemma3_text",
        kv_heads=4,
        max_positions=131072,
        tie=True,
        head_dim=256,
        activation="gelu_pytorch_tanh",
        norms_per_layer=4,
        qk_norm="head",
        bias_keys=(("attention_bias", "qkv o"),),
        sliding_pattern=6,
    ),
    "llama4_text": _Layout(
        "llama4_text",
        kv_heads=8,
        max_positions=4096 * 32,
        head_dim=128,
        bias_keys=(("attention_bias", "qkv o"),),
        shared_expert_is_expert=True,
        dense_width_key="intermediate_size_mlp",
        expert_width_key="intermediate_size",
        moe=True,
        experts=16,
        experts_per_token=1,
    ),
    "deepseek_v2": replace(_DEEPSEEK, family="deepseek_v2", experts=64, experts_per_token=6),
    "deepseek_v3": _DEEPSEEK,
    "gpt_oss": _Layout(
        "gpt_oss",
        kv_heads=8,
        max_positions=131072,
        head_dim=64,
        bias_keys=(("attention_bias", "qkv o"),),
        hard_bias="qkv o expert",  # GptOssConfig.attention_bias defaults to True
        sinks=True,
        router_bias=True,
        moe=True,
        experts=128,
        experts_per_token=4,
    ),
    "glm4_moe": _Layout(
        "glm4_moe",
        kv_heads=8,
        floor_head_dim=True,
        max_positions=131072,
        qk_norm="head",
        qk_norm_key="use_qk_norm",
        bias_keys=(("attention_bias", "qkv"),),
        moe=True,
        experts=128,
        experts_per_token=8,
    ),
    "olmo2": _Layout("olmo2", max_positions=2048, qk_norm="full", bias_keys=(("attention_bias", "qkv o"),)),
    "olmo3": _Layout("olmo3", max_positions=2048, qk_norm="full", bias_keys=(("attention_bias", "qkv o"),)),
    "olmoe": _Layout(
        "olmoe",
        max_positions=4096,
        qk_norm="full",
        bias_keys=(("attention_bias", "qkv o"),),
        moe=True,
        experts=64,
        experts_per_token=8,
    ),
    "smollm3": _Layout("smollm3", kv_heads=4, max_positions=32768, tie=True),
    "granite": replace(_LLAMA, family="granite"),
    "starcoder2": _Layout(
        "starcoder2",
        kv_heads=2,
        max_positions=4096,
        tie=True,
        activation="gelu_pytorch_tanh",
        norm="layernorm",
        gated=False,
        bias_keys=(("use_bias", "qkv o mlp"),),
        hard_bias="qkv o mlp",  # Starcoder2Config.use_bias defaults to True
        dropout_keys=("attention_dropout", "residual_dropout", "embedding_dropout"),
    ),
    "cohere2": _Layout(
        "cohere2",
        max_positions=8192,
        tie=True,
        head_dim=128,
        norm="layernorm",
        norm_bias=False,
        norms_per_layer=1,
        parallel=True,
        bias_keys=(("attention_bias", "qkv o"),),
        sliding_pattern=4,
    ),
    "internlm3": _Layout(
        "internlm3",
        kv_heads=None,
        max_positions=32768,
        head_dim=None,
        bias_keys=(("qkv_bias", "qkv o"), ("attention_bias", "qkv o"), ("bias", "mlp"), ("mlp_bias", "mlp")),
    ),
    "seed_oss": _Layout(
        "seed_oss",
        max_positions=524288,
        bias_keys=(("attention_bias", "qkv"), ("attention_out_bias", "o"), ("mlp_bias", "mlp")),
        hard_bias="qkv",  # SeedOssConfig.attention_bias defaults to True
        dropout_keys=("attention_dropout", "residual_dropout"),
    ),
    "ernie4_5": _Layout(
        "ernie4_5", kv_heads=None, max_positions=131072, tie=True, bias_keys=(("use_bias", "qkv o mlp"),)
    ),
}
# What an unknown model_type is assumed to be: a llama decoder, the layout most decoders share.
_ASSUMED = _Layout(
    "llama",
    bias_keys=(("attention_bias", "qkv o"), ("mlp_bias", "mlp")),
)
_ASSUMPTIONS = (
    "gated (SwiGLU) MLP, two RMSNorms per layer, no q/k norms, biases only where attention_bias/mlp_bias say, "
    "the llama module layout"
)
# The keys a decoder's traits are read from: the first present of each tuple is used.
_LAYERS_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
_HEADS_KEYS = ("num_attention_heads", "n_head")
_EXPERTS_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOPK_KEYS = ("num_experts_per_tok", "moe_k", "experts_per_token")


def _first(cfg: ConfigFile, keys: tuple[str, ...]) -> str:
    """The first of ``keys`` the config has (non-null), else the first of them (for the error)."""
    return next((k for k in keys if cfg.data.get(k) is not None), keys[0])


def _int_list(cfg: ConfigFile, key: str) -> list[int] | None:
    value = cfg.data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise cfg.error(key, f"expected a list of layer indices, got {value!r}")
    return value


def _moe_layers(cfg: ConfigFile, layers: int) -> int:
    """How many layers hold a mixture of experts, from whichever layer-pattern keys the config has:
    ``moe_layers`` (llama4), ``first_k_dense_replace`` (DeepSeek, GLM), ``mlp_only_layers`` and
    ``decoder_sparse_step`` (Qwen MoE), ``interleave_moe_layer_step`` (llama4); otherwise every layer."""
    listed = _int_list(cfg, "moe_layers")
    if listed is not None:
        return len({i for i in listed if 0 <= i < layers})
    if "interleave_moe_layer_step" in cfg.data and cfg.data["interleave_moe_layer_step"] is not None:
        step = cfg.integer("interleave_moe_layer_step")
        return len(range(step - 1, layers, step))
    first_dense = cfg.integer("first_k_dense_replace", 0, minimum=0)
    step = cfg.integer("decoder_sparse_step", 1)
    dense_only = set(_int_list(cfg, "mlp_only_layers") or [])
    return sum(1 for i in range(first_dense, layers) if i not in dense_only and (i + 1) % step == 0)


def _sliding_layers(cfg: ConfigFile, layers: int, layout: _Layout) -> tuple[int, int]:
    """(window, layers using it): ``layer_types`` when given, else the family's pattern (Gemma,
    Cohere: every n-th layer global), else every layer when a window is set and
    ``use_sliding_window`` is not false."""
    window = cfg.data.get("sliding_window")
    if window is None or window == 0:
        return 0, 0
    window = cfg.integer("sliding_window")
    types = cfg.data.get("layer_types")
    if isinstance(types, list):
        return window, sum(1 for t in types[:layers] if t == "sliding_attention")
    if cfg.data.get("use_sliding_window") is False:
        return 0, 0
    pattern = (
        cfg.data.get("sliding_window_pattern") or cfg.data.get("_sliding_window_pattern") or layout.sliding_pattern
    )
    if type(pattern) is int and pattern > 0:
        return window, sum(1 for i in range(layers) if (i + 1) % pattern)
    return window, layers


def _biases(cfg: ConfigFile, layout: _Layout) -> set[str]:
    on = set(layout.hard_bias.split())
    for key, targets in layout.bias_keys:
        if key in cfg.data and cfg.data[key] is not None:
            if cfg.boolean(key, False):
                on |= set(targets.split())
            else:
                on -= set(targets.split())
    return on


def _falcon_attention(cfg: ConfigFile, heads: int) -> tuple[int, int, bool]:
    """(kv heads, norms per layer, parallel) of Falcon's three layouts (FalconDecoderLayer)."""
    parallel = cfg.boolean("parallel_attn", True)
    if cfg.boolean("new_decoder_architecture", False):
        kv_heads = cfg.integer("num_kv_heads", heads)
        lns = cfg.data.get("num_ln_in_parallel_attn")
        return kv_heads, 2 if lns is None else cfg.integer("num_ln_in_parallel_attn"), True
    kv_heads = 1 if cfg.boolean("multi_query", True) else heads
    return kv_heads, 1 if parallel else 2, parallel


def _heads(cfg: ConfigFile, hidden: int, heads_key: str) -> tuple[int, int]:
    heads = cfg.integer(heads_key)
    if hidden % heads:
        raise cfg.error(heads_key, f"{heads} does not divide hidden_size ({hidden})")
    return heads, hidden // heads


def _decoder(model_type: str, cfg: ConfigFile, name: str) -> ModelShape:
    layout = _LAYOUTS.get(model_type, _ASSUMED)
    hidden_key = _first(cfg, _HIDDEN_KEYS)
    hidden = cfg.integer(hidden_key)
    heads_key = _first(cfg, _HEADS_KEYS)
    heads = cfg.integer(heads_key)
    layers = cfg.integer(_first(cfg, _LAYERS_KEYS))
    norms_per_layer, parallel = layout.norms_per_layer, layout.parallel
    if model_type == "falcon":
        kv_heads, norms_per_layer, parallel = _falcon_attention(cfg, heads)
    else:
        kv_heads = cfg.integer("num_key_value_heads", heads if layout.kv_heads is None else layout.kv_heads)
    mla = cfg.data.get("kv_lora_rank") is not None  # MLA: every head has its own k and v
    if heads % kv_heads and not mla:
        raise cfg.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads ({heads})")
    mla_fields: dict[str, Any] = {}
    if mla:
        nope, rope = cfg.integer("qk_nope_head_dim"), cfg.integer("qk_rope_head_dim")
        head_dim, kv_heads = nope + rope, heads
        mla_fields = {
            "q_lora_rank": cfg.integer("q_lora_rank", 0, minimum=0),
            "kv_lora_rank": cfg.integer("kv_lora_rank"),
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope,
            "v_head_dim": cfg.integer("v_head_dim"),
        }
    elif layout.head_dim is None and cfg.data.get("head_dim") is None:
        if hidden % heads and not layout.floor_head_dim:
            raise cfg.error(heads_key, f"{heads} does not divide {hidden_key} ({hidden})")
        head_dim = hidden // heads
    else:
        head_dim = cfg.integer("head_dim", layout.head_dim)
    width_key = (
        layout.dense_width_key
        if layout.dense_width_key in cfg.data
        else _first(cfg, ("intermediate_size", "ffn_hidden_size", "n_inner"))
    )
    if model_type == "falcon":
        intermediate = cfg.integer("ffn_hidden_size", 4 * hidden)
    else:
        intermediate = cfg.integer(width_key)
    experts_key = _first(cfg, _EXPERTS_KEYS)
    num_experts = cfg.integer(experts_key, layout.experts if layout.moe else 0, minimum=0)
    moe_fields: dict[str, Any] = {}
    if num_experts:
        topk_key = _first(cfg, _TOPK_KEYS)
        per_token = cfg.integer(topk_key, layout.experts_per_token)
        if per_token > num_experts:
            raise cfg.error(topk_key, f"{per_token} exceeds {experts_key} ({num_experts})")
        expert_width = cfg.integer(layout.expert_width_key, intermediate)
        if layout.shared_expert_is_expert:
            shared = expert_width
        elif cfg.data.get("shared_expert_intermediate_size"):
            shared = cfg.integer("shared_expert_intermediate_size")
        else:
            shared = cfg.integer("n_shared_experts", 0, minimum=0) * expert_width
        moe_fields = {
            "num_experts": num_experts,
            "experts_per_token": per_token,
            "moe_intermediate_size": 0 if expert_width == intermediate else expert_width,  # 0: the same
            "dense_layers": layers - _moe_layers(cfg, layers),
            "shared_expert_intermediate_size": shared,
            "shared_expert_gate": layout.shared_gate and shared > 0,
            "router_bias": layout.router_bias,
        }
    biases = _biases(cfg, layout)
    if model_type == "falcon":
        biases = {"qkv", "o", "mlp"} if cfg.boolean("bias", False) else set()
    activation = cfg.string(_first(cfg, ("hidden_act", "hidden_activation", "activation")), layout.activation)
    qk_norm = layout.qk_norm
    if layout.qk_norm_key is not None and not cfg.boolean(layout.qk_norm_key, False):
        qk_norm = "none"
    window, window_layers = _sliding_layers(cfg, layers, layout)
    if model_type == "falcon":
        norm, gated = "layernorm", False
    else:
        norm, gated = layout.norm, layout.gated
    return ModelShape(
        name=name,
        family=layout.family if model_type != "falcon" else "falcon",  # type: ignore[arg-type]  # Family literals
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=cfg.integer("vocab_size"),
        mlp=("geglu" if activation.startswith("gelu") else "swiglu") if gated else "gelu",
        norm=norm,  # type: ignore[arg-type]  # a NormKind literal of _LAYOUTS
        norm_bias=layout.norm_bias,
        norms_per_layer=norms_per_layer,
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", layout.tie),
        attention_bias="qkv" in biases,
        attention_out_bias="o" in biases,
        mlp_bias="mlp" in biases,
        expert_bias="expert" in biases,
        qk_norm=qk_norm,  # type: ignore[arg-type]  # a QkNormKind literal of _LAYOUTS
        parallel_block=parallel,
        attention_sinks=layout.sinks,
        sliding_window=window,
        sliding_window_layers=window_layers,
        max_position_embeddings=cfg.integer("max_position_embeddings", layout.max_positions),
        dropout=cfg.probability(*layout.dropout_keys, default=0.0),
        **mla_fields,
        **moe_fields,
    )


# ---- GPT-2, GPT-NeoX, BERT ------------------------------------------------------------------------
def _layernorm_mha(
    cfg: ConfigFile,
    name: str,
    *,
    family: str,
    keys: tuple[str, str, str],  # the config's names for (layers, hidden size, heads)
    intermediate_size: int,
    tie: bool,
    bias: bool,
    dropout_keys: tuple[str, ...],
    dropout_default: float,
    **family_fields: Any,
) -> ModelShape:
    """The classic LayerNorm + multi-head attention + GELU MLP families; what differs is passed in."""
    layers_key, hidden_key, heads_key = keys
    hidden = cfg.integer(hidden_key)
    heads, head_dim = _heads(cfg, hidden, heads_key)
    return ModelShape(
        name=name,
        family=family,  # type: ignore[arg-type]  # one of the three callers' literals
        num_layers=cfg.integer(layers_key),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=cfg.integer("vocab_size"),
        mlp="gelu",
        norm="layernorm",
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", tie),
        attention_bias=bias,
        attention_out_bias=bias,
        mlp_bias=True,
        dropout=cfg.probability(*dropout_keys, default=dropout_default),
        **family_fields,
    )


def _gpt2(cfg: ConfigFile, name: str) -> ModelShape:
    positions = cfg.integer("n_positions", 1024)
    return _layernorm_mha(
        cfg,
        name,
        family="gpt2",
        keys=("n_layer", "n_embd", "n_head"),
        intermediate_size=cfg.integer("n_inner", 4 * cfg.integer("n_embd")),  # null means 4 * n_embd
        tie=True,
        bias=True,
        dropout_keys=("resid_pdrop", "embd_pdrop", "attn_pdrop"),
        dropout_default=0.1,
        learned_position_embeddings=positions,
        max_position_embeddings=positions,
    )


def _gpt_neox(cfg: ConfigFile, name: str) -> ModelShape:
    return _layernorm_mha(
        cfg,
        name,
        family="gpt_neox",
        keys=("num_hidden_layers", "hidden_size", "num_attention_heads"),
        intermediate_size=cfg.integer("intermediate_size"),
        tie=False,
        bias=cfg.boolean("attention_bias", True),
        dropout_keys=("attention_dropout", "hidden_dropout"),
        dropout_default=0.0,
        max_position_embeddings=cfg.integer("max_position_embeddings", 2048),
    )


def _bert(cfg: ConfigFile, name: str) -> ModelShape:
    positions = cfg.integer("max_position_embeddings", 512)
    return _layernorm_mha(
        cfg,
        name,
        family="bert",
        keys=("num_hidden_layers", "hidden_size", "num_attention_heads"),
        intermediate_size=cfg.integer("intermediate_size"),
        tie=True,
        bias=True,
        dropout_keys=("hidden_dropout_prob", "attention_probs_dropout_prob"),
        dropout_default=0.1,
        learned_position_embeddings=positions,
        token_type_embeddings=cfg.integer("type_vocab_size", 2, minimum=0),
        embedding_norm=True,
        final_norm=False,
        pooler=True,  # BertModel (AutoModel) is built with its pooler by default
        max_position_embeddings=positions,
        encoder_only=True,
    )


_LAYOUTS["falcon"] = _Layout("falcon", max_positions=2048, tie=True, norm="layernorm", gated=False)
_READERS: dict[str, Callable[[ConfigFile, str], ModelShape]] = {
    **{model_type: partial(_decoder, model_type) for model_type in _LAYOUTS},
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bert": _bert,
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_READERS))


# ---- entry point ----------------------------------------------------------------------------------
def default_model_name(file: Path) -> str:
    """The name a config file gives its model: its stem, or its folder's name for ``config.json``
    (a model folder downloaded from the Hub holds ``config.json``; a hand-named file names itself)."""
    resolved = file.resolve()
    return resolved.parent.name if resolved.name == "config.json" else resolved.stem


def shape_from_hf_config(path: Path, *, name: str | None = None) -> ModelShape:
    """Build the :class:`ModelShape` described by a local ``config.json`` (or a folder holding one).

    ``name`` defaults to the file's stem (``models/llama-33b.json`` -> ``llama-33b``), except for a
    file named ``config.json``, which Hugging Face names for its folder (``Llama-2-7b-hf/config.json``
    -> ``Llama-2-7b-hf``).
    """
    file = path / "config.json" if path.is_dir() else path
    location = Location(str(file))
    text = read_text(file, "")  # a bounded regular file (dsgen.inputs)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DsgenError(
            f"invalid JSON: {exc.msg} (column {exc.colno})", location=Location(str(file), exc.lineno)
        ) from exc
    except ValueError as exc:  # an integer over Python's 4,300-digit conversion limit
        raise DsgenError(f"invalid JSON: {exc}", location=location) from None
    except RecursionError:
        raise DsgenError("invalid JSON: nested too deeply to be a model config", location=location) from None
    if not isinstance(data, dict):
        raise DsgenError(f"expected a JSON object, got {type(data).__name__}", location=location)

    cfg = ConfigFile(data, text, file)
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    model_type = data.get("model_type")
    if model_type is None:
        raise cfg.error("model_type", "missing", hint=f"supported model types: {supported}")
    if not isinstance(model_type, str):
        raise cfg.error("model_type", f"expected a string, got {model_type!r}")
    name = name or default_model_name(file)
    if isinstance(data.get("text_config"), dict):
        shape = _multimodal(cfg, model_type, name)
    else:
        reader = _READERS.get(model_type)
        shape = reader(cfg, name) if reader is not None else _by_traits(cfg, model_type, name, supported)
    if shape.num_layers > MAX_LAYERS:  # issue 14: the per-layer tensor list grows with it
        key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in data), "num_hidden_layers")
        raise cfg.error(key, f"must be at most {MAX_LAYERS:,}, got {shape.num_layers}")
    return shape


class AssumptionWarning(UserWarning):
    """A config was read, but part of what dsgen needed was assumed rather than read."""


_REQUIRED_TRAITS = (_HIDDEN_KEYS, _LAYERS_KEYS, _HEADS_KEYS, ("intermediate_size", "ffn_hidden_size"), ("vocab_size",))


def _by_traits(cfg: ConfigFile, model_type: str, name: str, supported: str) -> ModelShape:
    """An unknown model_type whose keys are those of a decoder: read it as a llama-layout decoder,
    saying what was assumed; without them, name the first key it lacks."""
    for keys in _REQUIRED_TRAITS:
        if all(cfg.data.get(k) is None for k in keys):
            raise cfg.error(
                keys[0],
                f"missing: model_type {model_type!r} is not one dsgen knows, and a decoder cannot be read without it",
                hint=f"supported model types: {supported}; or describe the model with model.architecture",
            )
    shape = _decoder(model_type, cfg, name)
    warnings.warn(
        f"{cfg.file}: model_type {model_type!r} is not one dsgen knows; read from its keys assuming {_ASSUMPTIONS}",
        AssumptionWarning,
        stacklevel=3,
    )
    return shape


def _multimodal(cfg: ConfigFile, model_type: str, name: str) -> ModelShape:
    """A checkpoint whose language model is described by ``text_config`` (Gemma 3, Llama 4,
    Qwen3-VL): the language model is read by its traits, the rest of the model (vision tower,
    projector) is counted from ``vision_config`` by :mod:`dsgen.catalog.vision`, so the parameter
    count (and the model states) are the whole model's while the activation model describes the
    language model, which the warning says."""
    text_data = dict(cfg.data["text_config"])
    text_type = text_data.get("model_type") or f"{model_type}_text"
    if "tie_word_embeddings" in cfg.data and "tie_word_embeddings" not in text_data:
        text_data["tie_word_embeddings"] = cfg.data["tie_word_embeddings"]
    text_cfg = ConfigFile(text_data, cfg.text, cfg.file)
    reader = _READERS.get(text_type)
    shape = (
        reader(text_cfg, name) if reader else _by_traits(text_cfg, text_type, name, ", ".join(SUPPORTED_MODEL_TYPES))
    )
    vision = non_text_parameters(cfg, model_type, shape)
    warnings.warn(
        f"{cfg.file}: {model_type} is multimodal: the parameter count includes its vision tower and projector "
        f"({vision:,} parameters); activations are those of the language model ({text_type}) on text",
        AssumptionWarning,
        stacklevel=3,
    )
    return replace(shape, non_text_parameters=vision)
