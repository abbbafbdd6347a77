"""Fixes for a config that does not fit, taken from the solver's own search (issue 22).

The doctor used to try a private list of levers; now every fix is a plan ``dsgen solve`` finds for
the same spec (the config's precision and global batch, nothing else pinned), written as key
changes to the user's config. So a config gets a fix whenever ``dsgen solve`` finds any plan, and
the fixes cover everything the solver searches: stage, partial offload, dropping parameter
offload, NVMe where the spec declares a drive, checkpointing, micro-batch and accumulation at the
same global batch, ZeRO++ and the ZeRO knobs.

Each candidate is written twice, nearest first: with the user's own ZeRO knobs (only the
structure changes), then with the solver's knobs. The fixed config is re-read the way the doctor
reads any config (``price``: "auto" values, validation, DeepSpeed's batch derivation, the
config's keys and DeepSpeed's defaults) and kept only if that reading fits. Fixes are ordered
by the solver's own ranking rule (:func:`dsgen.search.ranking.rank_within_error`), so the first fix is the
plan ``dsgen solve`` would choose among them; where the rule cannot tell two apart, the one that
changes fewer keys goes first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsgen.catalog.model_shape import ModelShape
from dsgen.doctor.config_to_plan import KNOB_KEYS
from dsgen.doctor.keys import MISSING, get, is_auto, with_changes
from dsgen.plan import Plan, ZeroKnobs
from dsgen.search.evaluation import Evaluation
from dsgen.search.ranking import rank_within_error
from dsgen.spec.types import Spec
from dsgen.vocabulary import Checkpointing, OffloadDevice

#: How many of the solver's ranked plans are written out as candidate fixes (the ranking puts the
#: fastest and simplest first; more are tried only until one survives the doctor's own reading).
CANDIDATES = 48


@dataclass(frozen=True)
class Fix:
    """A priced fix: the config keys it changes, what the script must change, the whole config."""

    label: str
    changes: tuple[tuple[str, Any], ...]
    script_changes: tuple[str, ...]
    evaluation: Evaluation
    config: dict[str, Any]

    @property
    def size(self) -> int:
        """How many things the user changes (config keys and script changes)."""
        return len(self.changes) + len(self.script_changes)


def batch_changes(
    config: Mapping[str, Any], micro: int, accum: int, trainer: bool
) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """Config keys and Trainer flags that set micro-batch and accumulation; train_batch_size stays
    as it is, because the global batch does not change.

    Under the HF Trainer (``trainer``: Trainer arguments given, or "auto" batch keys) the Trainer
    fills or checks the batch keys against its own arguments (``fill_match``), so the flags change
    and concrete keys change with them (accumulation is added when DeepSpeed would otherwise derive
    it as 1). Without it, DeepSpeed derives a missing
    accumulation from train_batch_size, so accumulation is written unless that derivation covers it.
    """
    changes: list[tuple[str, Any]] = []
    script: list[str] = []
    micro_value = config.get("train_micro_batch_size_per_gpu")
    accum_value = config.get("gradient_accumulation_steps")
    if trainer:
        script.append(
            f"pass --per_device_train_batch_size {micro} --gradient_accumulation_steps {accum} to the Trainer"
        )
        if micro_value is not None and not is_auto(micro_value):
            changes.append(("train_micro_batch_size_per_gpu", micro))
        if not is_auto(accum_value) and (
            accum_value is not None or not isinstance(config.get("train_batch_size"), int)
        ):
            # absent, DeepSpeed would derive 1 whatever the Trainer accumulates: write it
            changes.append(("gradient_accumulation_steps", accum))
        return tuple(changes), tuple(script)
    changes.append(("train_micro_batch_size_per_gpu", micro))
    if "gradient_accumulation_steps" in config or not isinstance(config.get("train_batch_size"), int):
        changes.append(("gradient_accumulation_steps", accum))
    return tuple(changes), tuple(script)


CHECKPOINTING_SCRIPT: dict[Checkpointing, str] = {
    "full": (
        "enable activation checkpointing in the training script "
        "(model.gradient_checkpointing_enable(), or --gradient_checkpointing with the HF Trainer)"
    ),
    "selective": "recompute only the attention function in backward (selective activation recomputation)",
    "none": "turn activation checkpointing off in the training script (it only costs time here)",
}

# ZeroKnobs fields that DeepSpeed reads at each stage (the others are not written for that stage)
_STAGE3_ONLY = {
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "sub_group_size",
    "hpz_partition_size",
    "quantized_weights",
    "quantized_gradients",
    "gather_16bit_weights_on_model_save",
}


def _offload_changes(block: str, device: OffloadDevice, spec: Spec) -> list[tuple[str, Any]]:
    changes: list[tuple[str, Any]] = [(f"zero_optimization.{block}.device", device)]
    if device == "nvme":
        assert spec.hardware.nvme is not None
        changes.append((f"zero_optimization.{block}.nvme_path", spec.hardware.nvme.path))
    if device != "none":
        changes.append((f"zero_optimization.{block}.pin_memory", True))
    return changes


def plan_changes(
    config: Mapping[str, Any], current: Plan, target: Plan, spec: Spec, trainer: bool
) -> tuple[tuple[tuple[str, Any], ...], tuple[str, ...]]:
    """The config keys and script changes that turn the run of ``current`` into ``target``."""
    changes: list[tuple[str, Any]] = []
    if target.zero_stage != current.zero_stage:
        changes.append(("zero_optimization.stage", target.zero_stage))
    if target.offload_optimizer != current.offload_optimizer:
        changes += _offload_changes("offload_optimizer", target.offload_optimizer, spec)
    if (
        target.offload_optimizer != "none"
        and (target.offload_ratio != current.offload_ratio or target.offload_optimizer != current.offload_optimizer)
        and (target.offload_ratio != 1.0 or get(config, "zero_optimization.offload_optimizer.ratio") is not MISSING)
    ):
        changes.append(("zero_optimization.offload_optimizer.ratio", target.offload_ratio))
    if target.offload_param != current.offload_param:
        changes += _offload_changes("offload_param", target.offload_param, spec)
    for key, field, _default, _source in KNOB_KEYS:
        if target.zero_stage < 3 and field in _STAGE3_ONLY:
            continue
        if target.zero_stage == 3 and field == "allgather_bucket_size":
            continue
        new = getattr(target.knobs, field)
        if new != getattr(current.knobs, field):
            changes.append((f"zero_optimization.{key}", new))
    if target.zero_stage > 0 and target.knobs.overlap_comm != current.knobs.overlap_comm:
        changes.append(("zero_optimization.overlap_comm", target.knobs.overlap_comm))
    if target.model_parallel != current.model_parallel:
        changes += _model_parallel_changes(config, target, spec)
    changes = [(key, value) for key, value in changes if get(config, key) != value]
    script: tuple[str, ...] = ()
    if (target.micro_batch_size, target.gradient_accumulation_steps) != (
        current.micro_batch_size,
        current.gradient_accumulation_steps,
    ):
        extra, script = batch_changes(config, target.micro_batch_size, target.gradient_accumulation_steps, trainer)
        changes += [change for change in extra if get(config, change[0]) != change[1]]
    if target.checkpointing != current.checkpointing:
        script = (CHECKPOINTING_SCRIPT[target.checkpointing], *script)
    return tuple(changes), script


def _model_parallel_changes(config: Mapping[str, Any], target: Plan, spec: Spec) -> list[tuple[str, Any]]:
    """The AutoTP / AutoEP keys of ``target`` (0 and ``enabled: false`` turn them off, DeepSpeed's
    defaults), and ``train_batch_size`` where the config states it: DeepSpeed counts every TP peer
    in it (dsgen.plan.Plan.deepspeed_train_batch_size), so a change of TP degree changes it."""
    from dsgen.facts.model_parallel import autoep_preset_for

    tp, ep = target.tensor_parallel_size, target.expert_parallel_size
    changes: list[tuple[str, Any]] = [("tensor_parallel.autotp_size", tp if tp > 1 else 0)]
    if ep > 1:
        changes += [
            ("expert_parallel.enabled", True),
            ("expert_parallel.autoep_size", ep),
            ("expert_parallel.preset_model", autoep_preset_for(spec.model.family, spec.training.deepspeed_version)),
        ]
    elif get(config, "expert_parallel.enabled") is True:
        changes.append(("expert_parallel.enabled", False))
    if isinstance(config.get("train_batch_size"), int):
        changes.append(("train_batch_size", target.deepspeed_train_batch_size))
    return [(key, value) for key, value in changes if not (value == 0 and get(config, key) is MISSING)]


def _saving_as_before(target: Plan, current: Plan) -> Plan:
    """``target`` with the user's own 16-bit gather on save where the run is at ZeRO-3 already, and
    the solver's (on) for a move to ZeRO-3. The key costs no GPU memory, so a fix has no reason to
    change a ZeRO-3 user's choice; but without the gather a ZeRO-3 run saves no model weights where
    its ZeRO-1/2 run did: the HF Trainer's ``save_model`` falls back to a DeepSpeed checkpoint and
    Accelerate's ``get_state_dict`` raises ValueError."""
    if current.zero_stage < 3:
        return target
    knobs = replace(target.knobs, gather_16bit_weights_on_model_save=current.knobs.gather_16bit_weights_on_model_save)
    return replace(target, knobs=knobs)


def _near(candidate: Plan, current: Plan) -> Plan:
    """``candidate``'s structure and batch with the user's own ZeRO knobs, except what the structure
    needs: ZeRO++ as the solver chose it, the sub-groups partial offload splits the partition into,
    and the gather on save of a move to ZeRO-3 (:func:`_saving_as_before`)."""
    chosen = candidate.knobs
    knobs: ZeroKnobs = replace(
        current.knobs,
        hpz_partition_size=chosen.hpz_partition_size,
        quantized_weights=chosen.quantized_weights,
        quantized_gradients=chosen.quantized_gradients,
        gather_16bit_weights_on_model_save=chosen.gather_16bit_weights_on_model_save,
    )
    if candidate.offload_ratio < 1:
        knobs = replace(knobs, sub_group_size=min(knobs.sub_group_size, candidate.knobs.sub_group_size))
    return _saving_as_before(replace(candidate, knobs=knobs), current)


DEVICE_NAMES: dict[OffloadDevice, str] = {"none": "no", "cpu": "CPU", "nvme": "NVMe"}


def _offload_text(plan: Plan) -> str:
    if plan.offload_optimizer == "none" and plan.offload_param == "none":
        return "no offload"
    if plan.offload_optimizer == "cpu" and plan.offload_ratio < 1:
        optimizer = f"partial CPU optimizer offload (ratio {plan.offload_ratio:g})"
    elif plan.offload_optimizer != "none":
        optimizer = f"{DEVICE_NAMES[plan.offload_optimizer]} optimizer offload"
    else:
        optimizer = "no optimizer offload"
    if plan.offload_param == "none":
        return optimizer if plan.offload_optimizer != "none" else "no offload"
    return f"{optimizer} + {DEVICE_NAMES[plan.offload_param]} parameter offload"


def describe(current: Plan, target: Plan) -> str:
    """A short label of what a fix changes in the plan."""
    parts = []
    if target.zero_stage != current.zero_stage:
        parts.append(f"ZeRO stage {target.zero_stage}")
    if (target.offload_optimizer, target.offload_param, target.offload_ratio) != (
        current.offload_optimizer,
        current.offload_param,
        current.offload_ratio,
    ):
        parts.append(_offload_text(target))
    if target.knobs.zeropp != current.knobs.zeropp:
        parts.append(f"ZeRO++ {target.knobs.zeropp}")
    if target.checkpointing != current.checkpointing:
        parts.append(
            {"full": "activation checkpointing", "selective": "selective recompute"}.get(
                target.checkpointing, "no activation checkpointing"
            )
        )
    if target.model_parallel != current.model_parallel:
        parts.append(target.model_parallel.label() or "no AutoTP / AutoEP")
    if target.micro_batch_size != current.micro_batch_size:
        parts.append(f"micro-batch {target.micro_batch_size} x accumulation {target.gradient_accumulation_steps}")
    if not parts:
        parts.append("ZeRO knobs")
    return " + ".join(parts)


def find_fixes(
    config: Mapping[str, Any],
    current: Plan,
    candidates: Iterable[Evaluation],
    spec: Spec,
    price: Callable[[dict[str, Any], Plan], Evaluation | None],
    trainer: bool,
    limit: int = 6,
) -> list[Fix]:
    """The ``limit`` best fixes among the solver's feasible ``candidates`` (in the solver's order).

    ``price`` reads a fixed config the way the doctor reads any config, at the candidate's batch
    and checkpointing, and returns its evaluation, or None when validation or DeepSpeed's batch
    derivation refuses it. A fix is kept when that reading is feasible."""
    found: list[Fix] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for index, candidate in enumerate(candidates):
        if index >= CANDIDATES and found:
            break
        for target in (_near(candidate.plan, current), _saving_as_before(candidate.plan, current)):
            changes, script = plan_changes(config, current, target, spec, trainer)
            if not changes and not script:
                continue
            key = tuple(sorted(changes, key=lambda kv: kv[0])) + tuple(("script", s) for s in script)
            if key in seen:
                break
            fixed = with_changes(config, dict(changes))
            evaluation = price(fixed, target)
            if evaluation is None or not evaluation.feasible:
                continue
            seen.add(key)
            found.append(Fix(describe(current, target), changes, script, evaluation, fixed))
            break
    return order_fixes(found, spec.model)[:limit]


def order_fixes(fixes: list[Fix], shape: ModelShape) -> list[Fix]:
    """The fixes in the order ``dsgen solve`` ranks plans (:func:`dsgen.search.ranking.rank_within_error`):
    the doctor holds no ranking rule of its own, so whatever the solver's rule prefers (step time
    within the model's error, then margin and fewer moving parts) the doctor's first fix follows.
    Fixes the rule cannot separate keep the order they are given in, fewest changes first."""
    by_size = sorted(fixes, key=lambda f: f.size)  # stable: the rule's exact ties go to fewer changes
    of_evaluation = {id(f.evaluation): f for f in by_size}
    ranked = rank_within_error([f.evaluation for f in by_size], shape)
    return [of_evaluation[id(e)] for e in ranked]


def current_value(config: Mapping[str, Any], key: str) -> Any:
    """The user's current value of ``key`` (None when unset), for showing a change as old -> new."""
    value = get(config, key)
    return None if value is MISSING else value
