"""The jsonschema-rs gate (dsgen/intake/schema_gate.py) passes a document only where jsonschema finds nothing.

The gate decides when jsonschema is imported at all, so a wrong "valid" would hide an error from
every command. These tests hold it against jsonschema itself: on the 345 real configs (under each
DeepSpeed release's schema), on every spec and sweep the project ships, and on generated documents
(real configs with one value replaced by an arbitrary JSON-like value, nasty ones included).
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.intake import schema_errors
from dsgen.intake.schema_gate import compile_gate, contains_string
from dsgen.resources import schema_path
from dsgen.spec.yaml_source import load_yaml
from dsgen.validate import schema_findings
from dsgen.validate.loader import load
from tests.conftest import EXAMPLES_DIR

RELEASES = ("0.19", "0.16", "0.14")
EXAMPLES = int(os.environ.get("DSGEN_PROPERTY_EXAMPLES", "2000"))


def jsonschema_finds_nothing(config: Any, version: str) -> bool:
    return not list(schema_findings.validator(version).iter_errors(config))


def corpus_configs(corpus: Path) -> list[Any]:
    configs = []
    for path in sorted(corpus.glob("*.json")):
        try:
            configs.append(load(path).data)
        except Exception:  # a corpus file that is not JSON at all is validate's business, not the gate's
            continue
    return configs


@pytest.mark.parametrize("version", RELEASES)
def test_the_gate_agrees_with_jsonschema_on_every_real_config(corpus_dir: Path, version: str) -> None:
    configs = [c for c in corpus_configs(corpus_dir) if not contains_string(c, "auto")]
    assert len(configs) > 100  # the comparison must cover real configs, not a handful
    passes = schema_findings.gate(version)
    disagree = [i for i, c in enumerate(configs) if passes(c) != jsonschema_finds_nothing(c, version)]
    assert disagree == []
    # both answers occur, so the comparison is not vacuous
    assert {passes(c) for c in configs} == {True, False}


def test_a_config_that_says_auto_goes_to_jsonschema(corpus_dir: Path) -> None:
    """jsonschema's type checker does not count "auto" as a string; the gate's would, so check()
    must not take its answer for such a config."""
    config = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    result = schema_findings.check(config, "0.19")
    assert [site.pointer for site in result.autos] == ["/optimizer/params/lr"]


def test_every_shipped_spec_and_sweep_passes_both() -> None:
    spec_gate = schema_errors._gate(schema_path("spec"))
    sweep_gate = schema_errors._gate(schema_path("sweep"))
    specs = sorted(EXAMPLES_DIR.glob("*.yaml"))
    sweeps = sorted((EXAMPLES_DIR / "sweep").glob("*.yaml"))
    assert specs and sweeps
    for files, gate, schema in ((specs, spec_gate, "spec"), (sweeps, sweep_gate, "sweep")):
        validator = schema_errors.load_validator(schema_path(schema))
        for file in files:
            data = load_yaml(file.read_text(encoding="utf-8"), str(file))[0]
            assert gate(data) and not list(validator.iter_errors(data)), file


@pytest.mark.parametrize(
    "value",
    [datetime.date(2024, 1, 1), 2**80, float("nan"), float("inf"), {1: "an integer key"}, {"a", "set"}],
    ids=["date", "int-past-64-bits", "nan", "inf", "integer-key", "set"],
)
def test_a_value_jsonschema_rs_cannot_read_is_left_to_jsonschema(value: Any) -> None:
    """YAML and JSON loaders hand over values with no JSON reading; the gate neither raises on them
    nor passes one that jsonschema rejects (all but the big integer are rejected here)."""
    import jsonschema

    schema = {"properties": {"key": {"type": "integer"}}}
    document = {"key": value}
    rejected = bool(list(jsonschema.Draft202012Validator(schema).iter_errors(document)))
    assert rejected == (value != 2**80)
    if rejected:
        assert compile_gate(schema)(document) is False


def test_a_spec_value_the_gate_cannot_read_still_gets_its_message() -> None:
    from dsgen.errors import DsgenError
    from dsgen.intake.loader import load_spec_text

    text = (EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml").read_text(encoding="utf-8")
    assert "sequence_length: 4096" in text
    with pytest.raises(DsgenError) as error:
        load_spec_text(text.replace("sequence_length: 4096", "sequence_length: 2024-01-01"), base_dir=EXAMPLES_DIR)
    assert error.value.path == "training.sequence_length"


# ---- generated documents ------------------------------------------------------------------------
_KEYS = sorted(json.loads(schema_path("deepspeed").read_text(encoding="utf-8"))["properties"])
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["fp16", "FP16", "fp16\n", "cpu", "nvme", "none", "", " ", "8", "1e3", "true", "AdamW"]),
    st.text(max_size=8),
)
_MAPPING_KEYS = st.one_of(st.sampled_from([*_KEYS, "stage", "enabled", "device", "type"]), st.text(max_size=5))
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_MAPPING_KEYS, inner, max_size=3)),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def real_configs(corpus_dir: Path) -> list[dict[str, Any]]:
    return [c for c in corpus_configs(corpus_dir) if isinstance(c, dict) and c]


def _replace_one(config: Any, choice: int, value: Any) -> Any:
    """``config`` with the value at one of its key paths (picked by ``choice``) replaced by ``value``."""
    paths: list[tuple[str, ...]] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for key, item in node.items():
                paths.append((*path, key))
                walk(item, (*path, key))

    walk(config, ())
    copy = json.loads(json.dumps(config))
    *parents, last = paths[choice % len(paths)]
    node = copy
    for key in parents:
        node = node[key]
    node[last] = value
    return copy


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_gate_never_passes_what_jsonschema_rejects(real_configs: list[dict[str, Any]], data: Any) -> None:
    config = data.draw(st.sampled_from(real_configs))
    document = _replace_one(config, data.draw(st.integers(min_value=0)), data.draw(_VALUES))
    version = data.draw(st.sampled_from(RELEASES))
    if contains_string(document, "auto"):
        return
    if schema_findings.gate(version)(document):
        assert jsonschema_finds_nothing(document, version), document


@pytest.fixture(scope="module")
def shipped_specs() -> list[dict[str, Any]]:
    files = sorted(EXAMPLES_DIR.glob("*.yaml"))
    return [load_yaml(file.read_text(encoding="utf-8"), str(file))[0] for file in files]


_SPEC_KEYS = st.sampled_from(["preset", "gpu", "nodes", "zero_stage", "precision", "sequence_length", "auto"])


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_spec_gate_never_passes_what_jsonschema_rejects(shipped_specs: list[dict[str, Any]], data: Any) -> None:
    spec = data.draw(st.sampled_from(shipped_specs))
    value = data.draw(st.one_of(_VALUES, st.dictionaries(_SPEC_KEYS, _VALUES, max_size=3)))
    document = _replace_one(spec, data.draw(st.integers(min_value=0)), value)
    schema_file = schema_path("spec")
    if schema_errors._gate(schema_file)(document):
        assert not list(schema_errors.load_validator(schema_file).iter_errors(document)), document
