"""The Python API behind the CLI: load a spec, solve it, render and validate the config.

from dsgen.api import load_spec, solve_spec, render_plan
spec = load_spec("examples/llama-3.1-8b-8xh100.yaml")   # or a mapping: load_spec({"model": ...})
result = solve_spec(spec)
rendered = render_plan(spec, result.best.plan)
run_sweep_to("sweep.yaml", "runs/")                      # what ``dsgen sweep -o runs/`` does
bundle = render_bundle(spec, result.best.plan, target="hf-trainer")   # + training_args.json, launch.sh
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsgen.doctor.diagnose import Diagnosis
    from dsgen.intake.starter import StarterOptions, write_starter_spec
    from dsgen.plan import Plan
    from dsgen.reporting.target_difference import TargetDifference
    from dsgen.search.frontier import FrontierPoint
    from dsgen.search.solver import Scope, SolveResult
    from dsgen.spec.types import Spec
    from dsgen.sweeps.output import Progress, SweepResult
    from dsgen.targets.bundle import Bundle
    from dsgen.targets.render import Rendered
    from dsgen.validate.method import TrainingMethod
    from dsgen.vocabulary import Accounting

__all__ = [
    "Bundle",
    "StarterOptions",
    "build_bundle",
    "build_config",
    "build_framework_bundle",
    "doctor",
    "explain_report",
    "framework_spec",
    "frontier_of",
    "frontier_report",
    "load_spec",
    "render_bundle",
    "render_plan",
    "run_sweep_to",
    "solve_for_target",
    "solve_json",
    "solve_spec",
    "spec_for_target",
    "training_method",
    "write_starter_spec",
]

#: Names this module hands on from where they live, imported when first asked for: each command
#: then loads only what it runs (``dsgen solve`` loads no Jinja2, no sweep machinery).
_REEXPORTS = {
    "Bundle": "dsgen.targets.bundle",
    "StarterOptions": "dsgen.intake.starter",
    "write_starter_spec": "dsgen.intake.starter",
}


def __getattr__(name: str) -> Any:
    if name in _REEXPORTS:
        import importlib

        return getattr(importlib.import_module(_REEXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_spec(
    source: str | Path | Mapping[str, Any],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    base_dir: str | Path | None = None,
) -> Spec:
    """Read and validate a spec: a YAML file, or a mapping already in memory (a notebook's dict).

    Raises DsgenError (exit 2) on bad input, naming the key path, and the file and line when
    there is a file. Relative paths inside a mapping (``model.hf_config``) are read from
    ``base_dir`` (default: the current directory); the mapping itself is not changed.
    """
    from dsgen.intake import loader

    if isinstance(source, Mapping):
        from dsgen.spec.yaml_source import SourceMap

        return loader.spec_from_data(
            _plain(source), SourceMap(None), base_dir=Path(base_dir or Path.cwd()), overrides=overrides
        )
    return loader.load_spec(source, overrides)


def training_method(spec: str | Path | Mapping[str, Any] | Spec) -> TrainingMethod:
    """The training method of a spec (a loaded one, a YAML file or a mapping), for
    ``validate_config(..., method=...)``: what ``dsgen validate --spec`` checks the config against.
    A spec that does not load raises DsgenError (exit 2)."""
    from dsgen.spec.types import Spec
    from dsgen.validate.method import TrainingMethod

    return TrainingMethod.from_spec(spec if isinstance(spec, Spec) else load_spec(spec))


def _plain(value: Any) -> Any:
    """A deep copy of ``value`` as YAML would have produced it: dicts and lists, not other containers."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def solve_spec(spec: Spec, accounting: Accounting = "dsgen", scope: Scope = "full") -> SolveResult:
    """Search the plan space; the result ranks every feasible plan (``scope="choice"``: only the
    chosen one, :data:`dsgen.search.solver.Scope`). ``accounting`` is ``dsgen`` (default) or
    ``deepspeed-estimator`` (DeepSpeed's own model-state estimator)."""
    from dsgen.search.solver import solve

    return solve(spec, accounting, scope)


def spec_for_target(spec: Spec, target: str | None, launcher: str | None = None) -> Spec:
    """``spec`` priced for ``target`` (``--target``; None: the spec's own ``output.target``): the
    target's training loop is part of what is priced, so ``solve``, ``explain``, ``frontier`` and
    ``new`` given the same target price the same plan. A bad target or launcher raises DsgenError."""
    if target is None and launcher is None:
        return spec  # the spec's own target, already checked by the loader
    from dsgen.reporting.target_difference import with_target
    from dsgen.targets.bundle import resolve

    chosen, _ = resolve(spec, target, launcher)
    return with_target(spec, chosen)


def solve_for_target(
    spec: Spec, target: str | None, accounting: Accounting = "dsgen"
) -> tuple[SolveResult, TargetDifference | None]:
    """:func:`solve_spec` for ``target``, and, when the target changes the plan the spec's own
    target would run, why (:func:`dsgen.reporting.target_difference.target_difference`)."""
    from dsgen.reporting.target_difference import target_difference

    priced = spec_for_target(spec, target)
    result = solve_spec(priced, accounting)
    if priced.output.target == spec.output.target:
        return result, None
    return result, target_difference(solve_spec(spec, accounting), result)


def solve_json(result: SolveResult, difference: TargetDifference | None, *, target_given: bool) -> dict[str, Any]:
    """``dsgen solve --json``'s object: the result, and with ``--target`` the target and why it
    changed the plan."""
    from dsgen.reporting.report import result_dict
    from dsgen.reporting.target_difference import difference_dict

    body = result_dict(result)
    if target_given:
        body["target"] = result.spec.output.target
        body["target_difference"] = difference_dict(difference)
    return body


def explain_report(
    result: SolveResult,
    difference: TargetDifference | None,
    explanation: str,
    spec_name: str,
    path: str | Path,
    *,
    target_given: bool,
) -> None:
    """Write ``dsgen explain --html``'s page to ``path`` (whole, or not at all)."""
    from dsgen.output import write_atomic
    from dsgen.reporting.html.explain_page import explain_page

    page = explain_page(solve_json(result, difference, target_given=target_given), explanation, spec_name)
    write_atomic(Path(path), page, force=True)


def frontier_report(points: list[FrontierPoint], over: str, spec_name: str, path: str | Path) -> None:
    """Write ``dsgen frontier --html``'s page to ``path`` (whole, or not at all)."""
    from dsgen.output import write_atomic
    from dsgen.reporting.frontier_report import frontier_dict
    from dsgen.reporting.html.frontier_page import frontier_page

    spec = points[0].result.spec
    body = frontier_dict(points, over, with_points=True)  # type: ignore[arg-type]
    page = frontier_page(body, spec_name, spec.model.name, spec.hardware.gpu.name)
    write_atomic(Path(path), page, force=True)


def render_plan(spec: Spec, plan: Plan, target: str | None = None) -> Rendered:
    """Render and validate the config of ``plan`` for ``target`` (default: the spec's output target)."""
    from dsgen.targets.render import render

    return render(spec, plan, target or spec.output.target)


def build_config(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), accounting: Accounting = "dsgen"
) -> tuple[SolveResult, Rendered]:
    """Load, solve (raising InfeasibleError, exit 3, when nothing fits) and render in one call."""
    from dsgen.search.solver import require_feasible

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
    deepspeed_version: str | None = None,
    peft: str | Path | None = None,
    llamafactory: str | Path | None = None,
) -> Diagnosis:
    """Size an existing DeepSpeed config on the spec's cluster (``dsgen doctor``): verdict,
    memory per phase, findings and ranked fixes. Paths are read here; bad input raises DsgenError.
    ``deepspeed_version`` replaces the spec's ``training.deepspeed_version``: the release the
    config is checked and priced against. ``peft`` (an ``adapter_config.json``), a TRL config
    in ``training_args`` and a LLaMA-Factory training YAML (``llamafactory``, which also gives the
    Trainer's batch and sequence) state the method and objective, which override the spec's
    (:mod:`dsgen.doctor.method_files`)."""
    from dataclasses import replace

    from dsgen.doctor.diagnose import diagnose
    from dsgen.doctor.method_files import llamafactory_inputs, read_training_args
    from dsgen.doctor.spec_batch import doctor_spec
    from dsgen.spec.types import Spec
    from dsgen.validate import loader

    data = config if isinstance(config, dict) else loader.load(config).data
    release = None if deepspeed_version is None else _release_name(deepspeed_version)
    args = (
        training_args if isinstance(training_args, dict) or training_args is None else read_training_args(training_args)
    )
    factory: list[str] = []
    shape: tuple[str, ...] = ()
    if llamafactory is not None:
        factory, factory_args = llamafactory_inputs(llamafactory)
        args = {**factory_args, **(args or {})}
        if not isinstance(spec, Spec):  # its model, sequence and batch, where the spec states none
            from dsgen.doctor.framework_runs import llamafactory_run

            run = llamafactory_run(llamafactory, spec)
            shape = run.shape + run.batch
    if isinstance(spec, Spec):
        loaded_spec = (
            spec if release is None else replace(spec, training=replace(spec.training, deepspeed_version=release))
        )
    else:  # through the loader, so its rules for the release hold (no ALST before 0.17.4)
        loaded_spec = doctor_spec(
            spec,
            data,
            release=release,
            trainer_args=args,
            method=tuple(factory),
            peft=peft,
            world_size=world_size,
            shape=shape,
        )
    return diagnose(data, loaded_spec, world_size=world_size, trainer_args=args, error_text=error)


def _release_name(version: str) -> str:
    from dsgen.errors import DsgenError
    from dsgen.facts.release import normalize_release

    try:
        return normalize_release(version)
    except ValueError as exc:
        raise DsgenError(f"--deepspeed-version: {exc}") from None


def run_sweep_to(
    path: str | Path,
    output: str | Path | None,
    *,
    force: bool = False,
    progress: Progress | None = None,
    max_runs: int | None = None,
    max_parallel: int | None = None,
) -> SweepResult:
    """Solve every run of the sweep file at ``path`` and publish them as the directory ``output``.

    ``output=None`` solves without writing anything (a dry run). The directory appears whole or
    not at all; ``force`` replaces only a directory an earlier dsgen run wrote. ``max_runs``
    (default :data:`dsgen.sweeps.runner.MAX_RUNS`) refuses sweeps that expand to more runs;
    ``max_parallel`` caps how many tasks of each Slurm job array in ``submit.sh`` run at once.
    """
    from dsgen.sweeps.output import solve_sweep, write_sweep
    from dsgen.sweeps.runner import MAX_RUNS, load_sweep

    max_runs = MAX_RUNS if max_runs is None else max_runs

    if output is None:
        return solve_sweep(load_sweep(path, max_runs=max_runs), progress)
    return write_sweep(path, output, force=force, progress=progress, max_runs=max_runs, max_parallel=max_parallel)


def render_bundle(
    spec: Spec,
    plan: Plan,
    target: str | None = None,
    launcher: str | None = None,
    template_dir: str | Path | None = None,
) -> Bundle:
    """Render every file of ``target`` and ``launcher`` (defaults: the spec's output section, then
    the target's usual launcher) for ``plan``; ``template_dir`` holds a team's own templates."""
    from dsgen.targets import bundle

    chosen, how = bundle.resolve(spec, target, launcher)
    return bundle.render_bundle(spec, plan, chosen, how, Path(template_dir) if template_dir is not None else None)


def build_bundle(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    accounting: Accounting = "dsgen",
    *,
    target: str | None = None,
    launcher: str | None = None,
    template_dir: str | Path | None = None,
    allow_tight: bool = False,
    scope: Scope = "full",
) -> tuple[SolveResult, Bundle]:
    """:func:`build_config` for a whole target bundle (``dsgen new --target/--launcher``).

    ``allow_tight``: when no plan fits below the safe line, take the fastest "tight" one (below
    GPU capacity, above the line; dsgen.search.verdict) rather than raising InfeasibleError. ``scope``:
    ``choice`` when only the chosen plan is shown (:data:`dsgen.search.solver.Scope`)."""
    from dataclasses import replace

    from dsgen.search.solver import require_feasible
    from dsgen.targets.bundle import resolve

    spec = load_spec(path, overrides)
    chosen, how = resolve(spec, target, launcher)  # a bad choice fails before the solver runs
    spec = spec_for_target(spec, chosen)
    result = solve_spec(spec, accounting, scope)
    if allow_tight and not result.feasible and not result.fully_pinned:
        # below capacity is what a tight plan must meet: search again with no headroom
        relaxed = replace(spec, constraints=replace(spec.constraints, memory_headroom=0.0))
        tight = solve_spec(relaxed, accounting, scope)
        result = tight if tight.feasible else result
    best = require_feasible(result)
    from dsgen.targets import bundle
    from dsgen.targets.requests import resource_request

    # the launch files ask for what this evaluation predicts (under the accounting asked for)
    request = resource_request(result.spec, chosen, best.memory.cpu.total, best.step.total_s)
    tdir = Path(template_dir) if template_dir is not None else None
    return result, bundle.render_bundle(result.spec, best.plan, chosen, how, tdir, request=request)


#: The frameworks whose own training YAML ``new`` and ``solve`` can start from (``--from``).
FROM_FRAMEWORKS = ("llamafactory",)


def framework_spec(
    framework_yaml: str | Path, framework: str, spec: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> Spec:
    """The spec of a run a framework's own YAML describes (``--from llamafactory``): its model,
    method, objective, sequence, precision, batch and pins (:mod:`dsgen.doctor.framework_runs`), on
    the hardware of ``spec``. Whatever ``spec`` states itself wins, and ``overrides`` (``--set``) over both."""
    from dsgen.doctor.framework_runs import llamafactory_run
    from dsgen.errors import DsgenError

    if framework not in FROM_FRAMEWORKS:
        raise DsgenError(f"unknown --from {framework!r}; choose one of {', '.join(FROM_FRAMEWORKS)}", path="--from")
    run = llamafactory_run(framework_yaml, spec)
    return load_spec(spec, [*run.shape, *run.method, *run.pins, *run.batch, f"output.target={framework}", *overrides])


def build_framework_bundle(
    framework_yaml: str | Path,
    framework: str,
    spec: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    accounting: Accounting = "dsgen",
    *,
    scope: Scope = "full",
) -> tuple[SolveResult, Bundle]:
    """``dsgen new FILE --from FRAMEWORK --spec SPEC``: the plan of :func:`framework_spec`, written
    as the DeepSpeed JSON and the user's own YAML with the plan's keys set (every other line kept,
    :func:`dsgen.targets.llamafactory.with_plan`); the notes list each key changed."""
    from dataclasses import replace

    from dsgen.inputs import read_text
    from dsgen.search.solver import require_feasible
    from dsgen.targets import CONFIG_FILE
    from dsgen.targets.bundle import render_bundle
    from dsgen.targets.llamafactory import plan_keys, with_plan

    loaded = framework_spec(framework_yaml, framework, spec, overrides)
    result = solve_spec(loaded, accounting, scope)
    best = require_feasible(result)
    bundle = render_bundle(result.spec, best.plan, framework, "none")
    name = Path(framework_yaml).name
    text, changed = with_plan(read_text(Path(framework_yaml), "LLaMA-Factory YAML"), plan_keys(best.plan, CONFIG_FILE))
    notes = tuple(f"set {change}" for change in changed)
    notes += (f"start it from the written directory: FORCE_TORCHRUN=1 llamafactory-cli train {name}",)
    return result, replace(bundle, files={CONFIG_FILE: bundle.files[CONFIG_FILE], name: text}, notes=notes)


def frontier_of(spec: Spec, over: str = "sequence_length", gpus: list[int] | None = None) -> list[FrontierPoint]:
    """The largest ``over`` (sequence_length or micro_batch_size) that fits, one point per GPU
    count (``dsgen frontier``): bisection over the solver, each point solved in full."""
    from dsgen.errors import DsgenError
    from dsgen.search.frontier import OVER_CHOICES, frontier

    if over not in OVER_CHOICES:
        raise DsgenError(f"must be one of {', '.join(OVER_CHOICES)}, got {over!r}", path="--over")
    return frontier(spec, over, gpus)
