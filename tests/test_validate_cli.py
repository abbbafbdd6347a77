"""``dsgen validate`` / ``dsgen schema`` through a throwaway Typer app, and the three output formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from dsgen.cli.validate_cmd import register
from dsgen.resources import schema_path
from dsgen.validate.findings import Finding, Report
from dsgen.validate.report import FileResult, render_github, render_human, render_json
from tests.conftest import REPO_ROOT

GOOD = '{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}'
WARN = '{"train_batch_size": 16, "train_micro_batch_size_per_gpus": 2}'
BAD = '{\n  // comment\n  "train_batch_size": 16,\n  "fp16": {"enabled": true},\n  "bf16": {"enabled": true},\n}'


@pytest.fixture
def app() -> typer.Typer:
    application = typer.Typer()
    register(application)
    return application


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, text in (("good", GOOD), ("warn", WARN), ("bad", BAD), ("broken", '{"a": 1,,}')):
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        out[name] = path
    return out


def invoke(app: typer.Typer, *args: str | Path):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_exit_codes(app: typer.Typer, files: dict[str, Path]) -> None:
    assert invoke(app, "validate", files["good"]).exit_code == 0
    assert invoke(app, "validate", files["warn"]).exit_code == 0  # warnings are allowed
    assert invoke(app, "validate", files["warn"], "--strict").exit_code == 1
    assert invoke(app, "validate", files["bad"]).exit_code == 1
    assert invoke(app, "validate", files["broken"]).exit_code == 2
    assert invoke(app, "validate", files["good"], files["broken"], files["bad"]).exit_code == 2
    assert invoke(app, "validate", files["good"].parent / "missing.json").exit_code == 2


def test_human_output(app: typer.Typer, files: dict[str, Path]) -> None:
    result = invoke(app, "validate", files["bad"], files["warn"], files["broken"])
    out = result.output
    assert (
        f"{files['bad']}:5:12: error: bfloat16 and fp16 modes cannot be simultaneously enabled [fp16-bf16-both]" in out
    )
    assert f"{files['warn']}:1:26: warning: unknown key 'train_micro_batch_size_per_gpus'" in out
    assert "hint: did you mean train_micro_batch_size_per_gpu?" in out
    assert f"{files['broken']}:1:9: invalid JSON" in out
    assert out.rstrip().endswith("checked 3 files: 1 error, 1 warning, 1 unreadable")


def test_json_output_for_many_files(app: typer.Typer, files: dict[str, Path]) -> None:
    result = invoke(app, "validate", files["good"], files["bad"], files["broken"], "--json", "--world-size", "8")
    document = json.loads(result.stdout)
    assert document["format_version"] == 1 and document["ok"] is False
    assert document["summary"] == {"files": 3, "errors": 1, "warnings": 0, "unreadable": 1}
    good, bad, broken = document["files"]
    assert good["ok"] and good["settings"]["world_size"] == 8 and good["findings"] == []
    (finding,) = bad["findings"]
    assert finding == {
        "severity": "error",
        "rule_id": "fp16-bf16-both",
        "pointer": "/bf16/enabled",
        "message": "bfloat16 and fp16 modes cannot be simultaneously enabled",
        "hint": finding["hint"],
        "line": 5,
        "column": 12,
        "phase": "config",
    }
    assert "invalid JSON" in broken["load_error"]
    assert result.exit_code == 2


def test_github_annotations(app: typer.Typer, files: dict[str, Path]) -> None:
    out = invoke(app, "validate", files["bad"], "--format", "github").stdout.splitlines()
    assert out == [
        f"::error file={files['bad']},line=5,col=12,title=dsgen fp16-bf16-both::bfloat16 and fp16 modes "
        "cannot be simultaneously enabled (hint: enable bf16 on Ampere or newer GPUs, fp16 on Volta/Turing; "
        "disable the other)"
    ]


def test_options_change_the_verdict(app: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "auto.json"
    path.write_text('{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}')
    assert invoke(app, "validate", path).exit_code == 1
    assert invoke(app, "validate", path, "--target", "hf-trainer").exit_code == 0
    legacy = tmp_path / "legacy.json"
    legacy.write_text('{"train_batch_size": 8, "amp": {"enabled": true}}')
    assert invoke(app, "validate", legacy).exit_code == 1
    assert invoke(app, "validate", legacy, "--deepspeed-version", "0.16").exit_code == 0
    batch = tmp_path / "batch.json"
    batch.write_text('{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}')
    assert invoke(app, "validate", batch, "--world-size", "8").exit_code == 0
    assert invoke(app, "validate", batch, "--world-size", "16").exit_code == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--target", "slurm"],
        ["--deepspeed-version", "0.10"],
        ["--world-size", "0"],
        ["--format", "xml"],
        ["--world-size", "eight"],
    ],
)
def test_bad_flags_exit_2_without_traceback(app: typer.Typer, files: dict[str, Path], args: list[str]) -> None:
    result = invoke(app, "validate", files["good"], *args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_no_files_is_a_usage_error(app: typer.Typer) -> None:
    assert invoke(app, "validate").exit_code == 2


def test_schema_command(app: typer.Typer) -> None:
    result = invoke(app, "schema", "deepspeed")
    assert result.exit_code == 0
    assert json.loads(result.stdout) == json.loads(schema_path("deepspeed").read_text())
    assert invoke(app, "schema", "nonsense").exit_code == 2
    for name in ("spec", "sweep"):  # written by the lead; printed when present, exit 2 otherwise
        result = invoke(app, "schema", name)
        assert result.exit_code == (0 if schema_path(name).exists() else 2)


# -- renderers on hand-made reports -----------------------------------------------------------
def _report() -> Report:
    return Report(
        findings=[
            Finding("error", "batch-mismatch", "/train_batch_size", "50% off: a,b\nnext", "fix, it", 3, 7, "config"),
            Finding("warning", "ignored-key", "/foo", "unknown key", None, None, None, "lint"),
        ],
        source="a:b.json",
    )


def test_renderers_escape_and_locate() -> None:
    results = [
        FileResult("a:b.json", report=_report()),
        FileResult("x.json", error="x.json:2:1: invalid JSON: oops", error_line=2),
    ]
    github = render_github(results).splitlines()
    assert github[0] == (
        "::error file=a%3Ab.json,line=3,col=7,title=dsgen batch-mismatch::50%25 off: a,b%0Anext (hint: fix, it)"
    )
    assert github[1] == "::warning file=a%3Ab.json,title=dsgen ignored-key::unknown key"
    assert github[2] == "::error file=x.json,line=2,title=dsgen::x.json:2:1: invalid JSON: oops"
    human = render_human(results)
    assert "a:b.json: warning: unknown key (at /foo) [ignored-key]" in human
    assert json.loads(render_json(results))["summary"] == {"files": 2, "errors": 1, "warnings": 1, "unreadable": 1}


def test_clean_summary() -> None:
    assert render_human([FileResult("ok.json", report=Report(source="ok.json"))]) == "checked 1 file: no problems found"


# -- packaging -----------------------------------------------------------------------------------
def test_pre_commit_hook_definition() -> None:
    (hook,) = yaml.safe_load((REPO_ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "dsgen-validate" and hook["entry"] == "dsgen validate" and hook["language"] == "python"
    import re

    pattern = re.compile(hook["files"])
    for name in ("ds_config.json", "configs/ds_config_zero3.json", "deepspeed.json", "scripts/zero2.json"):
        assert pattern.search(name), name
    for name in ("package.json", "tsconfig.json", "ds_config.yaml"):
        assert not pattern.search(name), name


def test_importing_the_validator_is_cheap() -> None:
    """dsgen new imports dsgen.validate at start-up: no jsonschema, deepspeed, torch or typer."""
    code = (
        "import sys, dsgen.validate; heavy = {'jsonschema', 'deepspeed', 'torch', 'typer', 'pydantic'};"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.strip() == "[]"
