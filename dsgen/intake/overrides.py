"""``--set key.path=value`` overrides applied to the loaded spec data before validation."""

from __future__ import annotations

from typing import Any

from dsgen.errors import DsgenError, Location
from dsgen.spec.yaml_source import KeyPath, SourceMap, load_yaml

MODEL_SOURCES = ("preset", "hf_config", "architecture")


def set_path(data: dict[str, Any], path: KeyPath, value: Any, origin: str) -> None:
    """Set ``data[a][b]... = value``, creating mappings on the way.

    Setting one model source (preset, hf_config, architecture) replaces the others, so an
    override can switch a spec from a preset to a local config.json.
    """
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(map(str, path[: depth + 1]))
            raise DsgenError(f"{origin}: {prefix} is not a mapping, cannot set {'.'.join(map(str, path))}")
        node = child
    if len(path) == 2 and path[0] == "model" and path[1] in MODEL_SOURCES:
        for other in MODEL_SOURCES:
            if other != path[1]:
                node.pop(other, None)
    node[path[-1]] = value


def _short(item: str, width: int = 80) -> str:
    """``item`` quoted, cut to ``width`` characters (a --set value can be megabytes long)."""
    return repr(item) if len(item) <= width else repr(item[: width - 3] + "...")


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...], source: SourceMap) -> None:
    """Set each ``a.b.c=value`` in ``data`` in place; values are parsed as YAML scalars/flows."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise DsgenError(f"--set {_short(item)}: expected KEY.PATH=VALUE, e.g. training.sequence_length=8192")
        try:
            # the spec's own YAML reader: the same bounds on aliases, integers and tags
            value = load_yaml(raw, "--set")[0] if raw.strip() else ""
        except DsgenError as exc:
            raise DsgenError(f"--set {_short(item)}: value is not valid: {exc.message}") from None
        parts = tuple(key.split("."))
        set_path(data, parts, value, f"--set {_short(item)}")
        source.overridden[parts] = Location(file="--set")
