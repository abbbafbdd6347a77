"""``dsgen validate`` (lint DeepSpeed JSON configs) and ``dsgen schema`` (print a shipped schema).

Exit codes: 0 no errors (warnings allowed), 1 errors found, 2 bad input or usage (unreadable file,
invalid JSON, bad option value). Never a traceback. Where the messages go:

* usage errors (an unknown --format or --target, a bad --world-size, no files, a --spec that
  does not load) stop the command before any file is read: one ``error: ...`` line on stderr;
* a file that cannot be read or parsed is part of the report, on stdout, in the chosen format (a
  line in the human report, ``load_error`` in JSON, an ``::error`` annotation for GitHub). With
  many files, one bad file must not hide the others' results, and ``--json`` readers must find
  every file's status in the one document they parse. The exit code is still 2.

Heavy imports happen inside the commands so registering them costs nothing at CLI start-up.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from dsgen.errors import ExitCode

SCHEMA_NAMES = ("deepspeed", "spec", "sweep")


def register(app: typer.Typer) -> None:
    """Add this module's commands to ``app``."""
    for name, command in COMMANDS.items():
        app.command(name)(command)


def _fail(message: str) -> typer.Exit:
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(int(ExitCode.BAD_INPUT))


def validate(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="DeepSpeed config files (JSON; // and # comments and "
            "trailing commas are accepted, as DeepSpeed does).",
            show_default=False,
            metavar="CONFIG...",
        ),
    ],
    world_size: Annotated[
        int | None,
        typer.Option("--world-size", help="Also check the batch keys for this many data-parallel ranks.", metavar="N"),
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            "--target",
            help='Launcher that fills "auto" values: deepspeed, hf-trainer, accelerate, lightning, trl or llamafactory.',
            metavar="TARGET",
        ),
    ] = "deepspeed",
    deepspeed_version: Annotated[
        str,
        typer.Option(
            "--deepspeed-version",
            help="DeepSpeed release to check against, e.g. 0.16.9 (read with the nearest parser profile: 0.14, 0.16 or 0.19).",
            metavar="VERSION",
        ),
    ] = "0.19",
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings (e.g. ignored keys) as errors.")] = False,
    fmt: Annotated[
        str, typer.Option("--format", help="Output format: human, json or github.", metavar="FORMAT")
    ] = "human",
    as_json: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    spec: Annotated[
        Path | None,
        typer.Option(
            "--spec",
            help="A dsgen spec whose training method (LoRA/QLoRA/freeze, objective, reference model, "
            "generation) adds the fine-tuning rules.",
            metavar="SPEC",
        ),
    ] = None,
) -> None:
    """Lint DeepSpeed configs: the full DeepSpeed schema plus the cross-field rules DeepSpeed misses."""
    from dsgen.errors import DsgenError
    from dsgen.facts.release import normalize_version
    from dsgen.validate import TARGETS, validate_file
    from dsgen.validate.report import FORMATS, FileResult, render

    fmt = "json" if as_json else fmt
    if fmt not in FORMATS:
        raise _fail(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if target not in TARGETS:
        raise _fail(f"unknown --target {target!r}; choose one of {', '.join(TARGETS)}")
    if world_size is not None and world_size < 1:
        raise _fail(f"--world-size must be a positive integer, got {world_size}")
    try:
        version = normalize_version(deepspeed_version)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if not files:
        raise _fail("no config files given")
    method = None
    if spec is not None:
        from dsgen.api import training_method

        try:
            method = training_method(spec)
        except DsgenError as exc:
            raise _fail(exc.render()) from None

    results: list[FileResult] = []
    for path in files:
        try:
            report = validate_file(
                path, world_size=world_size, target=target, deepspeed_version=version, strict=strict, method=method
            )
        except DsgenError as exc:
            text = exc.message + (f"\n    hint: {exc.hint}" if exc.hint else "")
            results.append(FileResult(str(path), error=text, error_line=getattr(exc, "line", None)))
        else:
            results.append(FileResult(str(path), report=report))

    output = render(results, fmt)
    if output:
        typer.echo(output)
    if any(r.error is not None for r in results):
        raise typer.Exit(int(ExitCode.BAD_INPUT))
    if any(not r.report.ok for r in results if r.report is not None):
        raise typer.Exit(int(ExitCode.FINDINGS))


def schema(
    name: Annotated[str, typer.Argument(help="Which schema: deepspeed, spec or sweep.", metavar="NAME")] = "deepspeed",
) -> None:
    """Print a JSON Schema shipped with dsgen (for editors and other tools)."""
    from dsgen.resources import schema_path

    if name not in SCHEMA_NAMES:
        raise _fail(f"unknown schema {name!r}; choose one of {', '.join(SCHEMA_NAMES)}")
    try:
        text = schema_path(name).read_text(encoding="utf-8")
    except (OSError, FileNotFoundError):
        raise _fail(f"the {name} schema is not available in this installation") from None
    typer.echo(text, nl=not text.endswith("\n"))


# The commands this module provides, by the name users type (dsgen.cli registers them lazily).
COMMANDS: dict[str, Callable[..., None]] = {"validate": validate, "schema": schema}
