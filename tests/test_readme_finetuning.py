"""docs/fine-tuning.md (the README's Fine-tuning section until issue 43) runs as written: each
``$ dsgen ...`` command it shows prints the lines shown under it (a line cut with ``...`` matches up
to the cut)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from tests.cli_helpers import run_cli


def _shown() -> list[tuple[str, list[str]]]:
    section = (REPO_ROOT / "docs" / "fine-tuning.md").read_text(encoding="utf-8")
    shown: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                shown.append((line[2:], []))
            elif shown and line.strip():
                shown[-1][1].append(line)
    return shown


def test_the_section_shows_commands() -> None:
    assert len(_shown()) >= 4


@pytest.mark.parametrize(("command", "lines"), _shown(), ids=[c for c, _ in _shown()])
def test_each_command_prints_what_the_page_shows(
    command: str, lines: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO_ROOT)
    argv = shlex.split(command)
    assert argv[0] == "dsgen"
    if "-o" in argv:  # write where the test may
        argv[argv.index("-o") + 1] = str(tmp_path / "out")
    result = run_cli(argv[1:], capsys)
    out = result.stdout
    assert result.exit_code == 0, out + result.stderr
    printed = out.splitlines()
    for line in lines:
        if line.endswith("..."):
            prefix = line[:-3]
            assert any(p.startswith(prefix) for p in printed), (line, out)
        else:
            assert line in printed, (line, out)
