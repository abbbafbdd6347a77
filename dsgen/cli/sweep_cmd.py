"""``dsgen sweep``: solve every run of a sweep file and write them all, or nothing.

The work (expanding, solving, publishing) is :mod:`dsgen.sweeps.output`'s; this module parses the
options, shows progress on stderr and prints the summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from dsgen.errors import DsgenError, ExitCode
from dsgen.sweeps.runner import MAX_RUNS

if TYPE_CHECKING:
    from dsgen.sweeps.output import SweepResult
    from dsgen.sweeps.runner import Outcome


def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="The sweep YAML file.", show_default=False, metavar="SWEEP")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Directory to create with one folder per run.", metavar="DIR"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the runs and their plans; write nothing.")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an output directory an earlier dsgen sweep wrote.")
    ] = False,
    fail_on_infeasible: Annotated[
        bool, typer.Option("--fail-on-infeasible", help="Exit 3 if any run has no feasible plan.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: print the manifest rows as JSON.")] = False,
    max_runs: Annotated[
        int, typer.Option("--max-runs", min=1, help="Refuse sweeps that expand to more runs than this.", metavar="N")
    ] = MAX_RUNS,
    max_parallel: Annotated[
        int | None,
        typer.Option(
            "--max-parallel",
            min=1,
            help="Slurm runs: at most N tasks of each job array in submit.sh at once (sbatch --array=...%N).",
            metavar="N",
        ),
    ] = None,
) -> None:
    """Expand a sweep (grid x zip over a base spec) and solve, render and validate every run."""
    from dsgen.api import run_sweep_to
    from dsgen.sweeps.output import sweep_table

    if not dry_run and output is None:
        raise DsgenError("missing --output DIR (or use --dry-run)")
    progress = _Progress()
    try:
        result = run_sweep_to(
            sweep_file,
            None if dry_run else output,
            force=force,
            progress=progress,
            max_runs=max_runs,
            max_parallel=max_parallel,
        )
    finally:
        progress.close()
    if dry_run:
        typer.echo(json.dumps(list(result.rows), indent=2) if as_json else sweep_table(result.outcomes))
    _finish(result, fail_on_infeasible)


def _finish(result: SweepResult, fail_on_infeasible: bool) -> None:
    where = f"; wrote {result.output}/" if result.output else " (dry run, nothing written)"
    typer.echo(
        f"sweep: {len(result.rows)} runs, {result.feasible} feasible, {result.infeasible} infeasible{where}",
        err=result.output is None,
    )
    if fail_on_infeasible and result.infeasible:
        raise typer.Exit(int(ExitCode.INFEASIBLE))


class _Progress:
    """A progress bar on a terminal; one plain line per run otherwise (logs, CI)."""

    def __init__(self) -> None:
        self.done = 0
        self.tty = sys.stderr.isatty()

    def __call__(self, outcome: Outcome, total: int) -> None:
        self.done += 1
        if self.tty:
            filled = 30 * self.done // max(total, 1)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{total} {outcome.run.name[:40]:<40}")
            sys.stderr.flush()
        else:
            sys.stderr.write(f"[{self.done}/{total}] {outcome.run.name}: {outcome.status}\n")

    def close(self) -> None:
        if self.tty and self.done:
            sys.stderr.write("\n")


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS = {"sweep": sweep}
