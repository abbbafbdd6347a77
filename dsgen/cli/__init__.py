"""The ``dsgen`` command line: a thin layer that parses arguments, calls the API and maps errors
to exit codes (0 ok, 1 findings, 2 bad input, 3 no feasible plan)."""

from __future__ import annotations

import sys

import typer

from dsgen.cli import plan_cmd, presets_cmd, sweep_cmd, validate_cmd
from dsgen.errors import DsgenError

app = typer.Typer(
    name="dsgen",
    help="Solve, render and validate DeepSpeed configs from a hardware + model + training spec.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
plan_cmd.register(app)
presets_cmd.register(app)
sweep_cmd.register(app)
validate_cmd.register(app)


def main() -> None:
    """Console entry point: run the app, turning :class:`DsgenError` into a message and exit code.

    Usage errors (unknown option, missing argument) are reported by typer itself with exit code 2;
    typer.Exit carries the command's own exit code.
    """
    try:
        app()
    except DsgenError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        sys.exit(int(exc.exit_code))
