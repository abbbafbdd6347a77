"""Step-time terms of DeepSpeed AutoTP and AutoEP (docs/throughput-model.md, "Model parallelism").

Each ``*_s`` function returns seconds per optimizer step on one GPU; :func:`dsgen.estimate.throughput.estimate_step_time`
adds them to the plan's exposed communication. The link efficiency and launch latencies are the
throughput model's, passed in so they are written once. Sources are DeepSpeed 0.19.8's
``deepspeed/module_inject/layers.py`` (AutoTP), ``deepspeed/sequence/cross_entropy.py`` (the
vocabulary-parallel loss) and ``deepspeed/module_inject/auto_ep_layer.py`` (AutoEP).

- AutoTP (:func:`tensor_parallel_s`): every rank of a TP group runs the same micro-batch, so the
  hidden states between sub-layers are whole on every rank and each row-parallel projection ends
  in an all-reduce of ``[micro, seq, hidden]``: ``LinearAllreduce.forward`` -> ``RowParallel.forward``
  (``dist.all_reduce``, blocking, on the compute stream), after o_proj and down_proj. Backward
  all-reduces the input gradient of every column-parallel projection (q, k, v, gate, up):
  ``LinearLayer.forward`` -> ``ColumnParallel.backward`` (``dist.all_reduce``, blocking; only
  ``tp_overlap_comm``'s ``AsyncColumnParallel.backward`` overlaps it with the weight-gradient
  matmul, and dsgen does not render that knob). The head: an untied LM head is
  ``LinearLayer(gather_output=True)``, whose forward all-gathers the ``[micro, seq, V/tp]`` logits
  (``GatherFromTensorParallelRegion.forward``, ``all_gather_into_tensor`` of shards padded to
  ``⌈V/tp⌉``); a tied one is ``VocabParallelLinear`` (no gather) with ``VocabParallelEmbedding``,
  whose forward all-reduces the looked-up ``[micro, seq, hidden]`` (``RowParallel.forward``), and the
  distributed loss (``_VocabParallelCrossEntropy.forward``: three fp32 all-reduces of
  ``[micro, seq]``). Both heads all-reduce their input gradient in backward (``ColumnParallel.backward``).
  None of it overlaps compute: the collectives are synchronous on the compute stream.
- AutoEP (:func:`expert_parallel_s`): each MoE block exchanges its routed token copies with the
  ranks that hold their experts: ``AutoEPMoELayer._forward`` -> ``compute_split_plan`` ->
  ``_split_plan_from_expert_counts`` (an all-to-all of per-expert counts and a ``.cpu()`` sync),
  then ``_AllToAllV.forward`` to dispatch and again to combine; ``_AllToAllV.backward`` runs the
  reverse all-to-all for each (``dist.all_to_all_single``, synchronous). The opt-in DeepEP
  transport (``comm_backend: deepep``, ``auto_ep_comm.py``) is not priced.
- ZeRO under AutoTP/AutoEP (:func:`zero_groups`): what ZeRO reduces and gathers is what a rank
  holds, over the group that partitions it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.sharding import rank_split, vocabulary_rows
from dsgen.estimate.trainable import full_split
from dsgen.plan import Plan
from dsgen.spec.types import Hardware, Training
from dsgen.units import FP32

#: row-parallel projections of a llama-style layer (o_proj, down_proj): one forward all-reduce each
ROW_PARALLEL_PER_LAYER = 2
#: all-reduces of ``[micro, seq]`` fp32 in the vocabulary-parallel loss's forward (max, sum of exp,
#: target logit: ``_VocabParallelCrossEntropy.forward``)
VOCAB_PARALLEL_LOSS_ALL_REDUCES = 3


class ZeroGroup(NamedTuple):
    """Elements one rank holds in one ZeRO partition group, the ranks of that group, and how many
    of those ranks share a node (the reach of ZeRO++'s intra-node passes)."""

    elements: float
    ranks: int
    node_ranks: int


@dataclass(frozen=True)  # one per collective kind and plan
class Traffic:
    """Collectives one GPU launches and the bytes it sends, per micro-step."""

    collectives: int
    bytes: float

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.collectives + other.collectives, self.bytes + other.bytes)


NO_TRAFFIC = Traffic(0, 0.0)


def ring_all_reduce_bytes(size: float, ranks: int) -> float:
    """Bytes one GPU sends in a ring all-reduce of ``size`` bytes: ``2·(n−1)/n·size``."""
    return 2 * (ranks - 1) / ranks * size


def group_bandwidth(hardware: Hardware, ranks: int, efficiency: float) -> float:
    """Bytes per second one GPU achieves in a collective over ``ranks`` consecutive ranks: the
    intra-node link while the group fits in a node, the slower of it and the inter-node fabric beyond."""
    link = hardware.gpu.interconnect_bandwidth_gbps
    if ranks > hardware.gpus_per_node:
        link = min(link, hardware.inter_node_bandwidth_gbps)
    return link * 1e9 * efficiency


def group_latency(hardware: Hardware, ranks: int, latency: Mapping[str, float]) -> float:
    """Launch latency of one collective over ``ranks`` consecutive ranks."""
    return latency["intra" if ranks <= hardware.gpus_per_node else "inter"]


def _layer_forwards(plan: Plan) -> int:
    """Forwards of every layer per micro-step: one, two with whole-layer checkpointing (the
    recompute in backward). Selective recomputation reruns only the attention core, which sits
    between the column- and row-parallel projections and launches no collective."""
    return 2 if plan.checkpointing == "full" else 1


def column_parallel_per_layer(shape: ModelShape) -> int:
    """Column-parallel projections of a layer: q, k, v and gate, up (up alone without a gated MLP)."""
    return 3 + (2 if shape.gated_mlp else 1)


def _hidden_bytes(shape: ModelShape, plan: Plan, training: Training) -> int:
    """One ``[micro, seq, hidden]`` tensor in the compute dtype."""
    return plan.micro_batch_size * training.sequence_length * shape.hidden_size * plan.dtype_bytes


def tp_layer_traffic(shape: ModelShape, plan: Plan, training: Training) -> Traffic:
    """The decoder layers' AutoTP all-reduces per micro-step: ``ROW_PARALLEL_PER_LAYER`` per
    forward (``RowParallel.forward``) and one per column-parallel projection in backward
    (``ColumnParallel.backward``), each of ``[micro, seq, hidden]``."""
    tp = plan.tensor_parallel_size
    if tp == 1:
        return NO_TRAFFIC
    per_layer = ROW_PARALLEL_PER_LAYER * _layer_forwards(plan) + column_parallel_per_layer(shape)
    count = shape.num_layers * per_layer
    return Traffic(count, count * ring_all_reduce_bytes(_hidden_bytes(shape, plan, training), tp))


def tp_head_traffic(shape: ModelShape, plan: Plan, training: Training) -> Traffic:
    """The embedding, LM head and loss under AutoTP, per micro-step (neither is inside a
    checkpointed layer, so neither is recomputed).

    Untied head (``colwise_gather_output``): the forward all-gather of the logit shards, each rank
    receiving the ``tp − 1`` others of ``[micro, seq, ⌈V/tp⌉]``. Tied head (``embedding_rowwise``):
    the vocabulary-parallel embedding's forward all-reduce of ``[micro, seq, hidden]`` and the loss's
    three fp32 all-reduces of ``[micro, seq]``. Either: the head's backward all-reduce of its
    ``[micro, seq, hidden]`` input gradient."""
    tp = plan.tensor_parallel_size
    if tp == 1:
        return NO_TRAFFIC
    tokens = plan.micro_batch_size * training.sequence_length
    hidden = ring_all_reduce_bytes(_hidden_bytes(shape, plan, training), tp)
    head_backward = Traffic(1, hidden)
    if shape.tie_word_embeddings:
        embedding = Traffic(1, hidden)
        loss = VOCAB_PARALLEL_LOSS_ALL_REDUCES * ring_all_reduce_bytes(tokens * FP32, tp)
        return head_backward + embedding + Traffic(VOCAB_PARALLEL_LOSS_ALL_REDUCES, loss)
    gather = (tp - 1) * tokens * vocabulary_rows(shape, tp) * plan.dtype_bytes
    return head_backward + Traffic(1, gather)


def tensor_parallel_s(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    efficiency: float,
    latency: Mapping[str, float],
) -> float:
    """AutoTP communication seconds per step on one GPU, all of it exposed: every micro-step's
    layer and head collectives over the TP group's link, plus one launch latency each."""
    tp = plan.tensor_parallel_size
    if tp == 1:
        return 0.0
    traffic = tp_layer_traffic(shape, plan, training) + tp_head_traffic(shape, plan, training)
    return _step_seconds(traffic, tp, plan, hardware, efficiency, latency)


def _step_seconds(
    traffic: Traffic, ranks: int, plan: Plan, hardware: Hardware, efficiency: float, latency: Mapping[str, float]
) -> float:
    """Seconds per step of one micro-step's ``traffic`` over a group of ``ranks`` consecutive ranks,
    every micro-step: the bytes over the group's link plus one launch latency per collective."""
    per_micro = traffic.bytes / group_bandwidth(hardware, ranks, efficiency)
    per_micro += traffic.collectives * group_latency(hardware, ranks, latency)
    return plan.gradient_accumulation_steps * per_micro


def ep_traffic(shape: ModelShape, plan: Plan, training: Training) -> Traffic:
    """AutoEP all-to-alls per micro-step. Per MoE layer: the dispatch and the combine of the
    rank's routed token copies (``micro·seq·top_k`` rows of ``hidden``), each sending ``(ep−1)/ep``
    of them off-rank, in forward and again (reversed) in backward, and the forward pair once more in
    a whole-layer checkpoint's recompute; plus one count exchange per forward, counted for its launch
    only (``num_experts`` integers)."""
    ep = plan.expert_parallel_size
    if ep == 1 or not shape.is_moe:
        return NO_TRAFFIC
    forwards = _layer_forwards(plan)
    all_to_alls = 2 * forwards + 2  # dispatch + combine per forward, both reversed in backward
    routed = plan.micro_batch_size * training.sequence_length * shape.experts_per_token
    sent = routed * shape.hidden_size * plan.dtype_bytes * (ep - 1) / ep
    layers = shape.moe_layers
    return Traffic(layers * (all_to_alls + forwards), layers * all_to_alls * sent)


def expert_parallel_s(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    efficiency: float,
    latency: Mapping[str, float],
) -> float:
    """AutoEP all-to-all seconds per step on one GPU, all of it exposed. The EP group is ``ep``
    consecutive ranks: the intra-node link while ``ep`` fits in a node, the inter-node fabric beyond."""
    ep = plan.expert_parallel_size
    if ep == 1:
        return 0.0
    return _step_seconds(ep_traffic(shape, plan, training), ep, plan, hardware, efficiency, latency)


def model_parallel_comm_s(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    efficiency: float,
    latency: Mapping[str, float],
) -> float:
    """AutoTP and AutoEP communication seconds per step on one GPU (0 without either)."""
    return tensor_parallel_s(shape, plan, hardware, training, efficiency, latency) + expert_parallel_s(
        shape, plan, hardware, training, efficiency, latency
    )


def zero_groups(shape: ModelShape, plan: Plan, count: int, gpus_per_node: int) -> tuple[ZeroGroup, ...]:
    """The ZeRO partition groups of one rank's parameters, ``count`` being the whole model's
    elements ZeRO moves (every parameter, or the trained ones).

    Without AutoTP or AutoEP: ``count`` over every GPU. AutoTP: the TP-local tensors
    (:func:`dsgen.estimate.sharding.tp_split`) over the data-parallel group, every GPU / tp, strided
    by tp (``runtime/engine.py`` ``_configure_zero_optimizer``: ``dp_process_group``). AutoEP: the
    dense tensors over every GPU and the rank's local experts over the expert-data-parallel group,
    every GPU / ep (``runtime/zero/stage_1_and_2.py`` ``_configure_moe_settings``). Model parallelism
    is priced for full training (``count`` is the parameter count); another ``count`` scales the
    rank's holdings in proportion. Under ZeRO-3 the tensors AutoTP replicates keep zero.Init's
    partition over the whole world; the ring volume ``(n−1)/n`` barely differs, so it is not kept apart.
    """
    if not plan.model_parallel.active:
        return (ZeroGroup(count, plan.data_parallel_size, gpus_per_node),)
    tp, ep = plan.tensor_parallel_size, plan.expert_parallel_size
    split = rank_split(shape, tp, ep, full_split(shape))
    share = count / shape.parameter_count()
    dense = split.trainable_count - split.local_experts
    groups = [_strided(dense * share, plan.zero_ranks, tp, gpus_per_node)]
    if split.local_experts:
        groups.append(_strided(split.local_experts * share, plan.expert_zero_ranks, ep, gpus_per_node))
    return tuple(groups)


def _strided(elements: float, ranks: int, stride: int, gpus_per_node: int) -> ZeroGroup:
    """A group of ``ranks`` ranks ``stride`` apart: ``gpus_per_node / stride`` of them share a node."""
    return ZeroGroup(elements, ranks, min(ranks, max(1, gpus_per_node // stride)))


def ring_elements(groups: tuple[ZeroGroup, ...]) -> float:
    """Elements one GPU sends in a ring reduce-scatter or all-gather of every group: ``Σ p·(n−1)/n``."""
    return sum(g.elements * _ring(g.ranks) for g in groups)


def node_ring_elements(groups: tuple[ZeroGroup, ...]) -> float:
    """The same within each group's node share (ZeRO++ hpZ and qgZ's intra-node pass): ``Σ p·(g−1)/g``."""
    return sum(g.elements * (g.node_ranks - 1) / g.node_ranks for g in groups)


def partition_elements(groups: tuple[ZeroGroup, ...]) -> float:
    """Elements of one rank's ZeRO partition: ``Σ p / n``."""
    return sum(g.elements / g.ranks for g in groups)


def _ring(ranks: int) -> float:
    return (ranks - 1) / ranks if ranks > 1 else 0.0
