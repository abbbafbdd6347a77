"""The rule catalogue: one entry per stable rule id.

Rule ids are part of dsgen's output contract (users filter and suppress by them), so each is
registered exactly once with its default severity, the phase in which DeepSpeed itself fails
(if it does), and the text that ``docs/validation.md`` and the benchmark show. The checks that
implement the rules live in :mod:`dsgen.validate.rules.registry`; the findings a check emits
(:mod:`dsgen.validate.rules.context`) read their severity from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsgen.vocabulary import Phase, Severity


@dataclass(frozen=True)
class RuleInfo:
    """Metadata of one rule id."""

    rule_id: str
    severity: Severity  # default severity; a few rules depend on --target / --deepspeed-version
    phase: Phase
    summary: str
    deepspeed: str  # what DeepSpeed does with such a config
    since: str = "0.14"  # first supported DeepSpeed version the rule applies to


RULES: dict[str, RuleInfo] = {}


def register(info: RuleInfo) -> RuleInfo:
    if info.rule_id in RULES:
        raise ValueError(f"rule id {info.rule_id!r} registered twice")
    RULES[info.rule_id] = info
    return info
