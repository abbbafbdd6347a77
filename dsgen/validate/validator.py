"""Run the schema check and the cross-field rules over one config and collect a :class:`Report`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsgen.errors import DsgenError
from dsgen.facts.release import normalize_version
from dsgen.validate import schema_findings
from dsgen.validate.findings import Finding, Report
from dsgen.validate.jsontypes import json_type
from dsgen.validate.method import TrainingMethod
from dsgen.validate.rules import Context, run_rules
from dsgen.validate.targets import check_target
from dsgen.validate.versions import profile

if TYPE_CHECKING:
    from dsgen.validate import loader


def validate_config(
    config: dict[str, Any],
    *,
    world_size: int | None = None,
    target: str = "deepspeed",
    deepspeed_version: str = "0.19",
    strict: bool = False,
    source: str | None = None,
    positions: Mapping[str, tuple[int, int]] | None = None,
    method: TrainingMethod | None = None,
) -> Report:
    """Validate an already-parsed DeepSpeed config.

    ``world_size`` is the data-parallel size the batch keys are checked against, the ``W`` of
    ``train_batch_size = micro batch x accumulation x W``: the number DeepSpeedConfig itself
    uses, i.e. world size / ``sequence_parallel_size`` with Ulysses, the mpu's data-parallel size
    with Megatron TP/PP, and the full world size with AutoTP (docs/validation.md); ``None``
    accepts any size that makes the batch keys consistent. ``target`` names the launcher that
    fills ``"auto"`` values (``deepspeed``, ``hf-trainer`` or ``accelerate``). ``strict`` turns warnings into errors.
    ``positions`` maps JSON pointers to (line, column), as produced by :func:`validate_file`.
    ``method`` (a :class:`TrainingMethod`: LoRA/QLoRA/freeze, objective, reference model, GRPO
    generation) also runs the fine-tuning rules (:data:`dsgen.validate.rules.METHOD_RULES`);
    without it they stay silent and the report is what it was before they existed.
    Bad settings raise :class:`DsgenError`; problems in the config never raise.
    """
    return _validate(
        config,
        world_size=world_size,
        target=target,
        deepspeed_version=deepspeed_version,
        strict=strict,
        source=source,
        positions=positions,
        duplicates=(),
        method=method,
    )


def validate_file(
    path: str | Path,
    *,
    world_size: int | None = None,
    target: str = "deepspeed",
    deepspeed_version: str = "0.19",
    strict: bool = False,
    method: TrainingMethod | None = None,
) -> Report:
    """Read a config file (comments and trailing commas allowed, as in DeepSpeed) and validate it.

    Unreadable or unparseable files raise :class:`DsgenError` whose message starts with
    ``file:line:col``; duplicate keys become ``duplicate-key`` findings. ``method`` is
    :func:`validate_config`'s.
    """
    from dsgen.validate import loader  # the file parser; validating a dict does not need it

    loaded = loader.load(path)
    return _validate(
        loaded.data,
        world_size=world_size,
        target=target,
        deepspeed_version=deepspeed_version,
        strict=strict,
        source=str(path),
        positions=loaded.positions,
        duplicates=loaded.duplicates,
        method=method,
    )


def _validate(
    config: Any,
    *,
    world_size: int | None,
    target: str,
    deepspeed_version: str,
    strict: bool,
    source: str | None,
    positions: Mapping[str, tuple[int, int]] | None,
    duplicates: tuple[loader.Duplicate, ...] | list[loader.Duplicate],
    method: TrainingMethod | None = None,
) -> Report:
    version, target = _check_settings(world_size, target, deepspeed_version)
    if method is not None and not isinstance(method, TrainingMethod):
        raise DsgenError(
            f"method must be a TrainingMethod (dsgen.validate.TrainingMethod), got {type(method).__name__}"
        )
    ctx = Context(
        config if isinstance(config, dict) else {},
        world_size=world_size,
        target=target,
        profile=profile(version),
        positions=positions,
        method=method,
    )
    for dup in duplicates:
        name = dup.pointer[1:].replace("/", ".")
        ctx.emit(
            "duplicate-key",
            dup.pointer,
            f"duplicate key {name} (first defined at line {dup.first_line}); "
            "DeepSpeed refuses configs with duplicate keys",
            "keep one of the two",
        )
    if not isinstance(config, dict):
        ctx.emit("type-mismatch", "", f"a DeepSpeed config must be a JSON object, not {json_type(config)}", None)
    else:
        result = schema_findings.check(config, version)
        ctx.auto_sites = result.autos
        for issue in result.issues:
            ctx.emit(
                issue.rule_id, issue.pointer, issue.message, issue.hint, severity=issue.severity, phase=issue.phase
            )
        run_rules(ctx)
    findings = ctx.findings
    if strict:
        findings = [dataclasses.replace(f, severity="error") if f.severity == "warning" else f for f in findings]
    findings.sort(key=_order)
    return Report(
        findings=findings, source=source, world_size=world_size, target=target, deepspeed_version=version, strict=strict
    )


def _check_settings(world_size: int | None, target: str, deepspeed_version: str) -> tuple[str, str]:
    try:
        version = normalize_version(deepspeed_version)
        target = check_target(target)
    except ValueError as exc:
        raise DsgenError(str(exc)) from None
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1):
        raise DsgenError(f"world size must be a positive integer, got {world_size!r}")
    return version, target


def _order(finding: Finding) -> tuple[int, int, str, str]:
    big = 1 << 30
    return (finding.line or big, finding.column or big, finding.pointer, finding.rule_id)
