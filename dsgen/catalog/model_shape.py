"""The architecture numbers dsgen needs from a model, and exact parameter counts derived from them.

A :class:`ModelShape` is what a preset, a local Hugging Face ``config.json`` or an inline
``architecture`` block all resolve to. Parameter counts are computed module by module in the
layout Hugging Face ``transformers`` uses for each family, so they match the published counts
exactly (tests check this against ``transformers`` models built on the meta device).
"""

from __future__ import annotations

import typing
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


# The family is the transformers implementation whose module layout (and saved activations) the shape
# follows; the traits below say how it differs from a llama decoder. A model_type dsgen reads by its
# traits but has no family for is described as the closest family (the reader says which).
Family = Literal[
    "llama",
    "mistral",
    "qwen2",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "bert",
    "mixtral",
    "qwen3",
    "qwen3_moe",
    "qwen2_moe",
    "gemma3_text",
    "llama4_text",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "glm4_moe",
    "olmo2",
    "olmo3",
    "olmoe",
    "smollm3",
    "granite",
    "starcoder2",
    "cohere2",
    "falcon",
    "internlm3",
    "seed_oss",
    "ernie4_5",
]
MlpKind = Literal["swiglu", "geglu", "gelu"]
NormKind = Literal["rmsnorm", "layernorm"]
QkNormKind = Literal["none", "head", "full"]  # RMSNorm over head_dim (qwen3, gemma3) or all heads (olmo2)

FAMILIES: tuple[str, ...] = typing.get_args(Family)
# Families whose transformers implementation fuses projections into one nn.Module (matters only for
# the largest-module size; the parameter totals are the same as with separate projections).
_FUSED_QKV = frozenset({"gpt2", "gpt_neox", "phi3", "falcon"})
_FUSED_GATE_UP = frozenset({"phi3"})
# The families of today's decoders (issue 17), described by the trait fields alone: their tensor
# layout (ModelShape.parameter_shapes) and activations (estimate.activations) follow the traits.
TRAIT_FAMILIES: frozenset[str] = frozenset(FAMILIES[FAMILIES.index("qwen3") :])
# The transformers class of each MoE family's sparse block: under ZeRO-3 it must be a leaf module
# (deepspeed.utils.set_z3_leaf_modules), or ranks whose tokens route to different experts fetch
# different parameters and hang (DeepSpeed's MoE/ZeRO-3 guidance; the plan's instructions say so).
MOE_BLOCK_CLASSES: dict[str, str] = {
    "mixtral": "MixtralSparseMoeBlock",
    "qwen3_moe": "Qwen3MoeSparseMoeBlock",
    "qwen2_moe": "Qwen2MoeSparseMoeBlock",
    "olmoe": "OlmoeSparseMoeBlock",
    "deepseek_v2": "DeepseekV2Moe",
    "deepseek_v3": "DeepseekV3MoE",
    "gpt_oss": "GptOssMLP",
    "glm4_moe": "Glm4MoeMoE",
    "llama4_text": "Llama4TextMoe",
}


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
    # ---- traits of today's decoders (defaults: a llama layer) ----
    norm_bias: bool = True  # LayerNorm with a bias (Cohere's LayerNorm has none); RMSNorm never has one
    qk_norm: QkNormKind = "none"  # RMSNorm weights on q and k after their projections
    parallel_block: bool = False  # attention and MLP read the same normed input (cohere2, falcon)
    attention_sinks: bool = False  # one learned sink logit per head (gpt_oss)
    sliding_window: int = 0  # window of the sliding-window layers (0: none)
    sliding_window_layers: int = 0  # how many layers use it (layer_types)
    # multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank > 0 switches it on
    q_lora_rank: int = 0  # 0: q is one projection from the hidden state
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # mixture of experts (num_experts > 0)
    moe_intermediate_size: int = 0  # one routed expert's width; 0: intermediate_size (mixtral)
    dense_layers: int = 0  # layers of an MoE model whose MLP is dense (first_k_dense_replace, mlp_only_layers)
    shared_expert_intermediate_size: int = 0  # width of the always-on shared expert(s), 0: none
    shared_expert_gate: bool = False  # qwen2_moe's sigmoid gate on the shared expert
    router_bias: bool = False
    expert_bias: bool = False  # biases on the routed experts (gpt_oss)
    # a multimodal checkpoint's vision tower and projector: counted in the model's parameters (and
    # so in its model states) but outside the language model the activation model describes
    non_text_parameters: int = 0
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
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_size(self) -> int:
        """Width of the queries (and, except for MLA, of the attention output)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def attention_out_size(self) -> int:
        """Input width of the output projection: heads x v_head_dim for MLA, q_size otherwise."""
        return self.num_attention_heads * self.v_head_dim if self.is_mla else self.q_size

    @property
    def attention_score_width(self) -> int:
        """Mean of the q·k and probs·v widths per token (heads x head dims): the width the
        ``12·L·s·width`` attention FLOPs term uses. MLA's q/k heads (nope + rope) are wider than
        its v heads; for every other attention both are q_size."""
        return (self.q_size + self.attention_out_size) // 2

    @property
    def gated_mlp(self) -> bool:
        return self.mlp in ("swiglu", "geglu")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (the other layers are dense)."""
        return self.num_layers - self.dense_layers if self.is_moe else 0

    # ---- parameter counts ----------------------------------------------------------------
    def _norm_params(self, width: int | None = None) -> int:
        width = self.hidden_size if width is None else width
        return width * (2 if self.norm == "layernorm" and self.norm_bias else 1)

    @_memoized
    def attention_parameters(self) -> int:
        h, nh = self.hidden_size, self.num_attention_heads
        if self.is_mla:  # DeepseekV3Attention: q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj
            bias = 1 if self.attention_bias else 0
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
            q = (h * r_q + bias * r_q + r_q + r_q * nh * q_head) if r_q else h * nh * q_head
            kv = h * (r_kv + self.qk_rope_head_dim) + bias * (r_kv + self.qk_rope_head_dim) + r_kv
            kv += r_kv * nh * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.attention_out_size * h + bias * h
        params = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            params += self.q_size + 2 * self.kv_size
        if self.attention_out_bias:
            params += h
        if self.qk_norm == "head":
            params += 2 * self.head_dim
        elif self.qk_norm == "full":
            params += self.q_size + self.kv_size
        if self.attention_sinks:
            params += nh
        return params

    def _mlp(self, width: int, bias: bool) -> int:
        h = self.hidden_size
        params = (3 if self.gated_mlp else 2) * h * width
        if bias:
            params += (2 * width if self.gated_mlp else width) + h
        return params

    def dense_mlp_parameters(self) -> int:
        """Parameters of a dense layer's feed-forward block."""
        return self._mlp(self.intermediate_size, self.mlp_bias)

    def expert_mlp_parameters(self) -> int:
        """Parameters of one feed-forward block (one routed expert for MoE models)."""
        if not self.is_moe:
            return self.dense_mlp_parameters()
        return self._mlp(self.expert_intermediate_size, self.expert_bias)

    def router_parameters(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def shared_expert_parameters(self) -> int:
        params = (
            self._mlp(self.shared_expert_intermediate_size, self.mlp_bias)
            if self.shared_expert_intermediate_size
            else 0
        )
        return params + (self.hidden_size if self.shared_expert_gate else 0)

    @_memoized
    def mlp_parameters(self, active_only: bool = False) -> int:
        """A layer's feed-forward block: the dense MLP, or the whole MoE block (routed experts,
        router, shared experts; only the experts_per_token routed experts when ``active_only``)."""
        if not self.is_moe:
            return self.dense_mlp_parameters()
        experts = self.experts_per_token if active_only else self.num_experts
        return experts * self.expert_mlp_parameters() + self.router_parameters() + self.shared_expert_parameters()

    def _layer(self, mlp: int) -> int:
        return self.attention_parameters() + mlp + self.norms_per_layer * self._norm_params()

    @_memoized
    def layer_parameters(self, active_only: bool = False) -> int:
        """The largest layer: an MoE layer when there is one (dense layers of MoE models are smaller
        in every released model, but the larger of the two is taken)."""
        dense = self._layer(self.dense_mlp_parameters()) if self.dense_layers or not self.is_moe else 0
        return max(dense, self._layer(self.mlp_parameters(active_only)) if self.is_moe else 0)

    @_memoized
    def layers_parameters(self, active_only: bool = False) -> int:
        """All transformer layers together."""
        moe = self.moe_layers * self._layer(self.mlp_parameters(active_only)) if self.is_moe else 0
        dense_count = self.dense_layers if self.is_moe else self.num_layers
        return moe + dense_count * self._layer(self.dense_mlp_parameters())

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
    def text_parameter_count(self) -> int:
        """Parameters of the language model (all of them for a text-only checkpoint)."""
        return self.embedding_parameters() + self.layers_parameters() + self.head_parameters()

    @_memoized
    def parameter_count(self) -> int:
        """Total trainable parameters (shared embedding/output weights counted once), vision tower included."""
        return self.text_parameter_count() + self.non_text_parameters

    @_memoized
    def active_parameter_count(self) -> int:
        """Parameters a text token goes through: all of the language model's for dense models, the
        routed experts it is sent to (plus router and shared experts) for MoE; a vision tower never."""
        return self.embedding_parameters() + self.layers_parameters(active_only=True) + self.head_parameters()

    @_memoized
    def largest_module_parameters(self) -> int:
        """Parameters of the largest single module (DeepSpeed's "largest layer" for ZeRO-3).

        DeepSpeed counts each ``nn.Module``'s own parameters (``recurse=False``), biases included.
        The candidates are the embedding tables, the untied output projection, the pooler and the
        biggest projection of a layer, in transformers' module layout: q/k/v fused into one module
        for gpt2, gpt_neox, phi3 and falcon, gate/up fused for phi3, MLA's low-rank projections,
        and (transformers >= 5) all routed experts of a MoE layer held as one module.
        """
        h, f = self.hidden_size, self.intermediate_size
        candidates = [
            self.vocab_size * h,
            self.learned_position_embeddings * h,
            self.token_type_embeddings * h,
            self.attention_out_size * h + (h if self.attention_out_bias else 0),
        ]
        if self.is_mla:
            bias = 1 if self.attention_bias else 0
            nh, q_head = self.num_attention_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
            r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
            candidates += [h * r_q + bias * r_q, r_q * nh * q_head] if r_q else [h * nh * q_head]
            kv_a = r_kv + self.qk_rope_head_dim
            candidates += [h * kv_a + bias * kv_a, r_kv * nh * (self.qk_nope_head_dim + self.v_head_dim)]
        else:
            q_out = self.q_size + 2 * self.kv_size if self.family in _FUSED_QKV else self.q_size
            candidates.append(h * q_out + (q_out if self.attention_bias else 0))
        if self.is_moe:
            candidates.append(self.num_experts * self.expert_mlp_parameters())
            candidates.append(self.router_parameters())
            fs = self.shared_expert_intermediate_size
            candidates.append(h * fs + (fs if self.mlp_bias else 0))
        if not self.is_moe or self.dense_layers:
            up_out = 2 * f if self.family in _FUSED_GATE_UP else f
            candidates.append(h * up_out + (up_out if self.mlp_bias else 0))
            candidates.append(f * h + (h if self.mlp_bias else 0))
        if not self.tie_word_embeddings and not self.encoder_only:
            candidates.append(self.vocab_size * h)
        if self.pooler:
            candidates.append(h * h + h)
        return max(candidates)

    def parameter_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes of the parameter tensors, in the registration order of transformers' llama-style
        decoder layer (attention, its q/k norms and sinks, then the MLP or MoE block - router,
        stacked experts, shared expert - then the norms), for the trait families. ZeRO-3
        partitions and keeps persistent each tensor on its own, so the sizes are what matter."""
        h, nh = self.hidden_size, self.num_attention_heads

        def linear(fan_in: int, fan_out: int, bias: bool) -> list[tuple[int, ...]]:
            return [(fan_out, fan_in), (fan_out,)] if bias else [(fan_out, fan_in)]

        norm: list[tuple[int, ...]] = [(h,), (h,)] if self.norm == "layernorm" and self.norm_bias else [(h,)]
        ab, aob = self.attention_bias, self.attention_out_bias
        if self.is_mla:
            q_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
            q = (
                [*linear(h, r_q, ab), (r_q,), *linear(r_q, nh * q_head, False)]
                if r_q
                else linear(h, nh * q_head, False)
            )
            attention = [
                *q,
                *linear(h, r_kv + self.qk_rope_head_dim, ab),
                (r_kv,),
                *linear(r_kv, nh * (self.qk_nope_head_dim + self.v_head_dim), False),
                *linear(nh * self.v_head_dim, h, aob),
            ]
        elif self.family in _FUSED_QKV:
            attention = [*linear(h, self.q_size + 2 * self.kv_size, ab), *linear(self.q_size, h, aob)]
        else:
            attention = [
                *linear(h, self.q_size, ab),
                *linear(h, self.kv_size, ab),
                *linear(h, self.kv_size, ab),
                *linear(self.q_size, h, aob),
            ]
        if self.qk_norm == "head":
            attention += [(self.head_dim,), (self.head_dim,)]
        elif self.qk_norm == "full":
            attention += [(self.q_size,), (self.kv_size,)]
        if self.attention_sinks:
            attention.append((nh,))

        def mlp(width: int, bias: bool) -> list[tuple[int, ...]]:
            up = linear(h, width, bias) * (2 if self.gated_mlp else 1)
            return [*up, *linear(width, h, bias)]

        dense = mlp(self.intermediate_size, self.mlp_bias)
        e, f = self.num_experts, self.expert_intermediate_size
        up_width = 2 * f if self.gated_mlp else f
        moe: list[tuple[int, ...]] = [(e, h), *([(e,)] if self.router_bias else [])]
        moe += [(e, up_width, h), *([(e, up_width)] if self.expert_bias else [])]
        moe += [(e, h, f), *([(e, h)] if self.expert_bias else [])]
        if self.shared_expert_intermediate_size:
            moe += mlp(self.shared_expert_intermediate_size, self.mlp_bias)
        if self.shared_expert_gate:
            moe.append((1, h))
        layer_norms = norm * self.norms_per_layer
        tensors: list[tuple[int, ...]] = [(self.vocab_size, h)]
        dense_count = self.dense_layers if self.is_moe else self.num_layers
        tensors += [*attention, *dense, *layer_norms] * dense_count
        tensors += [*attention, *moe, *layer_norms] * self.moe_layers
        tensors += norm
        if not self.tie_word_embeddings:
            tensors.append((self.vocab_size, h))
        if self.non_text_parameters:
            # a multimodal checkpoint's vision tower, as one tensor: its own layout is not kept (ZeRO-3
            # pads each of its tensors by < N elements and keeps its small ones whole: not modelled)
            tensors.append((self.non_text_parameters,))
        return tuple(tensors)

    @_memoized
    def largest_gathered_parameters(self) -> int:
        """The most parameters ZeRO-3 gathers at once for one module: the largest module, or a
        whole MoE block, which must be a ZeRO-3 leaf module (``deepspeed.utils.set_z3_leaf_modules``)
        so that every rank fetches all experts together even when its tokens route to few of them."""
        return max(self.largest_module_parameters(), self.mlp_parameters() if self.is_moe else 0)

    def layer_gather_parameters(self) -> int:
        """Parameters ZeRO-3 must gather to run one transformer layer (its live working set)."""
        return self.layer_parameters()
