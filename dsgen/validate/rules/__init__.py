"""Cross-field rules. Importing this package registers every rule in :data:`RULES`, and the
fine-tuning rules (which need a training method) in :data:`METHOD_RULES`."""

from __future__ import annotations

from functools import cache

from dsgen.validate.rules import batch, keys, misc, model_parallel, optimizer, parallel, precision, zero  # noqa: F401
from dsgen.validate.rules.catalogue import RULES, RuleInfo
from dsgen.validate.rules.context import Context
from dsgen.validate.rules.finetuning import METHOD_RULES, run_method_rules
from dsgen.validate.rules.registry import CHECKS, Check
from dsgen.validate.versions import profile

__all__ = ["METHOD_RULES", "RULES", "Context", "RuleInfo", "run_rules"]


@cache
def _checks_for(version: str) -> tuple[Check, ...]:
    prof = profile(version)
    return tuple(check for info, check in CHECKS if prof.at_least(info.since))


def run_rules(ctx: Context) -> None:
    """Run every check that applies to the context's DeepSpeed version, then the fine-tuning
    rules when the context has a training method."""
    for check in _checks_for(ctx.profile.version):
        check(ctx)
    run_method_rules(ctx)
