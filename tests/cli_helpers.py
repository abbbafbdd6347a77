"""Run the real CLI entry point in-process and capture what a user would see."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def sweep_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], base: Path, key: str, values: str
) -> list[dict[str, Any]]:
    """``dsgen sweep`` over one spec key (``values`` a YAML list) on ``base``: the manifest's rows,
    each run's files under ``tmp_path / "out" / <name>``."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f'base: {base}\nname: "run-{{{{ {key} }}}}"\ngrid:\n  {key}: {values}\n')
    out = tmp_path / "out"
    assert run_cli(["sweep", str(sweep), "-o", str(out)], capsys).exit_code == 0
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
