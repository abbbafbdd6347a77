"""Search precision x ZeRO stage x offload x checkpointing x micro-batch for the fastest plan that fits.

The search is exhaustive over the (small) discrete space: every candidate is priced by the pure
memory and step-time models, then ranked. It is deterministic: candidates are generated in a
fixed order and ties break toward the simpler plan.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError, InfeasibleError
from dsgen.estimate.memory import HOST_RESERVE, MemoryEstimate, estimate_memory
from dsgen.estimate.throughput import StepTime, estimate_step_time
from dsgen.plan import Plan, ZeroKnobs
from dsgen.spec.types import Spec

GIB = 1 << 30
OFFLOAD_ORDER = {"none": 0, "cpu": 1, "nvme": 2}


@dataclass(frozen=True)
class Evaluation:
    """One candidate plan with its predicted memory and step time."""

    plan: Plan
    memory: MemoryEstimate
    step: StepTime
    usable_gpu_bytes: int
    usable_cpu_bytes: int
    sequence_length: int

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
        return self.fits_gpu and self.fits_cpu and self.fits_nvme

    @property
    def tokens_per_s(self) -> float:
        return self.plan.global_batch_size * self.sequence_length / self.step.total_s

    def shortfall(self) -> float:
        """How far over budget the tightest resource is (1.0 = exactly at the limit)."""
        ratios = [self.memory.gpu.total / self.usable_gpu_bytes, self.memory.cpu.total / self.usable_cpu_bytes]
        if self.memory.nvme.total:
            ratios.append(self.memory.nvme.total / max(self.memory.nvme.capacity, 1))
        return max(ratios)

    def reason(self) -> str:
        """Why this plan does not fit, with numbers (empty when it fits)."""
        problems = []
        if not self.fits_gpu:
            problems.append(f"needs {gib(self.memory.gpu.total)} per GPU, {gib(self.usable_gpu_bytes)} usable")
        if not self.fits_cpu:
            problems.append(
                f"needs {gib(self.memory.cpu.total)} host RAM per node, {gib(self.usable_cpu_bytes)} usable"
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
    spec: Spec
    best: Evaluation | None  # fastest feasible plan, or the pinned plan when everything is pinned
    ranked: tuple[Evaluation, ...]  # every feasible plan, fastest first
    alternatives: tuple[Alternative, ...]
    closest: Evaluation | None  # the candidate that misses by least, when nothing fits
    candidates_evaluated: int
    fully_pinned: bool

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible


def gib(value: float) -> str:
    if value >= 1024 * GIB:
        return f"{value / (1024 * GIB):.2f} TiB"
    return f"{value / GIB:.1f} GiB"


def resolve_precision(spec: Spec) -> str:
    """bf16 where the GPU supports it, else fp16, else fp32 — unless the spec pins one."""
    chosen = spec.training.precision
    if chosen != "auto":
        return chosen
    gpu = spec.hardware.gpu
    if gpu.bf16:
        return "bf16"
    return "fp16" if gpu.fp16 else "fp32"


def default_knobs(shape: ModelShape, stage: int) -> ZeroKnobs:
    """ZeRO sizes scaled to the model as the HF integration does (h^2, 0.9 h^2, 10 h), bounded
    so small models keep efficient buckets and large ones do not pay gigabytes of buffers."""
    h = shape.hidden_size
    bucket = max(10_000_000, min(h * h, 500_000_000))
    bucket -= bucket % 2  # DeepSpeed requires even all-gather buckets
    return ZeroKnobs(
        reduce_bucket_size=bucket,
        allgather_bucket_size=bucket,
        overlap_comm=stage >= 2,
        contiguous_gradients=True,
        prefetch_bucket_size=int(0.9 * h * h),
        param_persistence_threshold=10 * h,
        max_live_parameters=1_000_000_000,
        max_reuse_distance=1_000_000_000,
        sub_group_size=1_000_000_000,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _batch_splits(spec: Spec, dp: int) -> list[tuple[int, int]]:
    """Every (micro-batch, accumulation) that meets the global batch exactly on ``dp`` ranks."""
    global_batch = spec.training.global_batch_size
    assert global_batch is not None
    c = spec.constraints
    if global_batch % dp:
        lower = (global_batch // dp) * dp
        options = [str(x) for x in (lower, lower + dp) if x > 0]
        raise DsgenError(
            f"{global_batch} sequences cannot be split evenly over {dp} data-parallel GPUs",
            path="training.global_batch_size",
            location=spec.location("training.global_batch_size"),
            hint=f"nearest global batches that can: {' or '.join(options)} (multiples of {dp})",
        )
    per_rank = global_batch // dp
    splits = []
    for micro in _divisors(per_rank):
        accum = per_rank // micro
        if c.micro_batch_size is not None and micro != c.micro_batch_size:
            continue
        if c.gradient_accumulation_steps is not None and accum != c.gradient_accumulation_steps:
            continue
        splits.append((micro, accum))
    if not splits:
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


def _choices(pinned: object, options: list) -> list:
    return options if pinned is None else [pinned]


def _candidates(spec: Spec) -> Iterator[Plan]:
    """All plans allowed by the spec, in a fixed order (simplest first)."""
    c = spec.constraints
    dp = spec.hardware.world_size
    precision = resolve_precision(spec)
    splits = _batch_splits(spec, dp)
    offload_targets = ["none", "cpu"] + (["nvme"] if spec.hardware.nvme else [])
    for stage in _choices(c.zero_stage, [0, 1, 2, 3]):
        knobs = default_knobs(spec.model, stage)
        # ZeRO-1/2 treat an NVMe optimizer device as CPU offload; only ZeRO-3 swaps to NVMe.
        optimizer_targets = offload_targets if stage == 3 else ["none", "cpu"]
        if stage == 0:
            optimizer_offloads = ["none"]
        elif c.offload_optimizer is None:
            optimizer_offloads = optimizer_targets
        else:
            optimizer_offloads = [c.offload_optimizer] if c.offload_optimizer in optimizer_targets else []
        param_offloads = _choices(c.offload_param, offload_targets) if stage == 3 else ["none"]
        for offload_optimizer in optimizer_offloads:
            for offload_param in param_offloads:
                if offload_param != "none" and offload_optimizer == "none" and c.offload_optimizer is None:
                    continue  # DeepSpeed offloads parameters only alongside optimizer states
                for checkpointing in _choices(c.activation_checkpointing, [False, True]):
                    for micro, accum in splits:
                        yield Plan(
                            precision=precision,
                            zero_stage=stage,
                            offload_optimizer=offload_optimizer,
                            offload_param=offload_param,
                            activation_checkpointing=checkpointing,
                            micro_batch_size=micro,
                            gradient_accumulation_steps=accum,
                            data_parallel_size=dp,
                            knobs=knobs,
                        )


def evaluate(spec: Spec, plan: Plan) -> Evaluation:
    """Price one plan against the spec's hardware."""
    hardware = spec.hardware
    memory = estimate_memory(spec.model, plan, hardware, spec.training)
    step = estimate_step_time(spec.model, plan, hardware, spec.training)
    return Evaluation(
        plan=plan,
        memory=memory,
        step=step,
        usable_gpu_bytes=int(hardware.gpu.memory_bytes * (1 - spec.constraints.memory_headroom)),
        usable_cpu_bytes=int(hardware.cpu_memory_bytes * (1 - HOST_RESERVE)),
        sequence_length=spec.training.sequence_length,
    )


def _rank_key(e: Evaluation) -> tuple:
    p = e.plan
    return (
        round(e.step.total_s, 9),
        OFFLOAD_ORDER[p.offload_param],
        OFFLOAD_ORDER[p.offload_optimizer],
        p.zero_stage,
        p.activation_checkpointing,
        -p.micro_batch_size,
    )


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


def solve(spec: Spec) -> SolveResult:
    """Evaluate every candidate and rank the feasible ones (pure function of the spec)."""
    evaluations = [evaluate(spec, plan) for plan in _candidates(spec)]
    feasible = sorted((e for e in evaluations if e.feasible), key=_rank_key)
    closest = None if feasible else min(evaluations, key=lambda e: (e.shortfall(), _rank_key(e)))
    pinned = _is_fully_pinned(spec)
    # A fully pinned spec reports that exact plan, feasible or not.
    best = evaluations[0] if pinned else (feasible[0] if feasible else None)
    chosen_stage = (best or closest).plan.zero_stage if (best or closest) else None
    alternatives = []
    for stage in range(4):
        if stage == chosen_stage:
            continue
        of_stage = [e for e in evaluations if e.plan.zero_stage == stage]
        if not of_stage:
            alternatives.append(Alternative(stage, None, "excluded by constraints"))
            continue
        fits = [e for e in of_stage if e.feasible]
        if fits:
            top = min(fits, key=_rank_key)
            reason = f"fits; {top.step.total_s:.2f} s/step"
            if best is not None and best.feasible:
                ratio = top.step.total_s / best.step.total_s
                reason += f" ({ratio:.2f}x the chosen plan's step time)"
        else:
            top = min(of_stage, key=lambda e: (e.shortfall(), _rank_key(e)))
            reason = f"does not fit: {top.reason()}"
        alternatives.append(Alternative(stage, top, reason))
    return SolveResult(
        spec=spec,
        best=best,
        ranked=tuple(feasible),
        alternatives=tuple(alternatives),
        closest=closest,
        candidates_evaluated=len(evaluations),
        fully_pinned=pinned,
    )


def require_feasible(result: SolveResult) -> Evaluation:
    """The chosen plan, or an :class:`InfeasibleError` that says what came closest and by how much."""
    if result.feasible:
        assert result.best is not None
        return result.best
    miss = result.best if result.fully_pinned else result.closest
    assert miss is not None
    spec = result.spec
    what = "the pinned plan" if result.fully_pinned else "no plan fits; the closest is"
    raise InfeasibleError(
        f"{what} {miss.plan.describe()}: {miss.reason()}",
        hint=_infeasible_hint(spec, miss),
    )


def _infeasible_hint(spec: Spec, miss: Evaluation) -> str:
    if not miss.fits_cpu:
        return "add host RAM (hardware.cpu_memory_gib), declare NVMe (hardware.nvme), or add nodes"
    if not miss.fits_gpu:
        return "add GPUs or nodes, shorten training.sequence_length, or relax constraints"
    return "declare more NVMe capacity (hardware.nvme.capacity_gib)"
