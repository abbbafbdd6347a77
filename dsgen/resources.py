"""Locate the data that ships with dsgen (templates, schemas, presets).

In a built wheel, ``templates/`` and ``schemas/`` are copied into ``dsgen/_data/``. In a source
checkout (editable install, tests) they live at the repository root beside the package. Looking in
both places keeps one copy of each file in the repository.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_dir(name: str) -> Path:
    """Return the directory holding the shipped ``templates`` or ``schemas``."""
    for candidate in (_PACKAGE_DIR / "_data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"dsgen's {name}/ directory is missing from this installation")


def schema_path(name: str) -> Path:
    """Path of a shipped JSON Schema, e.g. ``schema_path("spec")`` -> ``.../spec.schema.json``."""
    return data_dir("schemas") / f"{name}.schema.json"


def template_dir() -> Path:
    return data_dir("templates")
