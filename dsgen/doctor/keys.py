"""Dotted-key access to a nested DeepSpeed config, keeping key order when a value is set."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

MISSING = object()


def get(config: Mapping[str, Any], dotted: str, default: Any = MISSING) -> Any:
    """The value at ``a.b.c``, or ``default`` when any part is absent or not an object."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def with_changes(config: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with each dotted key set: existing keys keep their place,
    new keys (and the objects holding them) are appended at the end of their object."""
    result: dict[str, Any] = copy.deepcopy(dict(config))
    for dotted, value in changes.items():
        parts = dotted.split(".")
        node = result
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return result


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"
