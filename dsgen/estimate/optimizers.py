"""Optimizer state: the bytes an optimizer keeps for the tensors DeepSpeed hands it.

Two kinds of optimizer reach DeepSpeed:

* **DeepSpeed's own** (named in the config's ``optimizer`` block): Adam/AdamW keep two fp32
  moments (8 bytes per element), Lion one momentum and torch's SGD one momentum buffer (4),
  Adagrad one sum of squares (4).
* **Client optimizers** (built by the training script and passed to ``deepspeed.initialize``;
  the config then has no ``optimizer`` block and ZeRO needs ``zero_allow_untested_optimizer``):

  - ``adafactor`` is ``torch.optim.Adafactor`` (no first moment). For a tensor of two or more
    dimensions it keeps a row and a column second-moment vector over the last two dimensions
    (``prod(leading) * (rows + cols)`` fp32 values); for a 1-D tensor a full fp32 variance.
  - ``adamw-8bit`` is ``bitsandbytes.optim.AdamW8bit``: both moments as uint8 (2 bytes per
    element) plus an fp32 absmax per block of 256 elements for each, and two shared 256-entry
    fp32 quantisation maps (2,048 bytes once). Tensors under 4,096 elements keep 32-bit moments
    (8 bytes per element).

What "the tensors DeepSpeed hands it" are decides the figure (measured with DeepSpeed 0.19.8,
torch 2.13 and bitsandbytes 0.50 on 2 CPU ranks, see docs/memory-model.md): without ZeRO the
optimizer sees the model's own tensors (fp32 training) or fp32 copies of the same shapes
(``FP16_UnfusedOptimizer`` in 16-bit training), so Adafactor factors its second moment. ZeRO-1/2
hand it one flat 1-D fp32 partition per parameter group and ZeRO-3 one flat 1-D tensor per
sub-group, so Adafactor cannot factor and keeps 4 bytes per element, and 8-bit Adam's
small-tensor fallback applies to whole partitions, not to the model's small tensors.

Scalar step counters (one 0-d tensor or a Python int per tensor) are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import prod

from dsgen.spec.types import Optimizer
from dsgen.units import FP32

#: Bytes per element of DeepSpeed's own optimizers (named in the config's optimizer block).
DEEPSPEED_OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "lion": 4, "sgd": 4, "adagrad": 4}

#: Client optimizers dsgen models: the class the training script passes to deepspeed.initialize.
CLIENT_OPTIMIZERS = {
    "adafactor": "torch.optim.Adafactor",
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
}

#: bitsandbytes' 8-bit optimizers: block size of the absmax statistics, the smallest tensor that
#: gets 8-bit states (``min_8bit_size``), and the two shared fp32 quantisation maps.
BNB_BLOCK = 256
BNB_MIN_8BIT_SIZE = 4096
BNB_QUANTISATION_MAPS = 2 * 256 * FP32


#: torch.optim classes a training script may build for the types DeepSpeed also implements
#: (``training.optimizer.implementation: torch``; the HF Trainer builds ``torch.optim.AdamW`` when
#: the DeepSpeed config has no optimizer block).
TORCH_OPTIMIZERS = {
    "adamw": "torch.optim.AdamW",
    "adam": "torch.optim.Adam",
    "sgd": "torch.optim.SGD",
    "adagrad": "torch.optim.Adagrad",
}

#: torch optimizers whose foreach step allocates one fp32 tensor per stepped element beyond the
#: states: Adam/AdamW ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)``
#: (torch/optim/adam.py, ``_multi_tensor_adam``), Adagrad ``std = torch._foreach_sqrt(state_sums)``
#: (torch/optim/adagrad.py, ``_multi_tensor_adagrad``). torch's SGD updates in place without
#: weight decay; with it, it copies the gradients (not modelled: dsgen's SGD default has none).
TORCH_STEP_TEMPORARY_BYTES = {"adamw": FP32, "adam": FP32, "adagrad": FP32}


#: torch.optim classes with a fused kernel dsgen models (``implementation: torch-fused``): the
#: whole step in one kernel that updates in place (``_fused_adamw``; the HF Trainer's
#: ``adamw_torch_fused``, its default ``optim`` with torch >= 2.8, huggingface/transformers#37358).
TORCH_FUSED_OPTIMIZERS = ("adamw",)

#: The implementations that leave the config without an optimizer block: the script builds them.
CLIENT_IMPLEMENTATIONS = ("torch", "torch-fused")


def is_client_optimizer(optimizer: Optimizer) -> bool:
    """True for optimizers the training script builds itself (no ``optimizer`` block in the config)."""
    return optimizer.type in CLIENT_OPTIMIZERS or optimizer.implementation in CLIENT_IMPLEMENTATIONS


def client_optimizer_class(optimizer: Optimizer) -> str:
    """The class a training script passes to ``deepspeed.initialize`` for a client optimizer."""
    return CLIENT_OPTIMIZERS.get(optimizer.type) or TORCH_OPTIMIZERS[optimizer.type]


def client_optimizer_call(optimizer: Optimizer, parameters: str) -> str:
    """How the script builds a client optimizer, e.g. ``torch.optim.AdamW(params, lr=1e-05, fused=True)``."""
    fused = ", fused=True" if optimizer.implementation == "torch-fused" else ""
    return f"{client_optimizer_class(optimizer)}({parameters}, lr={optimizer.lr:g}{fused})"


def step_temporary_bytes(optimizer: Optimizer, stepped_elements: int) -> int:
    """Bytes the optimizer's step allocates beyond its states while it updates ``stepped_elements``
    fp32 elements at once. DeepSpeed's FusedAdam, DeepSpeedCPUAdam, torch's fused AdamW and the
    other fused kernels update in place (none); torch's foreach Adam/AdamW/Adagrad hold one fp32
    temporary of the stepped tensors (torch >= 2.0 picks the foreach path on CUDA:
    ``_default_to_fused_or_foreach``). Both measured on CPU: tests/test_optimizer_step_temporary.py."""
    if optimizer.implementation != "torch":
        return 0
    return TORCH_STEP_TEMPORARY_BYTES.get(optimizer.type, 0) * stepped_elements


def state_bytes(optimizer: str, tensors: Iterable[tuple[int, ...]]) -> int:
    """Bytes of optimizer state for tensors of the given shapes (each a tuple of dimensions).

    Pass ``(n,)`` for a flat partition of ``n`` elements; the shape only matters to Adafactor.
    """
    if optimizer in DEEPSPEED_OPTIMIZER_STATE_BYTES:
        return DEEPSPEED_OPTIMIZER_STATE_BYTES[optimizer] * sum(prod(shape) for shape in tensors)
    if optimizer == "adafactor":
        return FP32 * sum(prod(s[:-2]) * (s[-2] + s[-1]) if len(s) >= 2 else prod(s) for s in tensors)
    if optimizer == "adamw-8bit":
        total = 0
        quantised = False
        for shape in tensors:
            n = prod(shape)
            if n >= BNB_MIN_8BIT_SIZE:
                total += 2 * n + 2 * FP32 * -(-n // BNB_BLOCK)
                quantised = True
            else:
                total += 2 * FP32 * n
        return total + (BNB_QUANTISATION_MAPS if quantised else 0)
    raise ValueError(f"unknown optimizer {optimizer!r}")


def flat_state_bytes(optimizer: str, partitions: Iterable[int]) -> int:
    """Bytes of optimizer state for flat 1-D partitions of the given element counts (ZeRO 1-3)."""
    return state_bytes(optimizer, ((n,) for n in partitions))
