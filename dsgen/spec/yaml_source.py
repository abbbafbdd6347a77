"""Load YAML into plain Python data while remembering the line of every key.

PyYAML's composer gives nodes with marks; we walk them ourselves so that (a) every mapping key's
line is recorded under its key path, (b) duplicate keys are an error instead of silently keeping
the last one, and (c) only safe scalar types are constructed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dsgen.errors import DsgenError, Location

KeyPath = tuple[str | int, ...]

try:  # the C loader is several times faster and matters for cold-start time
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML built without libyaml
    _Loader = yaml.SafeLoader


@dataclass
class SourceMap:
    """Line numbers of keys in one YAML document, by key path."""

    file: str | None
    lines: dict[KeyPath, int] = field(default_factory=dict)
    overridden: dict[KeyPath, Location] = field(default_factory=dict)  # keys set from elsewhere

    def copy(self) -> SourceMap:
        return SourceMap(self.file, dict(self.lines), dict(self.overridden))

    def location(self, path: KeyPath) -> Location:
        """The best location for ``path``: its own line, else its nearest ancestor's."""
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if prefix in self.overridden:
                return self.overridden[prefix]
            if prefix in self.lines:
                return Location(self.file, self.lines[prefix])
        return Location(self.file)


def format_path(path: KeyPath) -> str:
    """``("hardware", "nvme", "path")`` -> ``hardware.nvme.path``; list indexes as ``[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def read_source(path: Path, what: str) -> str:
    """The text of a spec or sweep file, or a :class:`DsgenError` naming ``what`` could not be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DsgenError(f"{what} file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DsgenError(f"cannot read {what} file {path}: {exc}") from None


def load_yaml(text: str, file: str | None) -> tuple[Any, SourceMap]:
    """Parse one YAML document; return its data and a :class:`SourceMap`."""
    source = SourceMap(file)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or str(exc)
        raise DsgenError(f"invalid YAML: {problem}", location=Location(file, line)) from None
    except yaml.YAMLError as exc:
        raise DsgenError(f"invalid YAML: {exc}", location=Location(file)) from None
    if node is None:
        return None, source
    source.lines[()] = node.start_mark.line + 1
    constructor = yaml.SafeLoader("")  # only used to construct scalars safely
    return _build(node, (), source, constructor), source


def _build(node: yaml.Node, path: KeyPath, source: SourceMap, constructor: yaml.SafeLoader) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = constructor.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise DsgenError(
                    f"keys must be strings, got {key!r}",
                    path=format_path(path) or None,
                    location=Location(source.file, line),
                )
            child = (*path, key)
            if key in result:
                first = source.lines[child]
                raise DsgenError(
                    f"duplicate key (first defined on line {first})",
                    path=format_path(child),
                    location=Location(source.file, line),
                )
            source.lines[child] = line
            result[key] = _build(value_node, child, source, constructor)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = (*path, index)
            source.lines[child] = item.start_mark.line + 1
            items.append(_build(item, child, source, constructor))
        return items
    try:
        return constructor.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        raise DsgenError(
            f"unsupported YAML value: {exc.problem}",
            path=format_path(path) or None,
            location=Location(source.file, node.start_mark.line + 1),
        ) from None
