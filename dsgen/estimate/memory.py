"""Per-GPU, per-node host and per-node NVMe memory of one plan.

Model-state terms follow the ZeRO paper's partitioning (Rajbhandari et al. 2020) with DeepSpeed's
actual tensors (fp32 master weights and fp32 gradient partitions for mixed precision, as in
``stage_1_and_2.py`` / ``stage3.py``); buffers follow DeepSpeed's allocation of reduce buckets and
ZeRO-3 gathered parameters; activations come from :mod:`dsgen.estimate.activations`.
docs/memory-model.md documents every term and its source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.activations import estimate_activations
from dsgen.estimate.model_states import (
    ModelStates,
    model_states,
    parameter_tensors,
    zero3_layout,
    zero12_partition,
)
from dsgen.estimate.optimizers import flat_state_bytes, step_temporary_bytes
from dsgen.estimate.sequence_parallel import long_context_memory
from dsgen.plan import Plan
from dsgen.spec.types import Hardware, Optimizer, Training
from dsgen.units import FP32, GIB
from dsgen.vocabulary import ACCOUNTINGS, Accounting, StepPhase

# Fixed allowances (see docs/memory-model.md, "Overheads").
CUDA_CONTEXT_BYTES = int(0.75 * GIB)  # CUDA context, kernels and cuBLAS workspace (torch 2.x)
COMM_LIBRARY_BYTES = int(0.5 * GIB)  # NCCL communicators and their buffers
ALLOCATOR_SLACK = 0.05  # caching-allocator fragmentation, as a share of dynamic allocations
HOST_BYTES_PER_RANK = 3 * GIB  # python, torch, DeepSpeed and CUDA host state per training process
HOST_RESERVE = 0.10  # share of host RAM left for the OS, page cache and data loaders


@dataclass(frozen=True)
class NvmeBuffers:
    """The ZeRO-Infinity swap buffers dsgen renders (``templates/deepspeed/ds_config.json.j2`` reads
    these values) and prices in host RAM: one source for both (:func:`nvme_buffers`)."""

    optimizer_count: int = 4  # offload_optimizer.buffer_count, each one optimizer sub-group of fp32
    param_count: int = 5  # offload_param.buffer_count
    param_size: int = 100_000_000  # offload_param.buffer_size, elements


NVME_BUFFERS = NvmeBuffers()

#: fp32 tensors per element the optimizer swapper moves through pinned buffers besides the master
#: weight and the gradient: the optimizer's own states (Adam/AdamW two moments, the others one).
SWAPPED_STATE_TENSORS = {"adamw": 2, "adam": 2, "lion": 1, "sgd": 1, "adagrad": 1}


def nvme_buffers(optimizer: str) -> NvmeBuffers:
    """The swap buffers for ``optimizer``: as few optimizer buffers as DeepSpeed 0.19.8 needs.

    ``PartitionedOptimizerSwapper.swap_in_optimizer_state`` (swap_tensor/partitioned_optimizer_swapper.py)
    takes ``num_tensors() + 1`` buffers at once for a sub-group (fp32 master, each state, the
    gradient) and asserts it got them; dsgen renders no pipelined swapping, which would need more.
    So Adam/AdamW need DeepSpeed's default 4 and the one-state optimizers 3. Each buffer holds the
    largest sub-group (``SwapBufferManager(num_elems=largest_numel, count=buffer_count)``), which
    ``sub_group_size`` controls.
    """
    return replace(NVME_BUFFERS, optimizer_count=2 + SWAPPED_STATE_TENSORS.get(optimizer, 2))


@dataclass(frozen=True)  # one per candidate plan
class GpuMemory:
    """Per-GPU memory of one plan.

    Each reported term is its own largest value during a step. They do not all peak together:
    activations and the loss transient exist only in forward/backward, while the optimizer step
    holds the fp32 gradients (``step_gradients``) after activations are freed. ``total`` is the
    higher of the two phases, and ``peak_phase`` says which.
    """

    parameters: int
    optimizer_states: int
    activations: int
    buffers: int
    transient: int
    overhead: int
    capacity: int
    backward_gradients: int  # gradient memory while forward/backward run
    step_gradients: int  # the optimizer step's hand-off: fp32 gradients formed beside the 16-bit ones
    step_overhead: int = 0  # fixed allowances only: no activation-proportional slack in the step
    step_temporary: int = 0  # the optimizer's own working tensors while it steps (torch foreach)
    _total = None  # cache of ``total``, not a field (no annotation); set with object.__setattr__

    @property
    def gradients(self) -> int:
        """The most gradient memory held at once, in either phase (ZeRO-0/1 peak in backward)."""
        return max(self.backward_gradients, self.step_gradients)

    @property
    def forward_backward(self) -> int:
        return (
            self.parameters
            + self.backward_gradients
            + self.optimizer_states
            + self.activations
            + self.buffers
            + self.transient
            + self.overhead
        )

    @property
    def optimizer_step(self) -> int:
        return (
            self.parameters
            + self.step_gradients
            + self.optimizer_states
            + self.buffers
            + self.step_temporary
            + self.step_overhead
        )

    @property
    def total(self) -> int:
        value = self._total  # memoised: feasibility checks and ranking ask for it many times per plan
        if value is None:
            value = max(self.forward_backward, self.optimizer_step)
            object.__setattr__(self, "_total", value)
        return value

    @property
    def peak_phase(self) -> StepPhase:
        return "forward_backward" if self.forward_backward >= self.optimizer_step else "optimizer_step"


@dataclass(frozen=True)  # one per candidate plan
class HostMemory:
    """Host RAM per node, bytes: what the plan needs, what the node has, and the offload share of it."""

    total: int
    capacity: int
    offloaded_states: int
    process: int


@dataclass(frozen=True)  # one per candidate plan
class NvmeMemory:
    """NVMe bytes per node the plan writes (ZeRO-Infinity offload) against the drive's capacity."""

    total: int
    capacity: int


@dataclass(frozen=True)  # one per candidate plan
class MemoryEstimate:
    """Every memory prediction for one plan: per GPU (worst rank), host and NVMe per node."""

    gpu: GpuMemory
    cpu: HostMemory
    nvme: NvmeMemory


def buffer_bytes(shape: ModelShape, plan: Plan) -> int:
    """DeepSpeed's communication buffers and ZeRO-3's gathered parameters on one GPU."""
    if plan.zero_stage == 0:
        return 0
    w = plan.dtype_bytes
    k = plan.knobs
    # ZeRO-1/2 double the reduce bucket with overlap_comm; ZeRO-3 keeps one (measured).
    copies = 2 if k.overlap_comm and plan.zero_stage < 3 else 1
    reduce = copies * w * min(k.reduce_bucket_size, shape.parameter_count())
    if plan.zero_stage < 3:
        return reduce
    live = min(k.max_live_parameters, shape.layer_gather_parameters() + k.prefetch_bucket_size)
    gathered = w * max(shape.largest_gathered_parameters(), live)  # an MoE block is a leaf: gathered whole
    # ZeRO++ hpZ keeps a secondary copy of the parameters partitioned within the node only.
    secondary = w * -(-shape.parameter_count() // k.hpz_partition_size) if k.hpz_partition_size > 1 else 0
    return reduce + gathered + secondary


def partial_offload_on_gpu(shape: ModelShape, plan: Plan, optimizer: str) -> int:
    """Optimizer bytes that stay on the GPU when only ``offload_ratio`` of them go to the CPU.

    ZeRO-3's partial offload (``offload_optimizer.ratio`` < 1) keeps the remaining sub-groups'
    fp32 master weights, optimizer states and fp32 gradients on the GPU and steps them there.
    The fp32 master slice is counted in fp32 training too: ZeRO-3 clones one whatever the
    training dtype (``stage3.py``; the no-offload path and
    :func:`~dsgen.estimate.model_states.offloaded_optimizer_bytes` count it the same way).
    """
    if plan.offload_optimizer != "cpu" or plan.offload_ratio >= 1:
        return 0
    partition = -(-shape.parameter_count() // plan.data_parallel_size)
    # fp32 master + fp32 gradient per element, plus the optimizer's own state
    per_partition = (FP32 + FP32) * partition + flat_state_bytes(optimizer, (partition,))
    return int((1 - plan.offload_ratio) * per_partition)


def transient_bytes(shape: ModelShape, plan: Plan, training: Training, recompute_working_set: int) -> int:
    """The largest short-lived allocation of a step beyond saved activations.

    Loss backward: the 16-bit logits the model returned stay alive while the fp32 gradient of the
    log-softmax and of its input are formed. Checkpointed backward: one layer's activations are
    rebuilt. The two happen at different moments, so the larger one counts.
    """
    tokens = plan.micro_batch_size * training.sequence_length
    logits = tokens * shape.vocab_size * (plan.dtype_bytes + 2 * FP32)
    return max(logits, recompute_working_set)


def stepped_elements(shape: ModelShape, plan: Plan) -> int:
    """fp32 elements the optimizer updates in one call of its ``step``, as DeepSpeed 0.19.8 hands
    them over: ZeRO-0 the flat fp32 master group (``FP16_Optimizer``/``BF16_Optimizer``; fp32
    training: the model's tensors, all in one foreach call); ZeRO-1/2 the rank's flat partition of
    the one parameter group (``stage_1_and_2.py``, ``_optimizer_step``); ZeRO-3 one sub-group at a
    time, the largest (``stage3.py``, ``_optimizer_step`` per ``sub_group_id``)."""
    if plan.zero_stage == 0:
        return shape.parameter_count()
    if plan.zero_stage < 3:
        return zero12_partition(shape, plan.data_parallel_size)
    k = plan.knobs
    return zero3_layout(
        shape, plan.data_parallel_size, k.param_persistence_threshold, k.sub_group_size
    ).largest_sub_group


def optimizer_step_temporary(shape: ModelShape, plan: Plan, optimizer: Optimizer) -> int:
    """GPU bytes the optimizer's step allocates beyond its states (optimizers.step_temporary_bytes)
    over what DeepSpeed hands it at once. Offloaded optimizers step on the host with
    DeepSpeedCPUAdam (a client optimizer is never offloaded)."""
    if plan.offload_optimizer != "none":
        return 0
    return step_temporary_bytes(optimizer, stepped_elements(shape, plan))


def host_bytes(
    shape: ModelShape, plan: Plan, hardware: Hardware, optimizer: str, states: ModelStates | None = None
) -> tuple[int, int]:
    """(total, offloaded states) of host RAM per node; ``states``: the candidate's model states
    when the caller holds them already (:func:`estimate_memory` does)."""
    if states is None:
        states = model_states(shape, plan, optimizer)
    p = shape.parameter_count()
    n = plan.data_parallel_size
    ranks = hardware.gpus_per_node
    per_rank_partition = -(-p // n)
    w = plan.dtype_bytes
    offloaded = 0
    if plan.offload_optimizer == "cpu":
        # fp32 master weights (also in fp32 training), optimizer states, fp32 gradients and the
        # 16-bit staging copies DeepSpeed pins for offload (model_states.offloaded_optimizer_bytes)
        offloaded += int(ranks * states.offloaded_optimizer * plan.offload_ratio)
    elif plan.offload_optimizer == "nvme":
        offloaded += ranks * nvme_optimizer_host_bytes(shape, plan, optimizer)
    if plan.offload_param == "cpu":
        offloaded += ranks * w * per_rank_partition
    elif plan.offload_param == "nvme":
        buffers = nvme_buffers(optimizer)
        offloaded += ranks * buffers.param_count * buffers.param_size * w  # pinned swap buffers
    offloaded += ranks * pinned_rounding_bytes(shape, plan)
    # Loading a checkpoint without zero.Init materialises the full 16-bit model in every process;
    # those host copies are freed once the engine moves the model to the GPU, before the offloaded
    # states are allocated, so the two do not add up.
    loading = ranks * w * p if plan.zero_stage < 3 else 0
    process = ranks * HOST_BYTES_PER_RANK
    return process + max(loading, offloaded), offloaded


def pinned(nbytes: int) -> int:
    """Host bytes a pinned allocation of ``nbytes`` takes: PyTorch's CachingHostAllocator (what
    ``tensor.pin_memory()`` and so DeepSpeed's ``get_accelerator().pin_memory`` use) rounds every
    block up to the next power of two (``ATen/core/CachingHostAllocator.h``: "Round up the
    allocation to the nearest power of two to improve reuse", unless ``pinned_max_round_threshold``
    is set; its default is SIZE_MAX), and keeps freed blocks cached, pinned."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def pinned_rounding_bytes(shape: ModelShape, plan: Plan) -> int:
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
    """
    if plan.zero_stage != 3:
        return 0
    w = plan.dtype_bytes
    n = plan.data_parallel_size
    k = plan.knobs
    extra = 0
    layout = zero3_layout(shape, n, k.param_persistence_threshold, k.sub_group_size)
    if plan.offload_optimizer == "cpu":
        flat = w * layout.partition
        extra += pinned(flat) - flat
        extra += sum(pinned(FP32 * g) - FP32 * g for g in layout.sub_groups)
    if plan.offload_param == "cpu":
        flat = w * layout.partition
        extra += pinned(flat) - flat
        extra += _pinned_parameter_partitions(shape, w, n)
    return extra


@lru_cache(maxsize=256)  # a property of the model, precision and data-parallel size
def _pinned_parameter_partitions(shape: ModelShape, w: int, n: int) -> int:
    """Pinned host bytes of every parameter's own partition, each rounded by :func:`pinned`."""
    return sum(pinned(w * -(-t // n)) for t in parameter_tensors(shape))


def nvme_optimizer_host_bytes(shape: ModelShape, plan: Plan, optimizer: str) -> int:
    """Host bytes per rank of ZeRO-3 optimizer offload to NVMe, as DeepSpeed 0.19.8 allocates them
    (``stage3.py``): the 16-bit gradient partitions (``grad_partitions_flat_buffer``, on the host
    under optimizer offload, pinned); one fp32 gradient buffer of the largest sub-group that every
    swapped sub-group's ``.grad`` views (``initialize_optimizer_states``: ``gradient_buffer``); and
    the pinned swap buffers, ``buffer_count`` x the largest sub-group x 4 B (``SwapBufferManager``).
    The fp32 gradients themselves are swapped out to NVMe per sub-group at the boundary
    (``_offload_grad_partition_at_boundary`` -> ``_swap_out_offload_fp32_gradients``), and the fp32
    master weights and states live on NVMe; neither stays in host RAM."""
    k = plan.knobs
    layout = zero3_layout(shape, plan.data_parallel_size, k.param_persistence_threshold, k.sub_group_size)
    largest = layout.largest_sub_group
    count = nvme_buffers(optimizer).optimizer_count
    return plan.dtype_bytes * layout.partition + FP32 * largest + count * FP32 * largest


def nvme_bytes(shape: ModelShape, plan: Plan, hardware: Hardware, optimizer: str) -> int:
    """NVMe bytes per node: what ZeRO-Infinity swaps out for each of the node's ranks.

    Optimizer offload swaps the fp32 master slice (which ZeRO-3 keeps in fp32 training too, as
    :mod:`dsgen.estimate.model_states` counts it) and the optimizer states; parameter offload the
    16-bit parameter partition.
    """
    p = shape.parameter_count()
    per_rank_partition = -(-p // plan.data_parallel_size)
    ranks = hardware.gpus_per_node
    total = 0
    if plan.offload_optimizer == "nvme":
        total += ranks * (FP32 * per_rank_partition + flat_state_bytes(optimizer, (per_rank_partition,)))
    if plan.offload_param == "nvme":
        total += ranks * plan.dtype_bytes * per_rank_partition
    return total


def backward_gradient_bytes(plan: Plan, parameters: int, step_gradients: int) -> int:
    """16-bit gradient memory while forward/backward run: whole ``param.grad`` without ZeRO, the
    rank's partition with it (DeepSpeed reduces buckets as backward proceeds; the buckets are in
    ``buffers``). Never more than the step's hand-off, which also holds the fp32 copy."""
    w = plan.dtype_bytes
    elements = parameters if plan.zero_stage == 0 else -(-parameters // plan.data_parallel_size)
    return min(step_gradients, w * elements)


def estimator_model_states(shape: ModelShape, plan: Plan, hardware: Hardware) -> tuple[ModelStates, int]:
    """(model states, host model states per node) in DeepSpeed's estimator accounting: its per-GPU
    figure split along its own formula (16-bit parameters; 2 + 4 bytes of gradients and 4 + 8 bytes
    of optimizer state per partitioned parameter; ZeRO-3's largest-layer allowance counted with the
    parameters). The three GPU terms add up to the estimator's number to the byte; the gradients'
    backward phase is :func:`backward_gradient_bytes`."""
    from dsgen.estimate.ds_estimator import deepspeed_estimator

    if plan.zero_stage == 0:
        # DeepSpeed's estimators cover ZeRO-2/3 only; unpartitioned states are its one-GPU case.
        hardware = replace(hardware, gpus_per_node=1, nodes=1)
    cpu, gpu = deepspeed_estimator(shape, plan, hardware)
    p = shape.parameter_count()
    if plan.zero_stage == 3:
        params = 4 * shape.largest_module_parameters()
        if plan.offload_param == "none":
            params += 2 * p // hardware.world_size
    else:
        params = 2 * p
    params = min(params, gpu)
    rest = gpu - params
    grads = rest * 6 // 18
    backward = backward_gradient_bytes(plan, p, grads)
    return ModelStates(params, backward, grads, rest - grads, offloaded_optimizer=0), cpu


def estimate_memory(
    shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, accounting: Accounting = "dsgen"
) -> MemoryEstimate:
    """Predict the memory of ``plan`` (pure function of its inputs).

    ``accounting="deepspeed-estimator"`` replaces the model-state terms (GPU parameters, gradients,
    optimizer states and the host's model states) with DeepSpeed's own
    ``estimate_zero2/3_model_states_mem_needs``; activations, buffers and overheads, which that
    estimator ignores, stay dsgen's.
    """
    optimizer = training.optimizer.type
    process = hardware.gpus_per_node * HOST_BYTES_PER_RANK
    if accounting == "dsgen":
        states = model_states(shape, plan, optimizer)
        gpu_optimizer_states = states.optimizer_states + partial_offload_on_gpu(shape, plan, optimizer)
        host_total, offloaded = host_bytes(shape, plan, hardware, optimizer, states)
    elif accounting == "deepspeed-estimator":
        states, offloaded = estimator_model_states(shape, plan, hardware)
        gpu_optimizer_states = states.optimizer_states
        host_total = process + offloaded
    else:
        raise ValueError(f"unknown accounting {accounting!r}; expected one of {ACCOUNTINGS}")
    acts = estimate_activations(
        shape,
        micro_batch_size=plan.micro_batch_size,
        sequence_length=training.sequence_length,
        dtype_bytes=plan.dtype_bytes,
        attention=training.attention,
        checkpointing=plan.checkpointing == "full",
        selective=plan.checkpointing == "selective",
    )
    buffers = buffer_bytes(shape, plan)
    transient = transient_bytes(shape, plan, training, acts.recompute_working_set)
    if plan.long_context.active:  # Ulysses SP, tiling, checkpoint offload: dsgen.estimate.sequence_parallel
        long = long_context_memory(shape, plan, training)
        acts, transient = long.activations, long.transient
        buffers += long.buffers
        host_total += hardware.gpus_per_node * long.host_per_rank
    dynamic = acts.total + buffers + transient
    fixed = CUDA_CONTEXT_BYTES + COMM_LIBRARY_BYTES
    gpu = GpuMemory(
        parameters=states.parameters,
        optimizer_states=gpu_optimizer_states,
        activations=acts.total,
        buffers=buffers,
        transient=transient,
        overhead=fixed + int(ALLOCATOR_SLACK * dynamic),
        capacity=hardware.gpu.memory_bytes,
        backward_gradients=states.backward_gradients,
        step_gradients=states.step_gradients,
        step_overhead=fixed,
        step_temporary=optimizer_step_temporary(shape, plan, training.optimizer),
    )
    cpu = HostMemory(total=host_total, capacity=hardware.cpu_memory_bytes, offloaded_states=offloaded, process=process)
    nvme_capacity = hardware.nvme.capacity_bytes if hardware.nvme else 0
    nvme = NvmeMemory(total=nvme_bytes(shape, plan, hardware, optimizer), capacity=nvme_capacity)
    return MemoryEstimate(gpu=gpu, cpu=cpu, nvme=nvme)
