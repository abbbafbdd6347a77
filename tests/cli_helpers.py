"""Run the real CLI entry point in-process and capture what a user would see."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from dsgen.cli import main


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> CliResult:
    """Invoke ``dsgen ARGS`` exactly as the console script does (sys.argv + main())."""
    capsys.readouterr()  # drop anything printed before the command (e.g. by importing DeepSpeed)
    old_argv = sys.argv
    sys.argv = ["dsgen", *args]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
    out, err = capsys.readouterr()
    return CliResult(code, out, err)
