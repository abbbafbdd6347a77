"""dsgen: solve, render and validate DeepSpeed configs from a hardware + model + training spec.

The public API lives in :mod:`dsgen.api` (load_spec, solve_spec, render_plan, build_config,
render_bundle, build_bundle) and :mod:`dsgen.validate` (validate_config, validate_file). Names
are re-exported here lazily so that ``import dsgen`` stays cheap for the CLI's cold start.

Modules that moved into the stage packages (issue 49) still import from their old paths, with a
DeprecationWarning, through :class:`_MovedModules`: pipelines that import them keep working.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader

__version__ = "0.1.0"

_EXPORTS = {
    "load_spec": "dsgen.api",
    "solve_spec": "dsgen.api",
    "render_plan": "dsgen.api",
    "build_config": "dsgen.api",
    "render_bundle": "dsgen.api",
    "build_bundle": "dsgen.api",
    "validate_config": "dsgen.validate",
    "validate_file": "dsgen.validate",
    "DsgenError": "dsgen.errors",
    "ExitCode": "dsgen.errors",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dsgen' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


#: Old module path -> where it lives now (a package's submodules follow it).
MOVED_MODULES: dict[str, str] = {
    "dsgen.deepspeed_release": "dsgen.facts.release",
    "dsgen.model_parallel": "dsgen.facts.model_parallel",
    "dsgen.deepspeed_blocks": "dsgen.targets.deepspeed_blocks",
    "dsgen.render": "dsgen.targets.render",
    "dsgen.solver": "dsgen.search.solver",
    "dsgen.evaluation": "dsgen.search.evaluation",
    "dsgen.ranking": "dsgen.search.ranking",
    "dsgen.knob_variants": "dsgen.search.knob_variants",
    "dsgen.model_parallel_choices": "dsgen.search.model_parallel_choices",
    "dsgen.long_context": "dsgen.search.long_context",
    "dsgen.global_batch": "dsgen.search.global_batch",
    "dsgen.frontier": "dsgen.search.frontier",
    "dsgen.verdict": "dsgen.search.verdict",
    "dsgen.sweep": "dsgen.sweeps.runner",
    "dsgen.sweep_output": "dsgen.sweeps.output",
    "dsgen.sweep_submit": "dsgen.sweeps.submit",
    "dsgen.name_template": "dsgen.sweeps.name_template",
    "dsgen.report": "dsgen.reporting.report",
    "dsgen.target_difference": "dsgen.reporting.target_difference",
    "dsgen.method_summary": "dsgen.reporting.method_summary",
    "dsgen.frontier_report": "dsgen.reporting.frontier_report",
    "dsgen.text_table": "dsgen.reporting.text_table",
    "dsgen.html": "dsgen.reporting.html",
    "dsgen.starter": "dsgen.intake.starter",
    "dsgen.schema_gate": "dsgen.intake.schema_gate",
    "dsgen.spec.loader": "dsgen.intake.loader",
    "dsgen.spec.overrides": "dsgen.intake.overrides",
    "dsgen.spec.schema_errors": "dsgen.intake.schema_errors",
    "dsgen.jsontypes": "dsgen.validate.jsontypes",
}


def moved_to(name: str) -> str | None:
    """The current path of module ``name`` if it, or a package above it, moved; else None."""
    if not name.startswith("dsgen."):
        return None  # every other import passes this finder first: keep it one comparison
    for old, new in MOVED_MODULES.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedModules:
    """Imports an old module path as the module at its new path: one module object under both
    names (so ``isinstance`` checks and monkeypatching see the same thing), with a warning.

    A finder and loader by protocol (``find_spec``; ``create_module``, ``exec_module``), not by
    subclassing ``importlib.abc``, whose import (``importlib.resources``) would cost every cold
    start about 40 ms."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, cast("Loader", self)) if moved_to(fullname) else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        import importlib
        import warnings

        new = moved_to(spec.name)
        assert new is not None
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path will be removed)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path has already run."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
