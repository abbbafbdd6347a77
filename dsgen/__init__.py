"""dsgen: solve, render and validate DeepSpeed configs from a hardware + model + training spec.

The public API lives in :mod:`dsgen.api` (load_spec, solve_spec, render_plan, build_config,
render_bundle, build_bundle) and :mod:`dsgen.validate` (validate_config, validate_file). Names
are re-exported here lazily so that ``import dsgen`` stays cheap for the CLI's cold start.
"""

from __future__ import annotations

from typing import Any

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
