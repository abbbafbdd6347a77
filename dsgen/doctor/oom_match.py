"""Set an out-of-memory message against the prediction: which allocation it most likely was.

A failed request is one tensor. The doctor lists the single allocations a step makes whose size
the model knows (one fp32 optimizer partition, also under ZeRO-1/2 CPU offload, the flat 16-bit
parameter buffer, a gradient partition, a reduce bucket, a gathered ZeRO-3 module, the logits,
eager attention scores, the MLP intermediate) and names the one within 12% of the requested size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsgen.doctor.oom_message import OomMessage
from dsgen.estimate.memory import one_reduce_bucket_bytes
from dsgen.estimate.zero12_offload import writes_back_through_gpu
from dsgen.search.evaluation import Evaluation
from dsgen.spec.types import Spec
from dsgen.units import FP32, gib

TOLERANCE = 0.12  # relative: sizes in messages are rounded to two decimals of a unit
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


@dataclass(frozen=True)
class Allocation:
    """One allocation of known size, the phase it happens in and the memory term it belongs to."""

    what: str
    phase: str  # engine start | forward | backward | loss | optimizer step
    term: str  # a GPU memory term of the model
    size: int


@dataclass(frozen=True)
class OomReading:
    """What the doctor makes of one message."""

    message: OomMessage
    match: Allocation | None
    fragmentation: bool
    notes: tuple[str, ...]


def allocations(spec: Spec, evaluation: Evaluation) -> list[Allocation]:
    """The single allocations of ``evaluation``'s plan a failed request may have been, sized from
    the plan's model-state record (one partition, the flat copy) and its activation shapes."""
    m = spec.model
    plan = evaluation.plan
    parts = evaluation.memory.model_states.partitioning
    p = parts.parameters
    w = plan.dtype_bytes
    partition = parts.even_share if plan.zero_stage >= 1 else p
    tokens = plan.micro_batch_size * spec.training.sequence_length
    found = []
    if plan.offload_optimizer == "none" or plan.offload_ratio < 1:
        found.append(
            Allocation(
                "one fp32 optimizer partition (master weights, an Adam moment or its temporary)",
                "optimizer step",
                "optimizer_states",
                FP32 * partition,
            )
        )
    elif plan.zero_stage in (1, 2):
        found.append(_offloaded_partition(spec.training.deepspeed_version, FP32 * partition))
    if plan.zero_stage < 3:
        found.append(Allocation("the flat 16-bit copy of all parameters", "engine start", "parameters", w * p))
    grad_partition = parts.even_share if plan.zero_stage >= 2 else p
    found.append(
        Allocation(
            "the 16-bit gradient partition (contiguous gradient buffer)", "backward", "gradients", w * grad_partition
        )
    )
    if plan.zero_stage >= 1:
        found.append(Allocation("one reduce bucket", "backward", "buffers", one_reduce_bucket_bytes(plan)))
    if plan.zero_stage == 3:
        found.append(
            Allocation(
                "the largest module's gathered parameters", "forward", "buffers", w * m.largest_module_parameters()
            )
        )
    found.append(Allocation("the fp32 logits of the loss", "loss", "transient", FP32 * tokens * m.vocab_size))
    found.append(Allocation("the 16-bit logits", "forward", "activations", w * tokens * m.vocab_size))
    found.append(
        Allocation("one MLP intermediate activation", "forward", "activations", w * tokens * m.intermediate_size)
    )
    if spec.training.attention == "eager":
        scores = w * plan.micro_batch_size * m.num_attention_heads * spec.training.sequence_length**2
        found.append(Allocation("one layer's attention scores (eager attention)", "forward", "activations", scores))
    return found


def _offloaded_partition(release: str, size: int) -> Allocation:
    """An fp32 partition on the GPU of a ZeRO-1/2 plan that offloads its optimizer: the write-back
    copy of the releases that make one, else a sign that the optimizer is not offloaded."""
    if writes_back_through_gpu(release):
        what = (
            f"the fp32 copy of the rank's partition DeepSpeed {release} makes on the GPU to write the updated "
            "weights back (ZeRO-1/2 CPU offload, 0.14.1 to 0.16.x; 0.17.0 stages it on the host)"
        )
        return Allocation(what, "optimizer step", "step_temporary", size)
    what = (
        "one fp32 optimizer partition, which CPU offload keeps on the host: check that the config's "
        "offload_optimizer block reaches DeepSpeed"
    )
    return Allocation(what, "optimizer step", "optimizer_states", size)


def read_oom(message: OomMessage, spec: Spec, evaluation: Evaluation) -> OomReading:
    best: Allocation | None = None
    best_distance = math.inf
    for allocation in allocations(spec, evaluation):
        if allocation.size <= 0:
            continue
        distance = abs(math.log(message.tried / allocation.size))
        if distance < best_distance:
            best, best_distance = allocation, distance
    match = best if best is not None and best_distance <= math.log(1 + TOLERANCE) else None
    notes: list[str] = []
    capacity = spec.hardware.gpu.memory_bytes
    if message.capacity is not None and abs(message.capacity - capacity) > 0.1 * capacity:
        notes.append(
            f"the message's GPU has {gib(message.capacity)} in total, the spec's {spec.hardware.gpu.name} "
            f"{gib(capacity)}: check that the spec describes the machine that failed"
        )
    if match is not None:
        notes.append(
            f"the {gib(message.tried)} request matches {match.what} ({gib(match.size)}): "
            f"{match.phase}, the {match.term} term"
        )
    else:
        notes.append(f"the {gib(message.tried)} request matches no single allocation the model sizes")
    held = message.process_in_use if message.process_in_use is not None else message.allocated
    if held is not None:
        notes.append(
            f"at the failure this process held {gib(held)}; the model predicts a peak of "
            f"{gib(evaluation.memory.gpu.total)} ({evaluation.memory.gpu.peak_phase.replace('_', '/')})"
        )
    fragmentation = message.fragmentation
    if fragmentation:
        assert message.reserved_unallocated is not None
        notes.append(
            f"{gib(message.reserved_unallocated)} was reserved by PyTorch but unallocated, more than the request: "
            f"fragmentation; set {EXPANDABLE}"
        )
    elif (
        message.reserved_unallocated is not None
        and message.capacity
        and message.reserved_unallocated > 0.05 * message.capacity
    ):
        notes.append(
            f"{gib(message.reserved_unallocated)} reserved but unallocated: fragmentation adds to the shortage; "
            f"{EXPANDABLE} may help"
        )
    return OomReading(message=message, match=match, fragmentation=fragmentation, notes=tuple(notes))
