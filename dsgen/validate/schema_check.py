"""Check a config against ``schemas/deepspeed.schema.json`` and classify every deviation.

The schema is the single description of the DeepSpeed config surface (editors and other tools
read the same file via ``dsgen schema deepspeed``). It only uses a small set of JSON Schema
keywords, which this module interprets directly instead of going through ``jsonschema``:

* importing ``jsonschema`` costs ~0.2 s, more than ``dsgen new``'s whole start-up budget, and
  validating 300 configs with it is slower than the 1 s target;
* each deviation has to become a dsgen rule (``unknown-key`` vs ``ignored-key``, ``non-integer``,
  ``number-as-string``, ...) with a phase saying whether DeepSpeed itself would fail, which needs
  the ``x-dsgen-*`` annotations that a generic validator ignores.

The test-suite checks the schema with ``jsonschema`` (it is a valid 2020-12 schema, it uses only
the keywords below) and that both agree on which configs are valid.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

from dsgen.jsontypes import escape_pointer_token, json_type
from dsgen.resources import schema_path
from dsgen.validate.versions import apply_patches, profile
from dsgen.vocabulary import Phase, Severity

#: Keywords this interpreter understands; anything else in the schema is a test failure.
SUPPORTED_KEYWORDS = frozenset(
    {
        "$schema",
        "$id",
        "title",
        "description",
        "default",
        "deprecated",
        "examples",
        "type",
        "enum",
        "const",
        "properties",
        "additionalProperties",
        "items",
        "anyOf",
        "not",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "pattern",
        "minItems",
        "maxItems",
    }
)

# Known wrong keys with a better hint than "did you mean".
KNOWN_MISTAKES: dict[tuple[str, str], str] = {
    ("/aio", "thread_count"): "DeepSpeed's docs say thread_count, but the code reads intra_op_parallelism",
    ("/bf16", "check_overflow"): "the key is check_grad_overflow",
    ("/zero_optimization", "grad_hooks"): "grad_hooks is documented but is not a DeepSpeed field; remove it",
    ("/zero_optimization", "aio"): "aio is a top-level section, not part of zero_optimization",
    ("/fp16", "opt_level"): "opt_level is an Apex AMP setting with no DeepSpeed equivalent; remove it",
    ("/fp16", "fp16_scale_tolerance"): "an Apex-era setting DeepSpeed does not have; remove it",
    ("/compile", "disable"): "torch.compile is enabled from code (engine.compile()); the compile section only "
    "configures DeepCompile",
    ("/compile", "backend"): "torch.compile is enabled from code (engine.compile(backend=...)); the compile "
    "section only configures DeepCompile",
    ("", "offload_optimizer"): "offload_optimizer belongs under zero_optimization",
    ("", "offload_param"): "offload_param belongs under zero_optimization",
    ("", "arg_mappings"): "arg_mappings belongs under autotuning",
    ("", "zero_force_ds_cpu_optimization"): "the key is zero_force_ds_cpu_optimizer",
}
_FP16_ONLY = (
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "min_loss_scale",
    "consecutive_hysteresis",
    "auto_cast",
)
for _key in _FP16_ONLY:
    KNOWN_MISTAKES[("/bf16", _key)] = "bf16 needs no loss scaling; this fp16 setting belongs in fp16 or nowhere"

_BOOL_STRINGS = {"0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"}
_INT_STRING = re.compile(r"\s*[+-]?\d+\s*")


@dataclass(frozen=True)
class Issue:
    """A schema deviation before it becomes a :class:`~dsgen.validate.findings.Finding`."""

    rule_id: str
    pointer: str
    message: str
    hint: str | None
    phase: Phase
    severity: Severity = "error"


@dataclass(frozen=True)
class AutoSite:
    """A literal ``"auto"`` value: whether DeepSpeed itself accepts it there, and how it reads it."""

    pointer: str
    literal_allowed: bool
    pydantic: bool  # DeepSpeed's pydantic models drop "auto", i.e. silently use their default


@dataclass
class SchemaResult:
    """What the schema pass found in one config: issues, and the places that say ``"auto"``."""

    issues: list[Issue] = field(default_factory=list)
    autos: list[AutoSite] = field(default_factory=list)


@cache
def base_schema() -> dict[str, Any]:
    """The shipped 0.19.8 schema, parsed once per process."""
    with open(schema_path("deepspeed"), encoding="utf-8") as handle:
        return json.load(handle)


@cache
def schema_for(version: str) -> dict[str, Any]:
    """The schema as seen by one DeepSpeed release (0.19 is the file itself)."""
    prof = profile(version)
    if not prof.patches:
        return base_schema()
    schema = copy.deepcopy(base_schema())
    apply_patches(schema, prof.patches)
    return schema


def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type")
    if kind is None:
        return []
    return [kind] if isinstance(kind, str) else list(kind)


def type_matches(value: Any, kind: str) -> bool:
    actual = json_type(value)
    if kind == "integer":
        return actual == "integer" or (actual == "number" and math.isfinite(value) and value == int(value))
    if kind == "number":
        return actual in ("integer", "number")
    return actual == kind


def _same(a: Any, b: Any) -> bool:
    """Equality that does not confuse true with 1 (Python does)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _numeric_string(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _describe_expected(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_describe_expected(branch) for branch in schema["anyOf"])
    if "const" in schema:
        return json.dumps(schema["const"])
    names = {
        "integer": "an integer",
        "number": "a number",
        "boolean": "true or false",
        "string": "a string",
        "object": "an object",
        "array": "a list",
        "null": "null",
    }
    return " or ".join(names.get(kind, kind) for kind in _types(schema)) or "a different value"


def _pydantic_coerces(value: Any, schema: dict[str, Any]) -> bool:
    """Would pydantic's lax mode quietly accept this wrongly typed value? (Then DeepSpeed does.)"""
    if isinstance(value, bool) and schema.get("x-dsgen-rejects-bool"):
        return False
    kinds = set(_types(schema))
    enum = schema.get("enum")
    if enum and all(isinstance(v, int) and not isinstance(v, bool) for v in enum if v is not None):
        kinds.add("integer")
    if "integer" in kinds and (isinstance(value, bool) or (isinstance(value, str) and _INT_STRING.fullmatch(value))):
        return True
    if "number" in kinds and (isinstance(value, bool) or _numeric_string(value)):
        return True
    if "boolean" in kinds:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
            return True
        if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
            return True
    return False


def suggest(key: str, candidates: list[str] | tuple[str, ...]) -> str | None:
    """Did-you-mean for a mistyped key (also catches stray spaces, hyphens and case)."""
    return _suggest(key, tuple(candidates))


@lru_cache(maxsize=4096)
def _suggest(key: str, candidates: tuple[str, ...]) -> str | None:
    import difflib  # only needed when a key is wrong

    normal = key.strip().replace("-", "_").lower()
    for candidate in candidates:
        if candidate.lower() == normal:
            return candidate
    matches = difflib.get_close_matches(normal, candidates, n=1, cutoff=0.8)
    return matches[0] if matches else None


class _Walker:
    """Walk one config alongside the schema, collecting issues and "auto" sites."""

    def __init__(self) -> None:
        self.result = SchemaResult()

    def issue(
        self, rule_id: str, pointer: str, message: str, hint: str | None, config_phase: bool, severity: Severity = "error"
    ) -> None:
        self.result.issues.append(
            Issue(rule_id, pointer, message, hint, "config" if config_phase else "lint", severity)
        )

    def walk(self, value: Any, schema: dict[str, Any], pointer: str, pydantic: bool) -> None:
        if "x-dsgen-removed" in schema:
            return  # reported by the removed-key rule with DeepSpeed's own message
        checked = _checked(value, schema, pydantic)
        if value == "auto" and isinstance(value, str):
            allowed = _allows_literal(schema, "auto")
            self.result.autos.append(AutoSite(pointer, allowed, pydantic))
            if not allowed:
                return  # the auto-value rule decides, depending on the launcher target
        if "not" in schema:
            self.issue(
                "type-mismatch",
                pointer,
                f"{_name(pointer)} cannot be set in a JSON config",
                schema.get("description"),
                checked,
            )
            return
        if "anyOf" in schema:
            self._any_of(value, schema, pointer, pydantic, checked)
            return
        if not self._type_ok(value, schema, pointer, checked, pydantic):
            return
        if not self._value_ok(value, schema, pointer, checked):
            return
        if isinstance(value, dict):
            self._object(value, schema, pointer, pydantic)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                self.walk(item, schema["items"], f"{pointer}/{index}", pydantic)

    def _any_of(self, value: Any, schema: dict[str, Any], pointer: str, pydantic: bool, checked: bool) -> None:
        for branch in schema["anyOf"]:
            probe = _Walker()
            probe.walk(value, branch, pointer, pydantic)
            if not probe.result.issues:
                if isinstance(value, (dict, list)):
                    self.result.autos.extend(probe.result.autos)
                return
        self.issue(
            "invalid-value",
            pointer,
            f"{_name(pointer)} is {json.dumps(value)}; expected {_describe_expected(schema)}",
            schema.get("description"),
            checked,
        )

    def _type_ok(self, value: Any, schema: dict[str, Any], pointer: str, checked: bool, pydantic: bool) -> bool:
        kinds = _types(schema)
        if not kinds or any(type_matches(value, kind) for kind in kinds):
            return True
        coerced = _pydantic_coerces(value, schema)
        config_phase = checked and not coerced
        name = _name(pointer)
        if isinstance(value, float) and "integer" in kinds and math.isfinite(value):
            # pydantic refuses fractional ints (int_from_float); dict-based keys keep the float.
            self.issue(
                "non-integer",
                pointer,
                f"{name} is {value!r}, which is not a whole number",
                f"use an integer such as {math.floor(value)}",
                pydantic and not coerced,
            )
        elif _numeric_string(value) and ("integer" in kinds or "number" in kinds):
            number = float(value)
            shown = int(number) if number == int(number) and "integer" in kinds else number
            self.issue(
                "number-as-string",
                pointer,
                f"{name} is the string {json.dumps(value)}, not a number",
                f"write it without quotes: {shown}",
                config_phase,
            )
        else:
            hint = None
            if isinstance(value, str) and value.strip().lower() in ("true", "false") and "boolean" in kinds:
                hint = f"write it without quotes: {value.strip().lower()}"
            self.issue(
                "type-mismatch",
                pointer,
                f"{name} is {json_type(value)} {_short(value)}; expected {_describe_expected(schema)}",
                hint,
                config_phase,
            )
        return False

    def _value_ok(self, value: Any, schema: dict[str, Any], pointer: str, checked: bool) -> bool:
        name = _name(pointer)
        if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
            numbers = [o for o in schema["enum"] if isinstance(o, (int, float)) and not isinstance(o, bool)]
            coerced = _numeric_string(value) and any(_same(float(value), o) for o in numbers)
            if isinstance(value, bool) and any(_same(int(value), o) for o in numbers):
                self.issue(
                    "type-mismatch",
                    pointer,
                    f"{name} is {json.dumps(value)}; expected {_describe_expected(schema)}",
                    f"write {int(value)}",
                    False,
                )  # pydantic: true -> 1
            elif coerced:
                self.issue(
                    "number-as-string",
                    pointer,
                    f"{name} is the string {json.dumps(value)}, not a number",
                    f"write it without quotes: {value.strip()}",
                    False,
                )
            else:
                self.issue(
                    "invalid-value",
                    pointer,
                    f"{name} is {json.dumps(value)}; expected {_describe_expected(schema)}",
                    schema.get("description"),
                    checked,
                )
            return False
        if "const" in schema and not _same(value, schema["const"]):
            self.issue(
                "invalid-value",
                pointer,
                f"{name} must be {json.dumps(schema['const'])}",
                schema.get("description"),
                checked,
            )
            return False
        if isinstance(value, str):
            if "pattern" in schema and not re.search(schema["pattern"], value):
                options = schema.get("x-dsgen-enum")
                expected = "one of " + ", ".join(options) + " (any case)" if options else "a matching value"
                self.issue(
                    "invalid-value",
                    pointer,
                    f"{name} is {json.dumps(value)}; expected {expected}",
                    schema.get("description"),
                    checked,
                )
                return False
            if len(value) < schema.get("minLength", 0):
                self.issue("invalid-value", pointer, f"{name} must not be empty", schema.get("description"), checked)
                return False
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problem = _range_problem(value, schema)
            if problem:
                self.issue(
                    "out-of-range",
                    pointer,
                    f"{name} is {_short(value)}; it must be {problem}",
                    schema.get("description"),
                    checked,
                )
                return False
        if isinstance(value, list):
            low, high = schema.get("minItems", 0), schema.get("maxItems")
            if len(value) < low or (high is not None and len(value) > high):
                size = str(low) if high == low else f"{low}..{high if high is not None else ''}"
                self.issue(
                    "invalid-value",
                    pointer,
                    f"{name} has {len(value)} items; expected {size}",
                    schema.get("description"),
                    checked,
                )
                return False
        return True

    def _object(self, value: dict[str, Any], schema: dict[str, Any], pointer: str, pydantic: bool) -> None:
        parser = schema.get("x-dsgen-parser")
        strict = parser == "pydantic" if parser else pydantic
        properties: dict[str, Any] = schema.get("properties", {})
        for key, child in value.items():
            child_pointer = f"{pointer}/{escape_pointer_token(key)}"
            child_schema = properties.get(key)
            if child_schema is not None:
                self.walk(child, child_schema, child_pointer, strict)
            elif parser == "free" or (parser is None and not pydantic and not properties):
                self.walk(child, {}, child_pointer, False)  # free-form: only collect "auto" sites
            else:
                self._unknown(key, child_pointer, pointer, sorted(properties), strict)

    def _unknown(self, key: str, child_pointer: str, pointer: str, known: list[str], strict: bool) -> None:
        hint = KNOWN_MISTAKES.get((pointer, key))
        if hint is None:
            guess = suggest(key, known)
            hint = f"did you mean {guess}?" if guess else None
        where = f"in {pointer[1:].replace('/', '.')}" if pointer else "at the top level"
        if strict:
            self.issue(
                "unknown-key",
                child_pointer,
                f"unknown key {key!r} {where}: DeepSpeed rejects it (extra inputs are not permitted)",
                hint,
                True,
            )
        else:
            self.issue(
                "ignored-key",
                child_pointer,
                f"unknown key {key!r} {where}: DeepSpeed silently ignores it",
                hint,
                False,
                "warning",
            )


def _checked(value: Any, schema: dict[str, Any], pydantic: bool) -> bool:
    """Does DeepSpeedConfig itself fail on a wrong value here (so the finding is config-phase)?

    True inside pydantic sections, for sections themselves (DeepSpeed unpacks them with ``**`` or
    calls ``.get`` on them), and for keys annotated ``x-dsgen-checked`` (``"falsy"``: DeepSpeed only
    asserts the value is truthy).
    """
    mark = schema.get("x-dsgen-checked")
    if mark == "falsy":
        return not value
    return pydantic or bool(mark) or schema.get("x-dsgen-parser") in ("pydantic", "dict")


def _range_problem(value: float, schema: dict[str, Any]) -> str | None:
    if "minimum" in schema and value < schema["minimum"]:
        return f">= {schema['minimum']}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return f"> {schema['exclusiveMinimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"<= {schema['maximum']}"
    if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
        return f"< {schema['exclusiveMaximum']}"
    return None


def _allows_literal(schema: dict[str, Any], literal: str) -> bool:
    if any(_same(literal, option) for option in schema.get("enum", ())):
        return True
    if _same(literal, schema.get("const", object())):
        return True
    return any(_allows_literal(branch, literal) for branch in schema.get("anyOf", ()))


def _name(pointer: str) -> str:
    return pointer[1:].replace("/", ".").replace("~1", "/").replace("~0", "~") or "the config"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check(config: Any, version: str) -> SchemaResult:
    """Validate ``config`` against the schema of ``version``; never raises for bad input."""
    walker = _Walker()
    walker.walk(config, schema_for(version), "", False)
    return walker.result


def schema_at(pointer_tokens: list[str], version: str) -> dict[str, Any] | None:
    """The schema node for a property path, e.g. ``["zero_optimization", "stage"]``."""
    node: dict[str, Any] | None = schema_for(version)
    for token in pointer_tokens:
        if node is None:
            return None
        node = node.get("properties", {}).get(token)
    return node


def iter_keywords(schema: Any) -> Iterator[str]:
    """Every JSON Schema keyword used in ``schema`` (for the test that guards this interpreter)."""
    if isinstance(schema, dict):
        for keyword, value in schema.items():
            if keyword.startswith("x-dsgen-"):
                continue
            yield keyword
            if keyword == "properties":
                for child in value.values():
                    yield from iter_keywords(child)
            elif keyword in ("items", "not", "additionalProperties"):
                yield from iter_keywords(value)
            elif keyword == "anyOf":
                for branch in value:
                    yield from iter_keywords(branch)
