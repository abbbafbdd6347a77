"""The parameter tensors one rank holds under DeepSpeed AutoTP or AutoEP.

What DeepSpeed 0.19.8 does, measured on CPU ranks in ``docs/model-parallel-measurements.md``:

* AutoTP (``tensor_parallel.autotp_size``) applies the model's transformers ``tp_plan``
  (``runtime/tensor_parallel/config.py`` ``_get_hf_tp_plan``): q/k/v/gate/up are split by output
  columns and o/down by input rows, each rank keeping whole heads, so a rank holds the layer of a
  model with heads, key/value heads and MLP width divided by the degree
  (:func:`tp_local_shape`). An untied LM head is split over the vocabulary
  (``colwise_gather_output``); a tied embedding is split over the vocabulary with it
  (``embedding_rowwise``, a vocabulary-parallel head and loss). The embedding of an untied model,
  every norm and the row-parallel biases stay whole on every rank. Under ZeRO-3 those replicated
  tensors keep the partition ``zero.Init`` gave them, over the whole world, while the sharded ones
  are partitioned over the data-parallel group (``runtime/engine.py``
  ``_resolve_zero3_param_placement``): :attr:`ParameterSplit.replicated` says which are which.
* AutoEP (``expert_parallel.autoep_size``) replaces each MoE block by an ``AutoEPMoELayer`` whose
  experts hold ``num_experts / autoep_size`` of the block's experts; the router and everything
  outside the experts stay whole. The optimizer's MoE group is partitioned by ZeRO over the
  expert-data-parallel group (``moe/utils.py``
  ``split_params_into_different_moe_groups_for_optimizer``; ``runtime/zero/stage_1_and_2.py``
  ``_configure_moe_settings``): the local experts are the tail of the split
  (:attr:`ParameterSplit.local_experts`), whatever their place in ``model.parameters()``.

Model parallelism is priced for full training only (:mod:`dsgen.search.model_parallel_choices`).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from math import prod

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.parameter_layout import Shape, parameter_shapes
from dsgen.estimate.trainable import ParameterSplit
from dsgen.plan import Plan


@lru_cache(maxsize=256)  # one per model and degree; the solver asks for it for every candidate
def tp_local_shape(shape: ModelShape, tp: int) -> ModelShape:
    """The model one AutoTP rank runs: heads, key/value heads and MLP width divided by ``tp``
    (the degree divides each: :func:`dsgen.search.model_parallel_choices.tp_violation`). The hidden
    size, vocabulary and sequence stay whole."""
    if tp == 1:
        return shape
    return replace(
        shape,
        num_attention_heads=shape.num_attention_heads // tp,
        num_key_value_heads=shape.num_key_value_heads // tp,
        intermediate_size=shape.intermediate_size // tp,
    )


def vocabulary_rows(shape: ModelShape, tp: int) -> int:
    """Rows of the vocabulary-split head (and tied embedding) on the largest rank: ⌈V / tp⌉."""
    return -(-shape.vocab_size // tp)


@lru_cache(maxsize=256)
def tp_split(shape: ModelShape, tp: int) -> ParameterSplit:
    """The tensors one AutoTP rank holds and trains, in ``model.parameters()`` order."""
    whole = parameter_shapes(shape)
    local = list(parameter_shapes(tp_local_shape(shape, tp)))
    head = 0 if shape.tie_word_embeddings else len(local) - 1  # the tied embedding, or the untied head
    local[head] = (vocabulary_rows(shape, tp), shape.hidden_size)
    replicated = tuple(i != head and a == b for i, (a, b) in enumerate(zip(whole, local, strict=True)))
    return ParameterSplit(trainable_shapes=tuple(local), replicated=replicated)


def is_expert_tensor(shape: ModelShape, tensor: Shape) -> bool:
    """The stacked expert weights (transformers 5: ``(experts, out, in)``, one per projection)."""
    return len(tensor) == 3 and tensor[0] == shape.num_experts


@lru_cache(maxsize=256)
def ep_split(shape: ModelShape, ep: int) -> ParameterSplit:
    """The tensors one AutoEP rank holds and trains: the dense ones in order, then its local experts."""
    tensors = parameter_shapes(shape)
    dense = tuple(t for t in tensors if not is_expert_tensor(shape, t))
    experts = tuple((t[0] // ep, *t[1:]) for t in tensors if is_expert_tensor(shape, t))
    return ParameterSplit(trainable_shapes=dense + experts, local_experts=sum(prod(t) for t in experts))


def rank_split(shape: ModelShape, tp: int, ep: int, split: ParameterSplit) -> ParameterSplit:
    """``split`` as one rank holds it under AutoTP degree ``tp`` and AutoEP degree ``ep`` (1: off)."""
    if tp > 1:
        return tp_split(shape, tp)
    if ep > 1:
        return ep_split(shape, ep)
    return split


def rank_shape(shape: ModelShape, plan: Plan) -> ModelShape:
    """The model whose activations and ZeRO-3 gathers one rank holds: under AutoTP the TP-local
    layer (hidden-size tensors and the gathered full-vocabulary logits stay whole, as measured to
    4 bytes in ``tests/test_mp_predictions.py``); under AutoEP the MoE block with the rank's
    experts, which is what a ZeRO-3 leaf-module gather fetches. Routed tokens per rank are the same
    on average with or without AutoEP, so the experts' activations keep their size; the router's
    fp32 scores over all experts are then counted for the local ones only (4 bytes per token per
    remote expert)."""
    tp, ep = plan.tensor_parallel_size, plan.expert_parallel_size
    if tp > 1:
        return tp_local_shape(shape, tp)
    if ep > 1:
        return _ep_local_shape(shape, ep)
    return shape


@lru_cache(maxsize=256)
def _ep_local_shape(shape: ModelShape, ep: int) -> ModelShape:
    return replace(shape, num_experts=shape.num_experts // ep)
