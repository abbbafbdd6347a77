"""The Python API behind the CLI: load a spec, solve it, render and validate the config.

from dsgen.api import load_spec, solve_spec, render_plan
spec = load_spec("examples/llama-3.1-8b-8xh100.yaml")
result = solve_spec(spec)
rendered = render_plan(spec, result.best.plan)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsgen.plan import Plan
from dsgen.render import Rendered, render
from dsgen.solver import SolveResult, require_feasible, solve
from dsgen.spec.loader import load_spec as _load_spec
from dsgen.spec.types import Spec

if TYPE_CHECKING:
    from dsgen.doctor.diagnose import Diagnosis


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Read and validate a spec file; raises DsgenError (exit 2) with file:line on bad input."""
    return _load_spec(path, overrides)


def solve_spec(spec: Spec, accounting: str = "dsgen") -> SolveResult:
    """Search the plan space; the result ranks every feasible plan. ``accounting`` is ``dsgen``
    (default) or ``deepspeed-estimator`` (DeepSpeed's own model-state estimator)."""
    return solve(spec, accounting)


def render_plan(spec: Spec, plan: Plan, target: str | None = None) -> Rendered:
    """Render and validate the config of ``plan`` for ``target`` (default: the spec's output target)."""
    return render(spec, plan, target or spec.output.target)


def build_config(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), accounting: str = "dsgen"
) -> tuple[SolveResult, Rendered]:
    """Load, solve (raising InfeasibleError, exit 3, when nothing fits) and render in one call."""
    spec = load_spec(path, overrides)
    result = solve_spec(spec, accounting)
    best = require_feasible(result)
    return result, render_plan(spec, best.plan)


def doctor(
    config: str | Path | dict[str, Any],
    spec: str | Path | Spec,
    *,
    world_size: int | None = None,
    training_args: str | Path | dict[str, Any] | None = None,
    error: str | None = None,
) -> Diagnosis:
    """Size an existing DeepSpeed config on the spec's cluster (``dsgen doctor``): verdict,
    memory per phase, findings and ranked fixes. Paths are read here; bad input raises DsgenError."""
    from dsgen.doctor.auto_values import load_training_args
    from dsgen.doctor.diagnose import diagnose
    from dsgen.validate import loader

    data = config if isinstance(config, dict) else loader.load(config).data
    loaded_spec = spec if isinstance(spec, Spec) else load_spec(spec)
    args = training_args if isinstance(training_args, dict) or training_args is None else load_training_args(training_args)
    return diagnose(data, loaded_spec, world_size=world_size, trainer_args=args, error_text=error)
