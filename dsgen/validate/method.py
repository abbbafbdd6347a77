"""The training method a DeepSpeed config is used with, as far as the fine-tuning rules need it.

A DeepSpeed JSON does not say whether the run trains LoRA adapters on a 4-bit base or runs DPO
against a separate reference model, yet TRL, PEFT and transformers treat the config differently
for each. :class:`TrainingMethod` carries that; ``validate_config(..., method=...)`` hands it to
the rules of :mod:`dsgen.validate.rules.finetuning` (``docs/validation.md``, "Fine-tuning setups").

:meth:`TrainingMethod.from_spec` builds it from a dsgen spec, the reference model resolved as the
estimate resolves it (:func:`dsgen.estimate.objectives.reference_source`). That import happens
inside the constructor, so importing :mod:`dsgen.validate` stays cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsgen.vocabulary import (
    FINETUNING_METHODS,
    GENERATION_ENGINES,
    OBJECTIVES,
    QUANTIZATION_TYPES,
    REFERENCE_MODELS,
    FineTuningMethod,
    GenerationEngine,
    Objective,
    QuantizationType,
    ReferenceModel,
)

if TYPE_CHECKING:
    from dsgen.spec.types import FineTuning, Spec

#: The objectives that generate completions (their generation engine and group size matter).
GENERATING_OBJECTIVES: frozenset[Objective] = frozenset({"grpo", "ppo"})
#: The reference sources after ``auto`` is resolved.
REFERENCE_SOURCES: tuple[ReferenceModel, ...] = tuple(r for r in REFERENCE_MODELS if r != "auto")


@dataclass(frozen=True)
class TrainingMethod:
    """What trains and against what, for the rules that depend on it.

    ``reference`` is where reference log-probabilities come from, already resolved (never
    ``auto``): ``separate`` (a frozen copy, its own DeepSpeed engine in TRL), ``adapter-disabled``
    (the LoRA policy with its adapter off), ``precomputed`` (computed once before training) or
    ``none``. Quantization is set exactly for QLoRA (transformers' Trainer refuses a quantized
    base trained without adapters: ``trainer_utils.py`` ``validate_quantization_for_training``,
    "You cannot perform fine-tuning on purely quantized models"). The generation engine and the
    group size are set exactly for the generating objectives (GRPO, PPO).
    """

    finetuning: FineTuningMethod = "full"
    objective: Objective = "sft"
    reference: ReferenceModel = "none"
    quantization_bits: int | None = None
    quantization_type: QuantizationType | None = None
    generation_engine: GenerationEngine | None = None
    num_generations: int | None = None

    def __post_init__(self) -> None:
        _one_of("finetuning", self.finetuning, FINETUNING_METHODS)
        _one_of("objective", self.objective, OBJECTIVES)
        _one_of("reference", self.reference, REFERENCE_SOURCES)
        if self.reference == "adapter-disabled" and not self.adapters:
            raise ValueError(f"reference adapter-disabled needs a LoRA or QLoRA policy, not {self.finetuning}")
        quantization = (self.quantization_bits, self.quantization_type)
        if self.finetuning == "qlora":
            _one_of("quantization_type", self.quantization_type, QUANTIZATION_TYPES)
            bits = 8 if self.quantization_type == "int8" else 4
            if self.quantization_bits != bits or isinstance(self.quantization_bits, bool):
                raise ValueError(
                    f"quantization type {self.quantization_type} stores {bits}-bit weights, "
                    f"not {self.quantization_bits!r}-bit"
                )
        elif quantization != (None, None):
            raise ValueError(
                f"quantization applies to finetuning qlora only, not {self.finetuning} (transformers' Trainer "
                "refuses a quantized base without adapters: 'You cannot perform fine-tuning on purely quantized models')"
            )
        generation = (self.generation_engine, self.num_generations)
        if self.objective in GENERATING_OBJECTIVES:
            _one_of("generation_engine", self.generation_engine, GENERATION_ENGINES)
            count = self.num_generations
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise ValueError(f"num_generations must be a positive integer, got {count!r}")
        elif generation != (None, None):
            raise ValueError(f"generation applies to objective grpo or ppo, not {self.objective}")

    @property
    def adapters(self) -> bool:
        """LoRA adapters train (on a 16-bit base for ``lora``, a quantized one for ``qlora``)."""
        return self.finetuning in ("lora", "qlora")

    @classmethod
    def from_finetuning(cls, finetuning: FineTuning) -> TrainingMethod:
        """The method of a spec's ``training`` section (:class:`dsgen.spec.types.FineTuning`)."""
        from dsgen.estimate.objectives import reference_source

        qlora = finetuning.method == "qlora"
        generating = finetuning.objective in GENERATING_OBJECTIVES
        return cls(
            finetuning=finetuning.method,
            objective=finetuning.objective,
            reference=reference_source(finetuning),
            quantization_bits=finetuning.quantization.bits if qlora else None,
            quantization_type=finetuning.quantization.type if qlora else None,
            generation_engine=finetuning.generation.engine if generating else None,
            num_generations=finetuning.generation.num_generations if generating else None,
        )

    @classmethod
    def from_spec(cls, spec: Spec) -> TrainingMethod:
        """The method of a loaded spec (``dsgen.api.load_spec``)."""
        return cls.from_finetuning(spec.training.finetuning)


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
