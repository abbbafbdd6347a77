"""Check a config against ``schemas/deepspeed.schema.json`` with ``jsonschema`` and turn each error into a finding.

The schema is the single description of the DeepSpeed config surface (editors and other tools read
the same file via ``dsgen schema deepspeed``). ``jsonschema`` does all the validating; this module
only classifies its errors: which dsgen rule a deviation is (``unknown-key`` vs ``ignored-key``,
``non-integer``, ``number-as-string``, ...) and its phase (does ``DeepSpeedConfig`` itself fail?),
read from the error (keyword, instance, subschema) and from the ``x-dsgen-*`` annotations of the
schema nodes on the error's schema path.

One keyword is added to jsonschema's Draft 2020-12 validator, ``x-dsgen-parser``, because how
DeepSpeed reads a section decides what an unknown key means there: a ``"dict"`` section is read
with ``.get``, so an unknown key is ignored (reported through jsonschema's own
``additionalProperties`` check, as a warning); a ``"free"`` section is passed on as written, so the
only thing to report is an ``"auto"`` that nothing resolves. Pydantic sections say
``additionalProperties: false`` in the schema itself, which other validators read the same way.
A literal ``"auto"`` is valid only where the schema names it (see :func:`validator_class`).

A config that jsonschema-rs passes (:mod:`dsgen.intake.schema_gate`) and that holds no ``"auto"`` has no
issues and no auto sites, and is done with; ``jsonschema`` is imported only for the others.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

from dsgen.intake.schema_gate import Gate, compile_gate, contains_string
from dsgen.resources import schema_path
from dsgen.validate.jsontypes import escape_pointer_token, json_type
from dsgen.validate.versions import apply_patches, profile
from dsgen.vocabulary import Phase, Severity

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

#: When one value breaks several keywords, the one reported (DeepSpeed's own order: type, then value).
_KEYWORD_ORDER = (
    "not",
    "anyOf",
    "type",
    "enum",
    "const",
    "pattern",
    "minLength",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minItems",
    "maxItems",
)
_PARSER = "x-dsgen-parser"


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
    """A literal ``"auto"`` the schema does not allow there, and how DeepSpeed reads it."""

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


def schema_at(pointer_tokens: list[str], version: str) -> dict[str, Any] | None:
    """The schema node for a property path, e.g. ``["zero_optimization", "stage"]``."""
    node: dict[str, Any] | None = schema_for(version)
    for token in pointer_tokens:
        if node is None:
            return None
        node = node.get("properties", {}).get(token)
    return node


@cache
def validator_class() -> Any:
    """jsonschema's Draft 2020-12 validator with dsgen's reading of two things (built once).

    ``x-dsgen-parser`` is a keyword (see the module docstring), and the literal ``"auto"`` is not a
    string: it is a placeholder a launcher may fill in, so it is only valid where the schema names
    it (``enum``/``const``); everywhere else jsonschema reports it and the auto-value rule decides.
    """
    import jsonschema  # imported when the first config is checked, not with dsgen.validate

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine("string", lambda _checker, value: isinstance(value, str) and value != "auto")
    return jsonschema.validators.extend(base, {_PARSER: _parser_keyword}, type_checker=checker)


@cache
def validator(version: str) -> Any:
    """The validator for one DeepSpeed release's schema, built once per process."""
    return validator_class()(schema_for(version))


class _GateParserKeyword:
    """``x-dsgen-parser`` for the gate: a ``"dict"`` section takes no key its schema does not name
    (the reading :func:`_parser_keyword` gives jsonschema). A ``"free"`` section can only fail on
    ``"auto"``, and a config holding ``"auto"`` never reaches the gate."""

    def __init__(self, parent_schema: dict[str, Any], value: Any, schema_path: list[str | int]) -> None:
        self._strict = value == "dict"
        self._known = frozenset(parent_schema.get("properties", {}))

    def validate(self, instance: Any) -> None:
        if self._strict and isinstance(instance, dict) and any(key not in self._known for key in instance):
            raise ValueError("a key this section does not read")


@cache
def gate(version: str) -> Gate:
    """jsonschema-rs's yes/no for one release's schema; a pass means :func:`check` finds nothing."""
    return compile_gate(schema_for(version), {_PARSER: _GateParserKeyword})


def _parser_keyword(validator: Any, parser: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
    """``x-dsgen-parser``: unknown keys of a dict-based section, ``"auto"`` in a free-form one."""
    if parser == "dict" and validator.is_type(instance, "object"):
        # jsonschema's own additionalProperties check, as if the section said "false"
        yield from validator.VALIDATORS["additionalProperties"](validator, False, instance, schema)
    elif parser == "free":
        from jsonschema import ValidationError

        for path in _autos_in(instance, ()):
            yield ValidationError('"auto" is passed on as a string', path=path, instance="auto")


def _autos_in(value: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    """Where a free-form value says ``"auto"`` (DeepSpeed hands mappings on whole; lists are not read)."""
    if isinstance(value, str) and value == "auto":
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _autos_in(item, (*path, key))


# ---- from jsonschema errors to issues -----------------------------------------------------
def check(config: Any, version: str) -> SchemaResult:
    """Validate ``config`` against the schema of ``version``; never raises for bad input."""
    result = SchemaResult()
    if not contains_string(config, "auto") and gate(version)(config):
        return result
    root = schema_for(version)
    by_place: dict[tuple[Any, ...], list[Any]] = {}
    unknown: list[Any] = []
    free_autos: list[Any] = []
    for error in validator(version).iter_errors(config):
        ancestors = _ancestors(root, error.absolute_schema_path)
        if any("x-dsgen-removed" in node for node in (*ancestors, error.schema)):
            continue  # reported by the removed-key rule with DeepSpeed's own message
        if error.validator == "additionalProperties" or (
            error.validator == _PARSER and error.validator_value == "dict"
        ):
            unknown.append(error)
        elif error.validator == _PARSER:
            free_autos.append(error)
        else:
            by_place.setdefault(tuple(error.absolute_path), []).append((error, _pydantic(ancestors)))
    failed = set(by_place)
    sites: dict[str, AutoSite] = {}
    for place in sorted(by_place, key=_path_order):
        if any(place[:depth] in failed for depth in range(len(place))):
            continue  # DeepSpeed (and dsgen) never look inside a value that is already wrong
        errors = by_place[place]
        error, pydantic = min(errors, key=lambda item: _rank(item[0].validator))
        pointer = _pointer(place)
        autos = [error] if _is_auto(error) else _autos_of_passing_branch(error)
        for auto in autos:  # the auto-value rule decides
            auto_pointer = _pointer(tuple(auto.absolute_path))
            sites.setdefault(auto_pointer, AutoSite(auto_pointer, False, pydantic))
        if not autos:
            result.issues.append(_issue(error, pointer, pydantic))
    for error in sorted(free_autos, key=lambda e: _path_order(tuple(e.absolute_path))):
        pointer = _pointer(tuple(error.absolute_path))
        sites.setdefault(pointer, AutoSite(pointer, False, False))
    for error in sorted(unknown, key=lambda e: _path_order(tuple(e.absolute_path))):
        result.issues.extend(_unknown_keys(error))
    result.autos = list(sites.values())
    return result


def _rank(keyword: str) -> int:
    return _KEYWORD_ORDER.index(keyword) if keyword in _KEYWORD_ORDER else len(_KEYWORD_ORDER)


def _is_auto(error: Any) -> bool:
    return isinstance(error.instance, str) and error.instance == "auto"


def _autos_of_passing_branch(error: Any) -> list[Any]:
    """For an ``anyOf`` over a list or mapping: the ``"auto"`` errors of the first branch that
    nothing but placeholders broke (that branch is the one the value means)."""
    if error.validator != "anyOf" or not isinstance(error.instance, (list, dict)):
        return []
    branches: dict[int, list[Any]] = {index: [] for index in range(len(error.validator_value))}
    for sub in error.context:
        branches[sub.relative_schema_path[0]].append(sub)
    for subs in branches.values():
        if subs and all(_is_auto(sub) for sub in subs):
            return subs
    return []


def _path_order(path: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(part) for part in path)


def _ancestors(root: dict[str, Any], schema_path: Sequence[Any]) -> list[dict[str, Any]]:
    """The mappings jsonschema passed through on its way to the failing keyword, outermost first,
    without the node that holds the keyword (``error.schema``)."""
    nodes = [root]
    node: Any = root
    for token in list(schema_path)[:-1]:
        node = node[token]
        if isinstance(node, dict):
            nodes.append(node)
    return nodes[:-1]


def _pydantic(ancestors: list[dict[str, Any]]) -> bool:
    """Is the value read by a pydantic model? The nearest enclosing section's parser says."""
    for node in reversed(ancestors):
        parser = node.get(_PARSER)
        if parser is not None:
            return bool(parser == "pydantic")
    return False


def _pointer(path: tuple[Any, ...]) -> str:
    return "".join(f"/{escape_pointer_token(str(part))}" for part in path)


def _issue(error: Any, pointer: str, pydantic: bool) -> Issue:
    keyword, value, schema = error.validator, error.instance, error.schema
    checked = _checked(value, schema, pydantic)
    name = _name(pointer)
    if keyword == "not":
        return _make("type-mismatch", pointer, f"{name} cannot be set in a JSON config", schema, checked)
    if keyword == "anyOf":
        message = f"{name} is {json.dumps(value)}; expected {_describe_expected(schema)}"
        return _make("invalid-value", pointer, message, schema, checked)
    if keyword == "type":
        return _type_issue(value, schema, pointer, checked, pydantic)
    if keyword == "enum":
        return _enum_issue(value, schema, pointer, checked)
    if keyword == "const":
        return _make("invalid-value", pointer, f"{name} must be {json.dumps(schema['const'])}", schema, checked)
    if keyword == "pattern":
        options = schema.get("x-dsgen-enum")
        expected = "one of " + ", ".join(options) + " (any case)" if options else "a matching value"
        return _make("invalid-value", pointer, f"{name} is {json.dumps(value)}; expected {expected}", schema, checked)
    if keyword == "minLength":
        return _make("invalid-value", pointer, f"{name} must not be empty", schema, checked)
    if keyword in ("minItems", "maxItems"):
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        size = str(low) if high == low else f"{low}..{high if high is not None else ''}"
        return _make("invalid-value", pointer, f"{name} has {len(value)} items; expected {size}", schema, checked)
    sign = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}.get(keyword)
    if sign is None:  # a keyword the schema may use one day: jsonschema's own words
        return _make("invalid-value", pointer, f"{name}: {error.message}", schema, checked)
    message = f"{name} is {_short(value)}; it must be {sign} {error.validator_value}"
    return _make("out-of-range", pointer, message, schema, checked)


def _make(rule_id: str, pointer: str, message: str, schema: dict[str, Any], config_phase: bool) -> Issue:
    return Issue(rule_id, pointer, message, schema.get("description"), "config" if config_phase else "lint")


def _issue_with_hint(rule_id: str, pointer: str, message: str, hint: str | None, config_phase: bool) -> Issue:
    return Issue(rule_id, pointer, message, hint, "config" if config_phase else "lint")


def _type_issue(value: Any, schema: dict[str, Any], pointer: str, checked: bool, pydantic: bool) -> Issue:
    kinds = _types(schema)
    coerced = _pydantic_coerces(value, schema)
    config_phase = checked and not coerced
    name = _name(pointer)
    if isinstance(value, float) and "integer" in kinds and math.isfinite(value):
        # pydantic refuses fractional ints (int_from_float); dict-based keys keep the float.
        return _issue_with_hint(
            "non-integer",
            pointer,
            f"{name} is {value!r}, which is not a whole number",
            f"use an integer such as {math.floor(value)}",
            pydantic and not coerced,
        )
    if _numeric_string(value) and ("integer" in kinds or "number" in kinds):
        number = float(value)
        shown = int(number) if number == int(number) and "integer" in kinds else number
        # Only pydantic turns "8" into 8; a checked key DeepSpeedConfig reads itself (the batch keys,
        # sequence_parallel_size) reaches its arithmetic as a string and raises TypeError.
        return _issue_with_hint(
            "number-as-string",
            pointer,
            f"{name} is the string {json.dumps(value)}, not a number",
            f"write it without quotes: {shown}",
            checked and not (pydantic and coerced),
        )
    hint = None
    if isinstance(value, str) and value.strip().lower() in ("true", "false") and "boolean" in kinds:
        hint = f"write it without quotes: {value.strip().lower()}"
    return _issue_with_hint(
        "type-mismatch",
        pointer,
        f"{name} is {json_type(value)} {_short(value)}; expected {_describe_expected(schema)}",
        hint,
        config_phase,
    )


def _enum_issue(value: Any, schema: dict[str, Any], pointer: str, checked: bool) -> Issue:
    name = _name(pointer)
    numbers = [o for o in schema["enum"] if isinstance(o, (int, float)) and not isinstance(o, bool)]
    expected = f"{name} is {json.dumps(value)}; expected {_describe_expected(schema)}"
    if isinstance(value, bool) and int(value) in numbers:
        return _issue_with_hint("type-mismatch", pointer, expected, f"write {int(value)}", False)  # pydantic: true -> 1
    if _numeric_string(value) and float(value) in numbers:
        return _issue_with_hint(
            "number-as-string",
            pointer,
            f"{name} is the string {json.dumps(value)}, not a number",
            f"write it without quotes: {value.strip()}",
            False,
        )
    return _make("invalid-value", pointer, expected, schema, checked)


def _unknown_keys(error: Any) -> Iterator[Issue]:
    """One issue per key an ``additionalProperties`` error (strict section) or an ``x-dsgen-parser``
    error (dict section) covers; jsonschema reports them together."""
    strict = error.validator == "additionalProperties"
    pointer = _pointer(tuple(error.absolute_path))
    known = sorted(error.schema.get("properties", {}))
    where = f"in {pointer[1:].replace('/', '.')}" if pointer else "at the top level"
    for key in error.instance:
        if key in known:
            continue
        child_pointer = f"{pointer}/{escape_pointer_token(key)}"
        hint = KNOWN_MISTAKES.get((pointer, key))
        if hint is None:
            guess = suggest(key, known)
            hint = f"did you mean {guess}?" if guess else None
        if strict:
            message = f"unknown key {key!r} {where}: DeepSpeed rejects it (extra inputs are not permitted)"
            yield Issue("unknown-key", child_pointer, message, hint, "config")
        else:
            message = f"unknown key {key!r} {where}: DeepSpeed silently ignores it"
            yield Issue("ignored-key", child_pointer, message, hint, "lint", "warning")


# ---- helpers for the messages --------------------------------------------------------------
def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type")
    if kind is None:
        return []
    return [kind] if isinstance(kind, str) else list(kind)


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


def _checked(value: Any, schema: dict[str, Any], pydantic: bool) -> bool:
    """Does DeepSpeedConfig itself fail on a wrong value here (so the finding is config-phase)?

    True inside pydantic sections, for sections themselves (DeepSpeed unpacks them with ``**`` or
    calls ``.get`` on them), and for keys annotated ``x-dsgen-checked`` (``"falsy"``: DeepSpeed only
    asserts the value is truthy).
    """
    mark = schema.get("x-dsgen-checked")
    if mark == "falsy":
        return not value
    return pydantic or bool(mark) or schema.get(_PARSER) in ("pydantic", "dict")


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


def _name(pointer: str) -> str:
    return pointer[1:].replace("/", ".").replace("~1", "/").replace("~0", "~") or "the config"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
