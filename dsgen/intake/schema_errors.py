"""Check spec and sweep data with ``jsonschema`` and turn the first violation into one human sentence.

jsonschema's own messages ("-3 is less than the minimum of 1") are accurate but do not say which
key, where, or what to type instead. Here the error the user meets first in the file is picked,
its keyword gets a phrasing of what the value must be (from the failing subschema), and unknown
keys get a did-you-mean. A document jsonschema-rs passes is done with (:mod:`dsgen.intake.schema_gate`);
``jsonschema`` is imported only to explain one that fails.
"""

from __future__ import annotations

import difflib
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError
from dsgen.intake.schema_gate import Gate, compile_gate
from dsgen.spec.yaml_source import KeyPath, SourceMap, format_path

_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


@cache
def _schema(schema_file: Path) -> dict[str, Any]:
    """One schema file, parsed once per process."""
    return dict(json.loads(schema_file.read_text(encoding="utf-8")))


@cache
def _gate(schema_file: Path) -> Gate:
    return compile_gate(_schema(schema_file))


@cache
def load_validator(schema_file: Path) -> Any:
    """jsonschema's Draft 2020-12 validator for one schema file, built once per process."""
    import jsonschema  # imported to explain a failing document, never for a valid one

    return jsonschema.Draft202012Validator(_schema(schema_file))


def show(value: Any) -> str:
    """Render a user value the way they would write it in YAML/JSON."""
    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def describe(schema: dict[str, Any], root: dict[str, Any]) -> str:
    """A noun phrase for what ``schema`` accepts, e.g. 'a positive integer'."""
    if "$ref" in schema:
        return describe(_resolve(schema["$ref"], root), root)
    if "const" in schema:
        return show(schema["const"])
    if "x-dsgen-preset" in schema:
        return _TYPE_WORDS["string"]  # not the whole list: the catalog's message names the close ones
    if "enum" in schema:
        return "one of " + ", ".join(show(v) for v in schema["enum"])
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(describe(s, root) for s in schema[key])
    kind = schema.get("type")
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        lo, lo_excl = schema.get("minimum"), schema.get("exclusiveMinimum")
        hi, hi_excl = schema.get("maximum"), schema.get("exclusiveMaximum")
        if kind == "integer" and lo == 1 and hi is None:
            return "a positive integer"
        if lo_excl == 0 and hi is None and hi_excl is None:
            return f"{'a positive integer' if kind == 'integer' else 'a positive number'}"
        bounds = []
        if lo is not None:
            bounds.append(f">= {lo}")
        if lo_excl is not None:
            bounds.append(f"> {lo_excl}")
        if hi is not None:
            bounds.append(f"<= {hi}")
        if hi_excl is not None:
            bounds.append(f"< {hi_excl}")
        return noun + (" " + " and ".join(bounds) if bounds else "")
    items = schema.get("items")
    if kind == "array" and isinstance(items, dict) and "pattern" in items:
        return f"a list of strings matching {items['pattern']}"
    if isinstance(kind, str):
        return _TYPE_WORDS.get(kind, kind)
    if isinstance(kind, list):
        return " or ".join(_TYPE_WORDS.get(k, str(k)) for k in kind)
    return "a valid value"


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def _accepts_type(schema: dict[str, Any], value: Any, root: dict[str, Any], validator: Any) -> bool:
    """Does this ``oneOf`` alternative take values of ``value``'s type (jsonschema's type test)?"""
    if "$ref" in schema:
        schema = _resolve(schema["$ref"], root)
    kind = schema.get("type")
    if kind is None:
        return "const" in schema and type(schema["const"]) is type(value)
    kinds = kind if isinstance(kind, list) else [kind]
    return any(validator.is_type(value, k) for k in kinds)


def _explain(error: Any, validator: Any, source: SourceMap | None = None) -> tuple[KeyPath, str, str | None]:
    """(key path, message, hint) for one jsonschema ValidationError."""
    root = validator.schema
    path: KeyPath = tuple(error.absolute_path)
    keyword = error.validator
    schema = error.schema
    if keyword == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        key = _unknown_key(error, source)
        elsewhere = sections_with_key(key, root)
        if elsewhere:
            homes = " or ".join(f"{section}.{key}" for section in elsewhere)
            message = f"unknown key {key!r} here: it belongs in {' or '.join(elsewhere)} ({homes})"
            return (*path, key), message, f"move it into the {elsewhere[0]} section"
        return (*path, key), unknown_key_message(key, allowed), "valid keys here: " + ", ".join(allowed)
    if keyword == "required":
        missing = [k for k in schema.get("required", []) if k not in error.instance]
        return path, f"missing required key {missing[0]!r}", None
    if keyword in ("oneOf", "anyOf"):
        alternatives = schema[keyword]
        matching = [i for i, alt in enumerate(alternatives) if _accepts_type(alt, error.instance, root, validator)]
        if len(matching) == 1:
            sub = [e for e in error.context if e.relative_schema_path[0] == matching[0]]
            if sub:
                return _explain(_pick(sub, source), validator, source)
        return path, f"must be {describe(schema, root)}, got {show(error.instance)}", None
    if keyword == "enum" and "x-dsgen-preset" in schema:
        return (path, *_unknown_preset(schema["x-dsgen-preset"], error.instance))
    if keyword == "enum":
        allowed = [str(v) for v in schema["enum"]]
        close = difflib.get_close_matches(str(error.instance), allowed, n=1, cutoff=0.6)
        message = f"must be {describe(schema, root)}, got {show(error.instance)}"
        return path, message + (f" (did you mean {close[0]!r}?)" if close else ""), None
    if keyword in ("minItems", "maxItems"):
        bound = schema[keyword]
        fewest = keyword == "minItems"
        exact = schema.get("minItems") == schema.get("maxItems")
        count = "exactly" if exact else ("at least" if fewest else "at most")
        items = "item" if bound == 1 else "items"
        return path, f"must be a list of {count} {bound} {items}, got {len(error.instance)}", None
    if keyword == "minLength":
        return path, f"must be a non-empty string, got {show(error.instance)}", None
    return path, f"must be {describe(schema, root)}, got {show(error.instance)}", None


def unknown_key_message(key: str, allowed: list[str]) -> str:
    """'unknown key ...', with the nearest allowed key when one is close: a misspelt required key
    is reported this way, not as the missing key it was meant to be. Letters swapped (the same
    letters as an allowed key) come first: difflib's ratio misses them in short keys (``fh``)."""
    close = [name for name in allowed if sorted(name) == sorted(key)]
    close = close or difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    return f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def sections_with_key(key: str, root: dict[str, Any]) -> list[str]:
    """The top-level sections of the schema ``root`` that define ``key`` as a property, in schema
    order: a key written in the wrong section (``training.zero_stage``) is pointed to its home
    (``constraints``) rather than fuzzy-matched against the wrong section's keys."""
    found = []
    for section, sub in root.get("properties", {}).items():
        if "$ref" in sub:
            sub = _resolve(sub["$ref"], root)
        if isinstance(sub, dict) and key in sub.get("properties", {}):
            found.append(section)
    return found


def _unknown_preset(kind: str, name: str) -> tuple[str, str | None]:
    """The catalog's own message for a name its enum does not list (did-you-mean and the full list)."""
    from dsgen.catalog.presets import get_gpu, get_model

    try:
        (get_gpu if kind == "gpu" else get_model)(name)
    except DsgenError as error:
        return error.message, error.hint
    return f"unknown {kind} preset {name!r}", None  # only if the enum and the catalog drifted apart


def _unknown_key(error: Any, source: SourceMap | None) -> str:
    """The unknown key an ``additionalProperties`` error reports: the first written in the file."""
    path: KeyPath = tuple(error.absolute_path)
    extras = [k for k in error.instance if k not in error.schema.get("properties", {})]

    def line(key: str) -> int:
        return (source.location((*path, key)).line or 0) if source is not None else 0

    return min(extras, key=lambda key: (line(key), key))


def _pick(errors: list[Any], source: SourceMap | None) -> Any:
    """The error to report: the first in the file, except that an unknown key beats a missing one
    in the same mapping wherever the two are written (``sequence_lenght`` is usually the missing
    ``sequence_length``, and the mapping's own line, where a missing key is reported, comes first),
    and beats the missing key it spells elsewhere (``training.gpus_per_node`` is the missing
    ``hardware.gpus_per_node``). Deterministic across runs."""
    unknown = [e for e in errors if e.validator == "additionalProperties"]
    with_unknown = {tuple(e.absolute_path) for e in unknown}
    misplaced = {k for e in unknown for k in e.instance if k not in e.schema.get("properties", {})}

    def explained(e: Any) -> bool:
        """A missing key that an unknown key (same mapping, or the same name elsewhere) accounts for."""
        if e.validator != "required":
            return False
        missing = {k for k in e.schema.get("required", []) if k not in e.instance}
        return tuple(e.absolute_path) in with_unknown or bool(missing & misplaced)

    errors = [e for e in errors if not explained(e)] or errors

    def order(e: Any) -> tuple[int, str, bool]:
        path: KeyPath = tuple(e.absolute_path)
        named = (*path, _unknown_key(e, source)) if e.validator == "additionalProperties" else path
        line = (source.location(named).line or 0) if source is not None else 0
        return (line, format_path(path), e.validator != "additionalProperties")

    return min(errors, key=order)


def check_against_schema(data: Any, schema_file: Path, source: SourceMap, *, what: str = "spec") -> None:
    """Raise :class:`DsgenError` for the first schema violation in ``data``."""
    if _gate(schema_file)(data):
        return
    validator = load_validator(schema_file)
    errors = list(validator.iter_errors(data))
    if not errors:
        return
    error = _pick(errors, source)
    path, message, hint = _explain(error, validator, source)
    raise DsgenError(
        message if path else f"{what}: {message}",
        path=format_path(path) or None,
        location=source.location(path),
        hint=hint,
    )


@cache
def _subschema_gate(schema_file: Path, path: KeyPath) -> tuple[dict[str, Any], Gate]:
    root = _schema(schema_file)
    node: dict[str, Any] = root
    for key in path:
        node = node["properties"][key]
        if "$ref" in node:
            node = _resolve(node["$ref"], root)
    return node, compile_gate({"$defs": root.get("$defs", {}), **node})


#: The largest magnitude a JSON number carries exactly; nothing in a spec comes near it.
LARGEST_NUMBER = 2**53


def refusal(value: Any, schema_file: Path, path: KeyPath) -> str | None:
    """Why the schema (and the spec loader's number bounds) would refuse ``value`` at key ``path``
    ('must be a positive integer, got 0'), or None. For readers of a run's own files that turn a
    field into a spec key: the refusal is then reported against the field in that file, not against
    a ``--set`` override the user never wrote."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {show(value)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > LARGEST_NUMBER:
        return f"must be at most 2**53 in magnitude, got {show(value)}"
    schema, gate = _subschema_gate(schema_file, path)
    if gate(value):
        return None
    return f"must be {describe(schema, _schema(schema_file))}, got {show(value)}"
