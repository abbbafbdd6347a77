"""Each command loads only what it runs (issue 20): start-up time is paid per module imported.

Every case starts a fresh interpreter (imports are cached for the life of a process), runs the
command through ``dsgen.cli.main`` and reports which of the watched packages it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES_DIR

SPEC = str(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
WATCHED = (
    "jinja2",
    "jsonschema",
    "dsgen.sweeps.runner",
    "dsgen.sweeps.output",
    "dsgen.sweeps.name_template",
    "dsgen.search.solver",
    "dsgen.targets.render",
)

_PROBE = """
import contextlib, io, json, sys
args, watched = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["dsgen", *args]
from dsgen.cli import main
code = None
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main()
    except SystemExit as exit:
        code = exit.code
loaded = sorted(w for w in watched if any(m == w or m.startswith(w + ".") for m in sys.modules))
print(json.dumps({"code": code, "loaded": loaded}))
"""


def _loaded(args: list[str], cwd: Path) -> tuple[int, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(WATCHED)],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["code"], set(out["loaded"])


@pytest.mark.parametrize(
    ("args", "never"),
    [
        (
            ["solve", SPEC, "--json"],
            {
                "jinja2",
                "dsgen.sweeps.runner",
                "dsgen.sweeps.output",
                "dsgen.sweeps.name_template",
                "dsgen.targets.render",
            },
        ),
        (["explain", SPEC], {"jinja2", "dsgen.sweeps.runner", "dsgen.sweeps.name_template", "dsgen.targets.render"}),
        (
            ["presets", "gpus"],
            {
                "jinja2",
                "dsgen.sweeps.runner",
                "dsgen.sweeps.name_template",
                "dsgen.search.solver",
                "dsgen.targets.render",
            },
        ),
        (
            ["schema", "spec"],
            {
                "jinja2",
                "dsgen.sweeps.runner",
                "dsgen.sweeps.name_template",
                "dsgen.search.solver",
                "dsgen.targets.render",
            },
        ),
    ],
)
def test_a_command_loads_none_of_what_it_does_not_run(args: list[str], never: set[str], tmp_path: Path) -> None:
    code, loaded = _loaded(args, tmp_path)
    assert code in (0, None)
    assert loaded.isdisjoint(never), loaded & never


def test_validate_loads_no_solver(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}))
    code, loaded = _loaded(["validate", str(config), "--world-size", "8"], tmp_path)
    assert code in (0, 1, None)
    assert "dsgen.search.solver" not in loaded and "jinja2" not in loaded


@pytest.mark.parametrize("command", ["new", "solve", "validate"])
def test_a_valid_document_never_imports_jsonschema(command: str, tmp_path: Path) -> None:
    """jsonschema-rs passes it (dsgen/intake/schema_gate.py); jsonschema is imported only to explain a failure."""
    if command == "validate":
        config = tmp_path / "ds_config.json"
        config.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1}))
        args = ["validate", str(config), "--world-size", "8"]
    else:
        args = [command, SPEC] + (["-o", str(tmp_path / "ds.json")] if command == "new" else [])
    code, loaded = _loaded(args, tmp_path)
    assert code in (0, None)
    assert "jsonschema" not in loaded


def test_an_invalid_document_is_explained_by_jsonschema(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": "eight"}))
    code, loaded = _loaded(["validate", str(config), "--world-size", "8"], tmp_path)
    assert code == 1
    assert "jsonschema" in loaded


def test_the_probe_sees_what_a_command_does_load(tmp_path: Path) -> None:
    """``new`` renders through Jinja2: the probe must report it, or the cases above prove nothing."""
    code, loaded = _loaded(["new", SPEC, "-o", str(tmp_path / "ds.json")], tmp_path)
    assert code in (0, None)
    assert {"jinja2", "dsgen.targets.render", "dsgen.search.solver"} <= loaded
