"""The ZeRO knob settings the solver tries for a plan, fastest first, and ZeRO++'s choices."""

from __future__ import annotations

from dataclasses import replace

from dsgen.catalog.model_shape import ModelShape
from dsgen.plan import ZeroKnobs


def _bucket(shape: ModelShape) -> int:
    """HF's "auto" reduce bucket (h^2), bounded to 1e7..5e8 elements and even, as DeepSpeed requires."""
    h = shape.hidden_size
    bucket = max(10_000_000, min(h * h, 500_000_000))
    return bucket - bucket % 2


def default_knobs(shape: ModelShape, stage: int) -> ZeroKnobs:
    """The first (fastest) knob setting tried for a stage; see :func:`knob_variants`."""
    return knob_variants(shape, stage)[0]


def knob_variants(shape: ModelShape, stage: int) -> list[ZeroKnobs]:
    """ZeRO settings to try for one plan, fastest first, each leaner in GPU memory than the last.

    Because each variant needs no more memory than the one before it, taking the first variant
    that fits gives the fastest fitting setting for that plan without trying every combination.
    Stage 1/2: the reduce bucket (h^2, then 5e7) and, at stage 2, overlap_comm (two buckets, then
    one). Stage 3: prefetch one largest module ahead with persistent small parameters, then the HF
    defaults (0.9 h^2 prefetch, 10 h persistence), then lean settings for tight memory.
    """
    h = shape.hidden_size
    bucket = _bucket(shape)
    small = min(bucket, 50_000_000)
    if stage == 0:
        return [ZeroKnobs(overlap_comm=False)]
    if stage in (1, 2):
        overlap = stage == 2
        variants = [ZeroKnobs(reduce_bucket_size=bucket, allgather_bucket_size=bucket, overlap_comm=overlap)]
        if small < bucket:
            variants.append(ZeroKnobs(reduce_bucket_size=small, allgather_bucket_size=small, overlap_comm=overlap))
        if overlap:
            variants.append(ZeroKnobs(reduce_bucket_size=small, allgather_bucket_size=small, overlap_comm=False))
        return variants
    largest_linear = max(h * shape.intermediate_size, h * shape.q_size)
    return [
        ZeroKnobs(
            reduce_bucket_size=bucket,
            allgather_bucket_size=bucket,
            overlap_comm=True,
            prefetch_bucket_size=min(largest_linear, 500_000_000),
            param_persistence_threshold=max(10 * h, 100_000),
            max_live_parameters=1_000_000_000,
            sub_group_size=1_000_000_000,
        ),
        ZeroKnobs(
            reduce_bucket_size=bucket,
            allgather_bucket_size=bucket,
            overlap_comm=True,
            prefetch_bucket_size=int(0.9 * h * h),
            param_persistence_threshold=10 * h,
            max_live_parameters=300_000_000,
            sub_group_size=100_000_000,
        ),
        ZeroKnobs(
            reduce_bucket_size=small,
            allgather_bucket_size=small,
            overlap_comm=True,
            prefetch_bucket_size=min(int(0.9 * h * h), 10_000_000),
            param_persistence_threshold=min(10 * h, 10_000),
            max_live_parameters=100_000_000,
            max_reuse_distance=100_000_000,
            sub_group_size=100_000_000,
        ),
    ]


#: ZeRO++ features the solver may use per ``constraints.zeropp``. hpZ keeps a secondary parameter
#: copy within the node and changes no numerics; qwZ (int8 weight all-gather) and qgZ (int4
#: gradient reduce-scatter) quantize, so the solver uses them only when the user asks (``full``).
ZEROPP_CHOICES: dict[str, list[str]] = {
    "auto": ["none", "hpz"],
    "none": ["none"],
    "hpz": ["hpz"],
    "full": ["hpz+qwz+qgz"],
}


def with_zeropp(knobs: ZeroKnobs, zeropp: str, gpus_per_node: int) -> ZeroKnobs:
    if zeropp == "none":
        return knobs
    return replace(
        knobs,
        hpz_partition_size=gpus_per_node if "hpz" in zeropp else 1,
        quantized_weights="qwz" in zeropp,
        quantized_gradients="qgz" in zeropp,
    )
