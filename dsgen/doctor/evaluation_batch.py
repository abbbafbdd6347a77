"""The HF Trainer's evaluation batch beside the micro-batch the doctor prices.

An evaluation forward (``Trainer.prediction_step``, under ``torch.no_grad``) keeps no activations
for a backward, but its logits and its loss grow with its own batch, ``per_device_eval_batch_size``,
which is 8 when the arguments leave it out (``transformers.TrainingArguments``), whatever the
training micro-batch. A run that trains at micro-batch 1 or 2 and runs out of GPU memory at its
first evaluation is a published pattern (unslothai/unsloth#5168, Roblox/FAI-RL#109,
axolotl-ai-cloud/axolotl#12, huggingface/trl#675), so the doctor names it wherever the arguments
turn evaluation on. ``dsgen new --target hf-trainer`` writes the evaluation batch as the plan's
micro-batch (``templates/hf-trainer/training_args.json.j2``), where memory was sized. Under Ulysses
SP the Trainer evaluates whole sequences on every rank, which the doctor names too
(:func:`dsgen.targets.long_context.trainer_sp_evaluation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsgen.search.evaluation import Evaluation
from dsgen.spec.types import Spec
from dsgen.targets.long_context import trainer_sp_evaluation, unsharded_evaluation_bytes
from dsgen.units import gib

#: ``TrainingArguments`` defaults for the fields that decide whether and at what batch the Trainer
#: evaluates (transformers/training_args.py, the dataclass field defaults).
EVALUATION_DEFAULTS: dict[str, Any] = {
    "per_device_eval_batch_size": 8,
    "eval_strategy": "no",
    "do_eval": False,
}

#: The strategies ``TrainingArguments`` accepts (``IntervalStrategy``); ``evaluation_strategy`` is
#: the field's name before transformers 4.46.
STRATEGIES = ("no", "steps", "epoch")
STRATEGY_NAMES = ("eval_strategy", "evaluation_strategy")


def evaluates(trainer_args: Mapping[str, Any]) -> bool:
    """Whether the Trainer evaluates: an evaluation strategy other than "no" during training, or
    ``do_eval``, the flag scripts read to call ``trainer.evaluate()`` after it."""
    strategy = next((trainer_args[name] for name in STRATEGY_NAMES if name in trainer_args), "no")
    return strategy != "no" or trainer_args.get("do_eval") is True


def evaluation_batch(trainer_args: Mapping[str, Any]) -> int | None:
    """The per-GPU batch of an evaluation forward, or None when the arguments do not evaluate."""
    if not evaluates(trainer_args):
        return None
    batch = trainer_args.get("per_device_eval_batch_size", EVALUATION_DEFAULTS["per_device_eval_batch_size"])
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1 else None


def evaluation_notes(trainer_args: Mapping[str, Any], evaluation: Evaluation, spec: Spec) -> list[tuple[str, str, str]]:
    """(code, message, hint) of each way the Trainer's evaluation outgrows the training step the
    doctor priced: a larger batch than the micro-batch, and, under Ulysses SP, whole sequences on
    every rank (:func:`dsgen.targets.long_context.trainer_sp_evaluation`). The larger batch comes
    with a floor: the model states every forward holds (parameters, optimizer states, the fixed
    CUDA and NCCL allowances) and the batch's logits and loss
    (:func:`dsgen.targets.long_context.unsharded_evaluation_bytes`); gradients, ZeRO's buffers and
    the layers' working set are left out of it."""
    batch = evaluation_batch(trainer_args)
    if batch is None:
        return []
    notes = []
    plan, gpu = evaluation.plan, evaluation.memory.gpu
    micro = plan.micro_batch_size
    if batch > micro:
        source = (
            "per_device_eval_batch_size"
            if "per_device_eval_batch_size" in trainer_args
            else "per_device_eval_batch_size unset: the Trainer's default"
        )
        states = gpu.parameters + gpu.optimizer_states + gpu.step_overhead
        logits = unsharded_evaluation_bytes(spec.model, spec.training.sequence_length, batch, plan.dtype_bytes)
        floor = states + logits
        beyond = f", more than the {gib(gpu.capacity)} the GPU holds" if floor > gpu.capacity else ""
        message = (
            f"evaluation runs {batch} sequences per GPU per forward ({source}), {batch / micro:g}x the "
            f"micro-batch of {micro} that training runs and dsgen priced: it holds at least {gib(floor)} "
            f"({gib(states)} of model states, {gib(logits)} of logits and loss){beyond}"
        )
        notes.append(
            (
                "eval-batch",
                message,
                f"pass --per_device_eval_batch_size {micro} (dsgen new --target hf-trainer writes it so)",
            )
        )
    if plan.sequence_parallel_size > 1:
        advice, why = trainer_sp_evaluation(
            spec.model,
            spec.training.sequence_length,
            batch,
            plan.dtype_bytes,
            spec.hardware.gpu,
            spec.training.deepspeed_version,
        )
        notes.append(("eval-sequence-parallel", why, advice))
    return notes
