"""``record``: dsgen's dataclass decorator, a stdlib dataclass that is cheaper to define.

Why this exists: a pipeline may call dsgen once per job, so a cold ``dsgen new`` is part of the
product (issue 2 sets a target of 0.3 s). On CPython 3.11 and 3.12 ``@dataclass(frozen=True)``
writes the source of six methods per class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__``) and compiles each one separately, at about 0.2 ms a compile on
the development VM. For dsgen's 35 records on the ``dsgen new`` path that was 197 compiles and about
135 M instructions: a fifth of a cold run (docs/start-up.md).

``record`` still makes a real dataclass whose ``__init__`` is the one :mod:`dataclasses` generates;
:func:`dataclasses.fields`, :func:`~dataclasses.replace`, :func:`~dataclasses.asdict`,
``__match_args__``, pickling and copying behave as usual, and ``__dataclass_params__`` says
``frozen=True`` for frozen records. The other five methods are closures over the class's field
names, built once per class with no compilation:

* ``__repr__``, ``__eq__`` and ``__hash__`` follow the dataclass rules (``field(repr=False)``,
  ``field(compare=False)``, ``field(hash=...)``, ``NotImplemented`` for another class, no hash for
  mutable records, methods the class body defines win) and give the same results;
* a frozen record refuses every assignment and deletion with
  :class:`dataclasses.FrozenInstanceError` once its ``__init__`` has finished. (The generated
  ``__init__`` of a non-frozen dataclass assigns ``self.name = value``, then calls
  ``__post_init__``, which ``record`` provides to set the instance's ``_record_sealed`` flag; that
  flag is the one attribute a frozen record has beyond its fields.)

That last closure makes creating an instance slower: one Python call per field instead of the
compiled ``object.__setattr__`` of a frozen dataclass's ``__init__``. Records the solver creates
once per candidate plan say ``@record(fast_init=True)`` and keep the stdlib's compiled frozen
methods (two more compiles when the class is defined); without that, a 1,000-run sweep took 15 %
longer.

``tests/test_records.py`` checks all of this against what ``@dataclass`` itself makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields, is_dataclass
from operator import attrgetter
from reprlib import recursive_repr
from typing import Any, TypeVar, overload

try:
    from typing import dataclass_transform
except ImportError:  # Python 3.10: type checkers take the decorator from typing_extensions

    def dataclass_transform(**_options: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


_C = TypeVar("_C", bound=type)


@dataclass(frozen=True, repr=False, eq=False)
class _FrozenParamsSource:
    """Defined only for its ``__dataclass_params__``: what the stdlib records for a frozen dataclass
    with dataclass-generated ``__init__`` and no generated repr or eq, i.e. what a frozen record is."""


_FROZEN_PARAMS = _FrozenParamsSource.__dataclass_params__  # type: ignore[attr-defined]


@overload
def record(cls: _C, /) -> _C: ...


@overload
def record(*, frozen: bool = True, fast_init: bool = False) -> Callable[[_C], _C]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: _C | None = None, /, *, frozen: bool = True, fast_init: bool = False) -> _C | Callable[[_C], _C]:
    """Make ``cls`` a dataclass (frozen unless ``frozen=False``) with value equality and a repr.

    Frozen records hash by their compared fields, as ``@dataclass(frozen=True)`` does; mutable
    ones are unhashable, as ``@dataclass`` makes them. ``fast_init=True`` trades a slower class
    definition for faster instances (see the module docstring); use it for records created in
    the solver's inner loop.
    """

    def wrap(cls: _C) -> _C:
        if frozen and (fast_init or _has_frozen_base(cls)):
            # the stdlib's compiled frozen methods; with a frozen base, the dataclasses module
            # also enforces its own rules between frozen classes and their subclasses
            cls = dataclass(frozen=True, repr=False, eq=False)(cls)
        else:
            if frozen:
                _seal_after_init(cls)
            cls = dataclass(repr=False, eq=False)(cls)
            if frozen:
                _make_frozen(cls)
        _add_value_methods(cls, hashable=frozen)
        return cls

    return wrap if cls is None else wrap(cls)


def _has_frozen_base(cls: type) -> bool:
    return any(is_dataclass(base) and base.__dataclass_params__.frozen for base in cls.__mro__[1:])  # type: ignore[attr-defined]


_SEALED = "_record_sealed"  # instance flag: True once __init__ has finished


def _seal_after_init(cls: type) -> None:
    """Give ``cls`` a ``__post_init__`` (before ``dataclass`` sees the class, so that the generated
    ``__init__`` calls it) that marks the finished instance sealed, after any of the class's own."""
    own = cls.__dict__.get("__post_init__")

    def __post_init__(self: Any, *init_vars: Any) -> None:
        if own is not None:
            own(self, *init_vars)
        object.__setattr__(self, _SEALED, True)

    _install(cls, "__post_init__", __post_init__)
    setattr(cls, _SEALED, False)  # read by __setattr__ while __init__ runs


def _make_frozen(cls: type) -> None:
    """Refuse assignment and deletion, except ``__init__`` setting fields before it seals."""
    for name in ("__setattr__", "__delattr__"):
        if name in cls.__dict__:  # as @dataclass(frozen=True) does
            raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    set_by_init = frozenset(
        f.name for f in fields(cls) if f.init or f.default is not MISSING or f.default_factory is not MISSING
    )

    def __setattr__(self: Any, name: str, value: Any) -> None:
        # object.__setattr__, not self.__dict__: asking for __dict__ would make CPython give up its
        # faster attribute reads for this instance
        if self._record_sealed or name not in set_by_init:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)

    def __delattr__(self: Any, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    _install(cls, "__setattr__", __setattr__)
    _install(cls, "__delattr__", __delattr__)
    cls.__dataclass_params__ = _FROZEN_PARAMS  # type: ignore[attr-defined]


def _add_value_methods(cls: type, *, hashable: bool) -> None:
    every = fields(cls)
    shown = tuple(f.name for f in every if f.repr)
    compare_key = _key(tuple(f.name for f in every if f.compare))
    hash_key = _key(tuple(f.name for f in every if (f.compare if f.hash is None else f.hash)))

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
