"""What every rule sees: the config, the run settings, and normalised facts about the config.

Rules must not crash on malformed input (the schema check reports that), so every fact here is
either a well-typed value or ``None`` meaning "unknown" (missing, wrongly typed, or an ``"auto"``
that a launcher fills in later). A rule that needs an unknown fact stays silent.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from dsgen.validate.findings import Finding
from dsgen.validate.jsontypes import escape_pointer_token
from dsgen.validate.method import TrainingMethod
from dsgen.validate.rules.catalogue import RULES
from dsgen.validate.schema_findings import AutoSite
from dsgen.validate.targets import resolves_auto
from dsgen.validate.versions import Profile
from dsgen.vocabulary import Phase, Severity

# Both spellings DeepSpeed accepts for the ZeRO-3 fields (alias -> field name).
ZERO_ALIASES = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}


def number(value: Any) -> float | int | None:
    """The value if it is a JSON number (not a bool), else None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def whole(value: Any) -> int | None:
    """The value as an int if it is a whole JSON number, else None."""
    value = number(value)
    if value is None or value != value or value in (float("inf"), float("-inf")) or value != int(value):
        return None
    return int(value)


# The strings pydantic's lax mode turns into a bool (matched case-insensitively, not stripped).
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


def flag(value: Any) -> bool | None:
    """A pydantic ``bool`` field as DeepSpeed's model holds it (lax mode), else None.

    Lax mode also takes 0/1 (int or float) and "true"/"false", "yes"/"no", "on"/"off", "1"/"0", ...;
    anything else is rejected by the schema check, so it is unknown here.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lower = value.lower()
        if lower in _TRUE_STRINGS:
            return True
        if lower in _FALSE_STRINGS:
            return False
    return None


def truthy(value: Any) -> bool:
    """How DeepSpeed tests a value read with get_scalar_param / dict.get: plain truthiness
    (so 1, "0" and even "false" are on; a missing key is None, i.e. off)."""
    return bool(value)


def lax_number(value: Any) -> float | int | None:
    """A pydantic ``int``/``float`` field as DeepSpeed's model holds it: JSON numbers and numeric
    strings ("0", " 2 ", "1e-3"); bools (which DeepSpeed's fp16 validators refuse) give None."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return number(value)


def section(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class Context:
    """Settings of one validation run plus facts derived from the config."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        world_size: int | None,
        target: str,
        profile: Profile,
        positions: Mapping[str, tuple[int, int]] | None,
        method: TrainingMethod | None = None,
    ) -> None:
        self.config = config
        self.world_size = world_size
        self.target = target
        self.profile = profile
        self.positions = positions or {}
        self.method = method  # the training method, for the fine-tuning rules (None: they stay silent)
        self.findings: list[Finding] = []
        self.auto_sites: list[AutoSite] = []  # filled from the schema check, read by the auto-value rule

    # -- reporting -------------------------------------------------------------------------
    def emit(
        self,
        rule_id: str,
        pointer: str,
        message: str,
        hint: str | None = None,
        *,
        severity: Severity | None = None,
        phase: Phase | None = None,
    ) -> None:
        info = RULES[rule_id]
        line, column = self.locate(pointer)
        self.findings.append(
            Finding(severity or info.severity, rule_id, pointer, message, hint, line, column, phase or info.phase)
        )

    def locate(self, pointer: str) -> tuple[int | None, int | None]:
        """Line/column of ``pointer``, or of its closest ancestor present in the file."""
        while True:
            if pointer in self.positions:
                return self.positions[pointer]
            if not pointer:
                return None, None
            pointer = pointer.rsplit("/", 1)[0]

    # -- raw access --------------------------------------------------------------------------
    def get(self, *path: str) -> Any:
        node: Any = self.config
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return node

    def has(self, *path: str) -> bool:
        node: Any = self.config
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return False
            node = node[key]
        return True

    @staticmethod
    def pointer(*path: str) -> str:
        return "".join("/" + escape_pointer_token(key) for key in path)

    # -- ZeRO ------------------------------------------------------------------------------
    @cached_property
    def zero(self) -> dict[str, Any]:
        """The ``zero_optimization`` object (the deprecated boolean form is expanded)."""
        raw = self.config.get("zero_optimization")
        if isinstance(raw, bool):
            return {"stage": 1 if raw else 0}
        return section(raw)

    def pydantic_value(self, value: Any, default: Any, pointer: str) -> Any:
        """What a pydantic section holds: an unresolved "auto" is dropped, i.e. the default."""
        if value == "auto" and isinstance(value, str):
            return None if resolves_auto(self.target, pointer) else default
        return value

    @cached_property
    def stage(self) -> int | None:
        value = self.pydantic_value(self.zero.get("stage", 0), 0, "/zero_optimization/stage")
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)  # pydantic accepts "3"
        value = whole(value)
        return value if value in (0, 1, 2, 3) else None

    def zget(self, key: str) -> Any:
        """A ZeRO field by its documented name, also found under its alternate spelling."""
        if key in self.zero:
            return self.zero[key]
        alias = ZERO_ALIASES.get(key)
        return self.zero.get(alias) if alias else None

    def zpointer(self, key: str) -> str:
        alias = ZERO_ALIASES.get(key)
        if key not in self.zero and alias and alias in self.zero:
            key = alias
        return self.pointer("zero_optimization", key)

    def offload_device(self, which: str) -> str | None:
        """``none``/``cpu``/``nvme`` for ``offload_optimizer`` or ``offload_param``; None if unknown."""
        block = self.zero.get(which)
        legacy = {"offload_optimizer": "cpu_offload", "offload_param": "cpu_offload_param"}[which]
        if block is None:
            return "cpu" if self.zero.get(legacy) is True else "none"
        if not isinstance(block, dict):
            return None
        device = self.pydantic_value(block.get("device", "none"), "none", f"/zero_optimization/{which}/device")
        return device if device in ("none", "cpu", "nvme") else None

    # -- precision --------------------------------------------------------------------------
    @cached_property
    def fp16(self) -> dict[str, Any]:
        return section(self.config.get("fp16"))

    @cached_property
    def bf16_key(self) -> str:
        """DeepSpeed reads ``bfloat16`` only when ``bf16`` is absent or null (``get("bf16") is None``)."""
        return "bf16" if self.config.get("bf16") is not None or "bfloat16" not in self.config else "bfloat16"

    @cached_property
    def bf16(self) -> dict[str, Any]:
        return section(self.config.get(self.bf16_key))

    @cached_property
    def fp16_enabled(self) -> bool | None:
        return flag(self.pydantic_value(self.fp16.get("enabled", False), False, "/fp16/enabled"))

    @cached_property
    def bf16_enabled(self) -> bool | None:
        pointer = f"/{self.bf16_key}/enabled"
        return flag(self.pydantic_value(self.bf16.get("enabled", False), False, pointer))

    @cached_property
    def model_dtype(self) -> str | None:
        """fp16, bf16 or fp32 as DeepSpeed picks it; None when an ``enabled`` is unknown."""
        if self.fp16_enabled is None or self.bf16_enabled is None:
            return None
        if self.fp16_enabled:
            return "fp16"
        return "bf16" if self.bf16_enabled else "fp32"

    @cached_property
    def deepcompile(self) -> bool:
        """compile.deepcompile as DeepSpeed's pydantic model reads it ("true" and 1 count)."""
        return flag(section(self.config.get("compile")).get("deepcompile")) is True

    # -- optimizer -----------------------------------------------------------------------------
    @cached_property
    def optimizer(self) -> dict[str, Any]:
        return section(self.config.get("optimizer"))

    @cached_property
    def optimizer_type(self) -> str | None:
        """The configured optimizer type, lower-cased when DeepSpeed knows it (as DeepSpeed does)."""
        value = self.optimizer.get("type")
        if not isinstance(value, str):
            return None
        lower = value.lower()
        return lower if lower in self.profile.deepspeed_optimizers else value

    @cached_property
    def has_config_optimizer(self) -> bool:
        """DeepSpeed builds the optimizer only when ``optimizer.type`` is set."""
        return isinstance(self.optimizer.get("type"), str)

    def applies(self, since: str) -> bool:
        return self.profile.at_least(since)
