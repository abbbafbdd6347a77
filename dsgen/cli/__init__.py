"""The ``dsgen`` command line: a thin layer that parses arguments, calls the API and maps errors
to exit codes (0 ok, 1 findings, 2 bad input, 3 no feasible plan, 141 the reader of stdout left).

Commands are registered lazily. Typer inspects every registered command's signature (evaluating
its annotations) before it dispatches, and each command module imports what its commands need.
So when the command line names a command, only that command is built; ``dsgen``, ``dsgen -h``,
``--version``, shell completion and unknown names build them all, so help, completion and "No
such command" behave as usual. Typer's own ``--install-completion``/``--show-completion`` are
root options, so they are added only to that full app.

No ``from __future__ import annotations``: typer reads the root callback's signature on every
start, and annotations that are already objects save it compiling each string again.

May import :mod:`dsgen.api` and everything below it; nothing imports it. ``lint-imports`` holds
every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""

import atexit
import functools
import gc
import importlib
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from dsgen.errors import DsgenError, ExitCode

HELP = "Solve, render and validate DeepSpeed configs from a hardware + model + training spec."

# Which module under dsgen.cli provides each command (each module's COMMANDS dict; a test checks
# that the two agree).
COMMAND_MODULES = {
    "init": "init_cmd",
    "new": "plan_cmd",
    "solve": "plan_cmd",
    "explain": "plan_cmd",
    "presets": "presets_cmd",
    "sweep": "sweep_cmd",
    "validate": "validate_cmd",
    "schema": "validate_cmd",
    "doctor": "doctor_cmd",
    "frontier": "frontier_cmd",
}

# Every command, and the group, take -h as well as --help.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def _print_version(value: bool) -> None:
    if value:
        from dsgen import __version__

        typer.echo(f"dsgen {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print dsgen's version and exit.", is_eager=True, callback=_print_version),
    ] = False,
) -> None:
    """The group callback: it does nothing, but keeps ``dsgen`` a command group (help: ``HELP``)."""


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot fail a second time."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real stream (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _reader_gone_is_quiet(command: Callable[..., Any]) -> Callable[..., Any]:
    """Make a closed stdout (``dsgen solve ... | head -1``) end the command quietly with 141.

    Left to itself, typer reports EPIPE as exit 1, dsgen's code for validation findings. 141 is
    what a shell reports for a program killed by SIGPIPE (128 + 13), as ``cat`` or ``grep`` are
    in the same pipeline, so ``set -o pipefail`` scripts see dsgen behave like any other tool.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(int(ExitCode.READER_GONE)) from None

    return run


def build_app(argv: list[str] | None = None) -> typer.Typer:
    """The dsgen Typer app for this command line: only the named command, or every command.

    The root callback keeps the app a command group even when it holds a single command, so
    ``dsgen new SPEC`` parses the same whichever way the app was built.
    """
    wanted = argv[0] if argv and argv[0] in COMMAND_MODULES else None
    app = typer.Typer(
        name="dsgen",
        help=HELP,
        no_args_is_help=True,
        add_completion=wanted is None,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings=CONTEXT_SETTINGS,
    )
    app.callback(no_args_is_help=True)(_root)
    module_names = [COMMAND_MODULES[wanted]] if wanted else list(dict.fromkeys(COMMAND_MODULES.values()))
    for module_name in module_names:
        module = importlib.import_module(f"dsgen.cli.{module_name}")
        for name, command in module.COMMANDS.items():
            if wanted is None or name == wanted:
                app.command(name)(_reader_gone_is_quiet(command))
    return app


def main() -> None:
    """Console entry point: run the app, turning :class:`DsgenError` into a message and exit code.

    Usage errors (unknown option, missing argument) are reported by typer itself with exit code 2;
    typer.Exit carries the command's own exit code. Output still buffered when the command returns
    is flushed here, so a reader that went away at the very end (``| head -1``) also ends in 141.
    """
    _skip_the_collector_at_exit()
    try:
        _main()
    except SystemExit as exc:
        if not _stdout_flushed() and not exc.code:
            raise SystemExit(int(ExitCode.READER_GONE)) from None
        raise
    if not _stdout_flushed():
        sys.exit(int(ExitCode.READER_GONE))


@functools.cache
def _skip_the_collector_at_exit() -> None:
    """Freeze the heap when the interpreter exits, so its finalization skips the collector.

    Python's finalization runs the cyclic collector over every object still alive (about 30,000
    after a ``dsgen new``: the modules, their functions and classes) only to free memory the
    operating system is about to take back; that was about 55 ms of a 480 ms cold ``dsgen new``
    (docs/start-up.md). ``gc.freeze`` moves them out of the collector's sight. Registered with
    ``atexit``, it runs after the command, after stdout is flushed and files are closed, and the
    other exit handlers still run; only the collector's passes are skipped. Registered once per
    process, however often ``main`` is called in it.
    """
    atexit.register(gc.freeze)


def _stdout_flushed() -> bool:
    """Flush stdout; False (and stdout pointed at /dev/null) when its reader has gone away."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _silence_stdout()
        return False
    return True


def _main() -> None:
    debug = "--debug" in sys.argv[1:]  # any unexpected exception: its traceback instead of one line
    if debug:
        sys.argv = [arg for arg in sys.argv if arg != "--debug"]
    try:
        build_app(sys.argv[1:])(prog_name="dsgen")
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
