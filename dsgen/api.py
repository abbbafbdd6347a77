"""The Python API behind the CLI: load a spec, solve it, render and validate the config.

from dsgen.api import load_spec, solve_spec, render_plan
spec = load_spec("examples/llama-3.1-8b-8xh100.yaml")
result = solve_spec(spec)
rendered = render_plan(spec, result.best.plan)
bundle = render_bundle(spec, result.best.plan, target="hf-trainer")   # + training_args.json, launch.sh
"""

from __future__ import annotations

from pathlib import Path

from dsgen.plan import Plan
from dsgen.render import Rendered, render
from dsgen.solver import SolveResult, require_feasible, solve
from dsgen.spec.loader import load_spec as _load_spec
from dsgen.spec.types import Spec
from dsgen.targets.bundle import Bundle, resolve
from dsgen.targets.bundle import render_bundle as _render_bundle


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


def render_bundle(
    spec: Spec,
    plan: Plan,
    target: str | None = None,
    launcher: str | None = None,
    template_dir: str | Path | None = None,
) -> Bundle:
    """Render every file of ``target`` and ``launcher`` (defaults: the spec's output section, then
    the target's usual launcher) for ``plan``; ``template_dir`` holds a team's own templates."""
    chosen, how = resolve(spec, target, launcher)
    return _render_bundle(spec, plan, chosen, how, Path(template_dir) if template_dir is not None else None)


def build_bundle(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    accounting: str = "dsgen",
    *,
    target: str | None = None,
    launcher: str | None = None,
    template_dir: str | Path | None = None,
) -> tuple[SolveResult, Bundle]:
    """:func:`build_config` for a whole target bundle (``dsgen new --target/--launcher``)."""
    spec = load_spec(path, overrides)
    chosen, how = resolve(spec, target, launcher)  # a bad choice fails before the solver runs
    result = solve_spec(spec, accounting)
    best = require_feasible(result)
    return result, render_bundle(spec, best.plan, chosen, how, template_dir)
