"""The ZeRO-Infinity swap buffers dsgen renders and prices: one source for both.

``templates/deepspeed/ds_config.json.j2`` renders these values; the model-state record
(:mod:`dsgen.estimate.model_states`) prices them in host RAM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class NvmeBuffers:
    """``offload_optimizer.buffer_count`` and ``offload_param.buffer_count`` / ``buffer_size``."""

    optimizer_count: int = 4  # offload_optimizer.buffer_count, each one optimizer sub-group of fp32
    param_count: int = 5  # offload_param.buffer_count
    param_size: int = 100_000_000  # offload_param.buffer_size, elements


NVME_BUFFERS = NvmeBuffers()

#: fp32 tensors per element the optimizer swapper moves through pinned buffers besides the master
#: weight and the gradient: the optimizer's own states (Adam/AdamW two moments, the others one).
SWAPPED_STATE_TENSORS = {"adamw": 2, "adam": 2, "lion": 1, "sgd": 1, "adagrad": 1}


def nvme_buffers(optimizer: str) -> NvmeBuffers:
    """The swap buffers for ``optimizer``: as few optimizer buffers as DeepSpeed 0.19.8 needs.

    ``PartitionedOptimizerSwapper.swap_in_optimizer_state`` (swap_tensor/partitioned_optimizer_swapper.py)
    takes ``num_tensors() + 1`` buffers at once for a sub-group (fp32 master, each state, the
    gradient) and asserts it got them; dsgen renders no pipelined swapping, which would need more.
    So Adam/AdamW need DeepSpeed's default 4 and the one-state optimizers 3. Each buffer holds the
    largest sub-group (``SwapBufferManager(num_elems=largest_numel, count=buffer_count)``), which
    ``sub_group_size`` controls.
    """
    return replace(NVME_BUFFERS, optimizer_count=2 + SWAPPED_STATE_TENSORS.get(optimizer, 2))
