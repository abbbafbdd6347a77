"""The bundled GPU and model presets: one data file per preset under ``data/`` (see its README).

Every CLI command touches the catalog and the CLI has to start fast, so a lookup reads only the
file it needs (``data/gpus/<name>.yaml``, or ``data/models/<name>.yaml`` plus the small
``data/model-families.yaml``) with libyaml (``CSafeLoader`` when PyYAML was built with it); the list
of names comes from the directory listing. Composing the two single-file catalogs whole cost a cold
``dsgen new`` 25 M instructions (4 %) for the two entries it needed. Lookups normalise what people
type (case, ``_`` or spaces for ``-``) and answer an unknown name with a did-you-mean and the full
list, because a typo in ``hardware.gpu`` is the most likely first error a new user makes.

The shipped data is checked field by field on load: a typo in a preset file is a packaging bug,
reported as ``ValueError`` naming the file and the key, never silently turned into a default.
"""

from __future__ import annotations

import os
import sys
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
GPUS_DIR = DATA_DIR / "gpus"  # one <name>.yaml per GPU preset
MODELS_DIR = DATA_DIR / "models"  # one <name>.yaml per model preset
FAMILIES_FILE = DATA_DIR / "model-families.yaml"  # constants each model file's family supplies

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


#: What fine-tuned and re-uploaded repositories add to the base model's name (same config.json numbers).
_VARIANT_SUFFIXES = ("-instruct", "-it", "-chat", "-hf", "-base", "-pt")


def _architecture_key(model_id: str) -> str:
    """A repository's name without its organisation or a variant suffix, lower-cased:
    ``unsloth/Llama-3.1-8B-Instruct`` and ``meta-llama/Llama-3.1-8B`` share ``llama-3.1-8b``."""
    key = model_id.rsplit("/", 1)[-1].lower()
    stripped = True
    while stripped:
        stripped = False
        for suffix in _VARIANT_SUFFIXES:
            if key.endswith(suffix):
                key, stripped = key[: -len(suffix)], True
    return key


def preset_for_hf_id(model_id: str) -> str | None:
    """The model preset of Hugging Face repository ``model_id``: the one whose ``hf_id`` it names,
    else the one whose repository differs from it only by organisation or a variant suffix
    (``-Instruct``, ``-it``, ``-chat``, ``-hf``, ``-Base``, ``-pt``), which keep the base model's
    architecture. None when no preset matches."""
    ids = _hf_ids()
    exact = {hf_id.lower(): name for name, hf_id in ids.items()}
    if model_id.lower() in exact:
        return exact[model_id.lower()]
    by_architecture = {_architecture_key(hf_id): name for name, hf_id in ids.items()}
    return by_architecture.get(_architecture_key(model_id))


@cache
def _hf_ids() -> dict[str, str]:
    """Each model preset's Hugging Face repository (its ``hf_id``), by preset name."""
    return {name: str(_read(MODELS_DIR / f"{name}.yaml")["hf_id"]) for name in _names(MODELS_DIR)}


def family_defaults(family: str) -> dict[str, Any]:
    """The ModelShape fields one family fixes (``data/model-families.yaml``): what an inline
    ``model.architecture`` block, like a preset file, leaves out. A fresh dict."""
    return _family(family, FAMILIES_FILE)


def get_gpu(name: str, *, path: str = "hardware.gpu", location: Location | None = None) -> GpuSpec:
    """Look up a GPU preset; an unknown name raises :class:`DsgenError` with suggestions."""
    return _lookup(
        _LazyEntries(_names(GPUS_DIR), _gpu),
        name,
        kind="GPU",
        path=path,
        location=location,
        alternative="or describe the GPU as a mapping",
    )


def get_model(name: str, *, path: str = "model.preset", location: Location | None = None) -> ModelShape:
    """Look up a model preset; an unknown name raises :class:`DsgenError` with suggestions."""
    return _lookup(
        _LazyEntries(_names(MODELS_DIR), lambda key: _model(key)[0]),
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


# ---- loading ------------------------------------------------------------------------------------
def _gpus() -> dict[str, GpuSpec]:
    return {name: _gpu(name) for name in _names(GPUS_DIR)}


@cache
def _gpu(name: str) -> GpuSpec:
    file = GPUS_DIR / f"{name}.yaml"
    return GpuSpec(name=name, **_checked(GpuSpec, name, _read(file), file))


def _models() -> tuple[dict[str, ModelShape], dict[str, int]]:
    built = {name: _model(name) for name in _names(MODELS_DIR)}
    return {name: shape for name, (shape, _) in built.items()}, {name: count for name, (_, count) in built.items()}


@cache
def _model(name: str) -> tuple[ModelShape, int]:
    """One model preset, its family's constants filled in, and its published parameter count."""
    file = MODELS_DIR / f"{name}.yaml"
    entry = _read(file)
    values = {**_family(entry.get("family"), file), **entry}
    if not isinstance(values.pop("hf_id", None), str):  # read by preset_for_hf_id, not a ModelShape field
        raise ValueError(f"{file}: hf_id must name the model's Hugging Face repository")
    count = values.pop("published_parameters", None)
    if type(count) is not int or count <= 0:
        raise ValueError(f"{file}: published_parameters must be a positive integer")
    return ModelShape(name=name, **_checked(ModelShape, name, values, file)), count


def _family(family: object, file: Path) -> dict[str, Any]:
    """The constants of one family: only its node of the families file is constructed."""
    nodes = _family_nodes()
    if family not in nodes:
        raise ValueError(f"{file}: family: {family!r} is not a family of {FAMILIES_FILE.name} ({', '.join(nodes)})")
    constructor = yaml.constructor.SafeConstructor()
    return _mapping(constructor.construct_object(nodes[family], deep=True), FAMILIES_FILE, str(family))


@cache
def _family_nodes() -> dict[str, yaml.Node]:
    with FAMILIES_FILE.open(encoding="utf-8") as stream:
        root = yaml.compose(stream, Loader=_Loader)
    if not isinstance(root, yaml.MappingNode):
        raise ValueError(f"{FAMILIES_FILE}: top level: expected a mapping")
    return {key.value: value for key, value in root.value}


@cache
def _names(directory: Path) -> tuple[str, ...]:
    """The presets in ``directory``, one ``<name>.yaml`` file each, found without reading any."""
    names = sorted(entry.name[: -len(".yaml")] for entry in os.scandir(directory) if entry.name.endswith(".yaml"))
    for name in names:
        if name != normalize_name(name):
            raise ValueError(f"{directory / name}.yaml: preset names must be lowercase and hyphenated")
    return tuple(names)


def _read(file: Path) -> dict[str, Any]:
    """One data file's mapping (safe types only; YAML merge keys resolved)."""
    with file.open(encoding="utf-8") as stream:
        value = yaml.load(stream, Loader=_Loader)
    return _mapping(value, file, "top level")


def _forget_loaded() -> None:
    """Drop everything loaded so far (tests that point the module at other data files use this)."""
    for cached in (_names, _family_nodes, _gpu, _model, _hf_ids):
        cached.cache_clear()


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


_BUILTIN_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    """Each field's type: a builtin, or a ``Literal`` alias defined in the class's module.

    The annotations are strings (``from __future__ import annotations``). Resolving them by name,
    rather than with ``typing.get_type_hints``, saves compiling each one: 39 compiles, about 2 %
    of a cold ``dsgen new``. A field of any other type is a programming error, reported here.
    """
    module = sys.modules[cls.__module__]
    hints = {}
    for f in fields(cls):
        name = f.type if isinstance(f.type, str) else ""  # a string: annotations are postponed
        hint = _BUILTIN_TYPES.get(name) or getattr(module, name, None)
        if hint is None or not (hint in _BUILTIN_TYPES.values() or typing.get_origin(hint) is typing.Literal):
            raise TypeError(f"{cls.__name__}.{f.name}: preset fields must be bool, int, float, str or a Literal alias")
        hints[f.name] = hint
    return hints


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
