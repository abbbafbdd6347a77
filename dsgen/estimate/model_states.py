"""Model states on one GPU: parameters, gradients and optimizer states under ZeRO 0-3 and offload.

Follows the ZeRO paper's partitioning with the tensors DeepSpeed actually allocates for mixed
precision (fp32 master weights and an fp32 gradient for the rank's optimizer partition;
``stage_1_and_2.py`` / ``stage3.py``). See docs/memory-model.md.
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.plan import Plan

FP32 = 4

# Optimizer state bytes per parameter, not counting the fp32 master copy.
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "lion": 4, "sgd": 4, "adagrad": 4}


def persistent_parameters(shape: ModelShape, threshold: int) -> int:
    """Parameters ZeRO-3 keeps whole on every rank: tensors with at most ``threshold`` elements
    (norm weights and biases in practice; DeepSpeed's ``param_persistence_threshold``)."""
    h = shape.hidden_size
    norm_tensors = [h] * (2 if shape.norm == "layernorm" else 1)
    per_layer: list[int] = norm_tensors * shape.norms_per_layer
    if shape.attention_bias:
        per_layer += [shape.q_size, shape.kv_size, shape.kv_size]
    if shape.attention_out_bias:
        per_layer.append(h)
    if shape.mlp_bias:
        per_layer += [shape.intermediate_size] * (2 if shape.gated_mlp else 1) + [h]
    small = sum(n for n in per_layer if n <= threshold) * shape.num_layers
    tail = norm_tensors * (int(shape.final_norm) + int(shape.embedding_norm))
    return small + sum(n for n in tail if n <= threshold)


def model_state_bytes(shape: ModelShape, plan: Plan, optimizer: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) on one GPU, in bytes."""
    p = shape.parameter_count()
    n = plan.data_parallel_size
    w = plan.dtype_bytes
    stage = plan.zero_stage
    master = FP32 if plan.mixed_precision else 0
    state = OPTIMIZER_STATE_BYTES[optimizer]
    offloaded = plan.offload_optimizer != "none"

    if stage < 3:
        params = w * p
    else:
        kept = persistent_parameters(shape, plan.knobs.param_persistence_threshold)
        params = w * kept + (0 if plan.offload_param != "none" else w * -(-(p - kept) // n))

    # 16-bit gradients: whole for stage 0/1 (accumulated in param.grad), partitioned from stage 2.
    # CPU offload in ZeRO-1/2 streams gradient partitions to the host, so only the partition stays.
    grad_partitioned = stage >= 2 or (stage == 1 and offloaded)
    grads = w * (-(-p // n) if grad_partitioned else p)
    # Mixed precision adds the fp32 gradient of the rank's optimizer partition (on GPU unless offloaded).
    if plan.mixed_precision and not offloaded:
        grads += FP32 * (p if stage == 0 else -(-p // n))

    optimizer_bytes = 0 if offloaded else (master + state) * (p if stage == 0 else -(-p // n))
    return params, grads, optimizer_bytes
