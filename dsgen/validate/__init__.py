"""``dsgen validate``: a linter for DeepSpeed JSON configs.

It checks a config against the full DeepSpeed 0.19.8 schema (``schemas/deepspeed.schema.json``)
and against the cross-field rules DeepSpeed enforces at config time, at engine start, or not at
all (see ``docs/validation.md``). Public API::

    from dsgen.validate import validate_config, validate_file, Finding, Report

``validate_config(config, method=TrainingMethod(...))`` (or ``TrainingMethod.from_spec(spec)``)
also runs the fine-tuning rules (:data:`METHOD_RULES`), which need to know the training method.

The schema check is ``jsonschema``'s (see :mod:`dsgen.validate.schema_findings`). Importing this
package is cheap (standard library only; jsonschema and the schema are loaded by the first check).

May import :mod:`dsgen.intake` (its schema gate) and everything below it. ``lint-imports`` holds
every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""

from __future__ import annotations

from dsgen.facts.release import SUPPORTED as SUPPORTED_VERSIONS
from dsgen.validate.findings import Finding, Report
from dsgen.validate.method import TrainingMethod
from dsgen.validate.rules import METHOD_RULES, RULES
from dsgen.validate.targets import TARGETS
from dsgen.validate.validator import validate_config, validate_file

__all__ = [
    "METHOD_RULES",
    "RULES",
    "SUPPORTED_VERSIONS",
    "TARGETS",
    "Finding",
    "Report",
    "TrainingMethod",
    "validate_config",
    "validate_file",
]
