"""Resolve ``"auto"`` values the way the HF Trainer does before DeepSpeed sees the config.

This mirrors ``transformers/integrations/deepspeed.py``:
``HfTrainerDeepSpeedConfig.trainer_config_process`` (batch keys, clipping, optimizer and
scheduler parameters, fp16/bf16 from ``TrainingArguments``) and ``trainer_config_finalize``
(``reduce_bucket_size = h^2``; at ZeRO-3 ``stage3_prefetch_bucket_size = 0.9 h^2`` and
``stage3_param_persistence_threshold = 10 h``; the scheduler's step counts). Like ``fill_match``,
a concrete config value that disagrees with the Trainer's is a mismatch the Trainer refuses.
Without Trainer arguments the doctor still needs numbers, so it assumes them and says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsgen.doctor.keys import MISSING, get, is_auto, with_changes

# TrainingArguments defaults for the fields the DeepSpeed integration reads
# (transformers/training_args.py, the dataclass field defaults).
TRAINER_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-5,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "bf16": False,
    "fp16": False,
    "gradient_checkpointing": False,
    "max_steps": -1,
    "warmup_steps": 0,
}


@dataclass(frozen=True)
class AutoFill:
    """One ``"auto"`` value and what it became (``assumed`` when no Trainer arguments said so)."""

    key: str
    value: Any
    source: str
    assumed: bool


@dataclass(frozen=True)
class Resolved:
    """The config as DeepSpeed receives it from the Trainer, and how it got there."""

    config: dict[str, Any]
    fills: tuple[AutoFill, ...]
    mismatches: tuple[str, ...]  # what the Trainer's fill_match would refuse
    unresolved: tuple[str, ...]  # "auto" keys nothing could fill (left as they are)
    trainer_args: Mapping[str, Any]
    assumed_args: tuple[str, ...]  # Trainer arguments the doctor had to assume


def resolve(
    config: Mapping[str, Any],
    *,
    trainer_args: Mapping[str, Any] | None,
    assumptions: Mapping[str, Any],
    world_size: int,
    hidden_size: int,
) -> Resolved:
    """Fill every ``"auto"`` the Trainer would fill. ``assumptions`` stand in for Trainer
    arguments when ``trainer_args`` is None (or lacks them), and each one used is reported."""
    given = dict(trainer_args or {})
    args: dict[str, Any] = {**TRAINER_DEFAULTS, **assumptions, **given}
    used_assumptions: list[str] = []
    fills: list[AutoFill] = []
    mismatches: list[str] = []
    changes: dict[str, Any] = {}

    def arg(name: str) -> Any:
        if name not in given:
            origin = "assumed" if name in assumptions else "TrainingArguments default"
            note = f"{name}={args[name]!r} ({origin})"
            if note not in used_assumptions:
                used_assumptions.append(note)
        return args[name]

    def fill_match(key: str, value_of: Any, hf_key: str, must_match: bool = True) -> None:
        current = get(config, key)
        if current is MISSING:
            return
        if is_auto(current):
            value = value_of() if callable(value_of) else value_of
            changes[key] = value
            fills.append(
                AutoFill(key, value, f"Trainer {hf_key}", assumed=trainer_args is None or not _given(hf_key, given))
            )
            return
        if must_match and trainer_args is not None:
            value = value_of() if callable(value_of) else value_of
            if current is not None and current != value:
                mismatches.append(f"ds {key}={current} vs hf {hf_key}={value}")

    micro = lambda: arg("per_device_train_batch_size")  # noqa: E731
    accum = lambda: arg("gradient_accumulation_steps")  # noqa: E731
    fill_match("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size")
    fill_match("gradient_accumulation_steps", accum, "gradient_accumulation_steps")
    fill_match("train_batch_size", lambda: world_size * micro() * accum(), "train_batch_size (calculated)")
    fill_match("gradient_clipping", lambda: arg("max_grad_norm"), "max_grad_norm")
    fill_match("optimizer.params.lr", lambda: arg("learning_rate"), "learning_rate")
    fill_match("optimizer.params.betas", lambda: [arg("adam_beta1"), arg("adam_beta2")], "adam_beta1+adam_beta2")
    fill_match("optimizer.params.eps", lambda: arg("adam_epsilon"), "adam_epsilon")
    fill_match("optimizer.params.weight_decay", lambda: arg("weight_decay"), "weight_decay")
    fill_match("scheduler.params.warmup_min_lr", 0, "(not a Trainer argument)", must_match=False)
    fill_match("scheduler.params.warmup_max_lr", lambda: arg("learning_rate"), "learning_rate")
    fill_match("fp16.enabled", lambda: bool(arg("fp16")), "fp16")
    fill_match("bf16.enabled", lambda: bool(arg("bf16")), "bf16")
    # trainer_config_finalize: sizes from the model's hidden size
    stage = get(config, "zero_optimization.stage", 0)
    fill_match("zero_optimization.reduce_bucket_size", hidden_size * hidden_size, "hidden_size^2", must_match=False)
    if stage == 3:
        fill_match(
            "zero_optimization.stage3_prefetch_bucket_size",
            int(0.9 * hidden_size * hidden_size),
            "0.9 x hidden_size^2",
            must_match=False,
        )
        fill_match(
            "zero_optimization.stage3_param_persistence_threshold",
            10 * hidden_size,
            "10 x hidden_size",
            must_match=False,
        )
    steps = args.get("max_steps", -1)
    if isinstance(steps, int) and steps > 0:
        fill_match("scheduler.params.total_num_steps", steps, "max_steps")
        fill_match("scheduler.params.warmup_num_steps", max(1, int(args.get("warmup_steps") or 0)), "warmup_steps")
    resolved = with_changes(config, changes)
    unresolved = tuple(_auto_keys(resolved))
    return Resolved(
        config=resolved,
        fills=tuple(fills),
        mismatches=tuple(mismatches),
        unresolved=unresolved,
        trainer_args=args,
        assumed_args=tuple(used_assumptions),
    )


def _given(hf_key: str, given: Mapping[str, Any]) -> bool:
    names = [n for n in hf_key.replace("+", " ").replace("|", " ").split() if n in TRAINER_DEFAULTS]
    return bool(names) and all(n in given for n in names)


def _auto_keys(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, Mapping):
        found: list[str] = []
        for key, value in node.items():
            found += _auto_keys(value, f"{prefix}{key}.")
        return found
    return [prefix[:-1]] if is_auto(node) else []


def auto_keys(config: Mapping[str, Any]) -> list[str]:
    """Every dotted key whose value is ``"auto"``."""
    return _auto_keys(config)
