"""What a run trains and against what, said once for the JSON contract and the text report.

The fine-tuning method, the objective, where reference log-probabilities come from, and the
parameter counts and frozen bytes of one priced plan (:mod:`dsgen.estimate.trainable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsgen.estimate.objectives import reference_source, sequences_per_sample
from dsgen.estimate.trainable import ParameterSplit, parameter_split
from dsgen.search.evaluation import Evaluation
from dsgen.spec.types import FineTuning, Spec
from dsgen.units import format_count, gib

METHOD_LABELS = {"full": "full training", "lora": "LoRA", "qlora": "QLoRA", "freeze": "freeze-tuning"}


@dataclass(frozen=True)
class MethodSummary:
    """One plan's method, its parameter counts and the frozen weights' bytes on one GPU."""

    method: str
    objective: str
    reference_model: str  # resolved: separate | adapter-disabled | precomputed | none
    trainable_parameters: int
    frozen_parameters: int
    frozen_bytes: int  # on one GPU (the worst rank)
    frozen_precision: str  # the training dtype, or the quantization ('nf4', 'int8', ...)
    sequences_per_sample: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "objective": self.objective,
            "reference_model": self.reference_model,
            "trainable_parameters": self.trainable_parameters,
            "frozen_parameters": self.frozen_parameters,
            "frozen_bytes": self.frozen_bytes,
            "frozen_precision": self.frozen_precision,
            "sequences_per_sample": self.sequences_per_sample,
        }


def _frozen_precision(split: ParameterSplit, dtype: str) -> str:
    if split.quantization is None:
        return dtype if split.has_frozen else "none"
    q = split.quantization
    double = "+double-quant" if q.double_quant and q.type in ("nf4", "fp4") else ""
    return f"{q.type}{double} ({q.bits}-bit linear layers, {dtype} rest)"


def method_summary(spec: Spec, e: Evaluation) -> MethodSummary:
    finetuning = spec.training.finetuning
    split = parameter_split(spec.model, finetuning)
    trainable = spec.model.parameter_count() if finetuning.method == "full" else split.trainable_count
    return MethodSummary(
        method=finetuning.method,
        objective=finetuning.objective,
        reference_model=reference_source(finetuning),
        trainable_parameters=trainable,
        frozen_parameters=split.frozen_count,
        frozen_bytes=e.memory.gpu.frozen_parameters,
        frozen_precision=_frozen_precision(split, e.plan.precision),
        sequences_per_sample=sequences_per_sample(finetuning.objective),
    )


def method_line(spec: Spec, e: Evaluation) -> str | None:
    """The text report's line for a fine-tuning run (None for full training with the SFT loss)."""
    finetuning: FineTuning = spec.training.finetuning
    if finetuning.is_default:
        return None
    s = method_summary(spec, e)
    label = METHOD_LABELS[s.method]
    if finetuning.adapters:
        targets = finetuning.lora.target_modules
        named = targets if isinstance(targets, str) else ", ".join(targets)
        label += f" r{finetuning.lora.rank} on {named}"
    parts = [f"{label}: {format_count(s.trainable_parameters)} trained"]
    if s.frozen_parameters:
        parts.append(
            f"{format_count(s.frozen_parameters)} frozen ({s.frozen_precision}, {gib(s.frozen_bytes)} per GPU)"
        )
    objective = s.objective.upper() if s.objective != "sft" else "SFT"
    if s.sequences_per_sample > 1:
        objective += " (chosen + rejected: 2 sequences per sample)"
    if s.reference_model != "none":
        objective += f", reference model {s.reference_model}"
    return "method    " + "; ".join(parts) + f"; {objective}"
