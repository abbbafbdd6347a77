"""A small JSON Schema (2020-12) validator for the keywords dsgen's own spec and sweep schemas use.

``jsonschema`` is the reference implementation, but importing it costs more than the whole
cold-start budget of ``dsgen new`` (0.3 s). The spec and sweep schemas use a dozen keywords; this
module interprets exactly those and refuses any schema that uses others, so it cannot silently
under-validate. The test suite checks that it agrees with ``jsonschema`` on valid and mutated
specs and sweeps.

Errors mimic the attributes of ``jsonschema.ValidationError`` that dsgen's messages need:
``validator`` (the keyword), ``schema`` (the schema node holding it), ``instance``,
``absolute_path``, ``relative_schema_path`` and ``context`` (sub-errors of ``oneOf``/``anyOf``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_KEYWORDS = frozenset(
    {
        "$schema", "$id", "$defs", "$ref", "title", "description", "default",
        "type", "enum", "const", "properties", "additionalProperties", "required", "items",
        "oneOf", "anyOf", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minLength", "minItems", "maxItems",
    }
)  # fmt: skip


@dataclass
class SchemaError:
    """One schema violation, shaped like ``jsonschema.ValidationError`` so the friendly messages serve both."""

    validator: str
    schema: dict[str, Any]
    instance: Any
    absolute_path: tuple[Any, ...]
    relative_schema_path: tuple[Any, ...] = ()
    context: list[SchemaError] = field(default_factory=list)


def _is_type(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    # an int is never converted to float here: a 400-digit one would overflow
    return kind == "number" or (kind == "integer" and (isinstance(value, int) or value.is_integer()))


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true != 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


class LiteValidator:
    """Validate instances against one schema document."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._check_keywords(schema)

    def _check_keywords(self, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("properties", "$defs"):
                    for sub in value.values():
                        self._check_keywords(sub)
                elif key in ("additionalProperties", "items") and isinstance(value, dict):
                    self._check_keywords(value)
                elif key in ("oneOf", "anyOf"):
                    for sub in value:
                        self._check_keywords(sub)
                elif key not in SUPPORTED_KEYWORDS:
                    raise ValueError(f"schema keyword {key!r} is not supported by dsgen's validator")

    def _resolve(self, ref: str) -> dict[str, Any]:
        node: Any = self.schema
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def iter_errors(self, instance: Any) -> Iterator[SchemaError]:
        yield from self._errors(instance, self.schema, ())

    def is_valid(self, instance: Any) -> bool:
        return next(self.iter_errors(instance), None) is None

    def _errors(self, value: Any, schema: dict[str, Any], path: tuple[Any, ...]) -> Iterator[SchemaError]:
        if "$ref" in schema:
            yield from self._errors(value, self._resolve(schema["$ref"]), path)
        kind = schema.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not any(_is_type(value, k) for k in kinds):
                yield SchemaError("type", schema, value, path)
                return
        if "const" in schema and not _equal(value, schema["const"]):
            yield SchemaError("const", schema, value, path)
        if "enum" in schema and not any(_equal(value, option) for option in schema["enum"]):
            yield SchemaError("enum", schema, value, path)
        if _is_type(value, "number"):
            yield from self._number(value, schema, path)
        if isinstance(value, str) and len(value) < schema.get("minLength", 0):
            yield SchemaError("minLength", schema, value, path)
        if isinstance(value, list):
            yield from self._array(value, schema, path)
        if isinstance(value, dict):
            yield from self._object(value, schema, path)
        for keyword in ("oneOf", "anyOf"):
            if keyword in schema:
                yield from self._alternatives(keyword, value, schema, path)

    def _number(self, value: float, schema: dict[str, Any], path: tuple[Any, ...]) -> Iterator[SchemaError]:
        checks = (
            ("minimum", lambda bound: value < bound),
            ("maximum", lambda bound: value > bound),
            ("exclusiveMinimum", lambda bound: value <= bound),
            ("exclusiveMaximum", lambda bound: value >= bound),
        )
        for keyword, broken in checks:
            if keyword in schema and broken(schema[keyword]):
                yield SchemaError(keyword, schema, value, path)

    def _array(self, value: list[Any], schema: dict[str, Any], path: tuple[Any, ...]) -> Iterator[SchemaError]:
        if len(value) < schema.get("minItems", 0):
            yield SchemaError("minItems", schema, value, path)
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            yield SchemaError("maxItems", schema, value, path)
        items = schema.get("items")
        if isinstance(items, dict):
            for index, item in enumerate(value):
                yield from self._errors(item, items, (*path, index))

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: tuple[Any, ...]) -> Iterator[SchemaError]:
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        # an unknown key first: it is usually a misspelling of the required key that is missing
        if extra is False and any(key not in properties for key in value):
            yield SchemaError("additionalProperties", schema, value, path)
        for key in schema.get("required", ()):
            if key not in value:
                yield SchemaError("required", schema, value, path)
                break
        for key, item in value.items():
            if key in properties:
                yield from self._errors(item, properties[key], (*path, key))
            elif isinstance(extra, dict):
                yield from self._errors(item, extra, (*path, key))

    def _alternatives(
        self, keyword: str, value: Any, schema: dict[str, Any], path: tuple[Any, ...]
    ) -> Iterator[SchemaError]:
        context: list[SchemaError] = []
        passed = 0
        for index, alternative in enumerate(schema[keyword]):
            errors = list(self._errors(value, alternative, path))
            for error in errors:
                error.relative_schema_path = (index, *error.relative_schema_path)
            context.extend(errors)
            passed += not errors
        if (keyword == "oneOf" and passed != 1) or (keyword == "anyOf" and passed == 0):
            yield SchemaError(keyword, schema, value, path, context=context)
