"""The lazily built command line behaves like the full one: same commands, same help, same parsing."""

from __future__ import annotations

import importlib

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from dsgen.cli import COMMAND_MODULES, build_app
from tests.cli_helpers import run_cli


def _command_names(app) -> list[str]:
    return sorted(get_command(app).commands)  # type: ignore[attr-defined]


def test_every_command_module_declares_exactly_the_commands_the_dispatcher_maps() -> None:
    declared: dict[str, str] = {}
    for module_name in set(COMMAND_MODULES.values()):
        module = importlib.import_module(f"dsgen.cli.{module_name}")
        for name in module.COMMANDS:
            declared[name] = module_name
    assert declared == COMMAND_MODULES


def test_naming_a_command_builds_only_that_command() -> None:
    assert _command_names(build_app(["new", "spec.yaml"])) == ["new"]
    assert _command_names(build_app(["validate"])) == ["validate"]


@pytest.mark.parametrize("argv", [[], ["--help"], ["no-such-command"]])
def test_help_and_unknown_names_build_every_command(argv: list[str]) -> None:
    assert _command_names(build_app(argv)) == sorted(COMMAND_MODULES)


@pytest.mark.parametrize("command", sorted(COMMAND_MODULES))
def test_help_of_a_command_is_the_same_in_the_lazy_and_the_full_app(command: str) -> None:
    runner = CliRunner()
    lazy = runner.invoke(build_app([command]), [command, "--help"], prog_name="dsgen")
    full = runner.invoke(build_app([]), [command, "--help"], prog_name="dsgen")
    assert lazy.exit_code == full.exit_code == 0
    assert lazy.output == full.output
    assert "Usage: dsgen " + command in lazy.output


def test_no_arguments_prints_every_command_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli([], capsys)
    assert result.exit_code == 2
    listing = result.stdout + result.stderr
    for name in COMMAND_MODULES:
        assert f"  {name} " in listing


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["sovle"], capsys)
    assert result.exit_code == 2
    assert "No such command 'sovle'" in result.stderr
