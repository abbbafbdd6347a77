"""``dsgen sweep``: solve every run of a sweep file and write them all, or nothing."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from dsgen.errors import DsgenError, ExitCode


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="The sweep YAML file.", show_default=False)],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Directory to create with one folder per run.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the runs and their plans; write nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output directory.")] = False,
    fail_on_infeasible: Annotated[
        bool, typer.Option("--fail-on-infeasible", help="Exit 3 if any run has no feasible plan.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="With --dry-run: print the manifest rows as JSON.")] = False,
    max_runs: Annotated[
        int, typer.Option("--max-runs", min=1, help="Refuse sweeps that expand to more runs than this.")
    ] = 10_000,
) -> None:
    """Expand a sweep (grid x zip over a base spec) and solve, render and validate every run."""
    from dsgen.sweep import load_sweep, manifest_row, run_sweep

    if not dry_run and output is None:
        raise DsgenError("missing --output DIR (or use --dry-run)")
    if output is not None and not dry_run:
        with _writing(output):
            _check_output(output, force, sweep_file)
    plan = load_sweep(sweep_file, max_runs=max_runs)
    progress = _Progress(len(plan.runs))
    if dry_run:
        outcomes = list(run_sweep(plan, progress))
        progress.close()
        rows = [manifest_row(plan, o, []) for o in outcomes]
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
        else:
            typer.echo(_table(outcomes))
        _finish(rows, None, fail_on_infeasible)
        return
    assert output is not None
    from dsgen.output import publish_directory

    rows = []
    files: dict[str, str] = {}
    for outcome in run_sweep(plan, progress):
        written = []
        if outcome.rendered is not None:
            files[f"{outcome.run.name}/ds_config.json"] = outcome.rendered.text
            written.append(f"{outcome.run.name}/ds_config.json")
        rows.append(manifest_row(plan, outcome, written))
    progress.close()
    files["manifest.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows)
    files["manifest.csv"] = _csv(rows, plan.varied_keys)
    publish_directory(output, files, force=force)  # atomic, exclusive, --force only over dsgen's output
    _finish(rows, output, fail_on_infeasible)


@contextmanager
def _writing(output: Path) -> Iterator[None]:
    """Turn an OS failure while writing the sweep into one error naming the output directory.

    Only file-system steps run under it, so an unrelated OSError (say, from starting worker
    processes) is not misreported as a write failure.
    """
    from dsgen.output import cannot_write

    try:
        yield
    except OSError as exc:
        raise cannot_write(output, exc) from None


def _contains_cwd(output: Path) -> bool:
    """Whether ``output`` is the current directory or one of its ancestors.

    Such a directory cannot be renamed out of the way (EBUSY for "."), and where the rename does
    work, ``--force`` would delete the directory the user is standing in. Both the lexical and
    the symlink-resolved forms are compared, so "..", "./" and a symlinked cwd are all caught.
    """
    cwd_forms = {Path(os.getcwd()), Path.cwd().resolve()}
    output_forms = {Path(os.path.abspath(output)), output.resolve()}
    return any(o == c or o in c.parents for o in output_forms for c in cwd_forms)


def _check_output(output: Path, force: bool, sweep_file: Path) -> None:
    """Refuse an output directory that --force would wrongly destroy, before any work is done."""
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
    from dsgen.output import check_directory_destination

    check_directory_destination(output, force=force)
    if not output.parent.is_dir():
        raise DsgenError(f"parent directory does not exist: {output.parent}")
    os.rmdir(tempfile.mkdtemp(prefix=f".{output.name}.probe-", dir=output.parent))  # writable? fail before solving


def _finish(rows: list[dict[str, Any]], output: Path | None, fail_on_infeasible: bool) -> None:
    ok = sum(r["status"] == "ok" for r in rows)
    infeasible = sum(r["status"] == "infeasible" for r in rows)
    where = f"; wrote {output}/" if output else " (dry run, nothing written)"
    typer.echo(f"sweep: {len(rows)} runs, {ok} feasible, {infeasible} infeasible{where}", err=output is None)
    if fail_on_infeasible and infeasible:
        raise typer.Exit(int(ExitCode.INFEASIBLE))


def _csv(rows: list[dict[str, Any]], varied_keys: tuple[str, ...]) -> str:
    fixed = [k for k in rows[0] if k not in ("vars", "files")] if rows else []
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["name", *varied_keys, *[k for k in fixed if k != "name"], "files"])
    for row in rows:
        varied = [
            json.dumps(row["vars"][k]) if not isinstance(row["vars"][k], str) else row["vars"][k] for k in varied_keys
        ]
        rest = ["" if row[k] is None else row[k] for k in fixed if k != "name"]
        writer.writerow([row["name"], *varied, *rest, ";".join(row["files"])])
    return buffer.getvalue()


def _table(outcomes: list[Any]) -> str:
    lines = [f"{'run':<40} {'status':<10} {'GPU GiB':>8} {'step s':>9}  plan"]
    for o in outcomes:
        e = o.evaluation
        gib = f"{e.memory.gpu.total / 2**30:.1f}" if e else "-"
        step = f"{e.step.total_s:.3f}" if e else "-"
        detail = e.plan.describe() if e and o.status == "ok" else (o.reason or "")
        lines.append(f"{o.run.name:<40} {o.status:<10} {gib:>8} {step:>9}  {detail}")
    return "\n".join(lines)


class _Progress:
    """A progress bar on a terminal; one plain line per run otherwise (logs, CI)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.tty = sys.stderr.isatty()

    def __call__(self, outcome: Any) -> None:
        self.done += 1
        if self.tty:
            filled = 30 * self.done // max(self.total, 1)
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {outcome.run.name[:40]:<40}"
            )
            sys.stderr.flush()
        else:
            sys.stderr.write(f"[{self.done}/{self.total}] {outcome.run.name}: {outcome.status}\n")

    def close(self) -> None:
        if self.tty and self.done:
            sys.stderr.write("\n")


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS = {"sweep": sweep}
