"""The checks behind the rule ids: ``@rule`` registers a rule in the catalogue and its check here."""

from __future__ import annotations

from collections.abc import Callable

from dsgen.validate.rules.catalogue import RuleInfo, register
from dsgen.validate.rules.context import Context
from dsgen.vocabulary import Phase, Severity

Check = Callable[[Context], None]

CHECKS: list[tuple[RuleInfo, Check]] = []


def rule(
    rule_id: str, severity: Severity, phase: Phase, summary: str, deepspeed: str, since: str = "0.14"
) -> Callable[[Check], Check]:
    """Register ``func`` as the check behind ``rule_id``."""
    info = register(RuleInfo(rule_id, severity, phase, summary, deepspeed, since))

    def decorate(func: Check) -> Check:
        CHECKS.append((info, func))
        return func

    return decorate
