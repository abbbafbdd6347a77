"""Which optimizer a run steps with, read from its config and the HF Trainer's arguments.

The spec names what the user trains with (``training.optimizer``). Who builds that optimizer, and
so whether its step allocates a temporary (:func:`dsgen.estimate.optimizers.step_temporary_bytes`),
is the config's to say:

* With an ``optimizer`` block, DeepSpeed builds it (``engine.py`` ``_configure_basic_optimizer``):
  FusedAdam on the GPU, or ``torch.optim.AdamW``/``Adam`` when the block sets ``torch_adam``, and
  DeepSpeedCPUAdam under optimizer offload. A name DeepSpeed does not implement itself is looked
  up in ``torch.optim`` (SGD, Adagrad).
* With no block, under the HF Trainer (``--training-args``), the Trainer builds its ``optim``
  (``integrations/deepspeed.py`` ``deepspeed_optim_sched``, ``Trainer.create_optimizer``). Left out,
  that is ``adamw_torch_fused`` with torch >= 2.8 (huggingface/transformers#37358), else
  ``adamw_torch``. Under optimizer offload Accelerate swaps it for DeepSpeed's CPU optimizer
  (``accelerator.py`` ``_prepare_deepspeed``, ``map_pytorch_optim_to_deepspeed``).
* With no block and no Trainer arguments, the script builds it, as the spec says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsgen.doctor.keys import MISSING, get
from dsgen.spec.types import Optimizer, Spec

#: DeepSpeed config optimizer names (lower-cased) and the spec type each builds.
CONFIG_TYPES = {"adam": "adam", "adamw": "adamw", "lion": "lion", "adagrad": "adagrad", "sgd": "sgd"}

#: The HF Trainer's ``optim`` values dsgen models: (spec type, implementation; None for the types
#: the script always builds, whatever the implementation says: dsgen.estimate.optimizers.CLIENT_OPTIMIZERS).
TRAINER_OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", "torch"),
    "adamw_torch_fused": ("adamw", "torch-fused"),
    "sgd": ("sgd", "torch"),
    "adagrad": ("adagrad", "torch"),
    "adafactor": ("adafactor", None),
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
}

#: What the Trainer builds when its arguments name no ``optim`` (torch >= 2.8).
TRAINER_DEFAULT_OPTIM = "adamw_torch_fused"


def _offloaded(config: Mapping[str, Any]) -> bool:
    device = get(config, "zero_optimization.offload_optimizer.device")
    stage = get(config, "zero_optimization.stage")
    return device in ("cpu", "nvme") and stage not in (0, MISSING, None)


@dataclass(frozen=True)
class OptimizerReading:
    """The optimizer a run steps with, what was read to decide it (None: the spec's own), and
    whether that contradicts the spec (another type, or one dsgen does not model) or only fills
    in who builds it."""

    optimizer: Optimizer
    note: str | None = None
    contradicts_spec: bool = False


def run_optimizer(
    config: Mapping[str, Any], trainer_args: Mapping[str, Any] | None, given: Optimizer
) -> OptimizerReading:
    """The optimizer the run steps with: ``given`` (the spec's) with the type and implementation
    the config and the Trainer's arguments decide."""
    block = config.get("optimizer")
    if isinstance(block, Mapping):
        name = str(block.get("type", "")).lower()
        kind = CONFIG_TYPES.get(name)
        if kind is None:
            note = f"the config's optimizer {block.get('type')!r} is not modelled: priced as the spec's {given.type}"
            return OptimizerReading(given, note, contradicts_spec=True)
        params = block.get("params")
        torch_adam = isinstance(params, Mapping) and params.get("torch_adam") is True and kind in ("adam", "adamw")
        torch_built = (torch_adam or kind in ("sgd", "adagrad")) and not _offloaded(config)
        run = replace(given, type=kind, implementation="torch" if torch_built else "deepspeed")
        if run == given:
            return OptimizerReading(given)
        how = "torch.optim's foreach class (torch_adam)" if torch_adam else "DeepSpeed"
        note = f"the config's optimizer block builds {kind} ({how}): priced as that, not the spec's {given.type}"
        if run.type == given.type:
            note = f"the config's optimizer block builds {kind} ({how}): priced as that"
        return OptimizerReading(run, note, contradicts_spec=run.type != given.type)
    if trainer_args is None:
        return OptimizerReading(given)
    optim = str(trainer_args.get("optim", TRAINER_DEFAULT_OPTIM))  # the API takes any mapping
    source = (
        "optim"
        if "optim" in trainer_args
        else f"optim unset: {TRAINER_DEFAULT_OPTIM}, the Trainer's default with torch >= 2.8"
    )
    if optim not in TRAINER_OPTIM:
        note = f"the Trainer's optim {optim!r} is not modelled: priced as the spec's {given.type}"
        return OptimizerReading(given, note, contradicts_spec=True)
    kind, implementation = TRAINER_OPTIM[optim]
    if _offloaded(config):
        implementation = "deepspeed"  # Accelerate hands the offloaded step to DeepSpeed's CPU optimizer
    run = replace(given, type=kind, implementation=implementation or given.implementation)
    if run == given:
        return OptimizerReading(given)
    note = f"the config has no optimizer block, so the HF Trainer builds it ({source}): priced as {optim}"
    return OptimizerReading(run, note, contradicts_spec=run.type != given.type)


def with_run_optimizer(spec: Spec, config: Mapping[str, Any], trainer_args: Mapping[str, Any] | None) -> Spec:
    """``spec`` priced with the optimizer the run steps with (:func:`run_optimizer`)."""
    optimizer = run_optimizer(config, trainer_args, spec.training.optimizer).optimizer
    if optimizer == spec.training.optimizer:
        return spec
    return replace(spec, training=replace(spec.training, optimizer=optimizer))
