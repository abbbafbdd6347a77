"""What a validation run produces: :class:`Finding` (one problem) and :class:`Report` (one config).

Both are plain data so every output format (human, JSON, GitHub annotations) and every caller
(`dsgen validate`, `dsgen new`, the benchmark) reads the same thing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from dsgen.vocabulary import Phase, Severity


@dataclass(frozen=True)
class Finding:
    """One problem in a config, located by JSON pointer and (when known) line/column."""

    severity: Severity
    rule_id: str
    pointer: str
    message: str
    hint: str | None = None
    line: int | None = None
    column: int | None = None
    phase: Phase = "lint"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """All findings for one config, plus the settings it was checked under."""

    findings: list[Finding] = field(default_factory=list)
    source: str | None = None
    world_size: int | None = None
    target: str = "deepspeed"
    deepspeed_version: str = "0.19"
    strict: bool = False

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings are allowed)."""
        return not self.errors

    def rejected_by_deepspeed(self) -> bool:
        """Whether dsgen predicts that ``DeepSpeedConfig(config)`` itself raises."""
        return any(f.severity == "error" and f.phase == "config" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ok": self.ok,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "settings": {
                "world_size": self.world_size,
                "target": self.target,
                "deepspeed_version": self.deepspeed_version,
                "strict": self.strict,
            },
            "findings": [f.to_dict() for f in self.findings],
        }
