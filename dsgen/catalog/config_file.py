"""Typed access to one parsed ``config.json``: every bad value is a :class:`DsgenError` that
names the file, the key and, where the key occurs once, its line.

Shared by the decoder reader (:mod:`dsgen.catalog.hf_config`) and the vision-tower counter
(:mod:`dsgen.catalog.vision`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dsgen.errors import DsgenError, Location

_UNSET: Any = object()


#: Largest integer read from a config.json, the bound the spec schema puts on model dimensions.
MAX_INTEGER = 2**53


class ConfigFile:
    """Typed access to one parsed ``config.json``, raising :class:`DsgenError` that names the key."""

    def __init__(self, data: dict[str, Any], text: str, file: Path) -> None:
        self.data = data
        self.text = text
        self.file = file

    def error(self, key: str, message: str, hint: str | None = None) -> DsgenError:
        return DsgenError(message, path=key, location=Location(str(self.file), self._line_of(key)), hint=hint)

    def _line_of(self, key: str) -> int | None:
        """The line of ``"key":`` when it occurs exactly once in the file (never a wrong guess)."""
        matches = list(re.finditer(rf'"{re.escape(key)}"\s*:', self.text))
        if len(matches) != 1:
            return None
        return self.text.count("\n", 0, matches[0].start()) + 1

    def _get(self, key: str, default: Any) -> Any:
        value = self.data.get(key)
        if value is None:  # absent, or null: transformers then uses its class default too
            if default is _UNSET:
                raise self.error(key, "is null" if key in self.data else "missing")
            return default
        return value

    def integer(self, key: str, default: Any = _UNSET, *, minimum: int = 1) -> int:
        value = self._get(key, default)
        if type(value) is not int:
            raise self.error(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, got {value}")
        if value > MAX_INTEGER:  # issue 14: absurd sizes overflowed the float arithmetic
            raise self.error(key, f"must be at most 2**53, got an integer of {value.bit_length()} bits")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if type(value) is not bool:
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def probability(self, *keys: str, default: float) -> float:
        """The largest of several dropout probabilities (any of them > 0 means masks are kept)."""
        values = []
        for key in keys:
            value = self._get(key, default)
            if type(value) not in (int, float) or not 0 <= value < 1:
                raise self.error(key, f"expected a probability in [0, 1), got {value!r}")
            values.append(float(value))
        return max(values)

    def string(self, key: str, default: str) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value
