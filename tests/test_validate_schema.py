"""schemas/deepspeed.schema.json: a valid 2020-12 schema, complete, checked by jsonschema itself (plus
dsgen's x-dsgen-parser keyword), and every error jsonschema finds becomes a finding."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsgen.facts.release import SUPPORTED
from dsgen.resources import schema_path
from dsgen.validate import validate_config
from dsgen.validate.loader import loads
from dsgen.validate.rules.context import ZERO_ALIASES
from dsgen.validate.schema_findings import base_schema, schema_for, validator_class
from dsgen.validate.versions import PROFILES
from tests.conftest import require_module

SCHEMA_RULES = {
    "unknown-key",
    "type-mismatch",
    "invalid-value",
    "out-of-range",
    "non-integer",
    "number-as-string",
    "removed-key",
}
STRICT_SECTIONS = [
    ("zero_optimization",),
    ("zero_optimization", "offload_param"),
    ("zero_optimization", "offload_optimizer"),
    ("zero_optimization", "zenflow"),
    ("zero_optimization", "leaf_module"),
    ("fp16",),
    ("bf16",),
    ("tensorboard",),
    ("wandb",),
    ("csv_monitor",),
    ("comet",),
    ("comms_logger",),
    ("tensor_parallel",),
    ("tensor_parallel", "tp"),
    ("compile",),
    ("timers", "throughput"),
    ("hybrid_engine",),
    ("weight_quantization",),
]
DICT_SECTIONS = [
    ("optimizer",),
    ("scheduler",),
    ("activation_checkpointing",),
    ("flops_profiler",),
    ("autotuning",),
    ("aio",),
    ("checkpoint",),
    ("pipeline",),
    ("data_types",),
    ("torch_autocast",),
    ("data_efficiency",),
    ("expert_parallel",),
    ("timers",),
]


def node(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        schema = schema["properties"][key]
    return schema


def properties(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    for key, child in schema.get("properties", {}).items():
        yield f"{path}/{key}", child
        yield from properties(child, f"{path}/{key}")


@pytest.fixture(scope="module")
def jsonschema() -> Any:
    return require_module("jsonschema")


@pytest.mark.parametrize("version", SUPPORTED)
def test_schema_is_valid_2020_12(jsonschema: Any, version: str) -> None:
    schema = schema_for(version)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_validation_is_jsonschemas_own(jsonschema: Any) -> None:
    """dsgen adds one annotation keyword and reads "auto" as a placeholder; every JSON Schema
    keyword is checked by jsonschema's own implementation."""
    ours, theirs = validator_class(), jsonschema.Draft202012Validator
    assert set(ours.VALIDATORS) - set(theirs.VALIDATORS) == {"x-dsgen-parser"}
    assert all(ours.VALIDATORS[k] is theirs.VALIDATORS[k] for k in theirs.VALIDATORS)
    checker = ours.TYPE_CHECKER
    assert checker.is_type("fp16", "string") and not checker.is_type("auto", "string")
    assert all(checker.is_type(v, "integer") for v in (3, 2.0)) and not checker.is_type(True, "integer")


def test_auto_is_valid_only_where_the_schema_names_it() -> None:
    """The placeholder reading of "auto" is right only if no node both types a value as a string
    and lists "auto" among its values (there, jsonschema would refuse an "auto" the schema allows)."""

    def nodes(schema: Any) -> Iterator[dict[str, Any]]:
        if isinstance(schema, dict):
            yield schema
            for value in schema.values():
                yield from nodes(value)
        elif isinstance(schema, list):
            for value in schema:
                yield from nodes(value)

    for version in SUPPORTED:
        for node in nodes(schema_for(version)):
            kinds = node.get("type", [])
            if "string" in ([kinds] if isinstance(kinds, str) else kinds):
                assert "auto" not in node.get("enum", ()) and node.get("const") != "auto", node


def test_every_key_has_a_default() -> None:
    missing = [
        pointer
        for pointer, child in properties(base_schema())
        if "default" not in child and "x-dsgen-removed" not in child
    ]
    assert missing == []


def test_strict_and_dict_sections() -> None:
    schema = base_schema()
    for path in STRICT_SECTIONS:
        assert node(schema, path).get("additionalProperties") is False, path
    for path in DICT_SECTIONS:
        section = node(schema, path)
        assert "additionalProperties" not in section and section["x-dsgen-parser"] == "dict", path
    assert "additionalProperties" not in schema  # unknown top-level keys are ignored by DeepSpeed


def test_both_spellings_of_aliases() -> None:
    zero = node(base_schema(), ("zero_optimization",))["properties"]
    for canonical, alias in ZERO_ALIASES.items():
        assert canonical in zero and alias in zero
        assert zero[alias]["x-dsgen-alias-of"] == canonical
        assert zero[alias]["default"] == zero[canonical]["default"]
    tp = node(base_schema(), ("tensor_parallel",))["properties"]
    assert {"tp", "tensor_parallel", "kernel_inject", "replace_with_kernel_inject"} <= set(tp)


def test_defaults_match_deepspeed_0_19_8() -> None:
    zero = node(base_schema(), ("zero_optimization",))["properties"]
    assert zero["stage3_prefetch_bucket_size"]["default"] == 50000000  # docs say 5e8 (stale)
    assert zero["overlap_comm"]["default"] is None  # dynamic: true for stage 3 only
    assert zero["offload_param"]["properties"]["pin_memory"]["default"] is True
    assert node(base_schema(), ("bf16",))["properties"]["check_grad_overflow"]["default"] is True
    assert node(base_schema(), ("autotuning",))["properties"]["tuner_type"]["default"] == "gridsearch"


def test_removed_keys_are_marked_for_editors() -> None:
    schema = base_schema()
    for key in ("amp", "compression_training", "curriculum_learning", "sparse_attention", "elasticity", "nebula"):
        entry = schema["properties"][key]
        assert entry["not"] == {} and entry["deprecated"] is True and "x-dsgen-removed" in entry


def test_version_profiles_patch_cleanly() -> None:
    old = schema_for("0.16")
    assert "zenflow" not in node(old, ("zero_optimization",))["properties"]
    assert "additionalProperties" not in node(old, ("fp16",))
    assert "x-dsgen-removed" not in old["properties"]["amp"]
    assert "compile" not in schema_for("0.14")["properties"] and "compile" in old["properties"]
    assert schema_for("0.19") is base_schema()
    assert base_schema()["properties"]["amp"]["not"] == {}  # patches never leak into the shared schema
    assert set(PROFILES) == set(SUPPORTED)


def test_shipped_file_is_what_resources_finds() -> None:
    assert json.loads(Path(schema_path("deepspeed")).read_text()) == base_schema()


# -- a config gets a schema finding exactly when plain jsonschema finds it invalid -----------------
def _has_auto(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_auto(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_auto(v) for v in value)
    return value == "auto"


def _agree(jsonschema: Any, config: dict[str, Any], version: str = "0.19") -> None:
    validator = jsonschema.Draft202012Validator(schema_for(version))
    report = validate_config(config, deepspeed_version=version)
    ours = {f.rule_id for f in report.errors} & SCHEMA_RULES
    theirs = [e.message for e in validator.iter_errors(config)]
    assert bool(ours) == bool(theirs), (config, report.findings, theirs)


def test_agrees_with_jsonschema_on_the_corpus(jsonschema: Any, corpus_dir: Path) -> None:
    checked = 0
    for path in sorted(corpus_dir.glob("*.json")):
        try:
            config = loads(path.read_text(encoding="utf-8")).data
        except Exception:
            continue
        if isinstance(config, dict) and not _has_auto(config):
            for version in SUPPORTED:
                _agree(jsonschema, config, version)
            checked += 1
    assert checked > 100


MUTATION_LIST = [
    ("zero_optimization", "stage", 4),
    ("zero_optimization", "stage", "3"),
    ("zero_optimization", "stage", [1]),
    ("zero_optimization", "reduce_bucket_size", 0),
    ("zero_optimization", "reduce_bucket_size", 1.5),
    ("zero_optimization", "reduce_bucket_size", "5e8"),
    ("zero_optimization", "overlap_comm", None),
    ("zero_optimization", "overlap_comm", "yes"),
    ("zero_optimization", "foo", 1),
    ("zero_optimization", "offload_param", {"device": "gpu"}),
    ("zero_optimization", "offload_param", None),
    ("fp16", "enabled", 1),
    ("fp16", "loss_scale", -1),
    ("bf16", "loss_scale", 0),
    ("bf16", "enabled", True),
    ("", "communication_data_type", "FP16"),
    ("", "communication_data_type", "int8"),
    ("", "steps_per_print", None),
    ("", "gradient_clipping", -1.0),
    ("", "train_batch_size", 0),
    ("", "foo_bar", 3),
    ("", "amp", {}),
    ("checkpoint", "tag_validation", "fail"),
    ("checkpoint", "tag_validation", "often"),
    ("aio", "thread_count", 2),
    ("compile", "passes", ["z3"]),
    ("compile", "passes", ["zz"]),
    ("tensor_parallel", "dtype", "bf16"),
    ("data_types", "keep_in_fp32_modules", ["a"]),
    ("torch_autocast", "dtype", "bfloat16"),
    ("torch_autocast", "dtype", "bfloat8"),
    ("optimizer", "params", {"betas": [0.9]}),
    ("scheduler", "type", 3),
]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(range(len(MUTATION_LIST))), max_size=3, unique=True))
def test_agrees_with_jsonschema_on_mutations(jsonschema: Any, picks: list[int]) -> None:
    config: dict[str, Any] = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}
    for section, key, value in (MUTATION_LIST[i] for i in picks):
        target = config.setdefault(section, {}) if section else config
        if isinstance(target, dict):
            target[key] = copy.deepcopy(value)
    _agree(jsonschema, config)
