"""dsgen's small schema interpreter agrees with the reference jsonschema implementation on the
spec and sweep schemas, for valid documents and for mutated (mostly invalid) ones."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.resources import schema_path
from dsgen.spec.schema_lite import LiteValidator
from tests.spec_strategies import specs

SPEC_SCHEMA = json.loads(schema_path("spec").read_text())
SWEEP_SCHEMA = json.loads(schema_path("sweep").read_text())

ODD_VALUES = [None, True, False, 0, -1, 1.5, 0.0, 2**40, "", "x", "auto", "bf16", [], [1], {}, {"a": 1}, 1e-9, 3, 8]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*path, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid document with a few random edits: values replaced, keys added or deleted."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(_paths(doc)))
        parent: Any = doc
        for part in target[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if not target:
            continue
        if action == "replace":
            parent[target[-1]] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif action == "delete" and isinstance(parent, dict):
            del parent[target[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["bogus", "name", "nodes", "preset", "memory_gib"]))] = draw(
                st.sampled_from(ODD_VALUES)
            )
    return doc


def _agree(schema: dict[str, Any], doc: Any) -> None:
    reference = jsonschema.Draft202012Validator(schema).is_valid(doc)
    assert LiteValidator(schema).is_valid(doc) == reference, json.dumps(doc)


SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(doc=specs())
def test_agrees_on_valid_specs(doc: dict[str, Any]) -> None:
    _agree(SPEC_SCHEMA, doc)
    assert LiteValidator(SPEC_SCHEMA).is_valid(doc)


@SETTINGS
@given(doc=mutated(specs()))
def test_agrees_on_mutated_specs(doc: dict[str, Any]) -> None:
    _agree(SPEC_SCHEMA, doc)


sweeps = st.fixed_dictionaries(
    {
        "base": st.one_of(st.just("base.yaml"), specs()),
        "name": st.just("{{ index }}"),
        "grid": st.dictionaries(
            st.sampled_from(["training.sequence_length", "hardware.nodes"]), st.lists(st.integers(1, 8), min_size=1)
        ),
    }
)


@SETTINGS
@given(doc=mutated(sweeps))
def test_agrees_on_mutated_sweeps(doc: dict[str, Any]) -> None:
    _agree(SWEEP_SCHEMA, doc)


def test_rejects_schemas_with_keywords_it_does_not_implement() -> None:
    with pytest.raises(ValueError, match="'pattern' is not supported"):
        LiteValidator({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}})


def test_both_schemas_are_valid_2020_12() -> None:
    for schema in (SPEC_SCHEMA, SWEEP_SCHEMA):
        jsonschema.Draft202012Validator.check_schema(schema)
