"""Memoisation for the pricing of one candidate plan.

The solver prices hundreds of candidates per spec with the same model shape, hardware and
training section, so most terms of a candidate were already computed for the one before it.
``functools.lru_cache`` would key those terms on the spec's dataclasses, and hashing a
``Training`` (optimizer, scheduler, fine-tuning, generation ...) costs more than most of the terms
it would save. :func:`identity_cache` keys them on the identity of their arguments instead: every
argument is an immutable (frozen) value, so the same objects give the same answer, and the cache
holds the objects themselves, so an identity cannot be reused by another object while its entry
lives.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

_T = TypeVar("_T")


def identity_cache(maxsize: int = 64) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Memoise a pure function of immutable positional arguments on their identities.

    Only for functions whose arguments are frozen values (never lists or dicts that could change
    between calls). At most ``maxsize`` entries are kept; when full the cache starts again empty
    (the solver's working set is a handful of shapes and one spec at a time).
    """

    def decorate(function: Callable[..., _T]) -> Callable[..., _T]:
        cache: dict[tuple[int, ...], tuple[tuple[Any, ...], _T]] = {}

        @wraps(function)
        def wrapper(*args: Any) -> _T:
            key = tuple(map(id, args))
            hit = cache.get(key)
            if hit is not None:
                return hit[1]
            value = function(*args)
            if len(cache) >= maxsize:
                cache.clear()
            cache[key] = (args, value)  # the arguments stay alive with their entry: ids stay theirs
            return value

        wrapper.cache_clear = cache.clear  # type: ignore[attr-defined]
        return wrapper

    return decorate


def memo_tables(maxsize: int = 16) -> Callable[..., dict[Any, Any]]:
    """A memo table per context: call the result with the context's immutable objects (a spec's
    shape, hardware and training) to get a dict of that context's memoised terms, which the caller
    keys on the few plan fields the terms read. The context is matched by identity
    (:func:`identity_cache`), so its costly dataclasses are never hashed; the small keys are."""

    @identity_cache(maxsize)
    def table(*context: Any) -> dict[Any, Any]:
        return {}

    return table
