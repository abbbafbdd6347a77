"""Fixes that change what the run trains, offered apart from the config fixes.

Switching method changes the training itself, so these never mix with the config fixes the solver
finds with the method held. Each lighter setup (full to LoRA, LoRA to QLoRA, a separate reference
model to precomputed log-probabilities) is priced at its own best plan: the doctor's search (the
run's global batch and precision, everything else free) solved with that setup. Pricing it at the
crashed run's own micro-batch and checkpointing instead would hide a method that fits as soon as
the batch is split differently (a full fine-tune of Mistral-7B at micro 8 on two RTX 4090s: LoRA
does not fit at micro 8 without checkpointing, and fits at its own best plan). Each fix lists the
spec keys it changes and the config and script changes its plan needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dsgen.estimate.objectives import REFERENCE_OBJECTIVES, reference_source
from dsgen.plan import Plan
from dsgen.search.evaluation import Evaluation
from dsgen.spec.types import FineTuning, Spec


@dataclass(frozen=True)
class MethodFix:
    """One change of method or objective setup, and the run's plan priced under it."""

    label: str
    changes: tuple[tuple[str, str], ...]  # spec keys and their new values
    evaluation: Evaluation  # its own best plan (the doctor's search solved with this setup)
    config_changes: tuple[tuple[str, Any], ...] = ()  # what that plan changes in the config
    script_changes: tuple[str, ...] = ()


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
        reference = finetuning.objective in REFERENCE_OBJECTIVES
        out.append(
            (
                "LoRA adapters instead of training the weights"
                + (" (the reference pass then disables the adapter)" if reference else ""),
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


#: The doctor's search solved for a spec: its best plan that fits, or None.
BestPlan = Callable[[Spec], Evaluation | None]
#: The config and script changes that turn the run's plan into another.
PlanChanges = Callable[[Plan], tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]]


def method_fixes(spec: Spec, best_plan: BestPlan, changes_to: PlanChanges) -> tuple[MethodFix, ...]:
    """The lighter setups that fit at their own best plan (``best_plan``), each with the config
    and script changes that plan needs (``changes_to``); empty when none fits."""
    found = []
    for label, changes, finetuning in _alternatives(spec.training.finetuning):
        alternative = replace(spec, training=replace(spec.training, finetuning=finetuning))
        evaluation = best_plan(alternative)
        if evaluation is not None:
            config_changes, script = changes_to(evaluation.plan)
            found.append(MethodFix(label, changes, evaluation, config_changes, script))
    return tuple(found)
