"""``dsgen frontier``: the largest sequence (or micro-batch) that fits, per GPU count.

No ``from __future__ import annotations`` here: typer reads these signatures on every start.
"""

import json
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from dsgen.errors import DsgenError, ExitCode


class Over(str, Enum):
    sequence_length = "sequence_length"
    micro_batch_size = "micro_batch_size"


def _gpu_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or any(count < 1 for count in counts):
        raise DsgenError(f"must be a comma-separated list of positive GPU counts, got {text!r}", path="--gpus")
    return counts


def frontier(
    spec_file: Annotated[Path, typer.Argument(help="The spec YAML file.", show_default=False, metavar="SPEC")],
    over: Annotated[
        Over, typer.Option("--over", help="What to push: sequence_length (default) or micro_batch_size.", metavar="KEY")
    ] = Over.sequence_length,
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="GPU counts to search, e.g. 1,8,16,32,64 (default: the spec's).", metavar="LIST"),
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Override a spec key (repeatable).", metavar="KEY=VALUE"),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="Price every point for this target's training loop, as `dsgen new --target` does (default: output.target).",
            metavar="TARGET",
        ),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html", help="Also write the curve and each point's plan as one self-contained HTML page.", metavar="FILE"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="Also draw the curve to FILE.svg or FILE.png (needs dsgen[plot]).", metavar="FILE"),
    ] = None,
) -> None:
    """Find the largest sequence length (or micro-batch) that fits, by bisection over the solver.
    Exit 3 when not even the smallest value fits on any GPU count."""
    from dsgen.api import frontier_of, frontier_report, load_spec, spec_for_target
    from dsgen.reporting.frontier_report import frontier_dict, frontier_table, write_plot

    counts = _gpu_counts(gpus) if gpus is not None else None
    points = frontier_of(spec_for_target(load_spec(spec_file, overrides or []), target), over.value, counts)
    if plot is not None:
        write_plot(points, over.value, plot)
    if html is not None:
        frontier_report(points, over.value, spec_file.name, html)
    if as_json:
        typer.echo(json.dumps(frontier_dict(points, over.value, with_points=counts is not None), indent=2))
    else:
        typer.echo(frontier_table(points, over.value))
        for written in (plot, html):
            if written is not None:
                typer.echo(f"wrote {written}")
    if all(point.value is None for point in points):
        raise typer.Exit(int(ExitCode.INFEASIBLE))


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS: dict[str, Callable[..., None]] = {"frontier": frontier}
