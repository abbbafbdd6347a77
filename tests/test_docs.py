"""The README and the docs pages run as written, and the spec reference is the schema's.

* Every ``dsgen`` line of a fenced ``bash`` block runs, top to bottom through its page, in a
  scratch directory holding a copy of ``examples/`` (so a later line may read what an earlier one
  wrote), and exits 0, or the code its comment states (``# exit 3``).
* Under a ``$ dsgen ...`` line of a plain fenced block, every line shown is printed (a line ending
  in ``...`` up to the cut; a line ``...`` alone marks lines left out); the command exits as above.
* ``docs/spec-keys.md`` is ``python -m dsgen.spec.reference``'s output for the committed schema.
* Every relative link of those pages names a file that exists; the README stays a front door.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from dsgen.spec.reference import COMMAND, spec_reference
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, REPO_ROOT

# The pages whose commands run here: the README and the docs pages written for it (issue 43). Pages
# with tests of their own (docs/validation.md, docs/doctor.md, ...) are not listed.
PAGES = (
    "README.md",
    "docs/cli.md",
    "docs/clusters.md",
    "docs/development.md",
    "docs/exit-codes.md",
    "docs/fine-tuning.md",
    "docs/github-action.md",
    "docs/how-dsgen-chooses.md",
    "docs/long-context.md",
    "docs/my-run-crashed.md",
    "docs/output-contract.md",
    "docs/reports.md",
    "docs/spec.md",
    "docs/sweeps.md",
    "docs/targets.md",
)

# ``dsgen`` lines that are shown but not run, each with its reason. Lines that do not start with
# ``dsgen`` (python3 -m venv ..., python -m dsgen ..., kubectl, cd ...) are not commands of this test:
# the README's set-up lines run in tests/test_ci_command.py and tests/test_packaging.py.
NOT_RUN = {
    "dsgen --install-completion": "installing completion edits the shell's rc file",
}

# Pages whose commands another test runs in order with more to check: not run twice.
RUN_ELSEWHERE = {
    "docs/cli.md": "tests/test_cli_conventions.py runs its command block in order, then its Python block",
    "README.md": "test_readme_runs_in_order_in_one_shell_after_its_set_up: a fresh copy, a real install",
}

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_EXIT = re.compile(r"\bexit (\d+)\b")


@dataclass
class Command:
    line: str  # as written (continuations joined)
    argv: list[str]
    exit_code: int
    shown: list[str] = field(default_factory=list)  # output lines a transcript shows under it


def _command(line: str) -> Command:
    comment = line.split("  #", 1)[1] if "  #" in line else ""
    found = _EXIT.search(comment)
    return Command(line, shlex.split(line, comments=True), int(found.group(1)) if found else 0)


def commands(page: str) -> list[Command]:
    """The page's ``dsgen`` commands in document order, with the output its transcripts show."""
    found: list[Command] = []
    for language, body in _FENCE.findall((REPO_ROOT / page).read_text(encoding="utf-8")):
        if language == "bash":
            for line in body.replace("\\\n", " ").splitlines():
                if line.startswith("dsgen ") and line.split("  #", 1)[0].strip() not in NOT_RUN:
                    found.append(_command(line))
        elif language == "":
            transcript: Command | None = None
            for line in body.splitlines():
                if line.startswith("$ "):
                    transcript = _command(line[2:]) if line.startswith("$ dsgen ") else None
                    if transcript is not None:
                        found.append(transcript)
                elif transcript is not None and line.strip():
                    transcript.shown.append(line)
    return found


def _run(command: Command, cwd: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = command.argv[1:]
    redirect = None
    if ">" in argv:  # dsgen schema spec > spec.schema.json
        redirect, argv = cwd / argv[argv.index(">") + 1], argv[: argv.index(">")]
    argv = [a for arg in argv for a in (sorted(glob.glob(arg)) or [arg] if "*" in arg else [arg])]
    result = run_cli(argv, capsys)
    assert result.exit_code == command.exit_code, (command.line, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, (command.line, result.stderr)
    if redirect is not None:
        redirect.write_text(result.stdout)
    printed = result.stdout.splitlines()
    for line in command.shown:
        if line.endswith("..."):
            assert any(p.startswith(line[:-3]) for p in printed), (command.line, line, result.stdout)
        else:
            assert line in printed, (command.line, line, result.stdout)


@pytest.mark.parametrize("page", [page for page in PAGES if page not in RUN_ELSEWHERE])
def test_every_command_of_the_page_runs_as_written(
    page: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(EXAMPLES_DIR, tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for command in commands(page):
        _run(command, tmp_path, capsys)


def test_the_pages_show_commands() -> None:
    """A page's commands are found (a changed fence or prompt would otherwise test nothing)."""
    counts = {page: len(commands(page)) for page in PAGES}
    assert counts["README.md"] >= 15, counts
    without = {"docs/development.md", "docs/exit-codes.md", "docs/github-action.md", "docs/output-contract.md"}
    assert all(counts[page] >= 1 for page in PAGES if page not in without), counts
    readme = commands("README.md")
    shown = {c.argv[1] for c in readme if c.shown}
    assert {"solve", "new", "doctor", "frontier", "sweep"} <= shown, shown
    assert any(c.argv[1:3] == ["solve", "tour/spec.yaml"] and "--target" in c.argv for c in readme)


def test_spec_keys_page_is_generated_from_the_schema() -> None:
    committed = (REPO_ROOT / "docs" / "spec-keys.md").read_text(encoding="utf-8")
    assert committed == spec_reference(), f"docs/spec-keys.md is stale: run {COMMAND}"


def test_spec_reference_lists_every_key_of_the_schema() -> None:
    """Each key of the schema (nested and shared definitions included) has a row with its
    description, so the page says everything an editor shows."""
    import json

    from dsgen.resources import schema_path

    schema = json.loads(schema_path("spec").read_text(encoding="utf-8"))
    page = spec_reference(schema)

    def rows(node: dict[str, object], prefix: str) -> list[tuple[str, str]]:
        found = []
        for key, child in node.get("properties", {}).items():  # type: ignore[attr-defined]
            found.append((f"{prefix}{key}", child["description"]))
            found += rows(child, f"{prefix}{key}.")
        return found

    keys = rows(schema, "")
    keys += rows(schema["$defs"]["architecture"], "model.architecture.")
    keys += rows(schema["$defs"]["gpu"], "hardware.gpu.")
    for key, description in keys:
        if "." in key:
            row = next((line for line in page.splitlines() if line.startswith(f"| `{key}`")), None)
            assert row is not None, key
            assert description.replace("|", "\\|") in row, key
    assert len(keys) > 100


def test_hf_config_description_names_every_model_type_read() -> None:
    """The model types listed for model.hf_config are the readers dsgen has, and its multimodal ones."""
    import json

    from dsgen.catalog.hf_config import SUPPORTED_MODEL_TYPES
    from dsgen.catalog.vision import _TOWERS
    from dsgen.resources import schema_path

    schema = json.loads(schema_path("spec").read_text(encoding="utf-8"))
    description = schema["properties"]["model"]["properties"]["hf_config"]["description"]
    listed = re.search(r"Read for model_type (.*?);", description)
    assert listed is not None
    assert listed.group(1).split(", ") == list(SUPPORTED_MODEL_TYPES)
    multimodal = re.search(r"\(([a-z0-9_, ]+)\) is read as that model", description)
    assert multimodal is not None and set(multimodal.group(1).split(", ")) == set(_TOWERS)


def test_spec_page_example_is_a_spec_dsgen_loads(tmp_path: Path) -> None:
    from dsgen.api import load_spec

    text = (REPO_ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    specs = [body for language, body in _FENCE.findall(text) if language == "yaml" and "\nmodel:" in body]
    assert specs
    for body in specs:
        (tmp_path / "spec.yaml").write_text(body)
        spec = load_spec(tmp_path / "spec.yaml")
        assert spec.model.name == "llama-3.1-8b"


def test_yaml_blocks_naming_an_example_show_that_example() -> None:
    """A YAML block whose first line names a bundled file (``# examples/sweep/sweep.yaml``) holds
    that file's content."""
    checked = 0
    for page in PAGES:
        for language, body in _FENCE.findall((REPO_ROOT / page).read_text(encoding="utf-8")):
            named = re.match(r"# (examples/\S+\.yaml)\n", body)
            if language == "yaml" and named:
                assert yaml.safe_load(body) == yaml.safe_load((REPO_ROOT / named.group(1)).read_text()), page
                checked += 1
    assert checked >= 1


@pytest.mark.parametrize("page", [*PAGES, "docs/spec-keys.md"])
def test_relative_links_name_files_that_exist(page: str) -> None:
    path = REPO_ROOT / page
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
        if "://" not in target:
            assert (path.parent / target).exists(), (page, target)


def test_readme_is_a_front_door() -> None:
    """Issue 43: short, what dsgen is for on the first screen, exactly two set-up commands."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 200, len(lines)
    first_screen = "\n".join(lines[:15])
    assert "does my run fit" in first_screen and "DeepSpeed config" in first_screen
    setup = readme.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    blocks = [body for language, body in _FENCE.findall(setup) if language == "bash"]
    assert len(blocks) == 2 and all(body.count("\n") == 1 for body in blocks), blocks
    install, test = (body.strip() for body in blocks)
    assert install == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -q . && dsgen new examples/llama-3.1-8b-8xh100.yaml"
    )
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test in ci


def _readme_install_command() -> str:
    setup = (REPO_ROOT / "README.md").read_text(encoding="utf-8").split("\n## Set up\n", 1)[1]
    return next(body for language, body in _FENCE.findall(setup) if language == "bash").strip()


def _fresh_copy(destination: Path) -> None:
    """What a fresh clone holds: the tracked files and those git does not ignore (a change not yet
    committed is tested too), without the checkout's virtual environment or build outputs."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


@pytest.mark.slow
def test_readme_runs_in_order_in_one_shell_after_its_set_up(tmp_path: Path) -> None:
    """Issue 48: a newcomer runs the first set-up command in a fresh clone, then every command of
    the README top to bottom in the same bash shell. Here: a fresh copy, the set-up command as
    written (a new virtual environment, a real ``pip install .``), then each ``dsgen`` command of
    the page in document order, with a ``PATH`` that has no dsgen on it until the set-up activates
    its environment. Each must exit as its comment says and print the lines its transcript shows."""
    import os
    import subprocess

    clone = tmp_path / "clone"
    _fresh_copy(clone)
    readme = commands("README.md")
    script = ["set -u", _readme_install_command() + " > setup.out 2>&1 || exit 90"]
    for index, command in enumerate(readme):
        line = command.line.split("  #", 1)[0].strip()
        script.append(f"{{ {line} ; }} > cmd{index}.out 2> cmd{index}.err; echo $? > cmd{index}.rc")
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(
        part for part in env.get("PATH", "").split(os.pathsep) if ".venv" not in part and not Path(part, "dsgen").exists()
    )
    ran = subprocess.run(["bash", "-c", "\n".join(script)], cwd=clone, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ((clone / "setup.out").read_text()[-3000:], ran.stderr[-2000:])
    for index, command in enumerate(readme):
        out = (clone / f"cmd{index}.out").read_text()
        err = (clone / f"cmd{index}.err").read_text()
        code = int((clone / f"cmd{index}.rc").read_text())
        assert code == command.exit_code, (command.line, out[-2000:], err[-2000:])
        assert "Traceback" not in err, (command.line, err)
        printed = out.splitlines()
        for shown in command.shown:
            if shown.endswith("..."):
                assert any(p.startswith(shown[:-3]) for p in printed), (command.line, shown, out)
            else:
                assert shown in printed, (command.line, shown, out)
    assert (clone / "ds_config.json").is_file()  # the set-up's own config, beside the tour's
    assert (clone / "tour" / "ds_config.json").is_file() and (clone / "tour" / "hf" / "launch.sh").is_file()
