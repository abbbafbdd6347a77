"""The spec the doctor prices a run on, with the config's global batch where the spec states none.

``dsgen solve`` needs a global batch to search for; the doctor does not: the config (with the
Trainer's arguments for its ``"auto"`` keys) already says how many samples a step trains, and that
value wins over the spec's anyway (the doctor prices the config's batch, and its fixes keep it).
So a spec given to the doctor may leave out ``training.global_batch_size`` (and
``tokens_per_step``) when the config states its batch: the doctor reads the run once on a
provisional spec, takes the samples a step trains (micro x accumulation x data-parallel ranks, as
DeepSpeed derives them), and loads the spec again with that batch. The spec schema is unchanged:
the value is supplied as an override, before the loader validates, so every rule that reads the
batch (GRPO's generation groups) judges the config's value.

A config whose batch is ``"auto"`` without Trainer arguments (so the doctor would only be
assuming one), or that gives neither ``train_batch_size`` nor ``train_micro_batch_size_per_gpu``,
states no batch: then the spec must, and the error names ``training.global_batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsgen.doctor.method_files import peft_overrides, trl_overrides
from dsgen.doctor.reading import read_run
from dsgen.errors import DsgenError
from dsgen.intake.loader import load_spec
from dsgen.intake.overrides import apply_overrides
from dsgen.spec.types import Spec
from dsgen.spec.yaml_source import load_yaml, read_source

#: The DeepSpeed keys that state a run's batch (``"auto"`` ones are the Trainer's to fill).
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

#: A batch stand-in that no loader rule reads (only ``global_batch_size`` is checked against
#: GRPO's generation groups), used for the one reading that finds the config's own batch.
_PROVISIONAL = "training.tokens_per_step=1"


def doctor_spec(
    path: str | Path,
    config: Any,
    *,
    release: str | None = None,
    trainer_args: Mapping[str, Any] | None = None,
    method: tuple[str, ...] = (),
    peft: str | Path | None = None,
    world_size: int | None = None,
    shape: tuple[str, ...] = (),
) -> Spec:
    """The spec at ``path`` as the doctor prices ``config`` on it: the DeepSpeed ``release`` the
    run uses, the model and sequence a LLaMA-Factory YAML gives where the spec has none (``shape``),
    the method and objective its own files state (``method``: LLaMA-Factory and TRL
    overrides; ``peft``: the adapter config), and the config's global batch where the spec states
    none (:func:`config_batch_overrides`)."""
    base = [*shape] if release is None else [*shape, f'training.deepspeed_version="{release}"']
    batch = config_batch_overrides(path, base, config, trainer_args=trainer_args, world_size=world_size)
    spec = load_spec(path, [*base, *batch])
    chosen = [*method, *trl_overrides(dict(trainer_args or {}))]
    if peft is not None:
        chosen += peft_overrides(peft, spec.training.finetuning.method)
    if chosen:  # what the run's own files say about the method and objective wins
        spec = load_spec(path, [*base, *chosen, *batch])
    return spec


def config_batch_overrides(
    path: str | Path,
    overrides: list[str],
    config: Any,
    *,
    trainer_args: Mapping[str, Any] | None,
    world_size: int | None,
) -> list[str]:
    """``["training.global_batch_size=N"]`` with the samples a step of ``config`` trains, when the
    spec (with ``overrides``) states neither a global batch nor tokens per step; empty when it
    does. DsgenError naming ``training.global_batch_size`` when neither the spec nor the config
    states a batch."""
    file = Path(path)
    data, source = load_yaml(read_source(file, "spec"), str(file))
    if isinstance(data, dict):
        apply_overrides(data, overrides, source)
    training = data.get("training") if isinstance(data, dict) else None
    if not isinstance(training, dict) or "global_batch_size" in training or "tokens_per_step" in training:
        return []  # the loader judges the spec as it is
    provisional = load_spec(file, [*overrides, _PROVISIONAL])
    # read_run refuses a config that is not a JSON object, with the doctor's own message
    reading = read_run(config, provisional, world_size=world_size, trainer_args=trainer_args)
    assumed = [f.key for f in reading.resolved.fills if f.key in BATCH_KEYS and f.assumed]
    if reading.plan is None or assumed:
        why = (
            f'the config\'s {", ".join(assumed)} {"is" if len(assumed) == 1 else "are"} "auto" and no Trainer '
            "arguments say what the Trainer fills in"
            if assumed
            else f"the config gives no batch DeepSpeed accepts ({reading.batch.error})"
        )
        raise DsgenError(
            f"training.global_batch_size: the spec gives neither global_batch_size nor tokens_per_step, and {why}",
            location=source.location(("training",)),
            hint="state training.global_batch_size in the spec"
            + (", or pass --training-args with the Trainer's arguments" if assumed else ""),
        )
    return [f"training.global_batch_size={reading.plan.global_batch_size}"]
