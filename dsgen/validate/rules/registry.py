"""The rule catalogue: one entry per stable rule id, plus the checks that implement them.

Rule ids are part of dsgen's output contract (users filter and suppress by them), so each is
registered exactly once with its default severity, the phase in which DeepSpeed itself fails
(if it does), and the text that ``docs/validation.md`` and the benchmark show.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsgen.vocabulary import Phase, Severity

if TYPE_CHECKING:
    from dsgen.validate.rules.context import Context


@dataclass(frozen=True)
class RuleInfo:
    """Metadata of one rule id."""

    rule_id: str
    severity: Severity  # default severity; a few rules depend on --target / --deepspeed-version
    phase: Phase
    summary: str
    deepspeed: str  # what DeepSpeed does with such a config
    since: str = "0.14"  # first supported DeepSpeed version the rule applies to


Check = Callable[["Context"], None]

RULES: dict[str, RuleInfo] = {}
CHECKS: list[tuple[RuleInfo, Check]] = []


def register(info: RuleInfo) -> RuleInfo:
    if info.rule_id in RULES:
        raise ValueError(f"rule id {info.rule_id!r} registered twice")
    RULES[info.rule_id] = info
    return info


def rule(
    rule_id: str, severity: Severity, phase: Phase, summary: str, deepspeed: str, since: str = "0.14"
) -> Callable[[Check], Check]:
    """Register ``func`` as the check behind ``rule_id``."""
    info = register(RuleInfo(rule_id, severity, phase, summary, deepspeed, since))

    def decorate(func: Check) -> Check:
        CHECKS.append((info, func))
        return func

    return decorate


def describe(rule_ids: Iterable[str]) -> list[RuleInfo]:
    return [RULES[rule_id] for rule_id in rule_ids]
