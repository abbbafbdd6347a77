"""The architecture numbers dsgen needs from a model, and exact parameter counts derived from them.

A :class:`ModelShape` is what a preset, a local Hugging Face ``config.json`` or an inline
``architecture`` block all resolve to. Parameter counts are computed module by module in the
layout Hugging Face ``transformers`` uses for each family, so they match the published counts
exactly (tests check this against ``transformers`` models built on the meta device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import wraps
from typing import Any, Literal, TypeVar

_T = TypeVar("_T")


def _memoized(method: Callable[..., _T]) -> Callable[..., _T]:
    """Cache a count on the (immutable) instance: the solver asks for the same counts thousands
    of times per solve. The cache lives outside the dataclass fields, so equality, hashing,
    ``replace`` and ``asdict`` are unaffected."""

    name = method.__name__

    @wraps(method)
    def wrapper(self: ModelShape, *args: object, **kwargs: object) -> _T:
        cache: dict[object, Any] | None = self._memo
        if cache is None:
            cache = {}
            object.__setattr__(self, "_memo", cache)
        key = (name, *args, *kwargs.values()) if args or kwargs else name
        try:
            return cache[key]
        except KeyError:
            value = cache[key] = method(self, *args, **kwargs)
            return value

    return wrapper


Family = Literal["llama", "mistral", "qwen2", "gemma2", "phi3", "gpt2", "gpt_neox", "bert", "mixtral"]
MlpKind = Literal["swiglu", "geglu", "gelu"]
NormKind = Literal["rmsnorm", "layernorm"]

FAMILIES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "bert",
    "mixtral",
)
# Families whose transformers implementation fuses projections into one nn.Module (matters only for
# the largest-module size; the parameter totals are the same as with separate projections).
_FUSED_QKV = frozenset({"gpt2", "gpt_neox", "phi3"})
_FUSED_GATE_UP = frozenset({"phi3"})


@dataclass(frozen=True)
class ModelShape:
    """Architecture of a dense or mixture-of-experts transformer, as the memory model sees it."""

    name: str
    family: Family
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    mlp: MlpKind = "swiglu"
    norm: NormKind = "rmsnorm"
    norms_per_layer: int = 2
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # biases on the q/k/v projections
    attention_out_bias: bool = False  # bias on the attention output projection
    mlp_bias: bool = False
    learned_position_embeddings: int = 0  # rows of a learned position table (0 with rotary)
    token_type_embeddings: int = 0  # BERT's segment embeddings
    embedding_norm: bool = False  # a norm right after the embeddings (BERT)
    final_norm: bool = True
    pooler: bool = False  # BERT's pooler dense layer
    num_experts: int = 0  # 0 for dense models
    experts_per_token: int = 0
    max_position_embeddings: int = 4096
    dropout: float = 0.0  # residual/attention dropout probability used in training
    encoder_only: bool = False
    # Caches, not fields (no annotation): filled once per instance with object.__setattr__, never
    # through __dict__, which would cost every later attribute read CPython's fast path.
    _memo = None
    _hash = None

    def __hash__(self) -> int:
        """Hash of the fields, computed once: shapes are lru_cache keys on the solver's hot path."""
        value = self._hash
        if value is None:
            value = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", value)
        return value

    def __getstate__(self) -> dict[str, object]:
        """Pickle the fields only: the cached hash is of strings, which differ between processes."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in ("swiglu", "geglu")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # ---- parameter counts ----------------------------------------------------------------
    def _norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layernorm" else 1)

    @_memoized
    def attention_parameters(self) -> int:
        h = self.hidden_size
        params = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            params += self.q_size + 2 * self.kv_size
        if self.attention_out_bias:
            params += h
        return params

    def expert_mlp_parameters(self) -> int:
        """Parameters of one feed-forward block (one expert for MoE models)."""
        h, f = self.hidden_size, self.intermediate_size
        params = (3 if self.gated_mlp else 2) * h * f
        if self.mlp_bias:
            params += (2 * f if self.gated_mlp else f) + h
        return params

    @_memoized
    def mlp_parameters(self, active_only: bool = False) -> int:
        if not self.is_moe:
            return self.expert_mlp_parameters()
        experts = self.experts_per_token if active_only else self.num_experts
        router = self.hidden_size * self.num_experts
        return experts * self.expert_mlp_parameters() + router

    @_memoized
    def layer_parameters(self, active_only: bool = False) -> int:
        return (
            self.attention_parameters() + self.mlp_parameters(active_only) + self.norms_per_layer * self._norm_params()
        )

    @_memoized
    def embedding_parameters(self) -> int:
        h = self.hidden_size
        params = self.vocab_size * h
        params += self.learned_position_embeddings * h
        params += self.token_type_embeddings * h
        if self.embedding_norm:
            params += self._norm_params()
        return params

    @_memoized
    def head_parameters(self) -> int:
        """Final norm, untied output projection and pooler: everything after the last layer."""
        h = self.hidden_size
        params = self._norm_params() if self.final_norm else 0
        if not self.tie_word_embeddings and not self.encoder_only:
            params += self.vocab_size * h
        if self.pooler:
            params += h * h + h
        return params

    @_memoized
    def parameter_count(self) -> int:
        """Total trainable parameters (shared embedding/output weights counted once)."""
        return self.embedding_parameters() + self.num_layers * self.layer_parameters() + self.head_parameters()

    @_memoized
    def active_parameter_count(self) -> int:
        """Parameters touched per token: all of them for dense models, routed experts only for MoE."""
        return (
            self.embedding_parameters()
            + self.num_layers * self.layer_parameters(active_only=True)
            + self.head_parameters()
        )

    @_memoized
    def largest_module_parameters(self) -> int:
        """Parameters of the largest single module (DeepSpeed's "largest layer" for ZeRO-3).

        DeepSpeed counts each ``nn.Module``'s own parameters (``recurse=False``), biases included.
        The candidates are the embedding tables, the untied output projection, the pooler and the
        biggest projection of a layer, in transformers' module layout: q/k/v fused into one module
        for gpt2, gpt_neox and phi3, gate/up fused for phi3, and (transformers >= 5) all experts of
        a MoE layer held as one module, so ZeRO-3 gathers the whole expert bank at once.
        """
        h, f = self.hidden_size, self.intermediate_size
        candidates = [
            self.vocab_size * h,
            self.learned_position_embeddings * h,
            self.token_type_embeddings * h,
            self.q_size * h + (h if self.attention_out_bias else 0),
        ]
        q_out = self.q_size + 2 * self.kv_size if self.family in _FUSED_QKV else self.q_size
        candidates.append(h * q_out + (q_out if self.attention_bias else 0))
        if self.is_moe:
            candidates.append(self.num_experts * self.expert_mlp_parameters())
        else:
            up_out = 2 * f if self.family in _FUSED_GATE_UP else f
            candidates.append(h * up_out + (up_out if self.mlp_bias else 0))
            candidates.append(f * h + (h if self.mlp_bias else 0))
        if not self.tie_word_embeddings and not self.encoder_only:
            candidates.append(self.vocab_size * h)
        if self.pooler:
            candidates.append(h * h + h)
        return max(candidates)

    def layer_gather_parameters(self) -> int:
        """Parameters ZeRO-3 must gather to run one transformer layer (its live working set)."""
        return self.layer_parameters()
