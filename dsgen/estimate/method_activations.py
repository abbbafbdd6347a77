"""What the fine-tuning method changes in the activations autograd saves.

Autograd saves a tensor only for a gradient something needs. A frozen weight needs none, so the
tensors saved only for weight gradients go: each norm's normalised input (its weight's gradient),
the output head's input, and under LoRA, where the embeddings are frozen too, the embedding output
(nothing below the first trained tensor runs backward). Under freeze-tuning, the layers below the
first trained one save nothing at all. PEFT's LoRA layer (``peft/tuners/lora/layer.py``,
``Linear.forward``) adds, per adapted linear layer and token, ``A``'s output (``r`` values) for
``B``'s weight gradient, and with ``lora_dropout`` > 0 a dropped-out copy of the input and its mask.
Under whole-layer checkpointing a layer keeps only its input, so only the head's and the final
norm's savings remain at the end of forward. Each term was read off autograd's saved tensors on a
tiny Llama, and the totals are checked against DeepSpeed runs (``tests/test_finetuning_measured.py``).
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.activations import ActivationEstimate
from dsgen.estimate.trainable import targeted_layers
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Training

DROPOUT_MASK_BYTES = 1  # native_dropout's bool mask


def _qk_norm_width(shape: ModelShape) -> int:
    """Per token, the widths of a layer's q/k norms (their weight gradients need their inputs)."""
    return shape.q_size + shape.kv_size if shape.qk_norm != "none" else 0


def method_activation_delta(
    shape: ModelShape, plan: Plan, training: Training, finetuning: FineTuning, acts: ActivationEstimate
) -> int:
    """Bytes the method adds to (positive) or removes from (negative) ``acts.total`` on one GPU."""
    method = finetuning.method
    if method == "full":
        return 0
    e, h = plan.dtype_bytes, shape.hidden_size
    tokens = plan.micro_batch_size * training.sequence_length // plan.sequence_parallel_size
    checkpointed = plan.checkpointing == "full"
    trained = set(finetuning.freeze.trainable) if method == "freeze" else set()
    delta = 0
    if "lm_head" not in trained and not shape.tie_word_embeddings:
        delta -= tokens * h * e  # the head's input
    if "norm" not in trained and shape.final_norm:
        delta -= tokens * h * e  # the final norm's normalised input
    if checkpointed:
        return delta
    if method == "freeze":
        frozen_layers = shape.num_layers - min(finetuning.freeze.trainable_layers, shape.num_layers)
        return delta - frozen_layers * acts.per_layer - (tokens * h * e if frozen_layers else 0)
    # LoRA / QLoRA: every norm weight is frozen, and the embedding output needs no gradient
    norms = shape.norms_per_layer * h + _qk_norm_width(shape)
    delta -= shape.num_layers * tokens * norms * e + tokens * h * e
    lora = finetuning.lora
    for layer in targeted_layers(shape, lora):
        one = lora.rank * e + (layer.fan_in * (e + DROPOUT_MASK_BYTES) if lora.dropout > 0 else 0)
        delta += tokens * one * layer.layers
    return delta
