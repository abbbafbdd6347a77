"""Load YAML into plain Python data while remembering the line of every key.

PyYAML's composer gives nodes with marks; we walk them ourselves so that (a) every mapping key's
line is recorded under its key path, (b) duplicate keys are an error instead of silently keeping
the last one, and (c) only safe scalar types are constructed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dsgen.errors import DsgenError, Location
from dsgen.inputs import read_text

KeyPath = tuple[str | int, ...]

_Loader: Any  # yaml.CSafeLoader or yaml.SafeLoader
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
        """Where ``path`` was written (see :func:`locate`)."""
        return locate(path, self.lines, self.overridden, self.file)

    def is_overridden(self, path: KeyPath) -> bool:
        """Whether ``path`` or one of its ancestors was set from outside the file."""
        return _override_of(path, self.overridden) is not None


def _override_of(path: Sequence[Any], overridden: Mapping[Any, Location]) -> Location | None:
    """Where the outermost overridden ancestor of ``path`` (or ``path`` itself) was set, if any."""
    for end in range(1, len(path) + 1):
        where = overridden.get(tuple(path[:end]))
        if where is not None:
            return where
    return None


def locate(
    path: Sequence[Any], lines: Mapping[Any, int], overridden: Mapping[Any, Location], file: str | None
) -> Location:
    """The best location for ``path`` (keys of ``lines``/``overridden`` are tuples of its parts):
    where it was set from elsewhere if it or an ancestor was (an override replaces everything
    below it, so the file's lines there are stale), else its own line in ``file``, else its
    nearest ancestor's."""
    where = _override_of(path, overridden)
    if where is not None:
        return where
    for end in range(len(path), -1, -1):
        line = lines.get(tuple(path[:end]))
        if line is not None:
            return Location(file, line)
    return Location(file)


def format_path(path: KeyPath) -> str:
    """``("hardware", "nvme", "path")`` -> ``hardware.nvme.path``; list indexes as ``[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def read_source(path: Path, what: str) -> str:
    """The text of a spec or sweep file (a bounded regular file, see :mod:`dsgen.inputs`), or a
    :class:`DsgenError` naming ``what`` could not be read."""
    return read_text(path, what)


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
    return _build(node, (), source, constructor, frozenset(), _Budget()), source


MERGE_TAG = "tag:yaml.org,2002:merge"

#: Most values one YAML document may expand to. Aliases let a few hundred bytes stand for
#: billions of values (the "billion laughs" bomb); a real spec or sweep has a few hundred.
MAX_YAML_VALUES = 100_000


class _Budget:
    """Counts the values built so far, so alias expansion stops at :data:`MAX_YAML_VALUES`."""

    def __init__(self) -> None:
        self.left = MAX_YAML_VALUES

    def spend(self, path: KeyPath, node: yaml.Node, source: SourceMap) -> None:
        self.left -= 1
        if self.left < 0:
            raise DsgenError(
                f"the YAML expands to more than {MAX_YAML_VALUES:,} values (aliases repeating aliases?)",
                path=format_path(path) or None,
                location=Location(source.file, node.start_mark.line + 1),
            )


def _build(
    node: yaml.Node,
    path: KeyPath,
    source: SourceMap,
    constructor: yaml.SafeLoader,
    open_nodes: frozenset[int],
    budget: _Budget,
) -> Any:
    """Plain data for ``node``; ``open_nodes`` are the collections being built above it (an alias
    back to one of them would make the data infinite); ``budget`` bounds the values built."""
    budget.spend(path, node, source)
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        if id(node) in open_nodes:
            raise DsgenError(
                "a YAML alias refers to a mapping or list that contains it (the data would be infinite)",
                path=format_path(path) or None,
                location=Location(source.file, node.start_mark.line + 1),
            )
        open_nodes = open_nodes | {id(node)}
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == MERGE_TAG:
                raise DsgenError(
                    "YAML merge keys (<<) are not supported here; write the keys out",
                    path=format_path(path) or None,
                    location=Location(source.file, line),
                )
            key = _construct(constructor, key_node, "key", path, source)
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
            result[key] = _build(value_node, child, source, constructor, open_nodes, budget)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = (*path, index)
            source.lines[child] = item.start_mark.line + 1
            items.append(_build(item, child, source, constructor, open_nodes, budget))
        return items
    return _construct(constructor, node, "value", path, source)


def _construct(constructor: yaml.SafeLoader, node: yaml.Node, what: str, path: KeyPath, source: SourceMap) -> Any:
    """PyYAML's safe value for a scalar (or a key); whatever it raises is the input's fault."""
    try:
        return constructor.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        reason = exc.problem or str(exc)
    except ValueError as exc:
        reason = (
            "a number too long to read (more than 4,300 digits)"
            if "digits" in str(exc)
            else f"{node.value!r} is not a valid {node.tag.rsplit(':', 1)[-1]}"
        )
    except Exception:
        reason = f"{str(node.value)[:40]!r} is not a valid {node.tag.rsplit(':', 1)[-1]}"
    raise DsgenError(
        f"unsupported YAML {what}: {reason}",
        path=format_path(path) or None,
        location=Location(source.file, node.start_mark.line + 1),
    )
