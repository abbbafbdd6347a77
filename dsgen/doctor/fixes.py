"""Fixes for a config that does not fit: sets of key changes, each priced by the solver's models.

Levers (docs/doctor.md): a smaller micro-batch with more accumulation (same global batch),
activation checkpointing (a change to the training script, not the config), smaller buckets or
fewer live ZeRO-3 parameters, a higher ZeRO stage, CPU offload of optimizer states (then of
parameters), NVMe offload when the spec declares a drive. Every combination of one structural
lever, checkpointing and a micro-batch split is priced with :func:`dsgen.solver.evaluate`;
the feasible ones are ranked by predicted step time, fewer changes first on ties.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsgen.doctor.keys import MISSING, get, is_auto, with_changes
from dsgen.plan import Plan
from dsgen.solver import Evaluation
from dsgen.spec.types import Spec
from dsgen.vocabulary import OffloadDevice

SMALL_BUCKET = 50_000_000  # DeepSpeed's own stage-3 prefetch default; HF's floor for "auto" buckets is 1e7
LEAN_LIVE_PARAMETERS = 100_000_000
LEAN_PREFETCH = 10_000_000


@dataclass(frozen=True)
class Lever:
    """One structural change: the plan it leads to and the config keys it sets."""

    label: str
    plan: Plan
    changes: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Fix:
    """A priced fix: the config keys it changes, what the script must change, the whole config."""

    label: str
    changes: tuple[tuple[str, Any], ...]
    script_changes: tuple[str, ...]
    evaluation: Evaluation
    config: dict[str, Any]


def _levers(plan: Plan, spec: Spec) -> Iterator[Lever]:
    yield Lever("keep ZeRO settings", plan, ())
    k = plan.knobs
    stage = plan.zero_stage
    if stage in (1, 2, 3) and (k.reduce_bucket_size > SMALL_BUCKET or (stage == 2 and k.overlap_comm)):
        small = min(k.reduce_bucket_size, SMALL_BUCKET)
        changes: list[tuple[str, Any]] = [("zero_optimization.reduce_bucket_size", small)]
        knobs = replace(k, reduce_bucket_size=small)
        if stage < 3:
            changes.append(("zero_optimization.allgather_bucket_size", small))
            knobs = replace(knobs, allgather_bucket_size=small)
        if stage == 2 and k.overlap_comm:
            changes.append(("zero_optimization.overlap_comm", False))
            knobs = replace(knobs, overlap_comm=False)
        yield Lever("smaller communication buckets", replace(plan, knobs=knobs), tuple(changes))
    if stage == 3 and (k.max_live_parameters > LEAN_LIVE_PARAMETERS or k.prefetch_bucket_size > LEAN_PREFETCH):
        knobs = replace(
            k,
            max_live_parameters=min(k.max_live_parameters, LEAN_LIVE_PARAMETERS),
            prefetch_bucket_size=min(k.prefetch_bucket_size, LEAN_PREFETCH),
            reduce_bucket_size=min(k.reduce_bucket_size, SMALL_BUCKET),
        )
        lean = (
            ("zero_optimization.stage3_max_live_parameters", k.max_live_parameters, knobs.max_live_parameters),
            ("zero_optimization.stage3_prefetch_bucket_size", k.prefetch_bucket_size, knobs.prefetch_bucket_size),
            ("zero_optimization.reduce_bucket_size", k.reduce_bucket_size, knobs.reduce_bucket_size),
        )
        yield Lever(
            "fewer live ZeRO-3 parameters",
            replace(plan, knobs=knobs),
            tuple((key, new) for key, old, new in lean if new != old),
        )
    for higher in range(max(stage + 1, 2), 4):
        # DeepSpeed's overlap_comm default follows the stage (overlap_comm_valid) unless the config sets it
        yield Lever(f"ZeRO stage {higher}", replace(plan, zero_stage=higher), (("zero_optimization.stage", higher),))
    yield from _less_offload(plan, spec)
    targets: list[OffloadDevice] = ["cpu", "nvme"] if spec.hardware.nvme is not None else ["cpu"]
    for higher in range(max(stage, 2), 4):
        stage_change: tuple[tuple[str, Any], ...] = (("zero_optimization.stage", higher),) if higher != stage else ()
        if plan.offload_optimizer == "none" or plan.offload_ratio < 1:
            yield Lever(
                f"ZeRO-{higher} + CPU optimizer offload",
                replace(plan, zero_stage=higher, offload_optimizer="cpu", offload_ratio=1.0),
                stage_change + _offload_changes("offload_optimizer", "cpu", spec),
            )
        if higher == 3 and plan.offload_optimizer == "none" and spec.training.optimizer.type in ("adam", "adamw"):
            at_three = replace(plan, zero_stage=3)
            for ratio in PARTIAL_RATIOS:
                sub_group = _partial_sub_group(at_three, spec)
                yield Lever(
                    f"ZeRO-3 + partial CPU optimizer offload (ratio {ratio})",
                    replace(
                        at_three,
                        offload_optimizer="cpu",
                        offload_ratio=ratio,
                        knobs=replace(plan.knobs, sub_group_size=sub_group),
                    ),
                    stage_change
                    + _offload_changes("offload_optimizer", "cpu", spec)
                    + (
                        ("zero_optimization.offload_optimizer.ratio", ratio),
                        ("zero_optimization.sub_group_size", sub_group),
                    ),
                )
        if higher == 3 and (plan.offload_param == "none" or (plan.offload_param == "cpu" and "nvme" in targets)):
            for device in targets:
                if device == plan.offload_param:
                    continue
                yield Lever(
                    f"ZeRO-3 + {device.upper()} optimizer and parameter offload",
                    replace(plan, zero_stage=3, offload_optimizer=device, offload_param=device, offload_ratio=1.0),
                    stage_change
                    + _offload_changes("offload_optimizer", device, spec)
                    + _offload_changes("offload_param", device, spec),
                )


PARTIAL_RATIOS = (0.75, 0.5, 0.25)


def _partial_sub_group(plan: Plan, spec: Spec) -> int:
    """offload_optimizer.ratio applies per optimizer sub-group: split the rank's partition into at
    least eight, as the solver does (dsgen.solver._search)."""
    groups = max(1_000_000, -(-spec.model.parameter_count() // plan.data_parallel_size // 8))
    return min(plan.knobs.sub_group_size, groups)


def _less_offload(plan: Plan, spec: Spec) -> Iterator[Lever]:
    """Levers that move state back from the host (for host-memory shortfalls): parameters first,
    then a share of the optimizer (ZeRO-3 partial offload), then all of it."""
    if plan.offload_param != "none":
        yield Lever(
            "parameters back on the GPU",
            replace(plan, offload_param="none"),
            (("zero_optimization.offload_param.device", "none"),),
        )
    partial_ok = (
        plan.zero_stage == 3
        and plan.offload_optimizer == "cpu"
        and plan.offload_param == "none"
        and spec.training.optimizer.type in ("adam", "adamw")
    )
    if partial_ok:
        sub_group = _partial_sub_group(plan, spec)
        for ratio in PARTIAL_RATIOS:
            if ratio < plan.offload_ratio:
                yield Lever(
                    f"partial optimizer offload (ratio {ratio})",
                    replace(plan, offload_ratio=ratio, knobs=replace(plan.knobs, sub_group_size=sub_group)),
                    (
                        ("zero_optimization.offload_optimizer.ratio", ratio),
                        ("zero_optimization.sub_group_size", sub_group),
                    ),
                )
    if plan.offload_optimizer != "none":
        changes: tuple[tuple[str, Any], ...] = (("zero_optimization.offload_optimizer.device", "none"),)
        if plan.offload_param != "none":
            changes += (("zero_optimization.offload_param.device", "none"),)
        yield Lever(
            "no offload",
            replace(plan, offload_optimizer="none", offload_param="none", offload_ratio=1.0),
            changes,
        )


def _offload_changes(block: str, device: str, spec: Spec) -> tuple[tuple[str, Any], ...]:
    changes: list[tuple[str, Any]] = [(f"zero_optimization.{block}.device", device)]
    if device == "nvme":
        assert spec.hardware.nvme is not None
        changes.append((f"zero_optimization.{block}.nvme_path", spec.hardware.nvme.path))
    changes.append((f"zero_optimization.{block}.pin_memory", True))
    return tuple(changes)


def _divisors_below(n: int) -> list[int]:
    """Divisors of ``n``, largest first (O(sqrt n): micro-batches can be large numbers)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)}, reverse=True)


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


CHECKPOINTING_SCRIPT = (
    "enable activation checkpointing in the training script "
    "(model.gradient_checkpointing_enable(), or --gradient_checkpointing with the HF Trainer)"
)


def find_fixes(
    config: Mapping[str, Any],
    plan: Plan,
    spec: Spec,
    evaluate: Callable[[Plan], Evaluation],
    accept: Callable[[dict[str, Any], int, int], bool],
    trainer: bool,
    limit: int = 6,
) -> list[Fix]:
    """The ``limit`` fastest feasible fixes for ``plan``; ``accept`` vets each fixed config at its
    micro-batch and accumulation (validation), ``evaluate`` prices a plan; ``trainer``: the run
    goes through the HF Trainer (see :func:`batch_changes`). Deterministic: levers and splits in fixed order."""
    found: list[tuple[tuple[float, int, int], Fix]] = []
    per_rank = plan.micro_batch_size * plan.gradient_accumulation_steps
    checkpointing_modes = [plan.checkpointing] + (["full"] if plan.checkpointing != "full" else [])
    for order, lever in enumerate(_levers(plan, spec)):
        for mode in checkpointing_modes:
            for micro in _divisors_below(plan.micro_batch_size):
                if lever.changes == () and mode == plan.checkpointing and micro == plan.micro_batch_size:
                    continue  # that is the config as it is
                candidate = replace(
                    lever.plan,
                    checkpointing=mode,
                    micro_batch_size=micro,
                    gradient_accumulation_steps=per_rank // micro,
                )
                evaluation = evaluate(candidate)
                if not evaluation.feasible:
                    continue
                changes = tuple((key, value) for key, value in lever.changes if get(config, key) != value)
                script: tuple[str, ...] = ()
                if micro != plan.micro_batch_size:
                    extra, script = batch_changes(config, micro, per_rank // micro, trainer)
                    changes = changes + extra
                if mode != plan.checkpointing:
                    script = (CHECKPOINTING_SCRIPT, *script)
                fixed = with_changes(config, dict(changes))
                if not accept(fixed, micro, per_rank // micro):
                    break
                label = _label(lever.label, mode != plan.checkpointing, micro, per_rank // micro, plan)
                fix = Fix(label, changes, script, evaluation, fixed)
                found.append(((round(evaluation.step.total_s, 9), len(changes) + len(script), order), fix))
                break  # the largest feasible micro-batch of this lever is its fastest
    found.sort(key=lambda item: item[0])
    ranked = [fix for _key, fix in found]
    return [fix for fix in ranked if not any(_dominates(other, fix) for other in ranked)][:limit]


def _dominates(a: Fix, b: Fix) -> bool:
    """``a`` makes a subset of ``b``'s changes and is no slower: ``b`` adds nothing but margin."""
    return (
        a is not b
        and set(a.changes) <= set(b.changes)
        and set(a.script_changes) <= set(b.script_changes)
        and a.evaluation.step.total_s <= b.evaluation.step.total_s
        and (set(a.changes), set(a.script_changes)) != (set(b.changes), set(b.script_changes))
    )


def _label(lever: str, checkpointing: bool, micro: int, accum: int, plan: Plan) -> str:
    parts = [] if lever == "keep ZeRO settings" else [lever]
    if checkpointing:
        parts.append("activation checkpointing")
    if micro != plan.micro_batch_size:
        parts.append(f"micro-batch {micro} x accumulation {accum}")
    return " + ".join(parts) or lever


def current_value(config: Mapping[str, Any], key: str) -> Any:
    """The user's current value of ``key`` (None when unset), for showing a change as old -> new."""
    value = get(config, key)
    return None if value is MISSING else value
