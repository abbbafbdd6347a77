"""Host RAM a checkpoint save adds on rank 0's node, on top of what training keeps there.

A save runs between optimizer steps: activations and checkpoint offload's host copies are gone,
the offloaded model states stay. Two things copy tensors to the host then, one after the other:

* **DeepSpeed's ``save_checkpoint``** (every target). Each rank ``torch.save``s its state, and
  ``torch.save`` copies every GPU storage to the host whole, one storage at a time
  (``torch/serialization.py`` ``_save``: ``storage.cpu()`` per storage, CPU storages written in
  place). What a rank holds at once is its largest storage. All ranks save their ZeRO partition
  together (``engine.py`` ``_save_zero_checkpoint``); the data-parallel writer, rank 0, also
  saves the module (``_save_checkpoint``), whose 16-bit parameters at ZeRO-0/1/2 are views of one
  flat buffer (``stage_1_and_2.py``, ``bf16_optimizer.py``), so that buffer is one storage of the
  whole model. ZeRO-3's module holds partitioned stand-ins.
* **The HF Trainer's ``save_model``** (target ``hf-trainer``, every checkpoint). On every rank it
  builds ``accelerator.get_state_dict(engine)`` (transformers ``trainer.py`` ``save_model``):
  at ZeRO-3 with ``stage3_gather_16bit_weights_on_model_save`` the 16-bit model gathered on rank
  0's host (``engine.py`` ``_zero3_consolidated_16bit_state_dict``), without it nothing (the
  Trainer falls back to ``save_checkpoint``); at ZeRO-0/1/2 a host clone of the module's state
  dict on every rank (``deepspeed/checkpoint/utils.py`` ``clone_tensors_for_torch_save``), tied
  weights cloned once per key.

The Trainer saves the model before the engine's checkpoint (``_save_checkpoint``), and the state
dict dies with ``save_model``, so the save's host peak is the larger of the two. Measured through
the real Trainer and DeepSpeed in ``tests/test_checkpoint_save.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.model_states import ModelStates
from dsgen.estimate.trainable import ParameterSplit, largest_frozen
from dsgen.plan import Plan
from dsgen.units import FP32


@dataclass(frozen=True)  # one per candidate plan
class CheckpointSave:
    """Host bytes on rank 0's node while a checkpoint is written, by who copies them."""

    engine: int  # DeepSpeed save_checkpoint: each rank's largest storage, copied to the host
    state_dict: int  # the HF Trainer's 16-bit model state dict (0 for the other targets)

    @property
    def peak(self) -> int:
        return max(self.engine, self.state_dict)


NO_SAVE_COPIES = CheckpointSave(engine=0, state_dict=0)


def engine_save_bytes(states: ModelStates, plan: Plan, ranks_per_node: int) -> int:
    """The largest storage each rank of rank 0's node copies to the host in ``save_checkpoint``."""
    optimizer_on_gpu = plan.offload_optimizer == "none" or (plan.zero_stage == 3 and plan.offload_ratio < 1)
    # flat: the 16-bit parameters are views of one buffer (ZeRO-1/2; ZeRO-0 under FP16_/BF16_Optimizer,
    # whose fp32 master group is flat too); fp32 ZeRO-0 keeps torch's per-tensor parameters and states.
    # The optimizer's storage: ZeRO-0/1/2 the (rank's) flat fp32 group, ZeRO-3 its largest sub-group.
    flat = plan.zero_stage in (1, 2) or (plan.zero_stage == 0 and plan.dtype_bytes < FP32)
    largest = states.partitioning.largest_tensor
    stepped = states.partitioning.stepped if plan.zero_stage > 0 or flat else largest
    optimizer = FP32 * stepped if optimizer_on_gpu else 0
    # a frozen tensor is a storage of its own in the module's state dict (fine-tuning)
    largest_storage = max(
        states.partitioning.parameters if flat else largest, largest_frozen(states.partitioning.split)
    )
    module = plan.dtype_bytes * largest_storage if plan.zero_stage < 3 else 0
    rank0 = max(module, optimizer)
    if plan.zero_stage == 0:  # no ZeRO partition files: rank 0 writes the optimizer with the module
        return rank0
    return rank0 + (ranks_per_node - 1) * optimizer


def trainer_state_dict_bytes(shape: ModelShape, plan: Plan, ranks_per_node: int, split: ParameterSplit) -> int:
    """The HF Trainer's ``save_model`` state dict on rank 0's node (see the module docstring). A
    PEFT model saves its adapters alone (``PeftModel.save_pretrained``: ``get_peft_model_state_dict``)."""
    if split.adapters:
        return (1 if plan.zero_stage == 3 else ranks_per_node) * plan.dtype_bytes * split.trainable_count
    if plan.zero_stage == 3:
        gathered = plan.knobs.gather_16bit_weights_on_model_save
        return plan.dtype_bytes * shape.parameter_count() if gathered else 0
    tied = shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0
    return ranks_per_node * plan.dtype_bytes * (shape.parameter_count() + tied)


def checkpoint_save(
    shape: ModelShape, states: ModelStates, plan: Plan, ranks_per_node: int, trainer_saves_model: bool
) -> CheckpointSave:
    """What a checkpoint save copies to the host (``trainer_saves_model``: the HF Trainer's loop)."""
    return CheckpointSave(
        engine=engine_save_bytes(states, plan, ranks_per_node),
        state_dict=trainer_state_dict_bytes(shape, plan, ranks_per_node, states.partitioning.split)
        if trainer_saves_model
        else 0,
    )
