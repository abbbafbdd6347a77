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
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError, Location
from dsgen.inputs import read_text

_UNSET: Any = object()


#: Largest integer read from a config.json, the bound the spec schema puts on model dimensions.
MAX_INTEGER = 2**53
#: Most layers a model may have (the spec schema's bound on model.architecture.num_layers).
MAX_LAYERS = 10_000


class _Config:
    """Typed access to one parsed ``config.json``, raising :class:`DsgenError` that names the key."""

    def __init__(self, data: dict[str, Any], text: str, file: Path) -> None:
        self.data = data
        self.text = text
        self.file = file

    def error(self, key: str, message: str, hint: str | None = None) -> DsgenError:
        return DsgenError(message, path=key, location=Location(str(self.file), self._line_of(key)), hint=hint)

    def _line_of(self, key: str) -> int | None:
        """The line of ``"key":`` when it occurs exactly once in the file (never a wrong guess)."""
        matches = list(re.finditer(rf'"{re.escape(key)}"\s*:', self.text))
        if len(matches) != 1:
            return None
        return self.text.count("\n", 0, matches[0].start()) + 1

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is None:  # absent, or null: transformers then uses its class default too
            if default is _UNSET:
                raise self.error(key, "is null" if key in self.data else "missing")
            return default
        return value

    def integer(self, key: str, default: Any = _UNSET, *, minimum: int = 1) -> int:
        value = self._get(key, default)
        if type(value) is not int:
            raise self.error(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if value > MAX_INTEGER:  # issue 14: absurd sizes overflowed the float arithmetic
            raise self.error(key, f"must be at most 2**53, got an integer of {value.bit_length()} bits")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if type(value) is not bool:
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def probability(self, *keys: str, default: float) -> float:
        """The largest of several dropout probabilities (any of them > 0 means masks are kept)."""
        values = []
        for key in keys:
            value = self._get(key, default)
            if type(value) not in (int, float) or not 0 <= value < 1:
                raise self.error(key, f"expected a probability in [0, 1), got {value!r}")
            values.append(float(value))
        return max(values)

    def string(self, key: str, default: str) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value


# ---- gated-MLP decoders (llama and its descendants) ------------------------------------------------
@dataclass(frozen=True)
class _DecoderRules:
    """Where one llama-like family differs: its transformers defaults and hard-coded layout."""

    kv_heads: int | None  # default num_key_value_heads; None = num_attention_heads
    max_positions: int
    tie: bool = False
    head_dim: int | None = None  # default head_dim; None = hidden_size // num_attention_heads
    activation_key: str = "hidden_act"
    activation: str = "silu"
    attention_bias_key: bool = False  # reads attention_bias (biases on q/k/v and o_proj)
    mlp_bias_key: bool = False  # reads mlp_bias (biases on gate/up/down)
    qkv_bias: bool = False  # hard-coded biases on q/k/v only (qwen2)
    norms_per_layer: int = 2
    moe: bool = False
    dropout_keys: tuple[str, ...] = ("attention_dropout",)


_DECODERS: dict[str, _DecoderRules] = {
    "llama": _DecoderRules(kv_heads=None, max_positions=2048, attention_bias_key=True, mlp_bias_key=True),
    "mistral": _DecoderRules(kv_heads=8, max_positions=131072),
    "mixtral": _DecoderRules(kv_heads=8, max_positions=131072, moe=True),
    "qwen2": _DecoderRules(kv_heads=32, max_positions=32768, qkv_bias=True),
    "gemma2": _DecoderRules(
        kv_heads=4,
        max_positions=8192,
        tie=True,
        head_dim=256,
        activation_key="hidden_activation",
        activation="gelu_pytorch_tanh",
        attention_bias_key=True,
        norms_per_layer=4,
    ),
    "phi3": _DecoderRules(
        kv_heads=None,
        max_positions=4096,
        dropout_keys=("resid_pdrop", "embd_pdrop", "attention_dropout"),
    ),
}


def _heads(cfg: _Config, hidden: int, heads_key: str) -> tuple[int, int]:
    heads = cfg.integer(heads_key)
    if hidden % heads:
        raise cfg.error(heads_key, f"{heads} does not divide hidden_size ({hidden})")
    return heads, hidden // heads


def _decoder(model_type: str, cfg: _Config, name: str) -> ModelShape:
    rules = _DECODERS[model_type]
    hidden = cfg.integer("hidden_size")
    heads = cfg.integer("num_attention_heads")
    if rules.head_dim is None and cfg.data.get("head_dim") is None:
        _, head_dim = _heads(cfg, hidden, "num_attention_heads")
    else:
        head_dim = cfg.integer("head_dim", rules.head_dim)
    kv_heads = cfg.integer("num_key_value_heads", heads if rules.kv_heads is None else rules.kv_heads)
    if heads % kv_heads:
        raise cfg.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads ({heads})")
    attention_bias = cfg.boolean("attention_bias", False) if rules.attention_bias_key else False
    num_experts = experts_per_token = 0
    if rules.moe:
        num_experts = cfg.integer("num_local_experts", 8)
        experts_per_token = cfg.integer("num_experts_per_tok", 2)
        if experts_per_token > num_experts:
            message = f"{experts_per_token} exceeds num_local_experts ({num_experts})"
            raise cfg.error("num_experts_per_tok", message)
    activation = cfg.string(rules.activation_key, rules.activation)
    return ModelShape(
        name=name,
        family=model_type,  # type: ignore[arg-type]  # a key of _DECODERS, all of them families
        num_layers=cfg.integer("num_hidden_layers"),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.integer("intermediate_size"),
        vocab_size=cfg.integer("vocab_size"),
        mlp="geglu" if activation.startswith("gelu") else "swiglu",
        norm="rmsnorm",
        norms_per_layer=rules.norms_per_layer,
        tie_word_embeddings=cfg.boolean("tie_word_embeddings", rules.tie),
        attention_bias=attention_bias or rules.qkv_bias,
        attention_out_bias=attention_bias,
        mlp_bias=cfg.boolean("mlp_bias", False) if rules.mlp_bias_key else False,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        max_position_embeddings=cfg.integer("max_position_embeddings", rules.max_positions),
        dropout=cfg.probability(*rules.dropout_keys, default=0.0),
    )


# ---- GPT-2, GPT-NeoX, BERT ------------------------------------------------------------------------
def _layernorm_mha(
    cfg: _Config,
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


def _gpt2(cfg: _Config, name: str) -> ModelShape:
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


def _gpt_neox(cfg: _Config, name: str) -> ModelShape:
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


def _bert(cfg: _Config, name: str) -> ModelShape:
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


_READERS: dict[str, Callable[[_Config, str], ModelShape]] = {
    **{model_type: partial(_decoder, model_type) for model_type in _DECODERS},
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bert": _bert,
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_READERS))


# ---- entry point ----------------------------------------------------------------------------------
def shape_from_hf_config(path: Path, *, name: str | None = None) -> ModelShape:
    """Build the :class:`ModelShape` described by a local ``config.json`` (or a folder holding one).

    ``name`` defaults to the folder the file is in (``Llama-2-7b-hf/config.json`` -> ``Llama-2-7b-hf``).
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

    cfg = _Config(data, text, file)
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    model_type = data.get("model_type")
    if model_type is None:
        raise cfg.error("model_type", "missing", hint=f"supported model types: {supported}")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise cfg.error(
            "model_type",
            f"unsupported model_type {model_type!r}; supported: {supported}",
            hint="describe the model with model.architecture instead",
        )
    shape = reader(cfg, name or file.resolve().parent.name)
    if shape.num_layers > MAX_LAYERS:  # issue 14: the per-layer tensor list grows with it
        key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in data), "num_hidden_layers")
        raise cfg.error(key, f"must be at most {MAX_LAYERS:,}, got {shape.num_layers}")
    return shape
