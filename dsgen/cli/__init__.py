"""The ``dsgen`` command line: a thin layer that parses arguments, calls the API and maps errors
to exit codes (0 ok, 1 findings, 2 bad input, 3 no feasible plan).

Commands are registered lazily. Typer inspects every registered command's signature (evaluating
its annotations) before it dispatches, and each command module imports what its commands need;
for ``dsgen new`` that was a quarter of the cold-start budget. So when the command line names a
command, only that command is built; ``dsgen``, ``dsgen --help`` and unknown names build them all,
so help and "No such command" behave as usual.
"""

from __future__ import annotations

import importlib
import sys

import typer

from dsgen.errors import DsgenError, ExitCode

HELP = "Solve, render and validate DeepSpeed configs from a hardware + model + training spec."

# Which module under dsgen.cli provides each command (each module's COMMANDS dict; a test checks
# that the two agree).
COMMAND_MODULES = {
    "new": "plan_cmd",
    "solve": "plan_cmd",
    "explain": "plan_cmd",
    "presets": "presets_cmd",
    "sweep": "sweep_cmd",
    "validate": "validate_cmd",
    "schema": "validate_cmd",
}


def _root() -> None:
    """The group callback: it does nothing, but keeps ``dsgen`` a command group (help: ``HELP``)."""


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The dsgen Typer app for this command line: only the named command, or every command.

    The root callback keeps the app a command group even when it holds a single command, so
    ``dsgen new SPEC`` parses the same whichever way the app was built.
    """
    app = typer.Typer(
        name="dsgen",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback(no_args_is_help=True)(_root)
    wanted = argv[0] if argv and argv[0] in COMMAND_MODULES else None
    module_names = [COMMAND_MODULES[wanted]] if wanted else list(dict.fromkeys(COMMAND_MODULES.values()))
    for module_name in module_names:
        module = importlib.import_module(f"dsgen.cli.{module_name}")
        for name, command in module.COMMANDS.items():
            if wanted is None or name == wanted:
                app.command(name)(command)
    return app


def main() -> None:
    """Console entry point: run the app, turning :class:`DsgenError` into a message and exit code.

    Usage errors (unknown option, missing argument) are reported by typer itself with exit code 2;
    typer.Exit carries the command's own exit code.
    """
    debug = "--debug" in sys.argv[1:]  # any unexpected exception: its traceback instead of one line
    if debug:
        sys.argv = [arg for arg in sys.argv if arg != "--debug"]
    try:
        build_app(sys.argv[1:])()
    except DsgenError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        sys.exit(int(exc.exit_code))
    except Exception as exc:  # a bug in dsgen, not the user's mistake: one line, its own exit code
        if debug:
            raise
        detail = " ".join(str(exc).split())[:200]
        print(
            f"error: internal error: {type(exc).__name__}{': ' + detail if detail else ''} "
            f"(a bug in dsgen; rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        sys.exit(int(ExitCode.INTERNAL))
