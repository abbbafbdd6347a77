"""The config loader: DeepSpeed's JSON relaxations, positions for every pointer, duplicates, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsgen.errors import DsgenError
from dsgen.validate import validate_file
from dsgen.validate.loader import ConfigSyntaxError, escape_pointer_token, load, loads
from tests.conftest import require_module

RELAXED = """{
  // a line comment
  "train_batch_size": 16,   # a hash comment
  /* a block
     comment */
  "zero_optimization": {
    "stage": 3,
    "offload_param": {"device": "cpu",},
  },
  "betas": [0.9, 0.999,],
  "path/with~tilde": "x\\u00e9",
}
"""


def test_comments_and_trailing_commas() -> None:
    loaded = loads(RELAXED)
    assert loaded.data == {
        "train_batch_size": 16,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
        "betas": [0.9, 0.999],
        "path/with~tilde": "x\u00e9",
    }
    assert loaded.duplicates == []


def test_positions_for_every_pointer() -> None:
    positions = loads(RELAXED).positions
    assert positions[""] == (1, 1)
    assert positions["/train_batch_size"] == (3, 3)
    assert positions["/zero_optimization/stage"] == (7, 5)
    assert positions["/zero_optimization/offload_param/device"] == (8, 23)
    assert positions["/betas/1"] == (10, 18)
    assert positions["/path~1with~0tilde"] == (11, 3)


def test_numbers_keep_json_types() -> None:
    data = loads('{"a": 5e8, "b": 10, "c": -0.5, "d": 1E-3}').data
    assert data == {"a": 5e8, "b": 10, "c": -0.5, "d": 1e-3}
    assert isinstance(data["a"], float) and isinstance(data["b"], int)


def test_duplicates_are_reported_with_both_positions() -> None:
    loaded = loads('{"a": 1,\n "b": {"x": 1, "x": 2},\n "a": 3}')
    assert loaded.data == {"a": 3, "b": {"x": 2}}  # the last value wins, as in json.loads
    assert [(d.pointer, d.line, d.column, d.first_line) for d in loaded.duplicates] == [
        ("/b/x", 2, 16, 2),
        ("/a", 3, 2, 1),
    ]


def test_every_repeat_of_a_key_points_back_at_its_first_definition() -> None:
    # "a" on lines 2, 3 and 4: both repeats were first defined on line 2, not the previous line.
    # A second object at the same pointer (/o, repeated) counts its own first occurrence (line 6),
    # not the first object's (line 5).
    text = '{\n"a": 1,\n"a": 2,\n"a": 3,\n"o": {"x": 1, "x": 2},\n"o": {"x": 3,\n "x": 4,\n "x": 5}}'
    loaded = loads(text)
    assert loaded.data == {"a": 3, "o": {"x": 5}}
    assert [(d.pointer, d.line, d.first_line, d.first_column) for d in loaded.duplicates] == [
        ("/a", 3, 2, 1),
        ("/a", 4, 2, 1),
        ("/o/x", 5, 5, 7),  # '"o": {"x"': the first "x" starts in column 7
        ("/o", 6, 5, 1),
        ("/o/x", 7, 6, 7),
        ("/o/x", 8, 6, 7),
    ]
    assert loaded.positions["/a"] == (4, 1)  # positions keep the occurrence whose value wins


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("", 1, 1, "the file is empty"),
        ("   // only a comment\n", 1, 1, "the file is empty"),
        ('{"a": 1', 1, 8, "found end of file"),
        ('{"a" 1}', 1, 6, "expected ':'"),
        ('{\n  "a": ZERO_STAGE\n}', 2, 8, "unexpected 'ZERO_STAGE'"),
        ('{"a": NaN}', 1, 7, "unexpected 'NaN'"),
        ('{"a": "x', 1, 7, "unterminated string"),
        ("/* never closed", 1, 1, "unterminated /* comment"),
        ("[1,,2]", 1, 4, "expected a value"),
        ('{"a": 1} {"b": 2}', 1, 10, "after the end of the document"),
        ('{\n  "zero": {\n    "stage": 2\n    "x": 1\n  }\n}', 4, 5, "expected ',' or '}'"),
        ('{"a": 1e999}', 1, 7, "out of range"),
        ('{"a": "\\q"}', 1, 7, "bad escape"),
        ("{a: 1}", 1, 2, "unexpected 'a'"),
    ],
)
def test_syntax_errors_name_file_line_and_column(text: str, line: int, column: int, fragment: str) -> None:
    with pytest.raises(ConfigSyntaxError) as info:
        loads(text, "cfg.json")
    error = info.value
    assert isinstance(error, DsgenError)
    assert error.message.startswith(f"cfg.json:{line}:{column}: invalid JSON: ")
    assert fragment in error.message
    assert (error.line, error.column) == (line, column)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(DsgenError, match="cannot read file"):
        load(tmp_path / "missing.json")
    binary = tmp_path / "latin1.json"
    binary.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(DsgenError, match="not UTF-8"):
        load(binary)
    with pytest.raises(DsgenError, match="cannot read file"):
        validate_file(tmp_path)  # a directory


def test_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"train_batch_size": 8}')
    assert load(path).data == {"train_batch_size": 8}


def test_validate_file_locates_findings(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {\n    "stage": 7\n  }\n}\n')
    (finding,) = validate_file(path).findings
    assert (finding.rule_id, finding.pointer, finding.line, finding.column) == (
        "invalid-value",
        "/zero_optimization/stage",
        4,
        5,
    )


def test_escape_pointer_token() -> None:
    assert escape_pointer_token("a/b~c") == "a~1b~0c"


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def _pointers(value: Any, pointer: str = "") -> list[str]:
    out = [pointer]
    if isinstance(value, dict):
        for key, child in value.items():
            out += _pointers(child, f"{pointer}/{escape_pointer_token(key)}")
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += _pointers(child, f"{pointer}/{index}")
    return out


@settings(max_examples=150, deadline=None)
@given(_JSON, st.sampled_from([None, 0, 2]))
def test_parses_like_json_loads(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    loaded = loads(text)
    assert loaded.data == json.loads(text)
    assert set(_pointers(loaded.data)) <= set(loaded.positions)


def test_agrees_with_hjson_on_the_relaxations(corpus_dir: Path) -> None:
    """DeepSpeed loads files with hjson; every corpus file both can parse must parse the same."""
    hjson = require_module("hjson")
    compared = 0
    for path in sorted(corpus_dir.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        try:
            ours = loads(text).data
        except DsgenError:
            continue
        expected = json.loads(json.dumps(hjson.loads(text)))
        # hjson turns integral floats (5e8, 1.0) into ints; compare numbers by value.
        assert json.loads(json.dumps(ours)) == expected, path.name
        compared += 1
    assert compared > 300
