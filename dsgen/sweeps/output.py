"""Write a solved sweep as one directory: a folder per feasible run, and the manifests.

The directory is published all or nothing through :func:`dsgen.output.publish_directory` (staged
next to its destination, renamed into place, marked as dsgen's so ``force`` may replace it later).
On top of that contract a sweep refuses two destinations that ``force`` would wrongly destroy: the
current directory (or one above it) and a directory holding the sweep file itself.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.output import cannot_write, check_directory_destination, publish_directory
from dsgen.reporting.text_table import text_table
from dsgen.sweeps.name_template import MANIFEST_CSV, MANIFEST_JSONL, REPORT_HTML
from dsgen.sweeps.runner import MAX_RUNS, Outcome, Sweep, load_sweep, manifest_row, run_sweep
from dsgen.targets import LAUNCH_FILE
from dsgen.units import GIB

#: Called after each run with its outcome and the number of runs in the sweep.
Progress = Callable[[Outcome, int], None]


@dataclass(frozen=True)
class SweepResult:
    """Every run's outcome and manifest row, and where they were written (None: a dry run)."""

    sweep: Sweep
    outcomes: tuple[Outcome, ...]
    rows: tuple[dict[str, Any], ...]
    output: Path | None

    @property
    def feasible(self) -> int:
        return sum(r["status"] == "ok" for r in self.rows)

    @property
    def infeasible(self) -> int:
        return sum(r["status"] == "infeasible" for r in self.rows)


def _contains_cwd(output: Path) -> bool:
    """Whether ``output`` is the current directory or one of its ancestors.

    Such a directory cannot be renamed out of the way (EBUSY for "."), and where the rename does
    work, ``force`` would delete the directory the user is standing in. Both the lexical and the
    symlink-resolved forms are compared, so "..", "./" and a symlinked cwd are all caught.
    """
    cwd_forms = {Path(os.getcwd()), Path.cwd().resolve()}
    output_forms = {Path(os.path.abspath(output)), output.resolve()}
    return any(o == c or o in c.parents for o in output_forms for c in cwd_forms)


def check_sweep_destination(output: Path, sweep_file: Path, *, force: bool) -> None:
    """Refuse an output directory before any run is solved (see the module docstring)."""
    if _contains_cwd(output):
        raise DsgenError(
            f"{output} is the current directory or contains it; it cannot be the sweep output directory",
            hint="name a new directory, e.g. -o runs/",
        )
    if output.resolve() in sweep_file.resolve().parents:
        raise DsgenError(
            f"{output} contains the sweep file {sweep_file}; replacing it would delete the sweep",
            hint="write the runs to a directory of their own, e.g. -o runs/",
        )
    check_directory_destination(output, force=force)
    _probe_parent(output)


def _probe_parent(output: Path) -> None:
    """Fail now, not after every run is solved, where the output's directory cannot be written.

    Only an existing parent is probed; missing parents are created when the sweep is published.
    """
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        return
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{output.name}.probe-", dir=parent))
    except OSError as exc:
        raise cannot_write(output, exc) from None


def manifest_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    """One JSON object per line, in run order."""
    return "".join(json.dumps(r) + "\n" for r in rows)


def manifest_csv(rows: list[dict[str, Any]], varied_keys: tuple[str, ...]) -> str:
    """The manifest as CSV: name, one column per varied key, the fixed columns, then the files."""
    last = ("files", "launcher", "launch_files")  # after every other column (positional readers)
    fixed = [k for k in rows[0] if k not in ("name", "vars", *last)] if rows else []
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["name", *varied_keys, *fixed, *last])
    for row in rows:
        varied = [v if isinstance(v, str) else json.dumps(v) for v in (row["vars"][k] for k in varied_keys)]
        rest = ["" if row[k] is None else row[k] for k in fixed]
        tail = [";".join(row["files"]), row["launcher"] or "", ";".join(row["launch_files"])]
        writer.writerow([row["name"], *varied, *rest, *tail])
    return buffer.getvalue()


def _each_run(sweep: Sweep, progress: Progress | None) -> Callable[[Outcome], None] | None:
    return None if progress is None else (lambda outcome: progress(outcome, len(sweep.runs)))


def solve_sweep(sweep: Sweep, progress: Progress | None = None) -> SweepResult:
    """Solve every run in memory; nothing is written (``dsgen sweep --dry-run``)."""
    outcomes = tuple(run_sweep(sweep, _each_run(sweep, progress)))
    return SweepResult(sweep, outcomes, tuple(manifest_row(sweep, o, []) for o in outcomes), None)


def write_sweep(
    sweep_file: str | Path,
    output: str | Path,
    *,
    force: bool = False,
    progress: Progress | None = None,
    max_runs: int = MAX_RUNS,
    max_parallel: int | None = None,
) -> SweepResult:
    """Load, solve and publish the sweep at ``sweep_file`` as the directory ``output``.

    The destination is checked before anything is solved, so a refused one costs nothing. Runs
    with the slurm launcher also get ``submit.sh`` (job arrays of at most ``max_parallel`` tasks
    at once), Kubernetes runs ``kustomization.yaml`` (:mod:`dsgen.sweeps.submit`).
    """
    file, dest = Path(sweep_file), Path(output)
    check_sweep_destination(dest, file, force=force)
    sweep = load_sweep(file, max_runs=max_runs)
    files: dict[str, str] = {}
    executable: set[str] = set()
    outcomes, rows = [], []
    for outcome in run_sweep(sweep, _each_run(sweep, progress)):
        written = []
        for file_name, text in outcome.files:  # the run's target and launcher files
            name = f"{outcome.run.name}/{file_name}"
            files[name] = text
            written.append(name)
            if file_name == LAUNCH_FILE:
                executable.add(name)
        outcomes.append(outcome)
        rows.append(manifest_row(sweep, outcome, written))
    files[MANIFEST_JSONL] = manifest_jsonl(rows)
    files[MANIFEST_CSV] = manifest_csv(rows, sweep.varied_keys)
    from dsgen.reporting.html.sweep_page import sweep_page

    files[REPORT_HTML] = sweep_page(rows, sweep.varied_keys, file.name)
    from dsgen.sweeps.submit import submission_files

    submission = submission_files(outcomes, max_parallel)
    files.update(submission)
    executable |= {name for name in submission if name.endswith(".sh")}
    publish_directory(dest, files, force=force, executable=frozenset(executable))
    return SweepResult(sweep, tuple(outcomes), tuple(rows), dest)


def sweep_table(outcomes: Iterable[Outcome]) -> str:
    """``dsgen sweep --dry-run``: each run's status, predicted memory and step time, and plan."""
    rows = []
    for o in outcomes:
        e = o.evaluation
        rows.append(
            (
                o.run.name,
                o.status,
                f"{e.memory.gpu.total / GIB:.1f}" if e else "-",
                f"{e.step.total_s:.3f}" if e else "-",
                e.plan.describe() if e and o.status == "ok" else (o.reason or ""),
            )
        )
    return text_table(("run", "status", "GPU GiB", "step s", "plan"), rows, right={2, 3})
