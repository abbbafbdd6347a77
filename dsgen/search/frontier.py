"""``dsgen frontier``: the largest sequence length (or micro-batch) a cluster trains, found by bisection over the solver.

No closed formula: every probe is the solver's own feasibility question
(:func:`dsgen.search.solver.fits_any`, which prices the leanest plan of each structure the search
would try), and the point found is solved in full (:func:`dsgen.search.solver.solve`) for its plan,
memory and step time. Feasibility falls as the value grows (more tokens hold more activations
under every plan), which is what makes bisection sound. ``solve`` is the authority: where its
answer at the boundary differs from ``fits_any``'s, the bisection is redone over ``solve``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from dsgen.errors import DsgenError
from dsgen.estimate.sequence_parallel import sp_violation
from dsgen.search.evaluation import Evaluation
from dsgen.search.model_parallel_choices import ep_violation, tp_violation
from dsgen.search.solver import SolveResult, fits_any, solve
from dsgen.spec.types import Spec

Over = Literal["sequence_length", "micro_batch_size"]
OVER_CHOICES: tuple[Over, ...] = ("sequence_length", "micro_batch_size")

#: The longest sequence searched (issue 21: the batch search stays fast up to 2**24 tokens).
SEQUENCE_LIMIT = 1 << 24
#: Sequence lengths are searched in multiples of this (and of a pinned Ulysses degree).
SEQUENCE_GRANULE = 1024
MICRO_BATCH_LIMIT = 1 << 16


@dataclass(frozen=True)  # one per GPU count
class FrontierPoint:
    """The largest value that fits on one cluster size, and the solver's answer there."""

    gpus: int
    value: int | None  # None: not even the smallest value fits
    result: SolveResult  # the full solve at ``value`` (at the smallest value when nothing fits)
    at_limit: bool  # the search limit itself fits: the true frontier lies beyond it
    beyond: SolveResult | None = None  # the solve one granule past ``value``: what runs out there

    @property
    def nearest_beyond(self) -> Evaluation | None:
        """The plan that misses by least one granule past the frontier (None at the search limit,
        and when nothing fits: ``result`` then says why)."""
        return self.beyond.closest if self.beyond is not None else None

    @property
    def miss(self) -> Evaluation | None:
        """When nothing fits: the plan that misses by least at the smallest value (``solve``'s
        closest, or the pinned plan of a fully pinned spec), whose reason says what runs out."""
        if self.value is not None:
            return None
        return self.result.best if self.result.best is not None else self.result.closest

    @property
    def runs_out(self) -> tuple[str, ...]:
        """What runs out for :attr:`nearest_beyond`: any of ``gpu``, ``host``, ``nvme`` and
        ``kernel`` (a kernel's own limit); empty when there is no such plan."""
        e = self.nearest_beyond
        return e.runs_out if e is not None else ()

    @property
    def sequence_parallel_ceiling(self) -> str | None:
        """Why the plan's Ulysses degree is not the next one this cluster could run: the rule the
        next larger divisor of the GPU count breaks, when one does (e.g. a model's 32 query heads
        cap the degree at 32, so 64 GPUs add data parallelism, not sequence)."""
        best = self.result.best
        if self.value is None or best is None or self.result.spec.constraints.sequence_parallel_size is not None:
            return None
        spec, sp = self.result.spec, best.plan.long_context.sequence_parallel_size
        larger = [d for d in range(sp + 1, self.gpus + 1) if self.gpus % d == 0]
        if not larger:
            return None
        why = sp_violation(spec.model, larger[0], self.gpus, spec.training.sequence_length, spec.training.attention)
        return f"Ulysses degree {larger[0]}: {why}" if why else None


def spec_for_gpus(spec: Spec, gpus: int) -> Spec:
    """``spec`` on ``gpus`` GPUs of its type: one node while they fit in one, else whole nodes."""
    per_node = spec.hardware.gpus_per_node
    if gpus <= per_node:
        hardware = replace(spec.hardware, gpus_per_node=gpus, nodes=1)
    elif gpus % per_node == 0:
        hardware = replace(spec.hardware, nodes=gpus // per_node)
    else:
        raise DsgenError(
            f"{gpus} GPUs is neither at most one node of {per_node} nor whole nodes",
            path="--gpus",
            hint=f"use counts up to {per_node} or multiples of {per_node} (hardware.gpus_per_node)",
        )
    at = replace(spec, hardware=hardware)
    pinned = _pinned_degree_violation(at)
    if pinned is not None:
        key, why = pinned
        raise DsgenError(
            f"{gpus} GPUs: constraints.{key}: {why}",
            path="--gpus",
            hint=f"leave that count out, or let the solver choose constraints.{key} (auto)",
        )
    return at


def _pinned_degree_violation(spec: Spec) -> tuple[str, str] | None:
    """(key, why) for a pinned AutoTP, AutoEP or Ulysses degree this GPU count cannot run. The
    spec loader checks them on the spec's own cluster; ``--gpus`` moves it, so they are checked
    again with the same rules (else the solver has no layout to search, and no reason to give)."""
    c, model, training, hw = spec.constraints, spec.model, spec.training, spec.hardware
    found: list[tuple[str, str | None]] = []
    if c.tensor_parallel_size is not None:
        found.append(("tensor_parallel_size", tp_violation(model, c.tensor_parallel_size, hw.gpus_per_node, training)))
    if c.expert_parallel_size is not None:
        found.append(("expert_parallel_size", ep_violation(model, c.expert_parallel_size, hw.world_size, training)))
    if c.sequence_parallel_size is not None:
        sp = c.sequence_parallel_size
        found.append(
            (
                "sequence_parallel_size",
                sp_violation(model, sp, hw.world_size, training.sequence_length, training.attention),
            )
        )
    return next(((key, why) for key, why in found if why is not None), None)


def _at(spec: Spec, over: Over, value: int) -> Spec:
    """``spec`` with the searched key set to ``value``. The global batch is the spec's own
    (rounded to the nearest split, with a note), one sequence per GPU when the spec gives
    tokens per step; over micro-batches it is ``value`` per GPU."""
    world = spec.hardware.world_size
    training = spec.training
    batch = training.global_batch_size or world
    constraints = replace(spec.constraints, allow_batch_rounding="nearest")
    if over == "sequence_length":
        training = replace(training, sequence_length=value, global_batch_size=batch, tokens_per_step=None)
    else:
        training = replace(training, global_batch_size=value * world, tokens_per_step=None)
        constraints = replace(constraints, micro_batch_size=value, gradient_accumulation_steps=None)
    return replace(spec, training=training, constraints=constraints)


def _fits(spec: Spec) -> bool:
    """The fast feasibility question bisection asks (:func:`dsgen.search.solver.fits_any`)."""
    try:
        return fits_any(spec)
    except DsgenError:  # e.g. a pinned degree that does not divide this length
        return False


def _granule(spec: Spec, over: Over) -> int:
    if over == "micro_batch_size":
        return 1
    sp = spec.constraints.sequence_parallel_size or 1
    return math.lcm(SEQUENCE_GRANULE, sp)


def _bisect(fits: Callable[[int], bool], limit: int, low: int) -> int:
    """The largest ``k`` in ``1..limit`` with ``fits(k)``, or 0 when none: feasibility falls as
    ``k`` grows. ``low``: a ``k`` believed to fit (0: none known), checked before it is used."""
    if low and not fits(low):
        low = 0  # the hint did not hold here: search the whole range
    if fits(limit):
        return limit
    high = limit  # fits(low) (or low == 0); not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def _agrees(point: FrontierPoint) -> bool:
    """Whether ``solve`` confirms the boundary the fast predicate found: the value fits, one
    granule more does not, and when nothing fits, not even the smallest value does."""
    if point.value is None:
        return not point.result.feasible
    return point.result.feasible and (point.beyond is None or not point.beyond.feasible)


def frontier_point(spec: Spec, over: Over = "sequence_length", lower: int = 0) -> FrontierPoint:
    """The largest multiple of the granule up to the limit at which some plan fits.

    ``lower``: a value known to fit (a smaller cluster's frontier), which narrows the bisection.

    The bisection asks :func:`dsgen.search.solver.fits_any`, a fast stand-in for ``solve``'s own
    feasibility; the two full solves made anyway (at the value, one granule past it) check the
    boundary it found. Where they disagree (a layout ``fits_any`` misjudges), the bisection is
    redone over ``solve`` itself, so the point shown is always ``solve``'s boundary and a point
    where nothing fits always carries the closest plan's reason.
    """
    unit = _granule(spec, over)
    limit = (SEQUENCE_LIMIT if over == "sequence_length" else MICRO_BATCH_LIMIT) // unit
    solved: dict[int, SolveResult] = {}

    def solve_at(k: int) -> SolveResult:
        if k not in solved:
            solved[k] = solve(_at(spec, over, k * unit))
        return solved[k]

    def feasible_at(k: int) -> bool:
        try:
            return solve_at(k).feasible
        except DsgenError:
            return False

    def point_at(low: int) -> FrontierPoint:
        return FrontierPoint(
            gpus=spec.hardware.world_size,
            value=low * unit if low else None,
            result=solve_at(low or 1),
            at_limit=low == limit,
            beyond=solve_at(low + 1) if low and low < limit else None,
        )

    hint = min(lower // unit, limit)
    point = point_at(_bisect(lambda k: _fits(_at(spec, over, k * unit)), limit, hint))
    if not _agrees(point):
        point = point_at(_bisect(feasible_at, limit, hint))
    return point


def frontier(spec: Spec, over: Over = "sequence_length", gpus: list[int] | None = None) -> list[FrontierPoint]:
    """One :class:`FrontierPoint` per GPU count (the spec's own cluster without ``gpus``), in
    the order given. Counts are searched smallest first, so each starts from the last one's
    frontier as a hint (checked before it is used)."""
    counts = gpus or [spec.hardware.world_size]
    points: dict[int, FrontierPoint] = {}
    known = 0
    for count in sorted(set(counts)):
        point = frontier_point(spec_for_gpus(spec, count), over, lower=known)
        points[count] = point
        known = point.value or 0
    return [points[count] for count in counts]
