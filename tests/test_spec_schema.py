"""schemas/spec.schema.json and sweep.schema.json: what editors read is what dsgen checks and uses.

Valid 2020-12 schemas; every key described; preset names listed exactly as the catalog ships them;
the defaults a spec leaves out are the schema's; the bundled examples point editors at the schema;
and dsgen's friendly error is raised exactly when jsonschema finds the document invalid.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.catalog.presets import GPUS_DIR, MODELS_DIR
from dsgen.errors import DsgenError
from dsgen.intake.loader import load_spec_text
from dsgen.intake.schema_errors import check_against_schema
from dsgen.resources import schema_path
from dsgen.spec.yaml_source import load_yaml
from tests.conftest import EXAMPLES_DIR, REPO_ROOT
from tests.spec_strategies import specs

SPEC_SCHEMA = json.loads(schema_path("spec").read_text())
SWEEP_SCHEMA = json.loads(schema_path("sweep").read_text())
EDITOR_LINE = "# yaml-language-server: $schema=../schemas/spec.schema.json"


def _objects(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, node) for every property of every object, $defs included."""

    def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for key, child in node.get("properties", {}).items():
            yield f"{path}{key}", child
            yield from walk(child, f"{path}{key}.")

    yield from walk(schema, "")
    for name, definition in schema.get("$defs", {}).items():
        yield from walk(definition, f"$defs.{name}.")


@pytest.mark.parametrize("schema", [SPEC_SCHEMA, SWEEP_SCHEMA], ids=["spec", "sweep"])
def test_schema_is_valid_2020_12(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("schema", [SPEC_SCHEMA, SWEEP_SCHEMA], ids=["spec", "sweep"])
def test_every_property_is_described_for_editors(schema: dict[str, Any]) -> None:
    undescribed = [path for path, node in _objects(schema) if not node.get("description")]
    assert undescribed == []


def _shipped(directory: Path) -> list[str]:
    return sorted(file.stem for file in directory.glob("*.yaml"))


def test_preset_enums_are_the_catalog_files() -> None:
    """A preset added to (or removed from) the catalog must be added to the schema editors read."""
    gpu_names = SPEC_SCHEMA["properties"]["hardware"]["properties"]["gpu"]["oneOf"][0]
    model_names = SPEC_SCHEMA["properties"]["model"]["properties"]["preset"]
    assert gpu_names["enum"] == _shipped(GPUS_DIR) and gpu_names["x-dsgen-preset"] == "gpu"
    assert model_names["enum"] == _shipped(MODELS_DIR) and model_names["x-dsgen-preset"] == "model"


def test_preset_names_are_normalised_before_the_enum_check() -> None:
    text = "model: {preset: Llama_3.1_8B}\nhardware: {gpu: H100 80GB}\ntraining: {sequence_length: 512, global_batch_size: 8}\n"
    spec = load_spec_text(text, file="spec.yaml")
    assert (spec.model.name, spec.hardware.gpu.name) == ("llama-3.1-8b", "h100-80gb")


def test_unknown_preset_gets_the_catalogs_did_you_mean() -> None:
    text = "model: {preset: llama-3.1-8b}\nhardware: {gpu: h100, nodes: 0}\ntraining: {sequence_length: 512}\n"
    with pytest.raises(DsgenError) as caught:
        load_spec_text(text, file="spec.yaml")
    assert str(caught.value).startswith("spec.yaml:2: hardware.gpu: unknown GPU preset 'h100'; did you mean")
    assert "known GPU presets: a10, " in (caught.value.hint or "")


MINIMAL = "model: {preset: gpt2}\nhardware: {gpu: {memory_gib: 24}, nvme: {path: /nvme, capacity_gib: 100}}\ntraining: {sequence_length: 512, global_batch_size: 8}\n"
# Where a loaded Spec keeps what the schema describes, when the name differs.
ATTRIBUTE = {
    "hardware.gpu": None,  # a preset name or a mapping: no default
    "model.hf_revision": None,  # where model.hf's config is read from (tests/test_hf_cache.py), not kept
    "$defs.gpu.peak_tflops": "hardware.gpu.peak_tflops_bf16",
    "$defs.architecture.family": None,  # checked through the inline-architecture tests
    # the method, objective and reference model sit together in Training.finetuning
    "training.finetuning": "training.finetuning.method",
    "training.objective": "training.finetuning.objective",
    "training.reference_model": "training.finetuning.reference_model",
}
FINETUNING_BLOCKS = ("training.lora.", "training.quantization.", "training.freeze.", "training.generation.")


def test_a_spec_that_leaves_keys_out_gets_the_schemas_defaults() -> None:
    spec = load_spec_text(MINIMAL, file="spec.yaml")
    checked = 0
    for path, node in _objects(SPEC_SCHEMA):
        if "default" not in node or ATTRIBUTE.get(path, path) is None:
            continue
        target = ATTRIBUTE.get(path) or path.replace("$defs.gpu.", "hardware.gpu.")
        if target.startswith(FINETUNING_BLOCKS):
            target = target.replace("training.", "training.finetuning.", 1)
        value: Any = spec
        for part in target.split("."):
            value = getattr(value, part)
        expected = node["default"]
        if expected == "auto" and path.startswith("constraints."):
            expected = None  # a constraint left at auto pins nothing: the solver chooses
        elif isinstance(expected, list):
            expected = tuple(expected)
        assert value == expected, (path, value, expected)
        assert type(value) is type(expected), (path, value, expected)
        checked += 1
    assert checked >= 25


def test_examples_point_editors_at_the_schema_and_follow_it() -> None:
    validator = jsonschema.Draft202012Validator(SPEC_SCHEMA)
    for example in sorted(EXAMPLES_DIR.glob("*.yaml")):
        text = example.read_text()
        assert text.startswith(EDITOR_LINE + "\n"), example.name
        assert (example.parent / "../schemas/spec.schema.json").resolve() == (REPO_ROOT / "schemas/spec.schema.json")
        assert list(validator.iter_errors(yaml.safe_load(text))) == [], example.name


# ---- dsgen's message is raised exactly when jsonschema finds the document invalid ----------
ODD_VALUES = [None, True, False, 0, -1, 1.5, 0.0, 2**40, "", "x", "auto", "bf16", [], [1], {}, {"a": 1}, 1e-9, 3, 8]


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, (*path, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid document with a few random edits: values replaced, keys added or deleted."""
    doc = copy.deepcopy(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(_paths(doc)))
        if not target:
            continue
        parent: Any = doc
        for part in target[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[target[-1]] = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        elif action == "delete" and isinstance(parent, dict):
            del parent[target[-1]]
        elif isinstance(parent, dict):
            key = draw(st.sampled_from(["bogus", "name", "nodes", "preset", "memory_gib"]))
            parent[key] = draw(st.sampled_from(ODD_VALUES))
    return doc


def _agree(schema_name: str, doc: Any) -> None:
    reference = jsonschema.Draft202012Validator(SPEC_SCHEMA if schema_name == "spec" else SWEEP_SCHEMA)
    _, source = load_yaml("{}", "doc.yaml")
    try:
        check_against_schema(doc, schema_path(schema_name), source)
        ours = True
    except DsgenError:
        ours = False
    assert ours == reference.is_valid(doc), json.dumps(doc)


SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
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
@given(doc=mutated(specs()))
def test_spec_error_exactly_when_jsonschema_finds_one(doc: dict[str, Any]) -> None:
    _agree("spec", doc)


@SETTINGS
@given(doc=mutated(sweeps))
def test_sweep_error_exactly_when_jsonschema_finds_one(doc: dict[str, Any]) -> None:
    _agree("sweep", doc)
