"""One candidate plan priced against the spec's hardware: its memory, step time and verdict.

The solver, the doctor and the sweep all price plans through :func:`evaluate`, so a plan's
numbers and its verdict are computed in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.kernel_limits import kernel_limit
from dsgen.estimate.memory import HOST_RESERVE, MemoryEstimate, estimate_memory
from dsgen.estimate.throughput import StepTime, estimate_step_time
from dsgen.plan import Plan
from dsgen.search.verdict import FitVerdict, classify, invalid
from dsgen.spec.types import Hardware, Spec, Training
from dsgen.units import gib
from dsgen.vocabulary import Accounting


@dataclass(frozen=True)  # one per candidate plan
class Evaluation:
    """One candidate plan with its predicted memory and step time.

    The step time is priced when first asked for (:attr:`step`): most candidates the solver prices
    do not fit, and whether one fits reads memory alone."""

    plan: Plan
    memory: MemoryEstimate
    priced_on: tuple[ModelShape, Hardware, Training]  # what the step time is priced from, beside the plan
    usable_gpu_bytes: int
    usable_cpu_bytes: int
    sequence_length: int
    kernel_limit: str | None = None  # why a kernel fails on this plan whatever the memory (kernel_limits.py)
    packed_samples: bool = False  # Training.packed_samples: which published runs the verdict is read against
    given_step: StepTime | None = None  # a step time stated instead of priced (what-if comparisons)

    @cached_property
    def step(self) -> StepTime:
        if self.given_step is not None:
            return self.given_step
        shape, hardware, training = self.priced_on
        return estimate_step_time(shape, self.plan, hardware, training)

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
        and band (dsgen.search.verdict); independent of the spec's own memory_headroom, which decides
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
            problems.append(
                f"needs {gib(self.memory.gpu.total)} per GPU ({self.fit.fill:.0%} of GPU memory), "
                f"over the {gib(self.usable_gpu_bytes)} limit"
            )
            frozen = self.memory.gpu.frozen_parameters
            if frozen > self.usable_gpu_bytes / 2:
                where = "whole on every GPU under ZeRO-0/1/2" if self.plan.zero_stage < 3 else "ZeRO-3's share"
                problems.append(f"the frozen weights alone take {gib(frozen)} ({where})")
            if self.memory.gpu.reference_model > self.usable_gpu_bytes / 4:
                problems.append(f"the reference model takes {gib(self.memory.gpu.reference_model)}")
        if not self.fits_cpu:
            problems.append(
                f"needs {gib(self.memory.cpu.total)} host RAM per node {self.memory.cpu.peak_phase}, "
                f"over the {gib(self.usable_cpu_bytes)} limit" + self.host_capacity_note
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


def usable_bytes(spec: Spec) -> tuple[int, int]:
    """(GPU, host per node) bytes a plan may use: capacity less the headroom and the host reserve."""
    hardware = spec.hardware
    return (
        int(hardware.gpu.memory_bytes * (1 - spec.constraints.memory_headroom)),
        int(hardware.cpu_memory_bytes * (1 - HOST_RESERVE)),
    )


def evaluate(spec: Spec, plan: Plan, accounting: Accounting = "dsgen") -> Evaluation:
    """Price one plan against the spec's hardware (``accounting``: see ``estimate_memory``)."""
    hardware = spec.hardware
    memory = estimate_memory(
        spec.model,
        plan,
        hardware,
        spec.training,
        accounting,
        logits_released=spec.output.logits_released,
        trainer_saves_model=spec.output.trainer_saves_model,
    )
    usable_gpu, usable_cpu = usable_bytes(spec)
    return Evaluation(
        plan=plan,
        memory=memory,
        priced_on=(spec.model, hardware, spec.training),
        usable_gpu_bytes=usable_gpu,
        usable_cpu_bytes=usable_cpu,
        sequence_length=spec.training.sequence_length,
        kernel_limit=kernel_limit(spec.model, plan, spec.training.sequence_length, spec.training.attention),
        packed_samples=spec.training.packed_samples,
    )
