"""Which of a model's parameters train and which are frozen, for each fine-tuning method.

DeepSpeed builds everything an optimizer needs only from the parameters that require gradients:
ZeRO-1/2 flatten and partition ``[p for p in group if p.requires_grad]``
(``runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer.__init__``: ``trainable_parameters``),
ZeRO-3 builds its fp16/fp32 partitions, sub-groups and gradient buffer from
``_get_trainable_parameter_groups`` (``runtime/zero/stage3.py``), and the BF16/FP16 optimizers of
ZeRO-0 skip frozen parameters the same way. Frozen parameters therefore hold only their weights:
ZeRO-0/1/2 leave them whole in every process, and ZeRO-3 still partitions them (its parameter
partitioning, ``DeepSpeedZeRoOffload``, covers the whole module).

The split is computed once per model and method (:func:`parameter_split`); the model-state
accounting (:mod:`dsgen.estimate.model_states`) reads the trainable tensors where it read the
whole model before, and :func:`frozen_bytes` prices the rest. docs/memory-model.md, "Fine-tuning".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from math import prod
from typing import TypeVar

from dsgen.catalog.linear_layers import LinearLayer, decoder_linear_layers
from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.memo import identity_cache
from dsgen.estimate.parameter_layout import Shape, parameter_shapes
from dsgen.spec.types import FineTuning, Lora, Quantization
from dsgen.units import FP32

# bitsandbytes keeps each 4-bit block's absmax; with double quantization those absmax values are
# themselves quantized to 8 bits in blocks of 256, each with an fp32 absmax of its own
# (bitsandbytes/functional.py: quantize_4bit, compress_statistics -> quantize_blockwise(blocksize=256)).
NESTED_BLOCK = 256
T = TypeVar("T")


@dataclass(frozen=True)
class QuantizedWeight:
    """One frozen linear weight stored quantized: its logical shape (out, in) and how many layers hold it."""

    fan_in: int
    fan_out: int
    count: int

    @property
    def elements(self) -> int:
        return self.fan_in * self.fan_out


@dataclass(frozen=True, eq=False)  # one per model and method (memoised: hashed by identity)
class ParameterSplit:
    """The model's parameter tensors split into what trains and what is frozen.

    ``trainable_shapes`` are the tensors the optimizer sees, in ``model.parameters()`` order (PEFT
    adds each adapter beside the layer it adapts); ``frozen`` the element counts of the frozen
    tensors kept in the training dtype; ``quantized`` the frozen linear weights QLoRA stores in
    ``quantization`` (empty otherwise).
    """

    trainable_shapes: tuple[Shape, ...]
    frozen: tuple[int, ...] = ()
    quantized: tuple[QuantizedWeight, ...] = ()
    quantization: Quantization | None = None
    adapters: bool = False  # the trained tensors are LoRA adapters (a PEFT save writes them alone)
    # AutoTP: which trained tensors every TP rank holds whole (ZeRO-3 partitions them over the whole
    # world, the group zero.Init gave them; dsgen.estimate.sharding); empty without AutoTP
    replicated: tuple[bool, ...] = ()
    # AutoEP: elements of the rank's local experts, the tail of ``trainable_shapes`` (ZeRO
    # partitions them over the expert-data-parallel group; dsgen.estimate.sharding); 0 without
    local_experts: int = 0

    # Computed once per split (cached_property stores them beside the fields: equality, hashing by
    # identity, ``replace`` and ``asdict`` are unaffected): the solver asks for both of every
    # candidate, and a split has hundreds of tensors.
    @cached_property
    def trainable(self) -> tuple[int, ...]:
        return _sizes(self.trainable_shapes)

    @cached_property
    def trainable_count(self) -> int:
        return sum(self.trainable)

    @property
    def quantized_count(self) -> int:
        return sum(q.elements * q.count for q in self.quantized)

    @property
    def frozen_count(self) -> int:
        """Frozen parameters, quantized ones counted by their logical elements."""
        return sum(self.frozen) + self.quantized_count

    @property
    def has_frozen(self) -> bool:
        return bool(self.frozen or self.quantized)


@lru_cache(maxsize=4096)
def _sizes(shapes: tuple[Shape, ...]) -> tuple[int, ...]:
    return tuple(prod(s) for s in shapes)


def _without(items: Iterable[T], removed: Iterable[T]) -> tuple[T, ...]:
    """``items`` less one occurrence of each of ``removed`` (a multiset difference, order kept)."""
    left = Counter(removed)
    kept = []
    for item in items:
        if left[item] > 0:
            left[item] -= 1
        else:
            kept.append(item)
    return tuple(kept)


@lru_cache(maxsize=256)
def full_split(shape: ModelShape) -> ParameterSplit:
    """Full training: every tensor trains."""
    return ParameterSplit(trainable_shapes=parameter_shapes(shape))


@identity_cache(maxsize=64)  # the same spec's objects, candidate after candidate: no FineTuning hash
@lru_cache(maxsize=256)
def parameter_split(shape: ModelShape, finetuning: FineTuning) -> ParameterSplit:
    """What trains under ``finetuning``'s method (memoised; full training is :func:`full_split`)."""
    method = finetuning.method
    if method == "full":
        return full_split(shape)
    everything = tuple(prod(s) for s in parameter_shapes(shape))
    if method == "freeze":
        trainable = _freeze_trainable(shape, finetuning.freeze.trainable_layers, finetuning.freeze.trainable)
        return ParameterSplit(trainable_shapes=trainable, frozen=_without(everything, _sizes(trainable)))
    adapters = lora_adapter_shapes(shape, finetuning.lora)
    if method == "lora":
        return ParameterSplit(trainable_shapes=adapters, frozen=everything, adapters=True)
    quantized = tuple(
        QuantizedWeight(layer.fan_in, layer.fan_out, layer.layers) for layer in decoder_linear_layers(shape)
    )
    linear_weights = [q.elements for q in quantized for _ in range(q.count)]
    return ParameterSplit(
        trainable_shapes=adapters,
        frozen=_without(everything, linear_weights),
        quantized=quantized,
        quantization=finetuning.quantization,
        adapters=True,
    )


def targeted_layers(shape: ModelShape, lora: Lora) -> tuple[LinearLayer, ...]:
    """The decoder's linear layers ``lora.target_modules`` selects: PEFT's ``all-linear`` takes every
    one (not the output head: ``peft/tuners/tuners_utils.py``, ``_maybe_include_all_linear_layers``),
    ``attention`` the attention projections, a list those whose module name is listed."""
    layers = decoder_linear_layers(shape)
    targets = lora.target_modules
    if targets == "all-linear":
        return layers
    if targets == "attention":
        return tuple(layer for layer in layers if layer.attention)
    names = set(targets)
    return tuple(layer for layer in layers if layer.name in names or layer.name.split(".")[-1] in names)


#: MoE families whose transformers-5 experts and router PEFT still targets by their old module
#: names (``peft/utils/transformers_weight_conversion.py``: ``_MODEL_TO_CONVERSION_PATTERN``,
#: ``_MOE_TARGET_MODULE_MAPPING``, ``_MOE_FUSED_TARGETS``): (router, the two fused names, down).
#: ``all-linear`` names all of them; a list names them one by one.
PEFT_MOE_NAMES: dict[str, tuple[str, tuple[str, str], str]] = {
    "mixtral": ("gate", ("w1", "w3"), "w2"),
    **dict.fromkeys(
        ("qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "glm4_moe"),
        ("gate", ("gate_proj", "up_proj"), "down_proj"),
    ),
}


@lru_cache(maxsize=256)
def lora_adapter_shapes(shape: ModelShape, lora: Lora) -> tuple[Shape, ...]:
    """The adapters PEFT adds: for each targeted linear layer of fan-in i and fan-out o,
    ``lora_A`` (r, i) and ``lora_B`` (o, r) (``peft/tuners/lora/layer.py``, ``update_layer``),
    and the routers and stacked experts of :data:`PEFT_MOE_NAMES` families (:func:`_moe_adapter_shapes`)."""
    r = lora.rank
    # PEFT's MoE conversion takes the expert names off the module targets: a dense layer's or shared
    # expert's linear layer of that name is not adapted (``_convert_peft_config_moe``)
    converted = PEFT_MOE_NAMES.get(shape.family) if shape.moe_layers else None
    taken = {converted[0], *converted[1], converted[2]} if converted else set()
    shapes: list[Shape] = []
    for layer in targeted_layers(shape, lora):
        if layer.name not in taken:
            shapes += [(r, layer.fan_in), (layer.fan_out, r)] * layer.layers
    return tuple(shapes) + _moe_adapter_shapes(shape, lora)


def _moe_adapter_shapes(shape: ModelShape, lora: Lora) -> tuple[Shape, ...]:
    """PEFT's adapters on an MoE layer's router and stacked experts (``lora.ParamWrapper``): the
    router's weight (E, h) as a linear layer; each stacked expert tensor (E, o, i) with
    ``lora_A`` (E·r, i) and ``lora_B`` (o, E·r), the fused gate/up tensor at rank 2r (its
    ``rank_pattern``: the two projections it fuses keep r each)."""
    names = PEFT_MOE_NAMES.get(shape.family)
    if names is None or not shape.moe_layers:
        return ()
    router, fused, down = names
    targets = lora.target_modules
    if targets == "attention":
        return ()
    wanted = set(targets) if not isinstance(targets, str) else {router, *fused, down}
    r, e, h, f = lora.rank, shape.num_experts, shape.hidden_size, shape.expert_intermediate_size
    layer: list[Shape] = []
    if router in wanted:
        layer += [(r, h), (e, r)]
    if set(fused) <= wanted:
        rank = 2 * r if shape.gated_mlp else r
        layer += [(e * rank, h), ((2 if shape.gated_mlp else 1) * f, e * rank)]
    if down in wanted:
        layer += [(e * r, f), (h, e * r)]
    return tuple(layer * shape.moe_layers)


def _freeze_trainable(shape: ModelShape, layers: int, modules: tuple[str, ...]) -> tuple[Shape, ...]:
    """The tensors freeze-tuning trains: the last ``layers`` decoder layers whole (LLaMA-Factory's
    ``freeze_trainable_layers`` with ``freeze_trainable_modules: all``) and the named modules."""
    one = parameter_shapes(replace(shape, num_layers=1, dense_layers=0))
    two = parameter_shapes(replace(shape, num_layers=2, dense_layers=0))
    layer = _without(two, one)  # one decoder layer: a two-layer model's tensors less a one-layer model's
    h = shape.hidden_size
    extra: list[Shape] = []
    if "embeddings" in modules or ("lm_head" in modules and shape.tie_word_embeddings):
        extra.append((shape.vocab_size, h))
    if "lm_head" in modules and not shape.tie_word_embeddings:
        extra.append((shape.vocab_size, h))
    if "norm" in modules and shape.final_norm:
        extra += [(h,), (h,)] if shape.norm == "layernorm" and shape.norm_bias else [(h,)]
    return tuple(layer * min(layers, shape.num_layers)) + tuple(extra)


# ---- bytes -----------------------------------------------------------------------------------------
def quantized_weight_bytes(weight: QuantizedWeight, quantization: Quantization) -> int:
    """Bytes of one quantized weight: the packed values (``bits`` per element) and its constants.

    bitsandbytes 4-bit (nf4, fp4): one fp32 absmax per ``block_size`` elements, or with double
    quantization one uint8 per block plus an fp32 absmax per 256 blocks (``quantize_4bit``).
    LLM.int8: one fp32 scale per output row (``Int8Params``: ``SCB``). GPTQ/AWQ: per group of
    ``block_size`` input elements and output column, an fp16 scale and a packed 4-bit zero point.
    The constants' small fixed tables (the 16-value code book) are left out.
    """
    n = weight.elements
    packed = n * quantization.bits // 8
    if quantization.type in ("nf4", "fp4"):
        blocks = -(-n // quantization.block_size)
        constants = blocks + FP32 * -(-blocks // NESTED_BLOCK) if quantization.double_quant else FP32 * blocks
    elif quantization.type == "int8":
        constants = FP32 * weight.fan_out
    else:  # gptq, awq
        groups = -(-weight.fan_in // quantization.block_size)
        constants = groups * weight.fan_out * 2 + -(-groups * weight.fan_out // 2)
    return packed + constants


def shards_quantized_weights(quantization: Quantization) -> bool:
    """Whether ZeRO-3 partitions the packed weights: bitsandbytes' 4-bit ``Params4bit`` are
    parameters, packed into the compute dtype with ``bnb_4bit_quant_storage`` (PEFT's DeepSpeed
    guide, 'ZeRO-3 with QLoRA'); LLM.int8's ``Int8Params`` and GPTQ/AWQ's packed buffers are
    not partitioned, so every GPU holds them whole."""
    return quantization.type in ("nf4", "fp4")


@dataclass(frozen=True)
class FrozenBytes:
    """One rank's frozen weights: what stays whole on the GPU, and ZeRO-3's partitions of the rest
    (on the GPU, or in host RAM under ``offload_param``)."""

    resident: int
    partitions: int = 0


def frozen_bytes(split: ParameterSplit, dtype_bytes: int, zero_stage: int, ranks: int, persistence: int) -> FrozenBytes:
    """The frozen weights of one rank (the worst).

    ZeRO-0/1/2: every frozen tensor whole. ZeRO-3: each frozen tensor partitioned to ``⌈n/N⌉``
    elements, the small ones (at most ``persistence`` elements) also kept whole, as for trained
    tensors; 4-bit weights partitioned as their packed storage elements (``bnb_4bit_quant_storage``
    = the compute dtype), their quantization constants whole (they are not parameters).
    """
    if not split.has_frozen:
        return FrozenBytes(0)
    zero3 = zero_stage == 3
    resident = partitions = 0
    for n in split.frozen:
        if not zero3:
            resident += dtype_bytes * n
            continue
        partitions += dtype_bytes * -(-n // ranks)
        resident += dtype_bytes * n if n <= persistence else 0
    quantization = split.quantization
    if quantization is not None:
        sharded = zero3 and shards_quantized_weights(quantization)
        for weight in split.quantized:
            whole = quantized_weight_bytes(weight, quantization)
            if not sharded:
                resident += weight.count * whole
                continue
            packed = weight.elements * quantization.bits // 8
            storage = packed // dtype_bytes
            partitions += weight.count * dtype_bytes * -(-storage // ranks)
            resident += weight.count * ((whole - packed) + (packed if storage <= persistence else 0))
    return FrozenBytes(resident, partitions)


def largest_frozen(split: ParameterSplit) -> int:
    """Elements of the largest frozen tensor kept in the training dtype (0 without one)."""
    return max(split.frozen, default=0)


def largest_dequantized(split: ParameterSplit) -> int:
    """Elements of the largest quantized weight: a 4-bit layer dequantizes a 16-bit copy of its
    weight for each matmul, forward and backward (bitsandbytes ``MatMul4Bit``); 0 without one.
    LLM.int8 multiplies in int8 and needs no such copy."""
    if split.quantization is None or split.quantization.type == "int8":
        return 0
    return max((q.elements for q in split.quantized), default=0)
