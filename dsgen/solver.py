"""Search precision x ZeRO stage x offload x checkpointing x micro-batch for the fastest plan that fits.

The search is exhaustive over the (small) discrete space: every candidate is priced by the pure
memory and step-time models, then ranked within the step-time model's measured error: plans
predicted within ``STEP_TIME_TIE_BAND`` of each other are ties, and ties go to the simpler plan
(:func:`rank_within_error`). It is deterministic: candidates are generated in a fixed order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass, replace
from functools import partial
from itertools import takewhile
from typing import TypeVar

from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError, InfeasibleError
from dsgen.estimate.kernel_limits import KERNEL_LIMIT_HINT, kernel_limit
from dsgen.estimate.memory import HOST_RESERVE, MemoryEstimate, estimate_memory
from dsgen.estimate.optimizers import is_client_optimizer
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND, StepTime, estimate_step_time
from dsgen.long_context import long_context_choices, sequence_parallel_degrees, tricks_within
from dsgen.plan import LongContext, Plan, ZeroKnobs
from dsgen.spec.types import Spec
from dsgen.units import GIB
from dsgen.verdict import FitVerdict, classify, invalid
from dsgen.vocabulary import CHECKPOINTING_MODES, OFFLOAD_DEVICES, Accounting, Checkpointing, OffloadDevice, Precision

# ties break toward the simpler plan: no offload, then CPU, then NVMe; no recomputation, then
# attention only, then whole layers (the vocabulary lists them simplest first)
OFFLOAD_ORDER = {device: rank for rank, device in enumerate(OFFLOAD_DEVICES)}
CHECKPOINTING_ORDER = {mode: rank for rank, mode in enumerate(CHECKPOINTING_MODES)}

T = TypeVar("T")


@dataclass(frozen=True)  # one per candidate plan
class Evaluation:
    """One candidate plan with its predicted memory and step time."""

    plan: Plan
    memory: MemoryEstimate
    step: StepTime
    usable_gpu_bytes: int
    usable_cpu_bytes: int
    sequence_length: int
    kernel_limit: str | None = None  # why a kernel fails on this plan whatever the memory (kernel_limits.py)
    packed_samples: bool = False  # Training.packed_samples: which published runs the verdict is read against

    @property
    def fits_gpu(self) -> bool:
        return self.memory.gpu.total <= self.usable_gpu_bytes

    @property
    def fits_cpu(self) -> bool:
        return self.memory.cpu.total <= self.usable_cpu_bytes

    @property
    def fits_nvme(self) -> bool:
        return self.memory.nvme.total <= self.memory.nvme.capacity

    @property
    def feasible(self) -> bool:
        return self.fits_gpu and self.fits_cpu and self.fits_nvme and self.kernel_limit is None

    @property
    def fit(self) -> FitVerdict:
        """The calibrated verdict (fits | tight | oom | host-oom | invalid) of this plan, with its fill
        and band (dsgen.verdict); independent of the spec's own memory_headroom, which decides
        ``feasible``. A plan a kernel cannot run is ``invalid``, unless its memory already rules it
        out (``oom``, ``host-oom``), which stays the verdict.

        ``host-oom`` is said only of host RAM the spec states: against the size assumed when
        ``hardware.cpu_memory_gib`` is unset, the verdict is the GPU's, and :attr:`host_unjudged`
        says what the plan needs (the assumption still bounds what the solver picks). Of the held-out
        published runs dsgen called host-oom on the assumed size, none ran out of host memory
        (docs/prediction-accuracy.md, "Host RAM the source does not state"). A plan short of both
        is ``oom`` when the GPU runs out first (:attr:`gpu_runs_out_first`)."""
        verdict = classify(
            self.memory.gpu.total,
            self.memory.gpu.capacity,
            (not self.host_short or self.gpu_runs_out_first) and self.fits_nvme,
            long_context=self.plan.long_context.active,
            packed_samples=self.packed_samples,
        )
        runs_out = verdict.verdict in ("oom", "host-oom")
        return invalid(verdict.fill) if self.kernel_limit is not None and not runs_out else verdict

    @property
    def tokens_per_s(self) -> float:
        return self.plan.global_batch_size * self.sequence_length / self.step.total_s

    def shortfall(self) -> float:
        """How far over budget the tightest resource is (1.0 = exactly at the limit)."""
        ratios = [self.memory.gpu.total / self.usable_gpu_bytes, self.memory.cpu.total / self.usable_cpu_bytes]
        if self.memory.nvme.total:
            ratios.append(self.memory.nvme.total / max(self.memory.nvme.capacity, 1))
        return max(ratios)

    @property
    def runs_out(self) -> tuple[str, ...]:
        """What this plan runs out of: any of ``gpu``, ``host``, ``nvme`` and ``kernel`` (a
        kernel's own limit); empty when it is feasible."""
        failed = (
            ("gpu", not self.fits_gpu),
            ("host", not self.fits_cpu),
            ("nvme", not self.fits_nvme),
            ("kernel", self.kernel_limit is not None),
        )
        return tuple(name for name, fails in failed if fails)

    @property
    def host_short(self) -> bool:
        """The plan needs more host RAM than the node the spec states has (the host-oom of :attr:`fit`)."""
        return not self.fits_cpu and not self.memory.cpu.capacity_assumed

    @property
    def gpu_runs_out_first(self) -> bool:
        """Short of both GPU and host RAM, the GPU runs out first: checkpoint offload fills the host
        one layer's checkpoint at a time during forward, and a GPU that cannot hold the first
        checkpointed layer's forward (``GpuMemory.first_layer_forward``) runs out there, while the
        host holds what it held before forward. A host already short before forward (the offloaded
        model states, allocated when the engine is built) runs out first."""
        gpu, cpu = self.memory.gpu, self.memory.cpu
        return (
            cpu.checkpoints > 0
            and gpu.first_layer_forward > gpu.capacity
            and cpu.total - cpu.checkpoints <= self.usable_cpu_bytes
        )

    @property
    def host_unjudged(self) -> bool:
        """The plan needs more host RAM than the size assumed for a node whose RAM the spec does not
        state: the verdict leaves the host unjudged (:attr:`fit`) and the user is told to state it."""
        return not self.fits_cpu and self.memory.cpu.capacity_assumed

    @property
    def host_capacity_note(self) -> str:
        """What every message about host RAM adds when the spec left the node's RAM to the default:
        a host verdict then rests on a size the user never stated (empty when it was stated)."""
        if not self.memory.cpu.capacity_assumed:
            return ""
        return f" (hardware.cpu_memory_gib not set: {gib(self.memory.cpu.capacity)} per node assumed)"

    def reason(self) -> str:
        """Why this plan does not fit or run, with numbers (empty when it does)."""
        problems = [self.kernel_limit] if self.kernel_limit is not None else []
        if not self.fits_gpu:
            problems.append(f"needs {gib(self.memory.gpu.total)} per GPU, {gib(self.usable_gpu_bytes)} usable")
        if not self.fits_cpu:
            problems.append(
                f"needs {gib(self.memory.cpu.total)} host RAM per node, {gib(self.usable_cpu_bytes)} usable"
                + self.host_capacity_note
            )
        if self.gpu_runs_out_first:
            problems.append(
                f"the GPU runs out first: the first checkpointed layer's forward needs "
                f"{gib(self.memory.gpu.first_layer_forward)}, before the host holds more than that layer's checkpoint"
            )
        if not self.fits_nvme:
            if self.memory.nvme.capacity == 0:
                problems.append("needs NVMe but the spec declares none")
            else:
                problems.append(
                    f"needs {gib(self.memory.nvme.total)} NVMe per node, {gib(self.memory.nvme.capacity)} available"
                )
        return "; ".join(problems)


@dataclass(frozen=True)
class Alternative:
    """The best plan found for one ZeRO stage that was not chosen."""

    zero_stage: int
    evaluation: Evaluation | None  # None when the stage was excluded by a pin
    reason: str


@dataclass(frozen=True)
class SolveResult:
    """Everything one solve found: the chosen plan, every feasible plan ranked, and why others lost."""

    spec: Spec
    best: Evaluation | None  # fastest feasible plan, or the pinned plan when everything is pinned
    ranked: tuple[Evaluation, ...]  # every feasible plan, fastest first
    alternatives: tuple[Alternative, ...]
    closest: Evaluation | None  # the candidate that misses by least, when nothing fits
    candidates_evaluated: int
    fully_pinned: bool
    offload_alternatives: tuple[tuple[str, Evaluation, str], ...] = ()  # (offload choice, its best plan, reason)
    batch_note: str | None = None  # set when the global batch was rounded or needs Ulysses SP
    accounting: Accounting = "dsgen"

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    @property
    def fit(self) -> FitVerdict | None:
        """The calibrated verdict of the plan shown (the chosen one, else the closest miss)."""
        shown = self.best if self.best is not None else self.closest
        return shown.fit if shown is not None else None


def gib(value: float) -> str:
    if value >= 1024 * GIB:
        return f"{value / (1024 * GIB):.2f} TiB"
    return f"{value / GIB:.1f} GiB"


def resolve_precision(spec: Spec) -> Precision:
    """bf16 where the GPU supports it, else fp16, else fp32 — unless the spec pins one."""
    chosen = spec.training.precision
    if chosen != "auto":
        return chosen
    gpu = spec.hardware.gpu
    if gpu.bf16:
        return "bf16"
    return "fp16" if gpu.fp16 else "fp32"


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
    # batch is reported against the pin itself (see _batch_splits).
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
    if spec.constraints.sequence_parallel_size is not None or not _long_context_searchable(spec):
        return None
    if _requested_sequences(spec) >= world:
        return None
    for sp in sequence_parallel_degrees(spec, search=True)[1:]:
        with suppress(DsgenError):
            target = resolve_global_batch(spec, world // sp)
            if not _batch_splits(spec, world // sp, target.sequences):  # a pinned split that misses
                continue
            plural = "s" if target.sequences != 1 else ""
            return replace(
                target,
                note=f"{target.sequences} sequence{plural} per step cannot occupy {world} GPUs by data "
                f"parallelism; only plans with Ulysses SP {sp} or more meet the batch",
            )
    return None


def _batch_splits(spec: Spec, dp: int, global_batch: int) -> list[tuple[int, int]]:
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


def _choices(pinned: T | None, options: list[T]) -> list[T]:
    return options if pinned is None else [pinned]


OFFLOAD_RATIOS = (1.0, 0.75, 0.5, 0.25)


@dataclass(frozen=True)  # one per searched structure
class _Structure:
    """The choices of a plan other than batch split and knob sizes."""

    stage: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    offload_ratio: float
    zeropp: str
    checkpointing: Checkpointing
    long_context: LongContext = LongContext()


def _structures(spec: Spec, search: bool = False) -> Iterator[_Structure]:
    """:func:`_base_structures` times the long-context choices each allows (Ulysses degree
    ascending, then tiling and checkpoint offload, fewest tricks first); without ``search``
    the unpinned long-context dimensions stay off (see :func:`solve`)."""
    degrees = sequence_parallel_degrees(spec, search)
    for base in _base_structures(spec):
        for sp in degrees:
            for long_context in long_context_choices(spec, sp, base.checkpointing, search):
                yield replace(base, long_context=long_context)


def _base_structures(spec: Spec) -> Iterator[_Structure]:
    """Every allowed combination of stage, offload (with partial-offload share), ZeRO++ and
    checkpointing, in a fixed order (simplest first)."""
    c = spec.constraints
    hw = spec.hardware
    offload_targets: list[OffloadDevice] = [d for d in OFFLOAD_DEVICES if d != "nvme" or hw.nvme]
    # selective recomputation drops the eager attention's s x s tensors; flash and sdpa never keep
    # them, so there it would only cost time (it stays available as a pin)
    eager = spec.training.attention == "eager"
    checkpointing_modes = [m for m in CHECKPOINTING_MODES if m != "selective" or eager]
    for stage in _choices(c.zero_stage, [0, 1, 2, 3]):
        # ZeRO-1/2 treat an NVMe optimizer device as CPU offload; only ZeRO-3 swaps to NVMe.
        optimizer_targets: list[OffloadDevice] = offload_targets if stage == 3 else ["none", "cpu"]
        if stage == 0 or is_client_optimizer(spec.training.optimizer):
            # a client optimizer (Adafactor, 8-bit AdamW) is never offloaded: see the spec loader
            optimizer_offloads: list[OffloadDevice] = ["none"]
        elif c.offload_optimizer is None:
            optimizer_offloads = optimizer_targets
        else:
            optimizer_offloads = [c.offload_optimizer] if c.offload_optimizer in optimizer_targets else []
        param_offloads: list[OffloadDevice] = _choices(c.offload_param, offload_targets) if stage == 3 else ["none"]
        for offload_optimizer in optimizer_offloads:
            for offload_param in param_offloads:
                if offload_param != "none" and offload_optimizer == "none" and c.offload_optimizer is None:
                    continue  # DeepSpeed offloads parameters only alongside optimizer states
                # partial offload (offload_optimizer.ratio < 1) exists only for ZeRO-3 CPU offload
                # and needs DeepSpeedCPUAdam, i.e. an Adam-family optimizer
                partial = (
                    stage == 3
                    and offload_optimizer == "cpu"
                    and offload_param == "none"
                    and spec.training.optimizer.type in ("adam", "adamw")
                )
                # ZeRO++ targets multi-node ZeRO-3 with parameters on the GPU
                zeropps = (
                    ZEROPP_CHOICES[c.zeropp or "auto"]
                    if stage == 3 and hw.nodes > 1 and offload_param == "none"
                    else ["none"]
                )
                for ratio in OFFLOAD_RATIOS if partial else (1.0,):
                    for zeropp in zeropps:
                        for checkpointing in _choices(c.activation_checkpointing, checkpointing_modes):
                            yield _Structure(stage, offload_optimizer, offload_param, ratio, zeropp, checkpointing)


#: ZeRO++ features the solver may use per ``constraints.zeropp``. hpZ keeps a secondary parameter
#: copy within the node and changes no numerics; qwZ (int8 weight all-gather) and qgZ (int4
#: gradient reduce-scatter) quantize, so the solver uses them only when the user asks (``full``).
ZEROPP_CHOICES: dict[str, list[str]] = {
    "auto": ["none", "hpz"],
    "none": ["none"],
    "hpz": ["hpz"],
    "full": ["hpz+qwz+qgz"],
}


def _with_zeropp(knobs: ZeroKnobs, zeropp: str, gpus_per_node: int) -> ZeroKnobs:
    if zeropp == "none":
        return knobs
    return replace(
        knobs,
        hpz_partition_size=gpus_per_node if "hpz" in zeropp else 1,
        quantized_weights="qwz" in zeropp,
        quantized_gradients="qgz" in zeropp,
    )


def evaluate(spec: Spec, plan: Plan, accounting: Accounting = "dsgen") -> Evaluation:
    """Price one plan against the spec's hardware (``accounting``: see ``estimate_memory``)."""
    hardware = spec.hardware
    memory = estimate_memory(
        spec.model, plan, hardware, spec.training, accounting, logits_released=spec.output.logits_released
    )
    step = estimate_step_time(spec.model, plan, hardware, spec.training)
    usable_gpu, usable_cpu = _usable_bytes(spec)
    return Evaluation(
        plan=plan,
        memory=memory,
        step=step,
        usable_gpu_bytes=usable_gpu,
        usable_cpu_bytes=usable_cpu,
        sequence_length=spec.training.sequence_length,
        kernel_limit=kernel_limit(spec.model, plan, spec.training.sequence_length, spec.training.attention),
        packed_samples=spec.training.packed_samples,
    )


def _rank_key(e: Evaluation) -> tuple[float, int, int, int, int, int]:
    p = e.plan
    return (
        round(e.step.total_s, 9),
        OFFLOAD_ORDER[p.offload_param],
        OFFLOAD_ORDER[p.offload_optimizer],
        p.zero_stage,
        CHECKPOINTING_ORDER[p.checkpointing],
        -p.micro_batch_size,
    )


def simplicity_key(e: Evaluation, base: ZeroKnobs) -> tuple[float, ...]:
    """How far a plan is from the plainest DeepSpeed run, most important first: offload (parameters,
    then optimizer, then the offloaded share), ZeRO stage, quantized ZeRO++ (qwZ/qgZ change the
    numerics), hpZ, recomputation, then how many ZeRO knobs differ from the stage's first (fastest,
    least tuned) setting, ``base`` (:func:`default_knobs`), then the long-context tricks (each one
    a change to the training script) and the Ulysses degree. Offload comes before the stage because
    it moves the step onto the host: host RAM, pinned memory and DeepSpeedCPUAdam become part of
    what can fail."""
    p = e.plan
    k = p.knobs
    tuned = sum(getattr(k, name) != getattr(base, name) for name in KNOB_FIELDS)
    return (
        OFFLOAD_ORDER[p.offload_param],
        OFFLOAD_ORDER[p.offload_optimizer],
        p.offload_ratio if p.offload_optimizer != "none" else 0.0,
        p.zero_stage,
        int(k.quantized_weights or k.quantized_gradients),
        int(k.hpz_partition_size > 1),
        CHECKPOINTING_ORDER[p.checkpointing],
        tuned,
        sum((p.long_context.tiled_mlp, p.long_context.tiled_loss, p.long_context.checkpoint_offload)),
        p.long_context.sequence_parallel_size,
    )


#: ZeroKnobs fields counted by :func:`simplicity_key` (ZeRO++ is counted on its own).
KNOB_FIELDS = (
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "max_live_parameters",
    "max_reuse_distance",
    "sub_group_size",
)

#: Only the first plans of a ranking are placed by the tie rule (``solve --top`` shows at most a few);
#: the rest follow in predicted step time. Bounds the cost on a search with thousands of feasible plans.
TIE_RANKED = 32


def _within(limit: float, e: Evaluation) -> bool:
    return e.step.total_s <= limit


def rank_within_error(
    evaluations: list[Evaluation], shape: ModelShape, band: float = STEP_TIME_TIE_BAND, places: int = TIE_RANKED
) -> list[Evaluation]:
    """Feasible plans in the order the solver recommends them, respecting the model's own error.

    Plans predicted within ``band`` (relative) of the fastest remaining plan are ties the step-time
    model cannot separate (docs/throughput-model.md, "Ranking within the model's error"); of those
    the simplest (:func:`simplicity_key`) goes first, the faster of equally simple ones on top.
    Repeated for the first ``places`` places (:data:`TIE_RANKED`)."""
    remaining = sorted(evaluations, key=_rank_key)
    bases = {stage: default_knobs(shape, stage) for stage in {e.plan.zero_stage for e in remaining}}
    ranked: list[Evaluation] = []
    while remaining and len(ranked) < places:
        window = takewhile(partial(_within, remaining[0].step.total_s * (1 + band)), remaining)  # by time
        pick = min(window, key=lambda e: (simplicity_key(e, bases[e.plan.zero_stage]), _rank_key(e)))
        ranked.append(pick)
        remaining.remove(pick)
    return ranked + remaining


def _long_context_searchable(spec: Spec) -> bool:
    """Whether a long-context search could add plans: something is unpinned, and not every
    classic dimension is pinned (a fully pinned spec reports exactly its plan)."""
    c = spec.constraints
    unpinned = None in (c.sequence_parallel_size, c.tiled_mlp, c.tiled_loss, c.checkpoint_offload)
    return unpinned and not _is_fully_pinned(spec)


def _is_fully_pinned(spec: Spec) -> bool:
    c = spec.constraints
    stage_pins = c.zero_stage is not None
    optimizer_pinned = c.offload_optimizer is not None or c.zero_stage == 0
    param_pinned = c.offload_param is not None or (c.zero_stage is not None and c.zero_stage < 3)
    return (
        stage_pins
        and optimizer_pinned
        and param_pinned
        and c.activation_checkpointing is not None
        and c.micro_batch_size is not None
    )


def _no_plan_for_pins(spec: Spec) -> DsgenError:
    """The error for pins that leave nothing to search (issue 14: was ``min()`` of nothing)."""
    c = spec.constraints
    pins = {
        "zero_stage": c.zero_stage,
        "offload_optimizer": c.offload_optimizer,
        "offload_param": c.offload_param,
        "activation_checkpointing": c.activation_checkpointing,
    }
    shown = ", ".join(f"{k}: {v}" for k, v in pins.items() if v is not None)
    if c.offload_optimizer == "nvme" and ((c.zero_stage is not None and c.zero_stage < 3) or not spec.hardware.nvme):
        why = "optimizer offload to NVMe needs ZeRO-3 and hardware.nvme (ZeRO-1/2 only offload to CPU)"
    elif c.offload_param not in (None, "none") and is_client_optimizer(spec.training.optimizer):
        why = (
            f"parameter offload needs optimizer offload, which DeepSpeed does not do for the client "
            f"optimizer {spec.training.optimizer.type}"
        )
    elif c.offload_param not in (None, "none") and c.zero_stage is not None and c.zero_stage < 3:
        why = "parameter offload needs ZeRO-3"
    else:
        why = "DeepSpeed supports no plan with all of them together"
    key = next((k for k, v in pins.items() if v is not None), "zero_stage")
    return DsgenError(
        f"the pinned constraints ({shown}) leave no plan to search: {why}",
        path=f"constraints.{key}",
        location=spec.location(f"constraints.{key}"),
        hint="unpin one of them and let the solver choose",
    )


def _search(
    spec: Spec, global_batch: int, accounting: Accounting, long_search: bool = False
) -> tuple[list[Evaluation], int]:
    """Evaluate the search space with two safe prunings; return the evaluations kept and the count.

    1. Knob variants are ordered fastest-first and never larger in GPU memory than the previous
       one, so the first that fits is the best setting for that plan; leaner ones are not tried.
    2. GPU memory grows with the micro-batch while gradients are accumulated, so once a micro-batch
       does not fit on the GPU even with the leanest knobs, no larger one that still accumulates
       can. The single-step split (accumulation 1) is still tried: ZeRO-2 holds a second gradient
       buffer only when it accumulates, so that split can need less memory than smaller ones.
    """
    dp = spec.hardware.world_size
    precision = resolve_precision(spec)
    splits_by_sp = _splits_by_degree(spec, global_batch, long_search)
    # (structure without its tricks, micro, accum) -> the trick sets that fit there: a plan with
    # more tricks than one that fits uses less GPU memory but never less time, so it is skipped
    fitted: dict[tuple[_Structure, int, int], list[LongContext]] = {}
    variants_by_stage = {stage: knob_variants(spec.model, stage) for stage in range(4)}
    if next(_structures(spec, long_search), None) is None:
        raise _no_plan_for_pins(spec)
    kept: list[Evaluation] = []
    evaluated = 0

    def price(st: _Structure, knobs: ZeroKnobs, micro: int, accum: int) -> Evaluation:
        nonlocal evaluated
        evaluated += 1
        return evaluate(spec, _plan(st, precision, knobs, micro, accum, dp), accounting)

    # 3. (long-context search only) Tricks only lower GPU memory, so when a structure's leanest
    #    trick set does not fit the GPU at its leanest split and knobs, no other set of that
    #    structure and Ulysses degree can: one probe per (structure, degree) decides.
    probes: dict[_Structure, bool] = {}
    for st in _structures(spec, long_search):
        splits = splits_by_sp[st.long_context.sequence_parallel_size]
        if not splits:
            continue
        plain = replace(
            st, long_context=replace(LongContext(), sequence_parallel_size=st.long_context.sequence_parallel_size)
        )
        variants = _knob_variants_for(spec, st, variants_by_stage[st.stage])
        if long_search:
            if plain not in probes:
                tried = _probe(spec, st, splits, partial(price, _leanest(spec, st)))
                kept.extend(tried)  # candidates for the closest miss
                probes[plain] = any(e.fits_gpu for e in tried)
            if not probes[plain]:
                continue
        overflowed = False
        for micro, accum in splits:
            if overflowed and accum > 1:
                continue
            if any(tricks_within(done, st.long_context) for done in fitted.get((plain, micro, accum), ())):
                continue
            if overflowed:
                # the single-step split after an overflow (see 2.) seldom fits: try the leanest
                # knobs first, and look for faster ones only when they fit
                chosen = price(st, variants[-1], micro, accum)
                if not chosen.fits_gpu:
                    kept.append(chosen)
                    continue
            for knobs in variants:
                chosen = price(st, knobs, micro, accum)
                if chosen.fits_gpu:
                    break
            if chosen.fits_gpu and not chosen.fits_cpu and st.offload_optimizer == "nvme":
                chosen = _shrink_sub_groups(chosen, partial(price, st, micro=micro, accum=accum))
            kept.append(chosen)
            if chosen.feasible:
                fitted.setdefault((plain, micro, accum), []).append(st.long_context)
            overflowed = overflowed or not chosen.fits_gpu
    return kept, evaluated


def _plan(st: _Structure, precision: Precision, knobs: ZeroKnobs, micro: int, accum: int, dp: int) -> Plan:
    return Plan(
        precision=precision,
        zero_stage=st.stage,
        offload_optimizer=st.offload_optimizer,
        offload_param=st.offload_param,
        checkpointing=st.checkpointing,
        micro_batch_size=micro,
        gradient_accumulation_steps=accum,
        data_parallel_size=dp,
        knobs=knobs,
        offload_ratio=st.offload_ratio,
        long_context=st.long_context,
    )


def _knob_variants_for(spec: Spec, st: _Structure, stage_variants: list[ZeroKnobs]) -> list[ZeroKnobs]:
    """The knob variants of one structure: its stage's, with ZeRO++ and partial-offload sub-groups."""
    variants = [_with_zeropp(k, st.zeropp, spec.hardware.gpus_per_node) for k in stage_variants]
    if st.offload_ratio < 1:
        # DeepSpeed applies offload_optimizer.ratio per optimizer sub-group: with one sub-group
        # everything is offloaded, so split the rank's partition into at least eight.
        groups = max(1_000_000, -(-spec.model.parameter_count() // spec.hardware.world_size // 8))
        variants = [replace(k, sub_group_size=min(k.sub_group_size, groups)) for k in variants]
    return variants


def _leanest(spec: Spec, st: _Structure) -> _Structure:
    """``st`` with the trick set that needs the least GPU memory (the last: most tricks)."""
    choices = long_context_choices(spec, st.long_context.sequence_parallel_size, st.checkpointing, search=True)
    return replace(st, long_context=choices[-1])


def _probe(
    spec: Spec, st: _Structure, splits: list[tuple[int, int]], price: Callable[[ZeroKnobs, int, int], Evaluation]
) -> list[Evaluation]:
    """``st`` priced with its leanest knobs at the smallest micro-batch and at the single-step
    split (its two leanest splits; see :func:`_search`)."""
    leanest = _knob_variants_for(spec, st, knob_variants(spec.model, st.stage))[-1]
    return [price(leanest, micro, accum) for micro, accum in dict.fromkeys((splits[0], max(splits)))]


def fits_any(spec: Spec) -> bool:
    """Whether some plan fits the spec: :func:`solve`'s feasibility alone, fast enough to bisect on.

    Every structure the search would price is tried once at its leanest: the smallest Ulysses
    degree and the largest one (larger degrees hold fewer tokens per GPU; only the fp32
    gradient-reduction copy appears with SP, so 1 is tried too), every trick it allows (with and
    without checkpoint offload, which trades GPU memory for host RAM), the smallest micro-batch
    and the leanest knobs. Only memory and the kernel limits are priced (the largest degree has
    the smallest per-rank query tensor), leanest structures (ZeRO-3, offload) first.
    """
    global_batch = global_batch_target(spec).sequences
    search = _long_context_searchable(spec)
    splits_by_sp = _splits_by_degree(spec, global_batch, search)
    degrees = [d for d in sequence_parallel_degrees(spec, search) if splits_by_sp[d]]
    precision = resolve_precision(spec)
    usable_gpu, usable_cpu = _usable_bytes(spec)
    leanest_knobs = {stage: knob_variants(spec.model, stage)[-1] for stage in range(4)}
    for base in reversed(list(_base_structures(spec))):
        knobs = _knob_variants_for(spec, base, [leanest_knobs[base.stage]])[0]
        for sp in dict.fromkeys((degrees[-1], degrees[0])) if degrees else ():
            choices = long_context_choices(spec, sp, base.checkpointing, search)
            lean = {choices[-1], replace(choices[-1], checkpoint_offload=False)} & set(choices)
            micro, accum = splits_by_sp[sp][0]
            for long_context in lean:
                st = replace(base, long_context=long_context)
                plan = _plan(st, precision, knobs, micro, accum, spec.hardware.world_size)
                memory = estimate_memory(
                    spec.model, plan, spec.hardware, spec.training, logits_released=spec.output.logits_released
                )
                if (
                    memory.gpu.total <= usable_gpu
                    and memory.cpu.total <= usable_cpu
                    and memory.nvme.total <= memory.nvme.capacity
                    and kernel_limit(spec.model, plan, spec.training.sequence_length, spec.training.attention) is None
                ):
                    return True
    return False


def _usable_bytes(spec: Spec) -> tuple[int, int]:
    """(GPU, host per node) bytes a plan may use: capacity less the headroom and the host reserve."""
    hardware = spec.hardware
    return (
        int(hardware.gpu.memory_bytes * (1 - spec.constraints.memory_headroom)),
        int(hardware.cpu_memory_bytes * (1 - HOST_RESERVE)),
    )


def _splits_by_degree(spec: Spec, global_batch: int, long_search: bool) -> dict[int, list[tuple[int, int]]]:
    """(micro-batch, accumulation) splits for each Ulysses degree: the batch is met over the
    world / SP data-parallel ranks. A pin that fits no split is an error for the smallest degree
    (as without SP) and simply leaves the larger degrees without plans."""
    world = spec.hardware.world_size
    degrees = sequence_parallel_degrees(spec, long_search)
    splits: dict[int, list[tuple[int, int]]] = {}
    for sp in degrees:
        if global_batch % (world // sp):  # met at a larger degree (global_batch_target)
            splits[sp] = []
            continue
        try:
            splits[sp] = _batch_splits(spec, world // sp, global_batch)
        except DsgenError:
            if sp == degrees[0]:
                raise
            splits[sp] = []
    return splits


#: sub_group_size values tried, largest first, when host RAM is what an NVMe-offload plan lacks.
#: Its pinned swap buffers and fp32 gradient buffer scale with the largest sub-group
#: (ModelStates.nvme_optimizer_host); below 1e7 elements each NVMe transfer is
#: too small to keep the drive busy, so the search stops there.
NVME_SUB_GROUP_SIZES = (100_000_000, 50_000_000, 20_000_000, 10_000_000)


def _shrink_sub_groups(chosen: Evaluation, price: Callable[[ZeroKnobs], Evaluation]) -> Evaluation:
    """The first smaller ``sub_group_size`` whose host RAM fits, else the smallest tried."""
    for size in NVME_SUB_GROUP_SIZES:
        if size >= chosen.plan.knobs.sub_group_size:
            continue
        chosen = price(replace(chosen.plan.knobs, sub_group_size=size))
        if chosen.fits_cpu:
            break
    return chosen


def _best_of(evaluations: list[Evaluation], shape: ModelShape) -> Evaluation:
    fits = [e for e in evaluations if e.feasible]
    if fits:
        return rank_within_error(fits, shape, places=1)[0]
    return min(evaluations, key=lambda e: (e.shortfall(), _rank_key(e)))


def _compare(top: Evaluation, best: Evaluation | None) -> str:
    if top.feasible:
        text = f"fits; {top.step.total_s:.2f} s/step"
        if best is not None and best.feasible and best.step.total_s > 0:
            text += f" ({top.step.total_s / best.step.total_s:.2f}x the chosen plan's step time)"
        return text
    return f"does not fit: {top.reason()}"


def solve(spec: Spec, accounting: Accounting = "dsgen") -> SolveResult:
    """Evaluate the search space and rank the feasible plans (pure function of its inputs).

    ``accounting="deepspeed-estimator"`` prices model states with DeepSpeed's own estimator
    instead of dsgen's (see :func:`dsgen.estimate.memory.estimate_memory`)."""
    target = global_batch_target(spec)
    evaluations, evaluated = _search(spec, target.sequences, accounting)
    if not any(e.feasible for e in evaluations) and _long_context_searchable(spec):
        # ALST needs training-script changes no config carries (launch.sh lists them), so its
        # unpinned dimensions join the search only when no plan fits without them; then all
        # four are searched jointly with the others.
        more, counted = _search(spec, target.sequences, accounting, long_search=True)
        evaluations, evaluated = evaluations + more, evaluated + counted
    feasible = rank_within_error([e for e in evaluations if e.feasible], spec.model)
    closest = None if feasible else min(evaluations, key=lambda e: (e.shortfall(), _rank_key(e)))
    pinned = _is_fully_pinned(spec)
    # A fully pinned spec reports that exact plan, feasible or not.
    best = feasible[0] if feasible else (closest if pinned else None)
    shown = best or closest
    alternatives = []
    for stage in range(4):
        if shown is not None and stage == shown.plan.zero_stage:
            continue
        of_stage = [e for e in evaluations if e.plan.zero_stage == stage]
        if not of_stage:
            alternatives.append(Alternative(stage, None, "excluded by constraints"))
            continue
        top = _best_of(of_stage, spec.model)
        alternatives.append(Alternative(stage, top, _compare(top, best)))
    offload_choices = []
    if shown is not None:
        by_label: dict[str, list[Evaluation]] = {}
        for e in evaluations:
            by_label.setdefault(e.plan.offload_label(), []).append(e)
        by_label.pop(shown.plan.offload_label(), None)
        for label in sorted(by_label):
            top = _best_of(by_label[label], spec.model)
            offload_choices.append((label, top, _compare(top, best)))
    return SolveResult(
        spec=spec,
        best=best,
        ranked=tuple(feasible),
        alternatives=tuple(alternatives),
        offload_alternatives=tuple(offload_choices),
        closest=closest,
        candidates_evaluated=evaluated,
        fully_pinned=pinned,
        batch_note=target.note,
        accounting=accounting,
    )


def require_feasible(result: SolveResult) -> Evaluation:
    """The chosen plan, or an :class:`InfeasibleError` that says what came closest and by how much."""
    if result.feasible:
        assert result.best is not None
        return result.best
    miss = result.best if result.best is not None else result.closest
    assert miss is not None
    spec = result.spec
    what = "the pinned plan" if result.fully_pinned else "no plan fits; the closest is"
    raise InfeasibleError(
        f"{what} {miss.plan.describe()}: {miss.reason()}",
        hint=_infeasible_hint(spec, miss),
    )


def _infeasible_hint(spec: Spec, miss: Evaluation) -> str:
    if miss.kernel_limit is not None:
        return KERNEL_LIMIT_HINT
    if not miss.fits_cpu and miss.memory.cpu.capacity_assumed:
        return "set hardware.cpu_memory_gib to the node's RAM (the verdict assumed the default), declare NVMe (hardware.nvme), or add nodes"
    if not miss.fits_cpu:
        return "add host RAM (hardware.cpu_memory_gib), declare NVMe (hardware.nvme), or add nodes"
    if not miss.fits_gpu:
        return "add GPUs or nodes, shorten training.sequence_length, or relax constraints"
    return "declare more NVMe capacity (hardware.nvme.capacity_gib)"
