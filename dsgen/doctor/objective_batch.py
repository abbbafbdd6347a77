"""What the objective does to the batch the config states: the notes the batch diagnosis adds.

A paired objective (DPO, ORPO, SimPO, reward) runs the chosen and the rejected sequence of every
sample in one forward (TRL's ``DPOTrainer.concatenated_forward``), so a micro-batch of ``b`` pairs
is ``2b`` sequences of activations. GRPO's micro-batch counts completions, and TRL refuses a
generation batch (``per_device_train_batch_size × world × steps_per_generation``, the steps
defaulting to the accumulation steps) that does not hold whole groups of ``num_generations``:
``GRPOConfig.__post_init__`` raises "generation_batch_size ... must be divisible by num_generations".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsgen.estimate.objectives import sequences_per_sample
from dsgen.plan import Plan
from dsgen.spec.types import Spec


def objective_batch_notes(spec: Spec, plan: Plan, trainer_args: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(severity, code, message, hint) for the objective's batch."""
    finetuning = spec.training.finetuning
    notes: list[tuple[str, str, str, str]] = []
    sequences = sequences_per_sample(finetuning.objective)
    if sequences > 1:
        notes.append(
            (
                "info",
                "paired-sequences",
                f"objective {finetuning.objective}: each of the micro-batch's {plan.micro_batch_size} samples runs a "
                f"chosen and a rejected sequence, {sequences * plan.micro_batch_size} sequences per forward; priced so",
                "halve per_device_train_batch_size before halving anything else when it runs out",
            )
        )
    if finetuning.objective == "grpo":
        steps = trainer_args.get("steps_per_generation") or plan.gradient_accumulation_steps
        batch = plan.micro_batch_size * plan.batch_parallel_size * int(steps)
        generations = finetuning.generation.num_generations
        if batch % generations:
            notes.append(
                (
                    "error",
                    "generation-batch",
                    f"GRPO's generation batch, micro-batch {plan.micro_batch_size} x {plan.batch_parallel_size} ranks x "
                    f"{steps} steps per generation = {batch} completions, is not a multiple of num_generations "
                    f"{generations}: TRL's GRPOConfig refuses it",
                    "make per_device_train_batch_size x world size x steps_per_generation a multiple of num_generations",
                )
            )
    return notes
