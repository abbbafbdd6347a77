"""``dsgen.records.record`` behaves like ``@dataclass(frozen=True)`` (or ``@dataclass``) in every way
dsgen and its users rely on: each check builds the same class twice, once with the stdlib decorator
and once with ``record``, and compares what they do."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
import pkgutil
import re
from dataclasses import FrozenInstanceError, dataclass, field
from typing import ClassVar

import pytest

import dsgen
from dsgen.records import record


def _twins(frozen: bool = True) -> tuple[type, type]:
    """The same class body decorated by ``dataclass`` and by ``record``."""

    def body(name: str) -> type:
        namespace = {
            "__annotations__": {"a": "int", "b": "str", "hidden": "float", "ignored": "list", "tags": "tuple"},
            "__doc__": "A sample record.",
            "__module__": __name__,
            "__qualname__": name,
            "b": "x",
            "hidden": field(default=1.5, repr=False),
            "ignored": field(default_factory=list, compare=False),
            "tags": field(default=(), hash=False),
        }
        return type(name, (), namespace)

    stdlib = dataclass(frozen=frozen)(body("Sample"))
    ours = record(frozen=frozen)(body("Sample"))
    return stdlib, ours


@pytest.mark.parametrize("frozen", [True, False])
def test_repr_matches_dataclass(frozen: bool) -> None:
    stdlib, ours = _twins(frozen)
    for args in [(1,), (2, "y"), (3, "z", 9.0, [1], ("t",))]:
        assert repr(ours(*args)) == repr(stdlib(*args))


@pytest.mark.parametrize("frozen", [True, False])
def test_equality_matches_dataclass(frozen: bool) -> None:
    stdlib, ours = _twins(frozen)
    pairs = [((1,), (1,)), ((1,), (2,)), ((1, "x", 1.5, [1]), (1, "x", 1.5, [2])), ((1, "x", 1.0), (1, "x", 2.0))]
    for left, right in pairs:
        assert (ours(*left) == ours(*right)) == (stdlib(*left) == stdlib(*right))
        assert (ours(*left) != ours(*right)) == (stdlib(*left) != stdlib(*right))
    # Another class, even one with the same fields, is never equal (NotImplemented, then identity).
    assert ours(1) != stdlib(1)
    assert ours(1).__eq__(stdlib(1)) is NotImplemented
    assert ours(1) != (1, "x", 1.5, [], ())


def test_frozen_hash_matches_dataclass() -> None:
    stdlib, ours = _twins(frozen=True)
    for args in [(1,), (2, "y", 0.5), (3, "z", 9.0, [1], ("t",))]:
        assert hash(ours(*args)) == hash(stdlib(*args))
    # `tags` has hash=False and `ignored` compare=False: neither changes the hash.
    assert hash(ours(1, "x", 1.5, [], ("a",))) == hash(ours(1, "x", 1.5, [9], ("b",)))
    assert len({ours(1), ours(1), ours(2)}) == 2


def test_mutable_record_is_unhashable_and_assignable() -> None:
    stdlib, ours = _twins(frozen=False)
    assert stdlib.__hash__ is None and ours.__hash__ is None
    with pytest.raises(TypeError):
        hash(ours(1))
    item = ours(1)
    item.a = 5
    assert item == ours(5)


def test_frozen_record_refuses_assignment_and_deletion() -> None:
    _, ours = _twins(frozen=True)
    item = ours(1)
    with pytest.raises(FrozenInstanceError):
        item.a = 2
    with pytest.raises(FrozenInstanceError):
        item.not_a_field = 2
    with pytest.raises(FrozenInstanceError):
        del item.a
    with pytest.raises(FrozenInstanceError):
        del item.not_a_field
    assert ours.__dataclass_params__.frozen
    assert item == ours(1)  # nothing changed


def test_init_binds_arguments_as_dataclass_does() -> None:
    """Defaults, default factories (a fresh object each time) and every binding error."""
    stdlib, ours = _twins(frozen=True)
    item = ours(4)
    assert (item.a, item.b, item.hidden, item.ignored, item.tags) == (4, "x", 1.5, [], ())
    assert ours(4).ignored is not item.ignored
    assert ours(1, tags=("t",), b="y") == ours(1, "y", 1.5, [], ("t",))
    bad_calls = [
        ((), {}, "missing 1 required"),
        ((1, "x", 1.5, [], (), "extra"), {}, "positional arguments but 7 were given"),
        ((1,), {"a": 2}, "multiple values for argument 'a'"),
        ((1,), {"nonesuch": 2}, "unexpected keyword argument 'nonesuch'"),
    ]
    for args, kwargs, message in bad_calls:
        with pytest.raises(TypeError, match=re.escape(message)):
            ours(*args, **kwargs)
        with pytest.raises(TypeError):
            stdlib(*args, **kwargs)
    object.__setattr__(item, "a", 6)  # the escape hatch frozen dataclasses have
    assert item.a == 6


def test_post_init_runs_after_the_fields_are_set() -> None:
    seen = []

    @record
    class WithPostInit:
        """Records what __post_init__ saw."""

        a: int
        b: int = 2

        def __post_init__(self) -> None:
            seen.append((self.a, self.b))

    WithPostInit(1)
    assert seen == [(1, 2)]


def test_unsupported_fields_need_fast_init() -> None:
    from dataclasses import KW_ONLY

    namespace = {"__annotations__": {"a": "int", "_": KW_ONLY, "b": "int"}, "b": 0}
    with pytest.raises(TypeError, match=re.escape("need @record(fast_init=True)")):
        record(type("KeywordOnly", (), dict(namespace)))
    fast = record(fast_init=True)(type("KeywordOnly", (), dict(namespace)))
    assert fast(1, b=2).b == 2


def test_frozen_record_subclasses_follow_dataclass_rules() -> None:
    _, ours = _twins(frozen=True)

    @record
    class Child(ours):
        """A frozen record subclassing a frozen record."""

        c: int = 0

    child = Child(1, c=2)
    assert (
        repr(child)
        == "test_frozen_record_subclasses_follow_dataclass_rules.<locals>.Child(a=1, b='x', ignored=[], tags=(), c=2)"
    )
    with pytest.raises(FrozenInstanceError):
        child.c = 3
    with pytest.raises(TypeError, match="non-frozen"):
        record(frozen=False)(type("Mutable", (ours,), {"__annotations__": {"d": "int"}, "d": 0}))
    with pytest.raises(TypeError, match="non-frozen"):
        dataclass(type("Stdlib", (ours,), {"__annotations__": {"d": "int"}, "d": 0}))


def test_frozen_record_refuses_its_own_setattr() -> None:
    with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
        record(type("Custom", (), {"__annotations__": {"a": "int"}, "__setattr__": lambda self, n, v: None}))


def test_dataclass_helpers_work() -> None:
    stdlib, ours = _twins(frozen=True)
    item = ours(1, "x", 2.0, [3], ("t",))
    assert dataclasses.is_dataclass(item)
    assert [f.name for f in dataclasses.fields(ours)] == [f.name for f in dataclasses.fields(stdlib)]
    assert dataclasses.replace(item, a=7) == ours(7, "x", 2.0, [3], ("t",))
    assert dataclasses.asdict(item) == dataclasses.asdict(stdlib(1, "x", 2.0, [3], ("t",)))
    assert ours.__match_args__ == stdlib.__match_args__
    # the same text; only the object shown as "<factory>" differs
    assert str(inspect.signature(ours)) == str(inspect.signature(stdlib))
    for copied in (copy.deepcopy(item), copy.copy(item)):
        assert dataclasses.astuple(copied) == dataclasses.astuple(item)  # every field, compared or not


def test_records_pickle() -> None:
    from dsgen.catalog.presets import gpu_presets, model_presets

    for preset in (gpu_presets()["h100-80gb"], model_presets()["llama-3.1-8b"]):
        assert pickle.loads(pickle.dumps(preset)) == preset
    shape = model_presets()["llama-3.1-8b"]
    assert hash(shape) and shape.parameter_count() == 8_030_261_248  # fills both caches
    copy_ = pickle.loads(pickle.dumps(shape))
    assert copy_._hash is None and copy_._memo is None  # string hashes differ between processes
    assert hash(copy_) == hash(shape) and copy_.parameter_count() == shape.parameter_count()


def test_methods_the_class_defines_win() -> None:
    @record
    class Own:
        """Defines its own repr and hash."""

        a: int

        def __repr__(self) -> str:
            return "own"

        def __hash__(self) -> int:
            return 42

    assert repr(Own(1)) == "own"
    assert hash(Own(1)) == 42
    assert Own(1) == Own(1)

    @record
    class OwnEq:
        """Defines __eq__ only, which leaves __hash__ = None in its body: the record still hashes."""

        a: int

        def __eq__(self, other: object) -> bool:
            return True

    assert OwnEq(1) == OwnEq(2)
    assert hash(OwnEq(1)) == hash((1,))


def test_method_names_point_at_the_class() -> None:
    _, ours = _twins()
    assert ours.__repr__.__qualname__ == "Sample.__repr__"
    assert ours.__eq__.__qualname__ == "Sample.__eq__"
    assert ours.__hash__.__qualname__ == "Sample.__hash__"


def _dsgen_dataclasses() -> list[type]:
    classes = []
    for info in pkgutil.walk_packages(dsgen.__path__, "dsgen."):
        if info.name.endswith("__main__") or info.name == "dsgen.records":
            continue  # running __main__ would start the CLI; records defines the decorator
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__ == info.name and dataclasses.is_dataclass(value):
                classes.append(value)
    return classes


def test_every_dsgen_dataclass_is_a_record() -> None:
    """dsgen's own classes all go through ``record`` (no plain ``@dataclass`` creeping back in, which
    would cost a cold start about 1 ms per class), and every one that was frozen still is."""
    classes = _dsgen_dataclasses()
    assert len(classes) >= 35
    for cls in classes:
        assert cls.__repr__.__module__ == "dsgen.records", cls
        assert not cls.__dataclass_params__.eq, cls
    frozen = [cls for cls in classes if cls.__dataclass_params__.frozen]
    assert len(frozen) >= 30
    for cls in frozen:
        assert cls.__hash__ is not None, cls


@pytest.mark.parametrize("fast_init", [False, True])
def test_fast_init_changes_speed_not_behaviour(fast_init: bool) -> None:
    stdlib = dataclass(frozen=True)(type("Fast", (), {"__annotations__": {"a": "int", "b": "int"}, "b": 2}))
    ours = record(fast_init=fast_init)(type("Fast", (), {"__annotations__": {"a": "int", "b": "int"}, "b": 2}))
    assert repr(ours(1)) == repr(stdlib(1))
    assert hash(ours(1)) == hash(stdlib(1))
    assert ours(1) == ours(1) and ours(1) != ours(2)
    assert ours.__dataclass_params__.frozen
    with pytest.raises(FrozenInstanceError):
        ours(1).a = 3
    compiled = ours.__setattr__.__module__ != "dsgen.records"
    assert compiled == fast_init


def test_records_the_solver_creates_in_bulk_use_fast_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record the solver makes per candidate, structure or knob variant pays a Python call per
    field when it is created unless it says ``fast_init=True``; across a 1,000-run sweep that cost
    15 % of the wall time."""
    from dsgen.api import load_spec, solve_spec
    from tests.conftest import EXAMPLES_DIR

    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    created: dict[type, int] = {}
    for cls in _dsgen_dataclasses():
        original = cls.__init__

        def counting(self: object, *args: object, _cls: type = cls, _init=original, **kwargs: object) -> None:
            created[_cls] = created.get(_cls, 0) + 1
            _init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)
    result = solve_spec(spec)
    assert result.candidates_evaluated > 100
    in_bulk = {cls for cls, count in created.items() if count >= 10}
    assert len(in_bulk) >= 8, created
    for cls in in_bulk:
        compiled_init = getattr(cls.__init__, "__module__", None) != "dsgen.records"
        assert compiled_init, f"{cls.__qualname__}: {created[cls]} per solve"


@pytest.mark.parametrize("frozen", [True, False])
def test_a_subclass_post_init_is_the_one_called(frozen: bool) -> None:
    for decorate in (dataclass(frozen=frozen), record(frozen=frozen)):
        calls: list[str] = []
        base_post_init = lambda self, calls=calls: calls.append("base")  # noqa: E731
        child_post_init = lambda self, calls=calls: calls.append("child")  # noqa: E731
        base = decorate(type("Base", (), {"__annotations__": {"a": "int"}, "__post_init__": base_post_init}))
        child = type("Child", (base,), {"__post_init__": child_post_init})
        child(1)
        assert calls == ["child"], decorate


def test_mutable_record_init_assigns_through_setattr() -> None:
    """A mutable dataclass's __init__ assigns ``self.name = value``; validation in __setattr__ runs."""
    for decorate in (dataclass, record(frozen=False)):
        seen: list[str] = []

        def logging_setattr(self: object, name: str, value: object, seen: list[str] = seen) -> None:
            seen.append(name)
            object.__setattr__(self, name, value)

        cls = decorate(type("Logged", (), {"__annotations__": {"a": "int"}, "__setattr__": logging_setattr}))
        cls(1)
        assert seen == ["a"], decorate


def test_classvar_and_inheritance_between_mutable_records() -> None:
    @record(frozen=False)
    class Base:
        """A mutable record with a class variable, which is not a field."""

        a: int
        registry: ClassVar[dict[str, int]] = {}

    @record(frozen=False)
    class Derived(Base):
        """A mutable record extending it."""

        b: int = 2

    assert [f.name for f in dataclasses.fields(Derived)] == ["a", "b"]
    assert Derived(1) == Derived(a=1, b=2) and repr(Derived(1)) == repr(Derived(1))
    assert "registry" not in vars(Base(1))
    with pytest.raises(TypeError, match="cannot inherit frozen dataclass from a non-frozen one"):
        record(type("Frozen", (Base,), {"__annotations__": {"c": "int"}, "c": 0}))


def test_a_field_called_self_and_the_generated_doc() -> None:
    stdlib = dataclass(frozen=True)(type("Odd", (), {"__annotations__": {"self": "int", "b": "int"}, "b": 0}))
    ours = record(type("Odd", (), {"__annotations__": {"self": "int", "b": "int"}, "b": 0}))
    assert ours(self=1, b=2) == ours(1, 2)
    assert str(inspect.signature(ours)) == str(inspect.signature(stdlib))
    assert ours.__doc__ == stdlib.__doc__ == "Odd(self: 'int', b: 'int' = 0)"


def test_plain_subclass_of_a_frozen_record_may_add_attributes_but_not_fields() -> None:
    stdlib, ours = _twins(frozen=True)
    for base in (stdlib, ours):
        child = type("Plain", (base,), {})(1)
        child.extra = 5  # not a field: allowed on a subclass, as with dataclass
        with pytest.raises(FrozenInstanceError):
            child.a = 2
        with pytest.raises(FrozenInstanceError):
            del child.b
        del child.extra
