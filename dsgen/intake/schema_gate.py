"""A yes/no on a document's validity from jsonschema-rs, so that a valid document never imports jsonschema.

Why two validators: importing the Python ``jsonschema`` (with ``referencing``, ``attrs`` and
``rpds``) executes about 210 M instructions, a fifth of a cold ``dsgen new``; importing
``jsonschema_rs`` executes about 33 M and it validates in microseconds (docs/start-up.md gives the
measurement). dsgen's messages, though, are built from jsonschema's error tree (the failing
subschema, each ``anyOf`` branch's errors, a type checker that does not count the ``"auto"``
placeholder as a string), so jsonschema still explains every document the gate does not pass.

The gate may only err towards "not valid", which costs time and nothing else: a document it
rejects is checked again by jsonschema, whose verdict is the one reported. So a document the gate
cannot take (a value with no JSON type, an integer past 64 bits) is simply not passed.
``tests/test_schema_gate.py`` holds that it passes exactly the documents jsonschema finds no error
in, on the corpus and on generated documents.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: A document is passed when this returns True; anything else means "ask jsonschema".
Gate = Callable[[Any], bool]


def compile_gate(schema: Mapping[str, Any], keywords: Mapping[str, type] | None = None) -> Gate:
    """A Draft 2020-12 validity test for ``schema``; ``keywords`` adds jsonschema-rs custom keywords
    (a class taking ``(parent_schema, value, schema_path)`` whose ``validate`` raises on a failure)."""
    import jsonschema_rs  # imported with the first document checked, like jsonschema was

    validator = jsonschema_rs.Draft202012Validator(dict(schema), keywords=dict(keywords or {}))

    def passes(document: Any) -> bool:
        try:
            return bool(validator.is_valid(document))
        except (ValueError, TypeError, OverflowError, RecursionError):
            return False  # not a JSON value jsonschema-rs can read: jsonschema decides

    return passes


def contains_string(document: Any, text: str) -> bool:
    """Does ``text`` occur as a string value anywhere in ``document`` (mapping values, list items)?

    Iterative, so a document nested as deep as the parsers allow cannot exhaust Python's stack.
    """
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if value == text:
                return True
        elif isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return False
