"""Expand a sweep file into runs and solve, render and validate each one.

A sweep is a base spec plus ``grid`` (cartesian product) and ``zip`` (varied together) key paths.
Everything here is pure: :func:`load_sweep` reads and expands the file, :func:`run_sweep` turns
runs into outcomes in memory. Writing them (all or nothing) is :mod:`dsgen.sweeps.output`'s job.
"""

from __future__ import annotations

import copy
import gc
import itertools
import multiprocessing as mp
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsgen.errors import DsgenError, ExitCode, InfeasibleError
from dsgen.inputs import read_text
from dsgen.intake.loader import spec_from_data
from dsgen.intake.overrides import set_path
from dsgen.intake.schema_errors import check_against_schema, show
from dsgen.plan import LONG_CONTEXT_KEYS, checkpointing_flags, long_context_dict, offload_optimizer_ratio
from dsgen.resources import schema_path
from dsgen.search.evaluation import Evaluation
from dsgen.search.solver import require_feasible, solve
from dsgen.spec.yaml_source import KeyPath, SourceMap, load_yaml, read_source
from dsgen.sweeps.name_template import compile_name_template, render_name
from dsgen.targets.render import Rendered

if TYPE_CHECKING:
    from dsgen.targets.requests import ResourceRequest

#: Most runs a sweep may expand to unless the caller raises the cap (``dsgen sweep --max-runs``).
MAX_RUNS = 10_000


@dataclass(frozen=True)
class Run:
    """One point of the sweep: its name, the values it varies, and its spec data."""

    index: int
    name: str
    varied: tuple[tuple[str, Any], ...]
    data: dict[str, Any]
    source: SourceMap


@dataclass(frozen=True)
class Sweep:
    """An expanded sweep: every run's name and spec, in the order the sweep file defines them."""

    file: str
    runs: tuple[Run, ...]
    varied_keys: tuple[str, ...]
    base_dir: Path


@dataclass(frozen=True)
class Outcome:
    """What happened to one run: a rendered config, or the reason there is none."""

    run: Run
    status: str  # ok | infeasible | invalid
    evaluation: Evaluation | None
    rendered: Rendered | None
    reason: str | None
    files: tuple[tuple[str, str], ...] = ()  # the run's files (name, text) for its target and launcher
    launcher: str | None = None  # the run's launcher (None: no feasible plan, nothing rendered)
    launch_files: tuple[str, ...] = ()  # which of ``files`` start the run (launch.sh, manifests)
    request: ResourceRequest | None = None  # what its launch files ask a scheduler for


def load_sweep(path: str | Path, *, max_runs: int = MAX_RUNS) -> Sweep:
    """Read a sweep file, validate it, and expand it into uniquely and safely named runs.

    A grid multiplies: a few lines can describe millions of runs, so the count is checked
    against ``max_runs`` before anything is expanded.
    """
    file = Path(path)
    data, source = load_yaml(read_source(file, "sweep"), str(file))
    if not isinstance(data, dict):
        raise DsgenError("a sweep must be a YAML mapping with base, name and grid/zip", location=source.location(()))
    check_against_schema(data, schema_path("sweep"), source, what="sweep")
    base_data, base_source, base_dir = _load_base(data["base"], file, source)
    grid: dict[str, list[Any]] = data.get("grid", {})
    zipped: dict[str, list[Any]] = data.get("zip", {})
    _check_keys(grid, zipped, source)
    _check_count(grid, zipped, max_runs, source)
    combos = list(itertools.product(*grid.values())) if grid else [()]
    zip_rows = list(zip(*zipped.values(), strict=True)) if zipped else [()]
    runs: list[Run] = []
    names: dict[str, int] = {}
    name_template = _name_template(data["name"], source)
    for combo in combos:
        for row in zip_rows:
            varied = tuple(zip(list(grid) + list(zipped), list(combo) + list(row), strict=True))
            run_data = copy.deepcopy(base_data)
            run_source = base_source.copy()
            for key, value in varied:
                section = "grid" if key in grid else "zip"
                parts: KeyPath = tuple(key.split("."))
                set_path(run_data, parts, copy.deepcopy(value), f"{file}: {section}.{key}")
                run_source.overridden[parts] = source.location((section, key))
            index = len(runs)
            name = _render_name(name_template, run_data, varied, index, data["name"], source)
            if name in names:
                raise DsgenError(
                    f"run names collide: {name!r} is produced by run {names[name]} and run {index}",
                    path="name",
                    location=source.location(("name",)),
                    hint="include every varied key in the name template",
                )
            names[name] = index
            runs.append(Run(index, name, varied, run_data, run_source))
    return Sweep(str(file), tuple(runs), tuple(list(grid) + list(zipped)), base_dir)


def _load_base(base: Any, file: Path, source: SourceMap) -> tuple[dict[str, Any], SourceMap, Path]:
    if isinstance(base, dict):
        inline = SourceMap(source.file, {k[1:]: v for k, v in source.lines.items() if k[:1] == ("base",)})
        return base, inline, file.parent
    base_file = file.parent / base
    try:
        text = read_text(base_file, "base spec")
    except DsgenError as exc:  # missing, not a regular file, too large, not UTF-8
        raise DsgenError(
            f"cannot read base spec {base_file}: {exc.message}", path="base", location=source.location(("base",))
        ) from None
    data, base_source = load_yaml(text, str(base_file))
    if not isinstance(data, dict):
        raise DsgenError("the base spec must be a YAML mapping", location=base_source.location(()))
    return data, base_source, base_file.parent


def _check_count(grid: dict[str, list[Any]], zipped: dict[str, list[Any]], max_runs: int, source: SourceMap) -> None:
    count = len(next(iter(zipped.values()))) if zipped else 1
    for values in grid.values():
        count *= len(values)
    if count > max_runs:
        raise DsgenError(
            f"the sweep expands to {count:,} runs, more than the limit of {max_runs:,}",
            path="grid" if grid else "zip",
            location=source.location(("grid",) if grid else ("zip",)),
            hint="vary fewer values, or raise the limit with --max-runs",
        )


def _check_keys(grid: dict[str, list[Any]], zipped: dict[str, list[Any]], source: SourceMap) -> None:
    for section, block in (("grid", grid), ("zip", zipped)):
        for key in block:
            if not key or any(not part for part in key.split(".")):
                raise DsgenError(
                    f"{key!r} is not a key path like training.sequence_length",
                    path=f"{section}.{key}",
                    location=source.location((section, key)),
                )
    both = set(grid) & set(zipped)
    if both:
        key = sorted(both)[0]
        raise DsgenError(
            f"{key} is varied in both grid and zip", path=f"zip.{key}", location=source.location(("zip", key))
        )
    lengths = {key: len(values) for key, values in zipped.items()}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{k} has {n}" for k, n in lengths.items())
        raise DsgenError(
            f"zip lists must have the same length ({detail})", path="zip", location=source.location(("zip",))
        )


def _name_template(text: str, source: SourceMap) -> Any:
    return compile_name_template(text, lambda: source.location(("name",)))


def _render_name(
    template: Any, data: dict[str, Any], varied: tuple[tuple[str, Any], ...], index: int, text: str, source: SourceMap
) -> str:
    context = {**data, "index": index, "vars": dict(varied)}
    return render_name(template, context, index, text, lambda: source.location(("name",)))


def run_one(sweep: Sweep, run: Run) -> Outcome:
    """Solve, render and validate one run. Bad input in a run is an error for the whole sweep."""
    spec = spec_from_data(copy.deepcopy(run.data), run.source.copy(), base_dir=sweep.base_dir)
    result = solve(spec, scope="choice")  # only the plan written (the same as a full solve's)
    try:
        best = require_feasible(result)
    except InfeasibleError as exc:
        return Outcome(run, "infeasible", result.best or result.closest, None, exc.message)
    from dsgen.targets.bundle import render_bundle, resolve
    from dsgen.targets.requests import resource_request

    target, launcher = resolve(spec, None, None)
    request = resource_request(spec, target, best.memory.cpu.total, best.step.total_s)
    bundle = render_bundle(spec, best.plan, target, launcher, request=request, job_name=run.name)
    files = tuple(bundle.files.items())
    return Outcome(run, "ok", best, bundle.rendered, None, files, launcher, bundle.launch_files, request)


def _run_described(sweep: Sweep, run: Run) -> Outcome:
    try:
        return run_one(sweep, run)
    except DsgenError as exc:
        described = ", ".join(f"{k}={show(v)}" for k, v in run.varied)
        raise DsgenError(f"run {run.name!r} ({described}): {exc.render()}", exit_code=exc.exit_code) from None


_ACTIVE: Sweep | None = None  # the sweep a forked worker process solves (set before forking)


def _worker(index: int) -> Outcome | tuple[str, int]:
    assert _ACTIVE is not None
    try:
        return _run_described(_ACTIVE, _ACTIVE.runs[index])
    except DsgenError as exc:  # carried back as text: the parent raises it again
        return exc.render(), int(exc.exit_code)


PARALLEL_MIN_RUNS = 32

#: The worker processes' first-generation collection threshold (Python's default: 700 allocations).
#: Pricing allocates a great many short-lived frozen dataclasses and no reference cycles, so the
#: default spends its time scanning what reference counting frees anyway: measured 8 % of the
#: solve time of a 250-run sample (bench/sweep_speed.py's grid), none with this threshold.
WORKER_GC_THRESHOLD = 50_000


def _start_worker() -> None:
    """Set up a forked worker: what it inherited is never garbage (frozen out of the collector's
    scans) and collections are rarer (:data:`WORKER_GC_THRESHOLD`). Workers are dsgen's own
    processes; the caller's process keeps its own settings."""
    gc.freeze()
    gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])


def default_workers() -> int:
    return min(os.cpu_count() or 1, 8)


def run_sweep(
    sweep: Sweep, progress: Callable[[Outcome], None] | None = None, workers: int | None = None
) -> Iterator[Outcome]:
    """Outcomes of every run, in run order. Runs are independent, so large sweeps are solved in
    ``workers`` forked processes (default: the CPU count, at most 8); results keep run order, so
    the output is the same as a sequential run's."""
    global _ACTIVE
    workers = default_workers() if workers is None else workers
    parallel = workers > 1 and len(sweep.runs) >= PARALLEL_MIN_RUNS and "fork" in mp.get_all_start_methods()
    if not parallel:
        for run in sweep.runs:
            outcome = _run_described(sweep, run)
            if progress:
                progress(outcome)
            yield outcome
        return
    _ACTIVE = sweep
    try:
        with mp.get_context("fork").Pool(workers, initializer=_start_worker) as pool:
            for result in pool.imap(_worker, range(len(sweep.runs)), chunksize=8):
                if isinstance(result, tuple):
                    message, code = result
                    raise DsgenError(message, exit_code=ExitCode(code))
                if progress:
                    progress(result)
                yield result
    finally:
        _ACTIVE = None


def manifest_row(sweep: Sweep, outcome: Outcome, written: list[str]) -> dict[str, Any]:
    """One manifest row: name, varied values, plan, predictions, status, files.

    ``zeropp`` is the short label ('none', 'hpz', 'hpz+qwz+qgz'); hpZ partitions within a node.
    """
    e = outcome.evaluation
    plan = e.plan if e else None
    fit = e.fit if e else None
    return {
        "name": outcome.run.name,
        "vars": dict(outcome.run.varied),
        "status": outcome.status,
        "reason": outcome.reason,
        "precision": plan.precision if plan else None,
        "zero_stage": plan.zero_stage if plan else None,
        "offload_optimizer": plan.offload_optimizer if plan else None,
        "offload_param": plan.offload_param if plan else None,
        **checkpointing_flags(plan),
        "micro_batch_size": plan.micro_batch_size if plan else None,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps if plan else None,
        "data_parallel_size": plan.batch_parallel_size if plan else None,
        "global_batch_size": plan.global_batch_size if plan else None,
        "gpu_memory_bytes": e.memory.gpu.total if e else None,
        "host_memory_bytes": e.memory.cpu.total if e else None,
        "step_time_s": round(e.step.total_s, 6) if e else None,
        "tokens_per_s": round(e.tokens_per_s, 3) if e else None,
        # the long-context choices (issue 21), then the later plan columns and files, which stay last
        **(long_context_dict(plan) if plan else dict.fromkeys(LONG_CONTEXT_KEYS)),
        # after the original plan and prediction columns, so positional CSV readers keep working;
        # flat values, so the CSV stays one value per cell
        "offload_optimizer_ratio": offload_optimizer_ratio(plan) if plan else None,
        "zeropp": plan.knobs.zeropp if plan else None,
        # the calibrated verdict (dsgen.search.verdict) and GPU fill, appended for the same reason
        "verdict": fit.verdict if fit else None,
        "fill": round(fit.fill, 4) if fit else None,
        "likely": fit.likely if fit else None,
        # the plan's last output-contract key (issue 21), appended for the same reason
        "seq_parallel_communication_data_type": plan.long_context.communication_dtype if plan else None,
        "files": written,
        # after files, for the same reason: what starts the run, and which of its files those are
        "launcher": outcome.launcher,
        "launch_files": [p for p in (f"{outcome.run.name}/{name}" for name in outcome.launch_files) if p in written],
        # model parallelism (issue 42), appended for the same reason
        "tensor_parallel_size": plan.tensor_parallel_size if plan else None,
        "expert_parallel_size": plan.expert_parallel_size if plan else None,
    }
