"""Step-time terms of the long-context choices (docs/throughput-model.md, "Long context").

Each function returns seconds per optimizer step on one GPU; :func:`dsgen.estimate.throughput.estimate_step_time`
adds them to the plan's compute, exposed communication and offload time.

- Ulysses all-to-all (``UlyssesSPAttentionHF``): per layer and pass, q, k, v go out (k and v after
  head replication) and the output comes back, each rank sending ``(p-1)/p`` of its share. It is
  synchronous in DeepSpeed's implementation (``_dim_zero_all_to_all`` on the compute stream), so it
  is exposed. The SP group is the ``p`` consecutive ranks (``parallel_state_sp``), so it crosses
  NVLink while ``p`` fits in a node and the inter-node link beyond.
- SP gradient reduction in ``seq_parallel_communication_data_type`` (fp32 by default): the ZeRO
  gradient traffic is sent in 4 bytes instead of 2; the extra half is counted as exposed.
- The attention core: a long-context plan's attention is priced as the causal kernels run it (half
  of the full score matrix) at the kernel's measured speed (:mod:`dsgen.estimate.attention_speed`),
  apart from the matmuls the MFU prices.
- TiledMLP recomputes every MLP forward once more in backward (its docstring: "the forward
  occurs twice each iteration, and thrice with activation checkpointing").
- Checkpoint offload: every checkpointed layer input goes to host RAM in forward and comes back
  in backward, over the GPU's PCIe link.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.attention_speed import attention_seconds, kernel_shares
from dsgen.plan import Plan
from dsgen.spec.types import Hardware, Training


@dataclass(frozen=True)  # one per candidate plan
class LongContextTime:
    """Seconds per step the long-context choices add, by where they land in :class:`StepTime`."""

    attention_model_flops: float  # the PaLM attention term per step, all GPUs: priced here, not at the MFU
    attention_s: float  # the attention core's seconds per step on one GPU, recompute included
    tiled_mlp_flops: float  # TiledMLP's extra MLP forward per step, all GPUs (at the MFU)
    exposed_comm_s: float  # all-to-all and the fp32 SP gradient reduction
    offload_s: float  # checkpoint offload over PCIe


def _passes(plan: Plan) -> int:
    """Forward passes per micro-step that run attention's all-to-all: forward, backward, and the
    checkpointed recompute."""
    return 3 if plan.checkpointing == "full" else 2


def all_to_all_s(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, efficiency: float) -> float:
    """Ulysses all-to-all seconds per step on one rank."""
    sp = plan.sequence_parallel_size
    if sp == 1:
        return 0.0
    s_local = training.sequence_length // sp
    kv = max(shape.num_key_value_heads, sp) * shape.head_dim
    per_layer = plan.dtype_bytes * plan.micro_batch_size * s_local * (2 * shape.q_size + 2 * kv)  # q,k,v out; o back
    sent = per_layer * (sp - 1) / sp * shape.num_layers * _passes(plan) * plan.gradient_accumulation_steps
    link = hardware.gpu.interconnect_bandwidth_gbps
    if sp > hardware.gpus_per_node:
        link = min(link, hardware.inter_node_bandwidth_gbps)
    return sent / (link * 1e9 * efficiency)


def sp_gradient_reduction_s(shape: ModelShape, plan: Plan, hardware: Hardware, efficiency: float) -> float:
    """The extra bytes of reducing gradients in ``seq_parallel_communication_data_type`` when it is
    wider than the training dtype (fp32 under bf16 or fp16: twice the bytes; a narrower one is not
    credited)."""
    n = plan.data_parallel_size
    extra = plan.long_context.communication_bytes - plan.dtype_bytes
    if plan.sequence_parallel_size == 1 or n == 1 or extra <= 0:
        return 0.0
    link = hardware.gpu.interconnect_bandwidth_gbps
    if hardware.nodes > 1:
        link = min(link, hardware.inter_node_bandwidth_gbps)
    reductions = plan.gradient_accumulation_steps if plan.zero_stage >= 2 else 1
    return reductions * extra * shape.parameter_count() * (n - 1) / n / (link * 1e9 * efficiency)


def attention_model_flops(shape: ModelShape, plan: Plan, training: Training) -> float:
    """The attention core's FLOPs per step in the PaLM accounting, ``12·L·width·s`` per token
    (:func:`dsgen.estimate.throughput.model_flops_per_token`'s attention term), all GPUs."""
    tokens = plan.global_batch_size * training.sequence_length
    return 12.0 * shape.num_layers * shape.attention_score_width * training.sequence_length * tokens


def attention_s(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, mfu_flops: float) -> float:
    """Seconds per step of the attention core on one GPU (Ulysses: its heads over the whole sequence,
    a ``1/world`` share of the work). A causal decoder's fused kernel computes only the blocks on and
    below the diagonal, half the full score matrix; where its speed is published it runs at that
    speed, elsewhere at ``mfu_flops`` (the plan's MFU rate per GPU, FLOP/s) in the PaLM accounting
    (a backward is two forwards). Eager attention and encoders compute the whole matrix. One forward
    more with checkpointing (whole-layer or selective: both recompute the core)."""
    forward = attention_model_flops(shape, plan, training) / 3 / hardware.world_size  # PaLM: forward is 4 of 12
    forwards = 2 if plan.checkpointing in ("full", "selective") else 1
    causal = not shape.encoder_only and training.attention != "eager"
    shares = kernel_shares(hardware.gpu, training.attention) if causal else None
    if shares is not None:
        return attention_seconds(forward / 2, forwards, hardware.gpu.peak_tflops(plan.precision) * 1e12, shares)
    return (forward / 2 if causal else forward) * (forwards + 2) / mfu_flops


def tiled_mlp_flops(shape: ModelShape, plan: Plan, training: Training) -> float:
    """One more forward of every dense MLP: 2 FLOPs per MLP parameter per token."""
    if not plan.long_context.tiled_mlp or shape.is_moe:
        return 0.0
    tokens = plan.global_batch_size * training.sequence_length
    return 2.0 * shape.dense_mlp_parameters() * (shape.num_layers - shape.moe_layers) * tokens


def checkpoint_offload_s(
    shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, pcie_efficiency: float
) -> float:
    """Every layer input to the host and back, per micro-step, over this GPU's PCIe link."""
    if not plan.long_context.checkpoint_offload:
        return 0.0
    s_local = training.sequence_length // plan.sequence_parallel_size
    per_layer = plan.dtype_bytes * plan.micro_batch_size * s_local * shape.hidden_size
    moved = 2 * per_layer * shape.num_layers * plan.gradient_accumulation_steps
    return moved / (hardware.gpu.pcie_bandwidth_gbps * 1e9 * pcie_efficiency)


def long_context_time(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    collective_efficiency: float,
    pcie_efficiency: float,
    mfu_flops: float,
) -> LongContextTime:
    """Every long-context step-time term of ``plan``; the link efficiencies and the MFU rate per GPU
    (FLOP/s) are the throughput model's (:mod:`dsgen.estimate.throughput`), passed in so they are
    written once."""
    comm = all_to_all_s(shape, plan, hardware, training, collective_efficiency)
    comm += sp_gradient_reduction_s(shape, plan, hardware, collective_efficiency)
    return LongContextTime(
        attention_model_flops=attention_model_flops(shape, plan, training),
        attention_s=attention_s(shape, plan, hardware, training, mfu_flops),
        tiled_mlp_flops=tiled_mlp_flops(shape, plan, training),
        exposed_comm_s=comm,
        offload_s=checkpoint_offload_s(shape, plan, hardware, training, pcie_efficiency),
    )
