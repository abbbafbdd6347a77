"""The spec reference (``docs/spec-keys.md``), rendered from ``schemas/spec.schema.json``.

The schema is what editors complete from and what dsgen checks and takes its defaults from, so the
reference is made from it rather than written beside it: every key, the values it takes, its
default and its ``description``. ``tests/test_docs.py`` fails when the committed file is not this
module's output. Regenerate it with::

    python -m dsgen.spec.reference > docs/spec-keys.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from dsgen.resources import schema_path

Node = dict[str, Any]

COMMAND = "python -m dsgen.spec.reference > docs/spec-keys.md"
_KIND = {"gpu": "GPU", "model": "model"}  # x-dsgen-preset values, as the text names them


def _literal(value: Any) -> str:
    """A value as a spec writes it: strings bare, the rest as YAML/JSON does (true, null, 0.1)."""
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def _bounds(node: Node) -> str:
    parts = [
        f"{symbol} {node[key]:,}" if isinstance(node[key], int) else f"{symbol} {node[key]}"
        for key, symbol in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"))
        if key in node
    ]
    return ", ".join(parts)


def _values(node: Node, presets: dict[str, list[str]]) -> str:
    """What a key accepts, in words: an enum, a type with its bounds, or the alternatives."""
    if "$ref" in node:
        return f"a mapping (`{node['$ref'].rsplit('/', 1)[1]}`, below)"
    if "x-dsgen-preset" in node:
        kind = node["x-dsgen-preset"]
        presets[kind] = list(node["enum"])
        return f"a {_KIND.get(kind, kind)} preset name (Presets, below)"
    if "const" in node:
        return _literal(node["const"])
    if "enum" in node:
        return " | ".join(_literal(v) for v in node["enum"])
    for combination in ("oneOf", "anyOf"):
        if combination in node:
            return " or ".join(_values(alternative, presets) for alternative in node[combination])
    kind = node.get("type")
    if kind == "object":
        return "a mapping (keys below)" if "properties" in node else "a mapping"
    if kind == "array":
        items = _values(node.get("items", {}), presets) or "values"
        return f"a list of {items}"
    words = " or ".join(kind) if isinstance(kind, list) else (kind or "")
    bounds = _bounds(node)
    if "pattern" in node:
        bounds = ", ".join(filter(None, [bounds, f"matching `{node['pattern']}`"]))
    return f"{words} {bounds}".strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _rows(node: Node, prefix: str, presets: dict[str, list[str]]) -> Iterator[str]:
    required = set(node.get("required", ()))
    for key, child in node.get("properties", {}).items():
        name = f"`{prefix}{key}`" + (" (required)" if key in required else "")
        default = _literal(child["default"]) if "default" in child else ""
        description = child.get("description", "")
        yield f"| {name} | {_cell(_values(child, presets))} | {_cell(default)} | {_cell(description)} |"
        if "properties" in child:
            yield from _rows(child, f"{prefix}{key}.", presets)


def _table(node: Node, prefix: str, presets: dict[str, list[str]]) -> list[str]:
    return ["| key | values | default | description |", "|---|---|---|---|", *_rows(node, prefix, presets)]


def _references(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """(definition name, the key path that refers to it) for every ``$ref`` in the schema."""
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"].rsplit("/", 1)[1], path
        for key, child in node.get("properties", {}).items():
            yield from _references(child, f"{path}.{key}" if path else key)
        for combination in ("oneOf", "anyOf"):
            for alternative in node.get(combination, ()):
                yield from _references(alternative, path)


def spec_reference(schema: Node | None = None) -> str:
    """The markdown of ``docs/spec-keys.md`` for ``schema`` (default: the shipped spec schema)."""
    if schema is None:
        schema = json.loads(schema_path("spec").read_text(encoding="utf-8"))
    presets: dict[str, list[str]] = {}
    lines = [
        "# Spec keys",
        "",
        f"<!-- Generated from schemas/spec.schema.json by `{COMMAND}`; do not edit by hand. -->",
        "",
        f"A spec: {schema['description'][0].lower()}{schema['description'][1:]}",
        "",
        "Every key, with the values it takes, its default and what it means; a key not listed here is an",
        "error. How to write a spec, override its keys and read its errors: [spec.md](spec.md).",
    ]
    required = set(schema.get("required", ()))
    for section, node in schema["properties"].items():
        heading = f"## `{section}`" + (" (required)" if section in required else "")
        lines += ["", heading, "", node.get("description", ""), "", *_table(node, f"{section}.", presets)]
    used_at = dict(_references(schema, ""))
    for name, definition in schema.get("$defs", {}).items():
        where = used_at.get(name, name)
        lines += ["", f"## `{name}`: `{where}` as a mapping", "", definition.get("description", "")]
        lines += ["", *_table(definition, f"{where}.", presets)]
    if presets:
        lines += ["", "## Presets", ""]
        for kind, names in presets.items():
            shown = ", ".join(f"`{n}`" for n in names)
            label = _KIND.get(kind, kind)
            lines += [f"{label[0].upper()}{label[1:]} presets (`dsgen presets {kind}s`): {shown}.", ""]
        lines.pop()
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(spec_reference())


if __name__ == "__main__":
    main()
