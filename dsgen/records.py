"""``record``: dsgen's dataclass decorator, a stdlib dataclass that is cheaper to define.

Why this exists: a pipeline may call dsgen once per job, so a cold ``dsgen new`` is part of the
product (issue 2 sets a target of 0.3 s). On CPython 3.11 and 3.12 the :func:`dataclasses.dataclass`
decorator writes the source of up to six methods per class (``__init__``, ``__repr__``, ``__eq__``,
``__hash__``, and for frozen classes ``__setattr__`` and ``__delattr__``) and compiles each one
separately with ``exec``. Across dsgen's records that was a fifth of a cold run.

``record`` still makes a real dataclass, frozen by default: :func:`dataclasses.fields`,
:func:`dataclasses.replace`, :func:`dataclasses.asdict`, ``__match_args__`` and
:class:`dataclasses.FrozenInstanceError` behave as usual, and ``__init__`` and the frozen
``__setattr__``/``__delattr__`` are the ones :mod:`dataclasses` generates. Only ``__repr__``,
``__eq__`` and ``__hash__`` differ: they are closures over the class's field names, built once per
class with no compilation, and they follow the dataclass rules (``field(repr=False)``,
``field(compare=False)``, ``field(hash=...)``, ``NotImplemented`` for other classes, no hash for
mutable records). ``tests/test_records.py`` checks them against what ``dataclass`` itself makes.

One visible difference: ``__dataclass_params__`` reports ``repr=False`` and ``eq=False``, because
those methods do not come from :mod:`dataclasses`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from reprlib import recursive_repr
from typing import Any, TypeVar, overload

_C = TypeVar("_C", bound=type)


@overload
def record(cls: _C, /) -> _C: ...


@overload
def record(*, frozen: bool = True) -> Callable[[_C], _C]: ...


def record(cls: _C | None = None, /, *, frozen: bool = True) -> _C | Callable[[_C], _C]:
    """Make ``cls`` a dataclass (frozen unless ``frozen=False``) with value equality and a repr.

    Frozen records hash by their compared fields, as ``@dataclass(frozen=True)`` does; mutable
    ones are unhashable, as ``@dataclass`` makes them.
    """

    def wrap(cls: _C) -> _C:
        cls = dataclass(frozen=frozen, repr=False, eq=False)(cls)
        _add_value_methods(cls, hashable=frozen)
        return cls

    return wrap if cls is None else wrap(cls)


def _add_value_methods(cls: type, *, hashable: bool) -> None:
    every = fields(cls)
    shown = tuple(f.name for f in every if f.repr)
    compared = tuple(f.name for f in every if f.compare)
    hashed = tuple(f.name for f in every if (f.compare if f.hash is None else f.hash))
    compare_key = _key(compared)
    hash_key = _key(hashed)

    def __repr__(self: Any) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{self.__class__.__qualname__}({body})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is self.__class__:
            return compare_key(self) == compare_key(other)
        return NotImplemented

    def __hash__(self: Any) -> int:
        return hash(hash_key(self))

    # As with dataclass, methods the class body defines itself win. A body that defines __eq__
    # but not __hash__ leaves __hash__ = None in its namespace; that does not count as explicit.
    own = cls.__dict__
    if "__repr__" not in own:
        _install(cls, "__repr__", recursive_repr()(__repr__))
    if "__eq__" not in own:
        _install(cls, "__eq__", __eq__)
    explicit_hash = "__hash__" in own and not (own["__hash__"] is None and "__eq__" in own)
    if not explicit_hash:
        _install(cls, "__hash__", __hash__ if hashable else None)


def _install(cls: type, name: str, method: Callable[..., Any] | None) -> None:
    if method is not None:
        method.__name__ = name
        method.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, method)


def _key(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A function returning the named attributes as a tuple (always a tuple, even for one name)."""
    if not names:
        return lambda _obj: ()
    if len(names) == 1:
        (name,) = names
        return lambda obj: (getattr(obj, name),)
    return attrgetter(*names)
