"""DeepSpeed's own model-state memory estimators, reproduced to the byte.

DeepSpeed 0.19.8 ships ``estimate_zero2_model_states_mem_needs`` (``runtime/zero/stage_1_and_2.py``)
and ``estimate_zero3_model_states_mem_needs`` (``runtime/zero/stage3.py``). They are the numbers
users compare dsgen against, so dsgen can report them as an alternative accounting. The two functions
below are transcriptions: same arguments, same defaults, same floating-point expressions in the same
order (so the ``int()`` truncations match exactly), same return values. tests/test_ds_estimator.py
calls DeepSpeed's functions and asserts equality.

What they count differs from :mod:`dsgen.estimate.model_states` (which follows the tensors
DeepSpeed really allocates): 2 bytes per parameter for 16-bit weights whatever the precision, the
ZeRO-2 formula also for ZeRO-1 (DeepSpeed has no ZeRO-0/1 estimator), no alignment padding, no
persistent parameters, ZeRO-3's gathered "largest layer" (4 bytes per parameter: 16-bit weights
and gradients) instead of dsgen's buffer model, and a host term padded by
``additional_buffer_factor`` (1.5). Quirks kept on purpose: ZeRO-2's offload host term scales with
the *total* GPU count, and ZeRO-3 with ``offload_param`` but no ``offload_optimizer`` falls into
the no-offload branch.
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.plan import Plan
from dsgen.spec.types import Hardware

ADDITIONAL_BUFFER_FACTOR = 1.5


def estimate_zero2_model_states_mem_needs(
    total_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int]:
    """``(cpu_mem, gpu_mem)`` exactly as ``stage_1_and_2.estimate_zero2_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 2 = params_16bit; 18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8 optimizer states
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def estimate_zero3_model_states_mem_needs(
    total_params: int,
    largest_layer_params: int,
    num_gpus_per_node: int = 1,
    num_nodes: int = 1,
    cpu_offload: bool = True,
    cpu_offload_params: bool = True,
    zero_init: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """``(cpu_mem, gpu_mem, largest_layer_memory)`` exactly as ``stage3.estimate_zero3_model_states_mem_needs``."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            if zero_init:
                cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            if zero_init:
                cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
            else:
                cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def deepspeed_estimator(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    *,
    zero_init: bool = True,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int]:
    """``(cpu_bytes per node, gpu_bytes per GPU)`` of DeepSpeed's estimator for ``plan``.

    ZeRO-3 plans use ``estimate_zero3_model_states_mem_needs`` with the model's total and largest
    module parameters (what ``model_to_params`` counts), ``cpu_offload`` for optimizer offload and
    ``cpu_offload_params`` for parameter offload (NVMe counts as offload, as the estimator only
    knows on/off). Stages 0-2 use ``estimate_zero2_model_states_mem_needs``. ``zero_init``
    defaults to True because dsgen's ZeRO-3 configs are meant to be used with ``zero.Init`` (HF
    does so); pass False to model loading the full model in every process first.
    """
    cpu_offload = plan.offload_optimizer != "none"
    if plan.zero_stage == 3:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            shape.parameter_count(),
            shape.largest_module_parameters(),
            num_gpus_per_node=hardware.gpus_per_node,
            num_nodes=hardware.nodes,
            cpu_offload=cpu_offload,
            cpu_offload_params=plan.offload_param != "none",
            zero_init=zero_init,
            additional_buffer_factor=additional_buffer_factor,
        )
        return cpu, gpu
    return estimate_zero2_model_states_mem_needs(
        shape.parameter_count(),
        num_gpus_per_node=hardware.gpus_per_node,
        num_nodes=hardware.nodes,
        cpu_offload=cpu_offload,
        additional_buffer_factor=additional_buffer_factor,
    )
