"""``--set key.path=value`` overrides applied to the loaded spec data before validation."""

from __future__ import annotations

from typing import Any

import yaml

from dsgen.errors import DsgenError
from dsgen.spec.yaml_source import SourceMap


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...], source: SourceMap) -> None:
    """Set each ``a.b.c=value`` in ``data`` in place; values are parsed as YAML scalars/flows."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise DsgenError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. training.sequence_length=8192")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise DsgenError(f"--set {item!r}: value is not valid YAML ({exc})") from None
        parts = key.split(".")
        node: Any = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                prefix = ".".join(parts[: depth + 1])
                raise DsgenError(f"--set {item!r}: {prefix} is not a mapping, cannot set {key}")
            node = child
        node[parts[-1]] = value
        source.overridden.add(tuple(parts))
