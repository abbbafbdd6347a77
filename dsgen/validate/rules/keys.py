"""Rules about keys themselves: removed, renamed, spelled twice, or set to "auto".

The rule ids the schema check emits (unknown keys, wrong types, ranges) are registered here too,
so the catalogue in ``docs/validation.md`` and the registry list every id dsgen can produce.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from typing import Any

from dsgen.validate.rules.catalogue import RuleInfo, register
from dsgen.validate.rules.context import ZERO_ALIASES, Context
from dsgen.validate.rules.registry import rule
from dsgen.validate.schema_findings import base_schema, schema_at
from dsgen.validate.targets import LAUNCHER_NAMES, resolves_auto
from dsgen.validate.versions import removed_keys

# -- ids produced by the schema check and the loader ------------------------------------------
register(
    RuleInfo(
        "unknown-key",
        "error",
        "config",
        "Unknown key in a section DeepSpeed parses strictly.",
        "pydantic rejects it: 'Extra inputs are not permitted' (DeepSpeedConfig raises).",
    )
)
register(
    RuleInfo(
        "ignored-key",
        "warning",
        "lint",
        "Unknown key at the top level or in a dict-based section (error under --strict).",
        "Silently ignored, so the setting has no effect (typos fall back to defaults).",
    )
)
register(
    RuleInfo(
        "type-mismatch",
        "error",
        "config",
        "Value of the wrong JSON type.",
        "Rejected by pydantic sections and by the checked scalars; elsewhere it fails later "
        "(TypeError at engine start or in training).",
    )
)
register(
    RuleInfo(
        "invalid-value",
        "error",
        "config",
        "Value outside the allowed set (enum, pattern, empty).",
        "Rejected where DeepSpeed checks it (stage, offload device, dtypes, checkpoint modes, ...).",
    )
)
register(
    RuleInfo(
        "out-of-range",
        "error",
        "config",
        "Number outside its allowed range.",
        "Rejected by pydantic bounds (e.g. reduce_bucket_size > 0) and by the batch assertions.",
    )
)
register(
    RuleInfo(
        "non-integer",
        "error",
        "config",
        "Fractional number where DeepSpeed needs an integer (e.g. stage3_prefetch_bucket_size: 15099494.4).",
        "pydantic raises int_from_float in strict sections; dict-based keys keep the float.",
    )
)
register(
    RuleInfo(
        "number-as-string",
        "error",
        "config",
        'Number written as a string ("8").',
        'Batch keys crash (TypeError); pydantic accepts "8" but not "5e8"; optimizer '
        "params reach the optimizer as strings.",
    )
)
register(
    RuleInfo(
        "duplicate-key",
        "error",
        "config",
        "The same key twice in one object.",
        "DeepSpeed's loader raises 'Duplicate keys in DeepSpeed config'.",
    )
)


@rule(
    "removed-key",
    "error",
    "config",
    "Key removed in DeepSpeed 0.19.8 (legacy blocks such as amp, "
    "compression_training, curriculum_learning, sparse_attention, elasticity, MiCS).",
    "0.19.8 raises DeepSpeedConfigError on presence (even when disabled); 0.14/0.16 still read them (warning there).",
)
def removed_key(ctx: Context) -> None:
    error = ctx.profile.removed_keys_are_errors
    for pointer, info in _removed():
        path = pointer[1:].split("/")
        if path[0] == "zero_optimization" and not isinstance(ctx.config.get("zero_optimization"), dict):
            continue
        if not ctx.has(*path):
            continue
        if not error and schema_at(path, ctx.profile.version) is None:
            continue  # unknown to that release too: the schema check reports it
        name = ".".join(path)
        if error:
            message = f"{name} was removed in DeepSpeed {info['version']}: {info['message']}"
        else:
            message = (
                f"{name} is read by DeepSpeed {ctx.profile.release} but was removed in "
                f"{info['version']}, which rejects the config: {info['message']}"
            )
        ctx.emit(
            "removed-key",
            pointer,
            message,
            f"replacement: {info['replacement']}",
            severity="error" if error else "warning",
            phase="config" if error else "lint",
        )


@cache
def _removed() -> tuple[tuple[str, dict[str, Any]], ...]:
    """Removed keys as annotated in the 0.19.8 schema (older releases still read them)."""
    return tuple(sorted(removed_keys(base_schema())))


@rule(
    "renamed-key",
    "warning",
    "lint",
    "Deprecated spelling of a key that has a replacement "
    "(cpu_offload -> offload_optimizer, bfloat16 -> bf16, boolean zero_optimization, ...).",
    "Still mapped with a deprecation warning (or, for bfloat16, ignored when bf16 is present and not null).",
)
def renamed_key(ctx: Context) -> None:
    if isinstance(ctx.config.get("zero_optimization"), bool):
        stage = 1 if ctx.config["zero_optimization"] else 0
        ctx.emit(
            "renamed-key",
            "/zero_optimization",
            "the boolean form of zero_optimization is deprecated",
            f'write "zero_optimization": {{"stage": {stage}}}',
        )
    for pointer, info in _renamed_keys(ctx.config, base_schema(), ""):
        name = pointer[1:].replace("/", ".")
        target = info["to"]
        hint = f"use {target}"
        if "example" in info:
            hint += f": {json.dumps(info['example'])}"
        message = (
            f"{name} is a deprecated spelling; the current key is {target} (DeepSpeed 0.14 to "
            f"{ctx.profile.release} still map the old key, with a deprecation warning)"
        )
        if pointer == "/bfloat16" and ctx.bf16_key == "bf16":  # bf16 present and not null
            message += " (and DeepSpeed ignores bfloat16 entirely because bf16 is also present)"
        elif pointer == "/zero_optimization/cpu_offload_use_pin_memory":
            message += " (DeepSpeed discards the value)"
        ctx.emit("renamed-key", pointer, message, hint)


def _renamed_keys(config: Any, schema: dict[str, Any], pointer: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(config, dict):
        return
    for key, child in schema.get("properties", {}).items():
        if key not in config:
            continue
        child_pointer = f"{pointer}/{key}"
        if "x-dsgen-renamed" in child:
            yield child_pointer, child["x-dsgen-renamed"]
        else:
            yield from _renamed_keys(config[key], child, child_pointer)


_REPLACING = {
    "cpu_offload": ("offload_optimizer",),
    "cpu_offload_param": ("offload_param",),
    "stage3_gather_fp16_weights_on_model_save": (
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
    ),
}


@rule(
    "deprecated-with-replacement",
    "error",
    "config",
    "A deprecated ZeRO key together with the key that replaces it.",
    "pydantic raises: Cannot provide deprecated parameter 'cpu_offload' and replacing parameter "
    "'offload_optimizer' together.",
)
def deprecated_with_replacement(ctx: Context) -> None:
    for old, new_keys in _REPLACING.items():
        if old not in ctx.zero or ctx.zero[old] == "auto":
            continue
        for new in new_keys:
            if new in ctx.zero and ctx.zero[new] != "auto":
                ctx.emit(
                    "deprecated-with-replacement",
                    ctx.pointer("zero_optimization", old),
                    f"Cannot provide deprecated parameter '{old}' and replacing parameter '{new}' together",
                    f"remove zero_optimization.{old}",
                )


_OTHER_ALIASES = {("tensor_parallel",): {"tp": "tensor_parallel", "kernel_inject": "replace_with_kernel_inject"}}


@rule(
    "alias-conflict",
    "error",
    "config",
    "Both spellings of the same field (stage3_max_live_parameters and max_live_parameters).",
    "pydantic treats the second spelling as an extra key and rejects the config.",
)
def alias_conflict(ctx: Context) -> None:
    groups = [(("zero_optimization",), ctx.zero, ZERO_ALIASES)]
    groups += [(path, ctx.get(*path), aliases) for path, aliases in _OTHER_ALIASES.items()]
    for path, block, aliases in groups:
        if not isinstance(block, dict):
            continue
        for canonical, other in aliases.items():
            if canonical in block and other in block:
                ctx.emit(
                    "alias-conflict",
                    ctx.pointer(*path, other),
                    f"{'.'.join(path)} sets both {canonical} and {other}, two spellings of one field",
                    f"keep only {canonical}",
                )


@rule(
    "auto-value",
    "error",
    "engine",
    '"auto" where the chosen launcher does not fill it in (anywhere with --target deepspeed); a warning '
    "in sections DeepSpeed parses with pydantic, which run with the default.",
    "Batch keys: DeepSpeedConfig fails in the batch arithmetic (runtime/config.py _batch_assertion, TypeError). "
    'Other dict-based keys keep the string "auto" until code uses it as a number (optimizer and scheduler '
    'constructors at deepspeed.initialize). Pydantic sections drop "auto" (runtime/config_utils.py '
    'DeepSpeedConfigModel.__init__) and run with the default, e.g. stage "auto" means ZeRO-0 (warning).',
)
def auto_value(ctx: Context) -> None:
    seen: set[str] = set()
    for site in ctx.auto_sites:
        if site.literal_allowed or site.pointer in seen or resolves_auto(ctx.target, site.pointer):
            continue
        seen.add(site.pointer)
        name = site.pointer[1:].replace("/", ".")
        launcher = LAUNCHER_NAMES[ctx.target]
        if site.pydantic:
            effect = "DeepSpeed drops it and silently uses its default"
        elif site.pointer in _BATCH_POINTERS:
            effect = "DeepSpeed fails on it in the batch-size arithmetic"
        else:
            effect = 'DeepSpeed keeps the string "auto" as the value'
        resolvers = [t for t in ("hf-trainer", "accelerate") if resolves_auto(t, site.pointer)]
        hint = "set a concrete value"
        if resolvers and ctx.target == "deepspeed":
            hint += f" (or validate with --target {resolvers[0]} if that launcher runs this config)"
        ctx.emit(
            "auto-value",
            site.pointer,
            f'{name} is "auto", which {launcher} does not resolve: {effect}',
            hint,
            severity="warning" if site.pydantic else "error",
            phase="config" if site.pointer in _BATCH_POINTERS else ("lint" if site.pydantic else "engine"),
        )


_BATCH_POINTERS = {"/train_batch_size", "/train_micro_batch_size_per_gpu", "/gradient_accumulation_steps"}
