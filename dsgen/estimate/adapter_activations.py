"""What LoRA adapters add to the activations autograd saves.

PEFT's LoRA layer computes ``base(x) + B(A(dropout(x))) · scale`` (``peft/tuners/lora/layer.py``,
``Linear.forward``). For backward it saves, per adapted linear layer and token, the input of ``A``
(with ``lora_dropout`` > 0 a dropped-out copy of ``x`` made for this layer alone, and its mask) and
the output of ``A`` (``r`` values) for ``B``'s weight gradient. With ``lora_dropout`` 0 PEFT uses
``nn.Identity``, so ``A`` saves the very ``x`` the layer's input already is. Under whole-layer
checkpointing only the layer being recomputed holds them. docs/memory-model.md, "Fine-tuning".
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.trainable import targeted_layers
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Training

DROPOUT_MASK_BYTES = 1  # native_dropout's bool mask


def adapter_activation_bytes(shape: ModelShape, plan: Plan, training: Training, finetuning: FineTuning) -> int:
    """Bytes the adapters' saved tensors add on one GPU for ``plan``'s micro-batch (0 without adapters)."""
    if not finetuning.adapters:
        return 0
    lora = finetuning.lora
    w = plan.dtype_bytes
    per_token = 0  # bytes per token over every decoder layer
    widest_layer = 0  # bytes per token of the layer with the most adapted inputs
    for layer in targeted_layers(shape, lora):
        one = lora.rank * w + (layer.fan_in * (w + DROPOUT_MASK_BYTES) if lora.dropout > 0 else 0)
        per_token += one * layer.layers
        widest_layer += one
    tokens = plan.micro_batch_size * training.sequence_length // plan.sequence_parallel_size
    if plan.checkpointing == "full":
        return tokens * widest_layer
    return tokens * per_token
