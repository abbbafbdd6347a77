"""CI runs the README's set-up and test command verbatim, so what the README promises is what CI checks."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"this is what CI runs\):\n\n```bash\n(.+?)\n```", readme)
    assert match, "README: the test command block after 'this is what CI runs' is missing"
    command = match.group(1)
    assert "ruff check ." in command and ".venv/bin/mypy" in command and "pytest" in command
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci
