"""Fixes that change what the run trains, offered apart from the config fixes.

Switching method changes the training itself, so these never mix with the config fixes the solver
finds with the method held: the doctor prices the run's own plan under each lighter method (full
to LoRA, LoRA to QLoRA, a separate reference model to precomputed log-probabilities) and lists the
ones that fit, each saying what it changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsgen.estimate.objectives import REFERENCE_OBJECTIVES, reference_source
from dsgen.evaluation import Evaluation, evaluate
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Spec


@dataclass(frozen=True)
class MethodFix:
    """One change of method or objective setup, and the run's plan priced under it."""

    label: str
    changes: tuple[tuple[str, str], ...]  # spec keys and their new values
    evaluation: Evaluation


def _alternatives(finetuning: FineTuning) -> list[tuple[str, tuple[tuple[str, str], ...], FineTuning]]:
    """Lighter setups than ``finetuning``, each one step from it."""
    out: list[tuple[str, tuple[tuple[str, str], ...], FineTuning]] = []
    if finetuning.objective in REFERENCE_OBJECTIVES and reference_source(finetuning) == "separate":
        out.append(
            (
                "reference log-probabilities computed before training (precompute_ref_log_probs: no reference model held)",
                (("training.reference_model", "precomputed"),),
                replace(finetuning, reference_model="precomputed"),
            )
        )
    if finetuning.method in ("full", "freeze"):
        out.append(
            (
                "LoRA adapters instead of training the weights (the reference pass then disables the adapter)",
                (("training.finetuning", "lora"),),
                replace(finetuning, method="lora", reference_model="auto"),
            )
        )
    if finetuning.method in ("full", "freeze", "lora"):
        out.append(
            (
                "QLoRA: LoRA on 4-bit NF4 weights",
                (("training.finetuning", "qlora"),),
                replace(finetuning, method="qlora", reference_model="auto"),
            )
        )
    return out


def method_fixes(spec: Spec, plan: Plan) -> tuple[MethodFix, ...]:
    """The lighter setups under which the run's own plan fits (empty when none does)."""
    found = []
    for label, changes, finetuning in _alternatives(spec.training.finetuning):
        alternative = replace(spec, training=replace(spec.training, finetuning=finetuning))
        evaluation = evaluate(alternative, plan)
        if evaluation.feasible:
            found.append(MethodFix(label, changes, evaluation))
    return tuple(found)
