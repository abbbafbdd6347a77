"""The bundled GPU and model presets, loaded from ``data/gpus.yaml`` and ``data/models.yaml``.

Every CLI command touches the catalog and the CLI has to start fast, so a file is composed once
per process with libyaml (``CSafeLoader`` when PyYAML was built with it) and an entry is turned
into Python objects and checked only when it is asked for: building all thirty model presets in
pure Python cost ``dsgen new`` about 20 ms for the one it needed. Lookups normalise what people
type (case, ``_`` or spaces for ``-``) and answer an unknown name with a did-you-mean and the full
list, because a typo in ``hardware.gpu`` is the most likely first error a new user makes.

The shipped data is checked field by field on load: a typo in a preset file is a packaging bug,
reported as ``ValueError`` naming the preset and the key, never silently turned into a default.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import MISSING, fields
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError, Location

DATA_DIR = Path(__file__).resolve().parent / "data"
GPUS_FILE = DATA_DIR / "gpus.yaml"
MODELS_FILE = DATA_DIR / "models.yaml"

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def normalize_name(name: str) -> str:
    """The key a user-typed preset name maps to: ``"A100_80GB"`` and ``"a100 80gb"`` -> ``"a100-80gb"``."""
    return "-".join(name.strip().lower().replace("_", " ").split())


# ---- public API ---------------------------------------------------------------------------------
def gpu_presets() -> dict[str, GpuSpec]:
    """All GPU presets by name (a fresh dict; the specs themselves are frozen)."""
    return dict(_gpus())


def model_presets() -> dict[str, ModelShape]:
    """All model presets by name (a fresh dict; the shapes themselves are frozen)."""
    return dict(_models()[0])


def published_parameter_counts() -> dict[str, int]:
    """Each model preset's published parameter count (model card / checkpoint metadata).

    Kept apart from :class:`ModelShape` because nothing but the tests should use it: dsgen derives
    every figure from the architecture, and the tests check that derivation against these numbers.
    """
    return dict(_models()[1])


def get_gpu(name: str, *, path: str = "hardware.gpu", location: Location | None = None) -> GpuSpec:
    """Look up a GPU preset; an unknown name raises :class:`DsgenError` with suggestions."""
    return _lookup(
        _LazyEntries(_entry_nodes(GPUS_FILE, None), _gpu),
        name,
        kind="GPU",
        path=path,
        location=location,
        alternative="or describe the GPU as a mapping",
    )


def get_model(name: str, *, path: str = "model.preset", location: Location | None = None) -> ModelShape:
    """Look up a model preset; an unknown name raises :class:`DsgenError` with suggestions."""
    return _lookup(
        _LazyEntries(_entry_nodes(MODELS_FILE, "models"), lambda key: _model(key)[0]),
        name,
        kind="model",
        path=path,
        location=location,
        alternative="or point model.hf_config at a local config.json",
    )


# ---- lookup -------------------------------------------------------------------------------------
_T = typing.TypeVar("_T")


def _lookup(
    presets: Mapping[str, _T],
    name: str,
    *,
    kind: str,
    path: str,
    location: Location | None,
    alternative: str,
) -> _T:
    key = normalize_name(name)
    if key in presets:
        return presets[key]
    suggestions = _suggest(key, list(presets))
    message = f"unknown {kind} preset {name!r}"
    if suggestions:
        quoted = [repr(s) for s in suggestions]
        either = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
        message += f"; did you mean {either}?"
    hint = f"known {kind} presets: {', '.join(sorted(presets))} ({alternative})"
    raise DsgenError(message, path=path, location=location, hint=hint)


def _suggest(key: str, names: list[str]) -> list[str]:
    """Up to three likely intended names: prefix matches (``h100`` -> both H100s), then difflib's."""
    import difflib  # only needed on the error path

    if not key:
        return []
    prefixed = [n for n in sorted(names) if n.startswith(key)]
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    return list(dict.fromkeys(prefixed + close))[:3]


# ---- loading ------------------------------------------------------------------------------------
def _gpus() -> dict[str, GpuSpec]:
    return {name: _gpu(name) for name in _entry_nodes(GPUS_FILE, None)}


@cache
def _gpu(name: str) -> GpuSpec:
    entry = _mapping(_construct(_entry_nodes(GPUS_FILE, None)[name]), GPUS_FILE, name)
    return GpuSpec(name=name, **_checked(GpuSpec, name, entry, GPUS_FILE))


def _models() -> tuple[dict[str, ModelShape], dict[str, int]]:
    built = {name: _model(name) for name in _entry_nodes(MODELS_FILE, "models")}
    return {name: shape for name, (shape, _) in built.items()}, {name: count for name, (_, count) in built.items()}


@cache
def _model(name: str) -> tuple[ModelShape, int]:
    """One model preset and its published parameter count."""
    values = dict(_mapping(_construct(_entry_nodes(MODELS_FILE, "models")[name]), MODELS_FILE, name))
    count = values.pop("published_parameters", None)
    if type(count) is not int or count <= 0:
        raise ValueError(f"{MODELS_FILE}: {name}: published_parameters must be a positive integer")
    return ModelShape(name=name, **_checked(ModelShape, name, values, MODELS_FILE)), count


class _LazyEntries(Mapping[str, _T]):
    """A read-only name -> preset mapping that builds an entry on first access (see module doc)."""

    def __init__(self, names: Iterable[str], build: Callable[[str], _T]) -> None:
        self._names = tuple(names)
        self._build = build

    def __getitem__(self, name: str) -> _T:
        if name not in self._names:
            raise KeyError(name)
        return self._build(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@cache
def _entry_nodes(file: Path, section: str | None) -> dict[str, yaml.Node]:
    """The composed (not yet constructed) YAML node of every preset in ``file`` (or its ``section``)."""
    with file.open(encoding="utf-8") as stream:
        node = yaml.compose(stream, Loader=_Loader)
    if section is not None:
        node = _child(node, section, file)
    if not isinstance(node, yaml.MappingNode) or not all(isinstance(k, yaml.ScalarNode) for k, _ in node.value):
        raise ValueError(f"{file}: {section or 'top level'}: expected a mapping with string keys")
    entries = {key.value: value for key, value in node.value}
    for key in entries:
        if key != normalize_name(key):
            raise ValueError(f"{file}: {key!r}: preset names must be lowercase and hyphenated")
    return entries


def _child(node: yaml.Node, key: str, file: Path) -> yaml.Node:
    if isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value
    raise ValueError(f"{file}: top level: expected a mapping with a {key!r} key")


def _forget_loaded() -> None:
    """Drop everything loaded so far (tests that point the module at other data files use this)."""
    for cached in (_entry_nodes, _gpu, _model):
        cached.cache_clear()


def _construct(node: yaml.Node) -> Any:
    """Build the Python value of one entry (YAML merge keys and aliases resolved, safe types only)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


def _mapping(value: Any, file: Path, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{file}: {where}: expected a mapping with string keys")
    return value


def _checked(cls: type, name: str, entry: dict[str, Any], file: Path) -> dict[str, Any]:
    """Validate one preset entry against ``cls``'s fields: no unknown or missing keys, right types."""
    hints = _type_hints(cls)
    known = {f.name: f for f in fields(cls) if f.name != "name"}
    unknown = sorted(set(entry) - set(known))
    if unknown:
        raise ValueError(f"{file}: {name}: unknown keys {unknown}")
    missing = sorted(
        k for k, f in known.items() if k not in entry and f.default is MISSING and f.default_factory is MISSING
    )
    if missing:
        raise ValueError(f"{file}: {name}: missing keys {missing}")
    for key, value in entry.items():
        if not _matches(value, hints[key]):
            raise ValueError(f"{file}: {name}: {key}: {value!r} is not a valid {hints[key]}")
    return {k: float(v) if hints[k] is float else v for k, v in entry.items()}


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints`` evaluates every annotation string; once per class is enough."""
    return typing.get_type_hints(cls)


def _matches(value: Any, hint: Any) -> bool:
    if typing.get_origin(hint) is typing.Literal:
        return value in typing.get_args(hint)
    if hint is bool:
        return type(value) is bool
    if hint is int:
        return type(value) is int and value >= 0
    if hint is float:
        return type(value) in (int, float) and value >= 0
    return isinstance(value, hint)
