"""The value lists of dsgen's enumerated fields agree wherever else they are spelled out.

``dsgen.vocabulary`` is the one source inside the code; the spec schema (which editors read), the
CLI's choices and the validation rules spell the same values for their own consumers, and the
output contract keeps its two public checkpointing booleans.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dsgen.api import load_spec, solve_spec
from dsgen.cli.plan_cmd import Accounting as AccountingChoice
from dsgen.intake.loader import CHECKPOINTING_PINS
from dsgen.reporting.report import result_dict
from dsgen.resources import schema_path
from dsgen.validate.rules.catalogue import RULES
from dsgen.vocabulary import ACCOUNTINGS, CHECKPOINTING_MODES, OFFLOAD_DEVICES, PHASES, PRECISION_CHOICES, SEVERITIES
from tests.conftest import EXAMPLES_DIR


def _spec_schema_properties() -> dict:
    return json.loads(schema_path("spec").read_text(encoding="utf-8"))["properties"]


def test_spec_schema_spells_the_vocabulary() -> None:
    props = _spec_schema_properties()
    assert tuple(props["training"]["properties"]["precision"]["enum"]) == PRECISION_CHOICES
    for key in ("offload_optimizer", "offload_param"):
        assert tuple(props["constraints"]["properties"][key]["enum"]) == ("auto", *OFFLOAD_DEVICES)


def test_every_checkpointing_mode_has_a_spec_spelling() -> None:
    # the spec keeps its user-facing values (false | selective | true); each maps to one mode
    assert set(CHECKPOINTING_PINS) == {False, "selective", True}
    assert sorted(CHECKPOINTING_PINS.values()) == sorted(CHECKPOINTING_MODES)


def test_cli_accounting_choices_are_the_vocabulary() -> None:
    assert tuple(choice.value for choice in AccountingChoice) == ACCOUNTINGS


def test_validation_rules_use_the_vocabulary() -> None:
    import dsgen.validate.validator  # noqa: F401 - registers every rule

    assert RULES
    assert {info.severity for info in RULES.values()} <= set(SEVERITIES)
    assert {info.phase for info in RULES.values()} <= set(PHASES)


@pytest.mark.parametrize(
    ("pin", "activation_checkpointing", "selective_recompute"),
    [("none", False, False), ("selective", False, True), ("full", True, False)],
)
def test_output_contract_checkpointing_booleans(
    pin: str, activation_checkpointing: bool, selective_recompute: bool
) -> None:
    """docs/output-contract.md, "The plan": plan.activation_checkpointing (every layer recomputed) and
    plan.selective_recompute (attention only) stay two booleans."""
    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    spec = replace(spec, constraints=replace(spec.constraints, activation_checkpointing=pin))
    spec = replace(spec, training=replace(spec.training, attention="eager"))
    plan = result_dict(solve_spec(spec))["plan"]
    assert plan["activation_checkpointing"] is activation_checkpointing
    assert plan["selective_recompute"] is selective_recompute
