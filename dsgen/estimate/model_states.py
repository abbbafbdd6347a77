"""Model states on one GPU: parameters, gradients and optimizer states under ZeRO 0-3 and offload.

The accounting follows the tensors DeepSpeed 0.19.8 really allocates (read from
``runtime/fp16/fused_optimizer.py``, ``runtime/zero/stage_1_and_2.py``, ``stage3.py`` and
``partition_parameters.py``, and measured by ``bench/model_state_accuracy.py``):

* stage 0, 16-bit: ``FP16_Optimizer`` flattens the 16-bit weights, keeps a flat fp32 master copy
  and, inside ``step()``, builds a flat fp32 gradient before it drops the 16-bit ``param.grad``s.
  fp32: no wrapper; the optimizer updates the model's own weights from ``param.grad``.
* stages 1-2 (``DeepSpeedZeroOptimizer``): the 16-bit weights live in one flat buffer padded to a
  multiple of ``2·N`` elements (``nccl_start_alignment_factor`` × ranks); every rank owns an equal
  slice of it and keeps an fp32 master copy of that slice *also in fp32 training*. After backward
  the rank holds its gradient slice in a contiguous buffer sized by the parameters that overlap
  the slice, *whole* (a tensor crossing a slice boundary is held in full on both ranks); the
  optimizer step makes an fp32 copy of the slice before it frees that buffer. Stage 2 reduces
  gradients bucket by bucket during backward; with gradient accumulation its boundary micro-step
  holds the gradients accumulated so far and a new buffer, two buffers at once. Stage 1 reduces
  only at the accumulation boundary, after backward, so until then it holds every ``param.grad``
  whole.
  With CPU offload the fp32 copy, master and states live on the host, the GPU keeps one
  largest-tensor gradient staging buffer, and the host also holds a 16-bit copy of the slice and
  a largest-tensor staging buffer.
* stage 3 (``DeepSpeedZeroOptimizer_Stage3``): each tensor is split on its own into ``⌈n/N⌉``
  elements per rank; tensors of at most ``param_persistence_threshold`` elements are also kept
  whole on every rank. Gradients: a persistent 16-bit buffer of the rank's partitions, plus, in
  the step, the fp32 gradient of one optimizer sub-group (``sub_group_size``) at a time. The fp32
  master copy exists in fp32 training too. With optimizer offload (CPU or NVMe) the gradient
  buffer moves to the host with the fp32 gradients, master and states.

Everything here is computed once per plan, into one :class:`ModelStates` record (with its
:class:`Partitioning`): the GPU terms of each phase, the host and NVMe bytes one rank's offload
holds, and the element counts they are derived from. The memory estimate
(:mod:`dsgen.estimate.memory`), DeepSpeed's estimator accounting and the report read that
record; none of them derives a size again.

"Gradients" is the most gradient memory held at any one moment of a step: the hand-off inside
the optimizer step where the fp32 gradient has been formed and the gradients it was formed from
are not yet freed (DeepSpeed's own estimator counts both, "2 grads16 + 4 grads32"), or, if that
is more, the 16-bit gradients at the end of backward (ZeRO-1: all of them, whole, before the
boundary reduction; ZeRO-2 with accumulation: two partition buffers). Single-statement
temporaries (a flattened copy that dies on the same line) are not counted. One optimizer
parameter group is assumed, as ``deepspeed.initialize(model_parameters=model.parameters())``
gives. See docs/memory-model.md.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.optimizers import flat_state_bytes, state_bytes
from dsgen.estimate.parameter_layout import parameter_shapes, parameter_tensors, persistent_parameters
from dsgen.estimate.sharding import rank_split
from dsgen.estimate.swap_buffers import nvme_buffers
from dsgen.estimate.trainable import FrozenBytes, ParameterSplit, frozen_bytes, full_split
from dsgen.plan import ModelParallel, Plan, ZeroKnobs, simplest_plan
from dsgen.units import FP32
from dsgen.vocabulary import OffloadDevice, Precision

# stage_1_and_2.py: "align nccl all-gather send buffers to 4-byte boundary" -> the flat 16-bit
# group is padded to a multiple of this many elements times the data-parallel size.
NCCL_START_ALIGNMENT_FACTOR = 2
NO_FROZEN = FrozenBytes(0)


__all__ = ["parameter_shapes", "parameter_tensors", "persistent_parameters"]  # re-exported: their readers import them from here


def largest_parameter_tensor(shape: ModelShape) -> int:
    """Elements of the largest single parameter tensor (ZeRO-1/2 offload sizes staging buffers by it)."""
    return _largest_tensor(full_split(shape))


@lru_cache(maxsize=256)
def _largest_tensor(split: ParameterSplit) -> int:
    return max(split.trainable, default=0)


def zero12_partition(shape: ModelShape, ranks: int) -> int:
    """Elements of each rank's slice of the flat 16-bit group in ZeRO-1/2, alignment padding included."""
    return _zero12_partition(full_split(shape), ranks)


@lru_cache(maxsize=1024)
def _zero12_partition(split: ParameterSplit, ranks: int) -> int:
    alignment = NCCL_START_ALIGNMENT_FACTOR * ranks
    padded = -(-split.trainable_count // alignment) * alignment
    return padded // ranks


def zero12_gradient_buffer(shape: ModelShape, ranks: int) -> int:
    """Elements of the largest per-rank 16-bit gradient buffer in ZeRO-1/2 (no offload)."""
    return _zero12_gradient_buffer(full_split(shape), ranks)


@lru_cache(maxsize=1024)
def _zero12_gradient_buffer(split: ParameterSplit, ranks: int) -> int:
    """``get_partition_info`` gives a rank every tensor that starts inside its slice or straddles the
    slice's start, and the contiguous gradient buffer holds those tensors whole; the worst rank counts.
    Only trained tensors are in the flat group."""
    tensors = split.trainable
    ends = list(accumulate(tensors))
    starts = [end - n for end, n in zip(ends, tensors, strict=True)]
    size = _zero12_partition(split, ranks)
    largest = 0
    # Only ranks whose slice holds a tensor start, or begins inside a tensor, can be the worst: at
    # most two per tensor, so the loop does not grow with the rank count (issue 14: 2**53 GPUs).
    candidates = set()
    for start, end in zip(starts, ends, strict=True):
        candidates.add(start // size)
        if (start // size + 1) * size < end:
            candidates.add(start // size + 1)
    for rank in sorted(r for r in candidates if r < ranks):
        lo, hi = rank * size, (rank + 1) * size
        first = bisect_right(starts, lo) - 1  # the tensor holding element lo, if any
        if first < 0 or ends[first] <= lo:
            first += 1
        last = bisect_left(starts, hi) - 1  # the last tensor that starts before hi
        if last >= first:
            largest = max(largest, ends[last] - starts[first])
    return largest


@dataclass(frozen=True)
class Zero3Layout:
    """Per-rank element counts of ZeRO-3's partitioning of one model."""

    partition: int  # sum of ceil(n / N) over all tensors: the rank's parameter partitions
    persistent: int  # elements of the tensors kept whole on every rank
    persistent_partition: int  # the partitions of those persistent tensors
    largest_sub_group: int  # elements of the largest optimizer sub-group (sub_group_size)
    sub_groups: tuple[int, ...]  # elements of each optimizer sub-group, in order


def zero3_layout(shape: ModelShape, ranks: int, persistence_threshold: int, sub_group_size: int) -> Zero3Layout:
    """ZeRO-3's per-tensor partitioning (``partition_parameters.py``: each tensor padded to a
    multiple of N) and its optimizer sub-groups (``stage3.py::_create_fp16_sub_groups``)."""
    return _zero3_layout(full_split(shape), ranks, persistence_threshold, sub_group_size)


def _expert_start(split: ParameterSplit) -> int:
    """Index of the first of AutoEP's local experts, the tail of the split (its length without)."""
    tensors, start, held = split.trainable, len(split.trainable), 0
    while held < split.local_experts:
        start -= 1
        held += tensors[start]
    return start


def _tensor_ranks(split: ParameterSplit, ranks: int, world: int, expert_ranks: int) -> list[int]:
    """The ranks each trained tensor is partitioned over: ``ranks``, except AutoTP's replicated
    tensors (the whole world) and AutoEP's local experts (the expert-data-parallel group);
    dsgen.estimate.sharding says why."""
    count = len(split.trainable)
    out = [world if split.replicated and split.replicated[i] else ranks for i in range(count)]
    start = _expert_start(split)
    return out[:start] + [expert_ranks] * (count - start)


@lru_cache(maxsize=1024)
def _zero3_layout(
    split: ParameterSplit,
    ranks: int,
    persistence_threshold: int,
    sub_group_size: int,
    world: int | None = None,
    expert_ranks: int | None = None,
) -> Zero3Layout:
    """The layout of the trained tensors (frozen ones have no sub-groups: :func:`frozen_bytes`);
    ``world`` and ``expert_ranks``: the groups of AutoTP's replicated tensors and AutoEP's experts."""
    tensors = split.trainable
    partitioned_over = _tensor_ranks(split, ranks, world or ranks, expert_ranks or ranks)
    parts = [-(-n // r) for n, r in zip(tensors, partitioned_over, strict=True)]
    total = sum(parts)
    groups: list[int] = []
    if not total:
        groups.append(0)
    elif sub_group_size >= total:
        groups.append(total)
    else:
        current = 0
        for part in parts:
            current += part
            if current >= sub_group_size:
                groups.append(current)
                current = 0
        if current:
            groups.append(current)
    kept = [(n, part) for n, part in zip(tensors, parts, strict=True) if n <= persistence_threshold]
    return Zero3Layout(
        partition=total,
        persistent=sum(n for n, _ in kept),
        persistent_partition=sum(part for _, part in kept),
        largest_sub_group=max(groups),
        sub_groups=tuple(groups),
    )


@dataclass(frozen=True)  # one per candidate plan
class Partitioning:
    """How one plan splits the trained elements over its ``ranks`` data-parallel ranks (worst rank)."""

    parameters: int  # P, the trained parameters (the whole model in full training)
    ranks: int  # N
    even_share: int  # ⌈P/N⌉: what parameter offload and NVMe swapping hold per rank
    largest_tensor: int  # ZeRO-1/2 offload sizes its staging buffers by it
    zero12_slice: int  # ZeRO-1/2: the rank's slice of the flat 16-bit group, padding included (else 0)
    zero12_gradient_buffer: int  # ZeRO-1/2: the largest per-rank contiguous gradient buffer (else 0)
    zero3: Zero3Layout | None  # ZeRO-3's per-tensor partitions and sub-groups (ZeRO-3 or NVMe offload)

    # fp32 elements the optimizer updates in one call of its ``step``, as DeepSpeed 0.19.8 hands them
    # over: ZeRO-0 the flat fp32 master group (``FP16_Optimizer``/``BF16_Optimizer``; fp32 training:
    # the model's tensors, all in one foreach call); ZeRO-1/2 the rank's flat partition of the one
    # parameter group (``stage_1_and_2.py``, ``_optimizer_step``); ZeRO-3 one sub-group at a time,
    # the largest (``stage3.py``, ``_optimizer_step`` per ``sub_group_id``).
    stepped: int
    split: ParameterSplit  # what trains (P and every count above are of its trained tensors)
    # ZeRO-1/2: elements of the rank's flat 16-bit groups, padding included (one group, or AutoEP's
    # dense and expert groups); 0 at other stages
    flat_elements: int = 0


def partitioning(shape: ModelShape, plan: Plan, split: ParameterSplit | None = None) -> Partitioning:
    """The element counts of ``plan``'s partitioning of the trained tensors of ``split`` (the whole
    model by default; each memoised per split and rank count).

    NVMe optimizer offload swaps ZeRO-3's sub-groups, so a config that asks for it at another
    stage (``dsgen doctor`` reads such configs) is priced with ZeRO-3's layout, as DeepSpeed's
    swapper would need it."""
    whole = full_split(shape)
    split = whole if split is None else split
    split = rank_split(shape, plan.tensor_parallel_size, plan.expert_parallel_size, split)
    p = shape.parameter_count() if split is whole else split.trainable_count
    n = plan.zero_ranks
    stage = plan.zero_stage
    zero12 = stage in (1, 2)
    k = plan.knobs
    layout = None
    if stage == 3 or plan.offload_optimizer == "nvme":
        layout = _zero3_layout(
            split, n, k.param_persistence_threshold, k.sub_group_size, plan.data_parallel_size, plan.expert_zero_ranks
        )
    groups = _zero12_groups(split, n, plan.expert_zero_ranks)
    slice_ = sum(_zero12_partition(g, r) for g, r in groups) if zero12 else 0
    stepped = p
    if zero12:
        stepped = slice_
    elif layout is not None and stage == 3:
        stepped = layout.largest_sub_group
    return Partitioning(
        parameters=p,
        ranks=n,
        even_share=sum(-(-g.trainable_count // r) for g, r in groups),
        largest_tensor=_largest_tensor(split),
        zero12_slice=slice_,
        zero12_gradient_buffer=sum(_zero12_gradient_buffer(g, r) for g, r in groups) if zero12 else 0,
        zero3=layout,
        stepped=stepped,
        split=split,
        flat_elements=sum(_zero12_partition(g, r) * r for g, r in groups) if zero12 else 0,
    )


def _zero12_groups(split: ParameterSplit, ranks: int, expert_ranks: int) -> list[tuple[ParameterSplit, int]]:
    """ZeRO-1/2's flat groups and the ranks each is partitioned over: one, or under AutoEP the
    dense tensors over the data-parallel group and the local experts over the expert-data-parallel
    group (dsgen.estimate.sharding)."""
    if not split.local_experts:
        return [(split, ranks)]
    tensors, start = split.trainable_shapes, _expert_start(split)
    return [(ParameterSplit(trainable_shapes=tensors[:start]), ranks), (ParameterSplit(trainable_shapes=tensors[start:]), expert_ranks)]


@dataclass(frozen=True)  # one per candidate plan
class ModelStates:
    """One candidate's model states, computed once: what every memory term reads.

    GPU bytes of the worst rank (parameters, gradients in each phase, optimizer states kept on the
    GPU), and the host and NVMe bytes one rank's offload holds. Per-node totals multiply these by
    the node's ranks (:mod:`dsgen.estimate.memory`).
    """

    partitioning: Partitioning
    parameters: int
    backward_gradients: int  # the most gradient bytes held at the end of backward
    step_gradients: int  # ... and at the optimizer step's hand-off (fp32 copy formed)
    optimizer_states: int  # fp32 master and optimizer state on the GPU (0 when offloaded)
    partial_offload_on_gpu: int = 0  # what ZeRO-3 partial CPU offload keeps on the GPU
    offloaded_optimizer: int = 0  # host bytes of one rank's full CPU optimizer offload (0 without)
    nvme_optimizer_host: int = 0  # host bytes of one rank's NVMe optimizer offload (0 without)
    offloaded_parameters_host: int = 0  # host bytes of one rank's parameter offload (CPU or NVMe)
    pinned_rounding: int = 0  # host bytes one rank's pinned blocks take beyond their tensors
    nvme: int = 0  # NVMe bytes one rank swaps out (ZeRO-Infinity)
    frozen: FrozenBytes = NO_FROZEN  # the frozen weights (fine-tuning; dsgen.estimate.trainable)
    frozen_on_gpu: int = 0  # the GPU's share of them (ZeRO-3 parameter offload moves the partitions out)

    @property
    def gradients(self) -> int:
        """The most gradient memory held at once, in either phase."""
        return max(self.backward_gradients, self.step_gradients)

    @property
    def gpu_optimizer_states(self) -> int:
        """Optimizer bytes on the GPU: the states kept there and a partial offload's GPU share."""
        return self.optimizer_states + self.partial_offload_on_gpu


def model_states(shape: ModelShape, plan: Plan, optimizer: str, split: ParameterSplit | None = None) -> ModelStates:
    """Every model-state term of ``plan`` on one GPU and its host (see the module docstring).
    ``split``: what trains (:func:`dsgen.estimate.trainable.parameter_split`); the whole model by default.

    Memoised on the plan's fields that decide them (:func:`_model_states`): the solver prices
    every micro-batch, checkpointing mode and long-context variant of one ZeRO layout, and they
    all share its model states."""
    return _model_states(
        shape,
        split,
        optimizer,
        plan.precision,
        plan.zero_stage,
        plan.offload_optimizer,
        plan.offload_param,
        plan.offload_ratio,
        plan.knobs,
        plan.model_parallel,
        plan.data_parallel_size,
        plan.gradient_accumulation_steps > 1,
    )


@lru_cache(maxsize=4096)
def _model_states(
    shape: ModelShape,
    split: ParameterSplit | None,
    optimizer: str,
    precision: Precision,
    zero_stage: int,
    offload_optimizer: OffloadDevice,
    offload_param: OffloadDevice,
    offload_ratio: float,
    knobs: ZeroKnobs,
    model_parallel: ModelParallel,
    data_parallel_size: int,
    accumulates: bool,
) -> ModelStates:
    """The model states of every plan with these fields. Nothing here reads the micro-batch, the
    checkpointing mode or the long-context choices, and of the accumulation steps only whether
    there are several (ZeRO-2's second gradient buffer, its offload's host accumulators), so the
    plan priced is the one with those left at their simplest."""
    plan = simplest_plan(
        precision,
        zero_stage=zero_stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        gradient_accumulation_steps=2 if accumulates else 1,
        data_parallel_size=data_parallel_size,
        knobs=knobs,
        offload_ratio=offload_ratio,
        model_parallel=model_parallel,
    )
    return _plan_model_states(shape, plan, optimizer, split)


def _plan_model_states(shape: ModelShape, plan: Plan, optimizer: str, split: ParameterSplit | None) -> ModelStates:
    parts = partitioning(shape, plan, split)
    backward, step = _gradients_by_phase(shape, plan, parts)
    params, states = _parameters_and_states(shape, plan, parts, optimizer)
    frozen = frozen_bytes(
        parts.split, plan.dtype_bytes, plan.zero_stage, parts.ranks, plan.knobs.param_persistence_threshold
    )
    partitions_offloaded = plan.zero_stage == 3 and plan.offload_param != "none"
    return ModelStates(
        frozen=frozen,
        frozen_on_gpu=frozen.resident + (0 if partitions_offloaded else frozen.partitions),
        partitioning=parts,
        parameters=params,
        backward_gradients=backward,
        step_gradients=step,
        optimizer_states=states,
        partial_offload_on_gpu=_partial_offload_on_gpu(plan, parts, optimizer),
        offloaded_optimizer=_offloaded_optimizer(plan, parts, optimizer),
        nvme_optimizer_host=_nvme_optimizer_host(plan, parts, optimizer),
        offloaded_parameters_host=_offloaded_parameters_host(plan, parts, optimizer)
        + (frozen.partitions if plan.offload_param == "cpu" else 0),
        pinned_rounding=_pinned_rounding(shape, plan, parts),
        nvme=_nvme(plan, parts, optimizer),
    )


def _gradients_by_phase(shape: ModelShape, plan: Plan, parts: Partitioning) -> tuple[int, int]:
    """(end of backward, optimizer step): the most gradient bytes one GPU holds in each phase.

    Backward (activations may still be alive): stage 0 and ZeRO-1 hold every ``param.grad`` whole
    until the boundary reduction; ZeRO-2 its contiguous partition buffer (two of them at the
    boundary micro-step of gradient accumulation); ZeRO-3 its gradient-partition buffer. Step
    (activations freed): the hand-off, where the fp32 gradient has been formed from the 16-bit
    gradients still held. ZeRO-1/2 CPU offload keep a largest-tensor staging buffer throughout.
    """
    p = parts.parameters
    w = plan.dtype_bytes
    stage = plan.zero_stage
    offloaded = plan.offload_optimizer != "none"
    if stage == 0:
        # 16-bit: FP16_Optimizer adds a flat fp32 copy; fp32: no wrapper, param.grad is stepped
        return w * p, w * p + (FP32 * p if plan.mixed_precision else 0)
    if stage < 3:
        whole = w * p if stage == 1 else 0  # (p: what the rank holds, under AutoTP or AutoEP too)
        if offloaded:
            staging = w * parts.largest_tensor
            return whole + staging, staging
        buffer = w * parts.zero12_gradient_buffer
        accumulating = 2 * buffer if stage == 2 and plan.gradient_accumulation_steps > 1 else buffer
        return max(whole, accumulating), buffer + FP32 * parts.zero12_slice
    if offloaded:
        return 0, 0  # the gradient buffer and the fp32 gradients live on the host
    layout = _zero3(parts)
    return w * layout.partition, w * layout.partition + FP32 * layout.largest_sub_group


@lru_cache(maxsize=1024)
def _sub_group_state_bytes(layout: Zero3Layout, optimizer: str) -> int:
    """Optimizer state of ZeRO-3's flat sub-groups (the GPU's states and CPU offload's alike)."""
    return flat_state_bytes(optimizer, layout.sub_groups)


@lru_cache(maxsize=1024)
def _pinned_sub_group_gradients(layout: Zero3Layout) -> int:
    """Pinned rounding of each sub-group's fp32 gradient buffer under CPU optimizer offload."""
    return sum(pinned(FP32 * g) - FP32 * g for g in layout.sub_groups)


def _zero3(parts: Partitioning) -> Zero3Layout:
    assert parts.zero3 is not None, "a ZeRO-3 term asked of a plan without ZeRO-3's layout"
    return parts.zero3


@lru_cache(maxsize=256)
def _whole_model_state_bytes(split: ParameterSplit, optimizer: str) -> int:
    """Optimizer state when the optimizer sees the model's own trained tensors (no ZeRO); memoised,
    as the solver asks for it once per stage-0 candidate."""
    return state_bytes(optimizer, split.trainable_shapes)


def _parameters_and_states(shape: ModelShape, plan: Plan, parts: Partitioning, optimizer: str) -> tuple[int, int]:
    """(parameters, optimizer states) on one GPU, in bytes (the worst rank)."""
    p = parts.parameters
    w = plan.dtype_bytes
    stage = plan.zero_stage
    offloaded = plan.offload_optimizer != "none"

    if stage == 0:
        # fp32 training has no wrapper (no master copy); the optimizer sees the model's own shapes
        master = FP32 * p if plan.mixed_precision else 0
        return w * p, master + _whole_model_state_bytes(parts.split, optimizer)

    if stage < 3:
        size = parts.zero12_slice
        params = w * parts.flat_elements  # the flat 16-bit groups, padding included
        return params, 0 if offloaded else FP32 * size + flat_state_bytes(optimizer, (size,))

    layout = _zero3(parts)
    # Persistent tensors keep their whole data and their partition on the GPU even with offload_param.
    partitions = layout.persistent_partition if plan.offload_param != "none" else layout.partition
    params = w * (layout.persistent + partitions)
    states = FP32 * layout.partition + _sub_group_state_bytes(layout, optimizer)
    return params, 0 if offloaded else states


def _partial_offload_on_gpu(plan: Plan, parts: Partitioning, optimizer: str) -> int:
    """Optimizer bytes that stay on the GPU when only ``offload_ratio`` of them go to the CPU.

    ZeRO-3's partial offload (``offload_optimizer.ratio`` < 1) keeps the remaining sub-groups'
    fp32 master weights, optimizer states and fp32 gradients on the GPU and steps them there.
    The fp32 master slice is counted in fp32 training too: ZeRO-3 clones one whatever the
    training dtype (``stage3.py``; the no-offload path and :func:`_offloaded_optimizer` count it
    the same way).
    """
    if plan.offload_optimizer != "cpu" or plan.offload_ratio >= 1:
        return 0
    share = parts.even_share
    # fp32 master + fp32 gradient per element, plus the optimizer's own state
    per_partition = (FP32 + FP32) * share + flat_state_bytes(optimizer, (share,))
    return int((1 - plan.offload_ratio) * per_partition)


def _offloaded_optimizer(plan: Plan, parts: Partitioning, optimizer: str) -> int:
    """Host bytes one rank's CPU optimizer offload allocates (0 without offload).

    What DeepSpeed 0.19.8 pins on the host: the fp32 master slice, the optimizer states and the
    fp32 gradient slice (also in fp32 training), plus for ZeRO-1/2 a 16-bit copy of the slice, a
    largest-tensor 16-bit gradient staging buffer and, at stage 2 with gradient accumulation,
    16-bit accumulators for every tensor overlapping the slice (``accumulated_grads_in_cpu``);
    for ZeRO-3 the 16-bit gradient partitions. Full offload (``offload_ratio`` 1) is assumed.
    """
    if plan.offload_optimizer != "cpu" or plan.zero_stage == 0:
        return 0
    w = plan.dtype_bytes
    per_element = FP32 + FP32 + w  # master, fp32 gradient, 16-bit copy
    if plan.zero_stage < 3:
        size = parts.zero12_slice
        host = per_element * size + flat_state_bytes(optimizer, (size,)) + w * parts.largest_tensor
        if plan.zero_stage == 2 and plan.gradient_accumulation_steps > 1:
            host += w * parts.zero12_gradient_buffer
        return host
    layout = _zero3(parts)
    return per_element * layout.partition + _sub_group_state_bytes(layout, optimizer)


def _nvme_optimizer_host(plan: Plan, parts: Partitioning, optimizer: str) -> int:
    """Host bytes per rank of ZeRO-3 optimizer offload to NVMe, as DeepSpeed 0.19.8 allocates them
    (``stage3.py``): the 16-bit gradient partitions (``grad_partitions_flat_buffer``, on the host
    under optimizer offload, pinned); one fp32 gradient buffer of the largest sub-group that every
    swapped sub-group's ``.grad`` views (``initialize_optimizer_states``: ``gradient_buffer``); and
    the pinned swap buffers, ``buffer_count`` x the largest sub-group x 4 B (``SwapBufferManager``).
    The fp32 gradients themselves are swapped out to NVMe per sub-group at the boundary
    (``_offload_grad_partition_at_boundary`` -> ``_swap_out_offload_fp32_gradients``), and the fp32
    master weights and states live on NVMe; neither stays in host RAM."""
    if plan.offload_optimizer != "nvme":
        return 0
    layout = _zero3(parts)
    largest = layout.largest_sub_group
    count = nvme_buffers(optimizer).optimizer_count
    return plan.dtype_bytes * layout.partition + FP32 * largest + count * FP32 * largest


def _offloaded_parameters_host(plan: Plan, parts: Partitioning, optimizer: str) -> int:
    """Host bytes per rank of parameter offload: the 16-bit partition (CPU), or the pinned swap
    buffers ``offload_param.buffer_count x buffer_size`` (NVMe)."""
    if plan.offload_param == "cpu":
        return plan.dtype_bytes * parts.even_share
    if plan.offload_param == "nvme":
        buffers = nvme_buffers(optimizer)
        return buffers.param_count * buffers.param_size * plan.dtype_bytes
    return 0


def _nvme(plan: Plan, parts: Partitioning, optimizer: str) -> int:
    """NVMe bytes one rank swaps out. Optimizer offload swaps the fp32 master slice (which ZeRO-3
    keeps in fp32 training too) and the optimizer states; parameter offload the 16-bit partition."""
    share = parts.even_share
    total = 0
    if plan.offload_optimizer == "nvme":
        total += FP32 * share + flat_state_bytes(optimizer, (share,))
    if plan.offload_param == "nvme":
        total += plan.dtype_bytes * share
    return total


def pinned(nbytes: int) -> int:
    """Host bytes a pinned allocation of ``nbytes`` takes: PyTorch's CachingHostAllocator (what
    ``tensor.pin_memory()`` and so DeepSpeed's ``get_accelerator().pin_memory`` use) rounds every
    block up to the next power of two (``ATen/core/CachingHostAllocator.h``: "Round up the
    allocation to the nearest power of two to improve reuse", unless ``pinned_max_round_threshold``
    is set; its default is SIZE_MAX), and keeps freed blocks cached, pinned."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def _pinned_rounding(shape: ModelShape, plan: Plan, parts: Partitioning) -> int:
    """Host bytes per rank that ZeRO-3 CPU offload pins beyond the tensors' own sizes (:func:`pinned`).

    Optimizer offload pins the 16-bit gradient partitions as one flat buffer
    (``stage3.py``: ``grad_partitions_flat_buffer``) and each sub-group's fp32 gradient
    (``initialize_optimizer_states``: ``subgroup_gradient_buffer``). Parameter offload pins every
    parameter's partition on its own when it is created (``partition_parameters.py``:
    ``partitioned_tensor = get_accelerator().pin_memory(...)``), then copies them into one pinned
    flat buffer (``stage3.py``: ``param_groups_fp16_flat_cpu_memory``,
    ``_create_fp16_partitions_with_defragmentation``); the per-parameter blocks go back to the
    allocator's cache, still pinned, and no later allocation of another size reuses them, so they
    count whole. ZeRO-1/2 offload and the fp32 master weights and optimizer states (not pinned:
    ``clone()`` and ``zeros_like``) are not rounded here.

    Only the flat parameter buffer is pinned unconditionally; the gradient buffers follow
    ``offload_optimizer.pin_memory`` (``offload_optimizer_pin_memory``) and the per-parameter
    partitions ``offload_param.pin_memory`` (``Init.pin_memory``), in 0.16.9 as in 0.19.8
    (:attr:`dsgen.plan.ZeroKnobs.pin_optimizer_offload`, ``pin_param_offload``).
    """
    if plan.zero_stage != 3:
        return 0
    w = plan.dtype_bytes
    layout = _zero3(parts)
    extra = 0
    if plan.offload_optimizer == "cpu" and plan.knobs.pin_optimizer_offload:
        flat = w * layout.partition
        extra += pinned(flat) - flat
        extra += _pinned_sub_group_gradients(layout)
    if plan.offload_param == "cpu":
        flat = w * layout.partition
        extra += pinned(flat) - flat
        if plan.knobs.pin_param_offload:
            extra += _pinned_parameter_partitions(shape, w, parts.ranks)
    return extra


@lru_cache(maxsize=256)  # a property of the model, precision and data-parallel size
def _pinned_parameter_partitions(shape: ModelShape, w: int, n: int) -> int:
    """Pinned host bytes of every parameter's own partition, each rounded by :func:`pinned`."""
    return sum(pinned(w * -(-t // n)) for t in parameter_tensors(shape))


# ---- readers of the record, for tests and benches that ask for one term ---------------------------
def model_state_bytes(shape: ModelShape, plan: Plan, optimizer: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer states) on one GPU, in bytes (the worst rank).

    ``gradients`` is the larger of the two phases of :class:`ModelStates`.
    """
    states = model_states(shape, plan, optimizer)
    return states.parameters, states.gradients, states.optimizer_states
