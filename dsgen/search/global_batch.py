"""The global batch a plan must meet, and every (micro-batch, accumulation) split that meets it.

A batch that does not split evenly over the data-parallel ranks is an error naming the nearest
batches that do (or is rounded when the spec allows it): DeepSpeed's classic
``train_batch_size != micro_batch * accumulation * world_size`` failure, caught before launch.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, replace

from dsgen.errors import DsgenError
from dsgen.search.long_context import sequence_parallel_degrees
from dsgen.spec.types import Spec

#: Micro-batches and accumulation counts are searched among the divisors up to this bound (and
#: their cofactors), so the search costs the same for a global batch of 64 or of 10**12. A
#: micro-batch above it (with accumulation above it too) never fits a GPU.
DIVISOR_SEARCH_LIMIT = 1 << 16


def _divisors(n: int) -> list[int]:
    """Divisors of ``n``: all of them when ``n <= DIVISOR_SEARCH_LIMIT**2``, else those up to the
    limit and their cofactors (issue 14: time must not grow with the batch)."""
    small = [d for d in range(1, min(n, DIVISOR_SEARCH_LIMIT) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


@dataclass(frozen=True)
class BatchTarget:
    """The global batch the plans must meet, and a note when it differs from what was asked."""

    sequences: int
    note: str | None = None


def resolve_global_batch(spec: Spec, dp: int) -> BatchTarget:
    """Sequences per optimizer step, from ``global_batch_size`` or ``tokens_per_step``.

    The batch must split evenly over the data-parallel ranks (and any pinned micro-batch or
    accumulation). With ``constraints.allow_batch_rounding: nearest`` the closest batch that does
    is used and a note says so; otherwise the error names the nearest ones that would work.
    """
    t = spec.training
    c = spec.constraints
    # Rounding honours pinned micro-batch/accumulation; without it, a pin that does not divide the
    # batch is reported against the pin itself (see batch_splits).
    rounding = c.allow_batch_rounding == "nearest"
    unit = dp * ((c.micro_batch_size or 1) * (c.gradient_accumulation_steps or 1) if rounding else 1)
    requested = _requested_sequences(spec)
    if t.tokens_per_step is not None:
        key, what = "training.tokens_per_step", f"{t.tokens_per_step} tokens per step"
    else:
        key, what = "training.global_batch_size", f"{t.global_batch_size} sequences"
    if requested == int(requested) and int(requested) % unit == 0:
        return BatchTarget(int(requested))
    lower = int(requested // unit) * unit
    upper = lower + unit
    options = [x for x in (lower, upper) if x > 0]
    if rounding:
        chosen = min(options, key=lambda x: (abs(x - requested), x))
        return BatchTarget(
            chosen,
            note=f"{what} rounded to a global batch of {chosen} sequences "
            f"({chosen * t.sequence_length} tokens), the nearest multiple of {unit}",
        )
    shown = " or ".join(
        f"{x} sequences ({x * t.sequence_length} tokens)" if t.tokens_per_step else str(x) for x in options
    )
    raise DsgenError(
        f"{what} cannot be split evenly over {dp} data-parallel GPUs",
        path=key,
        location=spec.location(key),
        hint=f"nearest global batches that can: {shown} (multiples of {unit}); "
        "or set constraints.allow_batch_rounding: nearest",
    )


def _requested_sequences(spec: Spec) -> float:
    """Sequences per step as the spec asks: ``global_batch_size``, or ``tokens_per_step`` in sequences."""
    t = spec.training
    if t.tokens_per_step is not None:
        return t.tokens_per_step / t.sequence_length
    assert t.global_batch_size is not None
    return t.global_batch_size


def global_batch_target(spec: Spec) -> BatchTarget:
    """The global batch, met over world / SP data-parallel ranks. With the Ulysses degree left to
    the solver, a batch with fewer sequences than GPUs (one million-token sequence on 8 GPUs),
    which data parallelism alone cannot spread, is met exactly at the smallest degree whose
    data-parallel size divides it, and the long-context search prices it. Otherwise the batch is
    the plain data-parallel one: rounded when the spec allows it, else the error with its
    nearest batches."""
    world = spec.hardware.world_size
    plain_dp = world // sequence_parallel_degrees(spec)[0]
    exact = replace(spec, constraints=replace(spec.constraints, allow_batch_rounding="none"))
    try:
        return resolve_global_batch(exact, plain_dp)
    except DsgenError:
        met = _met_by_sequence_parallelism(exact)
        if met is not None:
            return met
        return resolve_global_batch(spec, plain_dp)  # rounded, or the error


def _met_by_sequence_parallelism(spec: Spec) -> BatchTarget | None:
    """The exact batch at the smallest Ulysses degree that splits it, when the degree is the
    solver's to choose and the batch has fewer sequences than GPUs."""
    world = spec.hardware.world_size
    if spec.constraints.sequence_parallel_size is not None or not spec.long_context_searchable:
        return None
    if _requested_sequences(spec) >= world:
        return None
    for sp in sequence_parallel_degrees(spec, search=True)[1:]:
        with suppress(DsgenError):
            target = resolve_global_batch(spec, world // sp)
            if not batch_splits(spec, world // sp, target.sequences):  # a pinned split that misses
                continue
            plural = "s" if target.sequences != 1 else ""
            return replace(
                target,
                note=f"{target.sequences} sequence{plural} per step cannot occupy {world} GPUs by data "
                f"parallelism; only plans with Ulysses SP {sp} or more meet the batch",
            )
    return None


def batch_splits(spec: Spec, dp: int, global_batch: int) -> list[tuple[int, int]]:
    """Every (micro-batch, accumulation) that meets ``global_batch`` exactly on ``dp`` ranks,
    smallest micro-batch first."""
    c = spec.constraints
    per_rank = global_batch // dp
    splits = []
    if c.micro_batch_size is not None:  # a pin is checked directly, whatever its size
        candidates = [c.micro_batch_size] if per_rank % c.micro_batch_size == 0 else []
    elif c.gradient_accumulation_steps is not None:
        accum = c.gradient_accumulation_steps
        candidates = [per_rank // accum] if per_rank % accum == 0 else []
    else:
        candidates = _divisors(per_rank)
    for micro in candidates:
        accum = per_rank // micro
        if c.micro_batch_size is not None and micro != c.micro_batch_size:
            continue
        if c.gradient_accumulation_steps is not None and accum != c.gradient_accumulation_steps:
            continue
        splits.append((micro, accum))
    if not splits:
        if c.micro_batch_size is not None and c.gradient_accumulation_steps is not None:
            # Both pinned: neither alone is at fault, their product is. Point at the one that
            # cannot be part of any split (micro-batch first), else at micro_batch_size.
            micro, accum = c.micro_batch_size, c.gradient_accumulation_steps
            pinned = "gradient_accumulation_steps" if per_rank % micro == 0 and per_rank % accum else "micro_batch_size"
            pairs = [f"{micro} x {per_rank // micro}"] if per_rank % micro == 0 else []
            if per_rank % accum == 0:
                pairs.append(f"{per_rank // accum} x {accum}")
            valid = f"valid pairs that keep one pin: {' or '.join(pairs)}; otherwise " if pairs else ""
            raise DsgenError(
                f"micro_batch_size x gradient_accumulation_steps = {micro} x {accum} = {micro * accum}, "
                f"but it must equal the {per_rank} sequences each of the {dp} GPUs gets per step "
                f"(global batch {global_batch})",
                path=f"constraints.{pinned}",
                location=spec.location(f"constraints.{pinned}"),
                hint=f"{valid}pin two divisors of {per_rank} ({', '.join(map(str, _divisors(per_rank)))}) "
                f"whose product is {per_rank}, or unpin one of them",
            )
        pinned = "micro_batch_size" if c.micro_batch_size is not None else "gradient_accumulation_steps"
        value = c.micro_batch_size if c.micro_batch_size is not None else c.gradient_accumulation_steps
        raise DsgenError(
            f"{value} does not divide the {per_rank} sequences each of the {dp} GPUs gets per step "
            f"(global batch {global_batch})",
            path=f"constraints.{pinned}",
            location=spec.location(f"constraints.{pinned}"),
            hint=f"choose a divisor of {per_rank}: {', '.join(map(str, _divisors(per_rank)))}",
        )
    return splits
