"""``record``: dsgen's dataclass decorator, a stdlib dataclass that is cheaper to define.

Why this exists: a pipeline may call dsgen once per job, so a cold ``dsgen new`` is part of the
product (issue 2 sets a target of 0.3 s). On CPython 3.11 and 3.12 ``@dataclass(frozen=True)``
writes the source of six methods per class (``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__``) and compiles each one separately, at about 0.2 ms a compile on
the development VM. For dsgen's 35 records on the ``dsgen new`` path that was 197 compiles and about
135 M instructions: a fifth of a cold run (docs/start-up.md).

``record`` lets :mod:`dataclasses` read the fields, so a record is a real dataclass:
:func:`dataclasses.fields`, :func:`~dataclasses.replace`, :func:`~dataclasses.asdict`,
``__match_args__``, pickling, copying and type checkers (through ``dataclass_transform``) work as
usual, and ``__dataclass_params__`` says ``frozen=True`` for frozen records. The methods are
closures over the field list instead, built once per class with nothing to compile, and they do
what the generated ones do:

* ``__init__`` takes the fields in order, positionally or by keyword, fills defaults and
  ``default_factory`` values, calls ``__post_init__`` if the class has one, and sets the fields
  with ``object.__setattr__``, as a frozen dataclass's ``__init__`` does;
* ``__setattr__`` and ``__delattr__`` of a frozen record raise
  :class:`dataclasses.FrozenInstanceError` under the same conditions as the generated ones;
* ``__repr__``, ``__eq__`` and ``__hash__`` follow ``field(repr=False)``, ``field(compare=False)``
  and ``field(hash=...)``, return ``NotImplemented`` for another class, give mutable records no
  hash, and yield to methods the class body defines.

The closure ``__init__`` binds its arguments in Python, so creating an instance costs more than
with a compiled one. Records the solver creates in bulk (per candidate plan, structure or knob
variant) say ``@record(fast_init=True)`` and get the stdlib's compiled ``__init__``,
``__setattr__`` and ``__delattr__`` (three compiles when the class is defined). A record with a
frozen dataclass base takes that path too, and one with ``InitVar`` or ``kw_only`` fields, which
the closure does not handle, is refused unless it asks for it.

Known differences from the generated ``__init__``, none of which dsgen depends on: the wording of
its ``TypeError`` messages, and ``typing.get_type_hints(Record.__init__)``, which sees
``*args, **kwargs`` (``inspect.signature`` and ``dataclasses.fields`` give the real parameters).

``tests/test_records.py`` checks all of this against what ``@dataclass`` itself makes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError, InitVar, dataclass, field, fields, is_dataclass
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
    """Defined for its ``__dataclass_params__`` only: what the stdlib records for a frozen dataclass
    with an ``__init__`` and no generated repr or eq, which is what a frozen record is."""


@dataclass(repr=False, eq=False)
class _MutableParamsSource:
    """The same for a mutable record."""


_PARAMS = {
    True: _FrozenParamsSource.__dataclass_params__,  # type: ignore[attr-defined]
    False: _MutableParamsSource.__dataclass_params__,  # type: ignore[attr-defined]
}


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
        if fast_init or (frozen and _has_frozen_base(cls)):
            # the stdlib's compiled methods; with a frozen base, the dataclasses module also
            # enforces its own rules between frozen classes and their subclasses
            cls = dataclass(frozen=frozen, repr=False, eq=False)(cls)
        else:
            if frozen:
                for name in ("__setattr__", "__delattr__"):
                    if name in cls.__dict__:  # as @dataclass(frozen=True) refuses it
                        raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
                if any(is_dataclass(base) for base in cls.__mro__[1:]):  # no frozen one: see above
                    raise TypeError("cannot inherit frozen dataclass from a non-frozen one")
            had_doc = cls.__dict__.get("__doc__") is not None
            cls = dataclass(init=False, repr=False, eq=False)(cls)
            if not _closure_init_fits(cls):
                raise TypeError(f"{cls.__qualname__}: InitVar or keyword-only fields need @record(fast_init=True)")
            if "__init__" not in cls.__dict__:  # as with dataclass, an __init__ of the body wins
                _install(cls, "__init__", _init(cls, frozen=frozen))
                if not had_doc:  # dataclass wrote one from the signature before there was an __init__
                    cls.__doc__ = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
            if frozen:
                _install_frozen(cls)
            cls.__dataclass_params__ = _PARAMS[frozen]  # type: ignore[attr-defined]
        _add_value_methods(cls, hashable=frozen)
        return cls

    return wrap if cls is None else wrap(cls)


def _has_frozen_base(cls: type) -> bool:
    return any(is_dataclass(base) and base.__dataclass_params__.frozen for base in cls.__mro__[1:])  # type: ignore[attr-defined]


def _closure_init_fits(cls: type) -> bool:
    """Whether the closure ``__init__`` covers the class: no ``InitVar`` pseudo-fields (init-only
    arguments) and no keyword-only fields. ``ClassVar`` pseudo-fields take no part in ``__init__``."""
    every = fields(cls)
    if any(f.kw_only for f in every):
        return False
    names = {f.name for f in every}
    pseudo = [f for name, f in cls.__dataclass_fields__.items() if name not in names]  # type: ignore[attr-defined]
    return not any(_is_init_var(f.type) for f in pseudo)


def _is_init_var(annotation: object) -> bool:
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return "InitVar" in annotation
    return annotation is InitVar or isinstance(annotation, InitVar)


def _init(cls: type, *, frozen: bool) -> Callable[..., None]:
    """What the generated ``__init__`` does, as a closure over the fields: a frozen record sets
    them with ``object.__setattr__``, a mutable one by assignment (through any ``__setattr__``)."""
    every = fields(cls)
    order = tuple(f.name for f in every)
    parameters = tuple(f.name for f in every if f.init)
    accepted = frozenset(parameters)
    required = tuple(f.name for f in every if f.init and _default_of(f) is MISSING)
    fill = tuple((f.name, f.default, f.default_factory) for f in every if _default_of(f) is not MISSING)
    has_post_init = hasattr(cls, "__post_init__")  # called as self.__post_init__(): subclasses' win
    where = f"{cls.__qualname__}.__init__()"
    set_field = object.__setattr__ if frozen else setattr

    def __init__(self: Any, /, *args: Any, **kwargs: Any) -> None:  # a field may be called self
        if len(args) > len(parameters):
            raise TypeError(f"{where} takes {len(parameters) + 1} positional arguments but {len(args) + 1} were given")
        values = dict(zip(parameters, args, strict=False))  # too many args were refused above
        for name, value in kwargs.items():
            if name not in accepted:
                raise TypeError(f"{where} got an unexpected keyword argument {name!r}")
            if name in values:
                raise TypeError(f"{where} got multiple values for argument {name!r}")
            values[name] = value
        if len(values) < len(parameters):
            missing = [name for name in required if name not in values]
            if missing:
                raise TypeError(f"{where} missing {len(missing)} required argument(s): {', '.join(map(repr, missing))}")
        for name, default, factory in fill:
            if name not in values:
                values[name] = default if factory is MISSING else factory()
        for name in order:  # field order, whatever the call's order: instances share one layout
            if name in values:
                set_field(self, name, values[name])
        if has_post_init:
            self.__post_init__()

    __init__.__signature__ = _signature(every)  # type: ignore[attr-defined]
    return __init__


class _Factory:
    """Shown as the default of a ``default_factory`` field in signatures, as dataclasses does."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def _default_of(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    return _FACTORY if f.default_factory is not MISSING else MISSING


def _signature(every: tuple[Field[Any], ...]) -> inspect.Signature:
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    # dataclasses names the instance __dataclass_self__ when a field is called self
    self_name = "__dataclass_self__" if any(f.name == "self" for f in every) else "self"
    params = [inspect.Parameter(self_name, kind)]
    for f in every:
        if f.init:
            default = _default_of(f)
            default = inspect.Parameter.empty if default is MISSING else default
            params.append(inspect.Parameter(f.name, kind, default=default, annotation=f.type))
    return inspect.Signature(params, return_annotation=None)


def _install_frozen(cls: type) -> None:
    """``__setattr__``/``__delattr__`` with the generated ones' rule: on the record itself nothing
    may be set or deleted; a subclass may add attributes that are not the record's fields."""
    names = frozenset(f.name for f in fields(cls))

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    _install(cls, "__setattr__", __setattr__)
    _install(cls, "__delattr__", __delattr__)


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
