"""The spec's defaults, written once: as ``"default"`` in ``schemas/spec.schema.json``.

Editors show those values while a spec is written, so they are the source; the dataclasses of
:mod:`dsgen.spec.types` take their defaults from here and the loader passes on only the keys a
spec sets. Defaults that depend on something else (an inline GPU's fp32 peak, a model family's
layout) are described in the schema and derived in the loader instead.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from dsgen.resources import schema_path


@cache
def _schema() -> dict[str, Any]:
    return json.loads(schema_path("spec").read_text(encoding="utf-8"))


def spec_default(key: str) -> Any:
    """The default of a spec key, e.g. ``"hardware.nodes"``; ``"$defs.gpu.peak_tflops"`` for a
    key of a shared definition. A key without a default is a programming error (KeyError)."""
    node = _schema()
    parts = key.split(".")
    if parts[0] == "$defs":
        node, parts = node["$defs"][parts[1]], parts[2:]
    for part in parts:
        node = node["properties"][part]
    return node["default"]
