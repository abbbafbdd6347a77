"""Small JSON helpers shared by the spec and DeepSpeed-config checkers: type names and pointers."""

from __future__ import annotations

from typing import Any


def json_type(value: Any) -> str:
    """'null', 'boolean', 'integer', 'number', 'string', 'array' or 'object' (bool before int:
    in Python ``True`` is an int, in JSON it is not)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def escape_pointer_token(token: str) -> str:
    """Escape one JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")
