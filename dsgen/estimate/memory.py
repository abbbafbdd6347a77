"""Per-GPU, per-node host and per-node NVMe memory of one plan.

Model-state terms follow the ZeRO paper's partitioning (Rajbhandari et al. 2020) with DeepSpeed's
actual tensors (fp32 master weights and fp32 gradient partitions for mixed precision, as in
``stage_1_and_2.py`` / ``stage3.py``); buffers follow DeepSpeed's allocation of reduce buckets and
ZeRO-3 gathered parameters; activations come from :mod:`dsgen.estimate.activations`. The model
states are computed once per plan (:func:`dsgen.estimate.model_states.model_states`) and every
term here reads that record. docs/memory-model.md documents every term and its source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.checkpoint_save import NO_SAVE_COPIES, CheckpointSave, checkpoint_save
from dsgen.estimate.memo import memo_tables
from dsgen.estimate.method_activations import method_activation_delta
from dsgen.estimate.model_states import ModelStates, model_states
from dsgen.estimate.objectives import GENERATION_OBJECTIVES, objective_memory, sequences_per_sample
from dsgen.estimate.optimizers import step_temporary_bytes
from dsgen.estimate.sequence_parallel import long_context_memory
from dsgen.estimate.sharding import rank_shape
from dsgen.estimate.trainable import ParameterSplit, largest_dequantized, parameter_split
from dsgen.estimate.zero3_moe import backward_held_elements
from dsgen.estimate.zero12_offload import offload_write_back_copy, zero12_pinned_rounding, zero12_staging_bytes
from dsgen.facts.release import release_key
from dsgen.plan import ModelParallel, Plan, PlanFields, ZeroKnobs, simplest_plan
from dsgen.spec.types import Hardware, Optimizer, Training
from dsgen.units import FP32, GIB
from dsgen.vocabulary import ACCOUNTINGS, Accounting, Checkpointing, Precision, StepPhase

# Fixed allowances (see docs/memory-model.md, "Overheads").
CUDA_CONTEXT_BYTES = int(0.75 * GIB)  # CUDA context, kernels and cuBLAS workspace (torch 2.x)
COMM_LIBRARY_BYTES = int(0.5 * GIB)  # NCCL communicators and their buffers
ALLOCATOR_SLACK = 0.05  # caching-allocator fragmentation, as a share of dynamic allocations
HOST_BYTES_PER_RANK = 3 * GIB  # python, torch, DeepSpeed and CUDA host state per training process
HOST_RESERVE = 0.10  # share of host RAM left for the OS, page cache and data loaders


#: The GpuMemory terms every phase holds beside the trained model states (fine-tuning, objectives).
HELD_BESIDE_TERMS = ("frozen_parameters", "reference_model", "value_model", "vllm_reserved")

#: The GpuMemory terms each phase of a step sums (its total is their sum: GpuMemory.phase_total).
PHASE_TERMS: dict[StepPhase, tuple[str, ...]] = {
    "forward_backward": (
        "parameters",
        "backward_gradients",
        "optimizer_states",
        "activations",
        "buffers",
        "transient",
        "overhead",
        *HELD_BESIDE_TERMS,
    ),
    "optimizer_step": (
        "parameters",
        "step_gradients",
        "optimizer_states",
        "step_buffers",
        "step_temporary",
        "step_overhead",
        *HELD_BESIDE_TERMS,
    ),
    "generation": (
        "parameters",
        "optimizer_states",
        "step_buffers",
        "step_overhead",
        "generation",
        "generation_gather",
        *HELD_BESIDE_TERMS,
    ),
}
#: The phases every step has (GRPO and PPO add generation).
PHASE_ORDER: tuple[StepPhase, ...] = ("forward_backward", "optimizer_step")
#: The names reports print for a phase's own variant of a term (both phases hold "gradients").
TERM_NAMES = {
    "backward_gradients": "gradients",
    "step_gradients": "gradients",
    "step_buffers": "buffers",
    "step_temporary": "transient",
    "step_overhead": "overhead",
}


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
    step_buffers: int = 0  # the buffers still allocated while the optimizer steps (step_buffer_bytes)
    step_temporary: int = 0  # the optimizer's own working tensors while it steps (torch foreach)
    # the GPU while the first whole-layer-checkpointed layer runs forward (model states, ZeRO's
    # buffers, the layer's input and working set, the allowances); 0 without whole-layer
    # checkpointing. Below ``total`` in practice; what it decides is which resource a plan short of
    # both GPU and host RAM runs out of first (dsgen.search.evaluation.Evaluation.fit)
    first_layer_forward: int = 0
    # fine-tuning and objectives (dsgen.estimate.trainable, dsgen.estimate.objectives); 0 in full SFT
    frozen_parameters: int = 0  # the frozen weights (16-bit, or quantized with their constants)
    reference_model: int = 0  # a separate reference model (and PPO's reward model), held all step
    value_model: int = 0  # PPO's value model: a second trained model's states
    vllm_reserved: int = 0  # vllm-colocate: the share of the GPU vLLM keeps while training too
    generation: int = 0  # GRPO/PPO generation: the KV cache and sampling logits (transformers engine)
    generation_gather: int = 0  # ZeRO-3: the whole model gathered to generate or to sync vLLM
    generates: bool = False  # whether the step has a generation phase (GRPO, PPO)
    _total = None  # cache of ``total``, not a field (no annotation); set with object.__setattr__

    @property
    def gradients(self) -> int:
        """The most gradient memory held at once, in either phase (ZeRO-0/1 peak in backward)."""
        return max(self.backward_gradients, self.step_gradients)

    @property
    def held_beside(self) -> int:
        """What every phase holds beside the trained model states: frozen weights, the objective's
        other models, and vLLM's reserved share (:data:`HELD_BESIDE_TERMS`)."""
        return sum(getattr(self, term) for term in HELD_BESIDE_TERMS)

    def phase_terms(self, phase: StepPhase) -> dict[str, int]:
        """The terms ``phase`` sums, by the names reports print (``step_gradients`` as ``gradients``)."""
        return {TERM_NAMES.get(name, name): int(getattr(self, name)) for name in PHASE_TERMS[phase]}

    @property
    def phases(self) -> tuple[StepPhase, ...]:
        """The phases this step has: generation only for GRPO/PPO."""
        return ("forward_backward", "optimizer_step", "generation") if self.generates else PHASE_ORDER

    @property
    def forward_backward(self) -> int:
        return sum(getattr(self, name) for name in PHASE_TERMS["forward_backward"])

    @property
    def optimizer_step(self) -> int:
        return sum(getattr(self, name) for name in PHASE_TERMS["optimizer_step"])

    @property
    def generation_phase(self) -> int:
        """GRPO/PPO's generation, between optimizer steps (0 without one): the model states and
        the ZeRO buffers that stay allocated, the cache and logits of generating, and under ZeRO-3
        the whole gathered model; no activations or gradients are alive."""
        if not self.generates:
            return 0
        return sum(getattr(self, name) for name in PHASE_TERMS["generation"])

    @property
    def total(self) -> int:
        value = self._total  # memoised: feasibility checks and ranking ask for it many times per plan
        if value is None:
            value = max(self.forward_backward, self.optimizer_step, self.generation_phase)
            object.__setattr__(self, "_total", value)
        return value

    @property
    def peak_phase(self) -> StepPhase:
        if self.generation_phase > max(self.forward_backward, self.optimizer_step):
            return "generation"
        return "forward_backward" if self.forward_backward >= self.optimizer_step else "optimizer_step"


@dataclass(frozen=True)  # one per candidate plan
class HostMemory:
    """Host RAM per node, bytes: what the plan needs, what the node has, and the offload share of it."""

    total: int
    capacity: int
    offloaded_states: int
    process: int
    checkpoints: int = 0  # the checkpointed layer inputs checkpoint offload keeps here, all ranks
    capacity_assumed: bool = False  # the spec did not state the node's RAM (Hardware.cpu_memory_assumed)
    # what a checkpoint save copies here (dsgen.estimate.checkpoint_save), beside the offloaded states
    checkpoint_save: CheckpointSave = NO_SAVE_COPIES
    startup: int = 0  # before the offloaded states exist: processes and loading (startup_host_bytes)

    @property
    def training(self) -> int:
        """Host bytes while training steps: processes, offloaded states, offloaded checkpoints."""
        return self.process + self.offloaded_states + self.checkpoints

    @property
    def saving(self) -> int:
        """Host bytes while a checkpoint is written (checkpoint offload's copies are gone by then)."""
        return self.process + self.offloaded_states + self.checkpoint_save.peak

    @property
    def peak_phase(self) -> str:
        """When the host peaks, as a phrase for messages: the first phase to reach ``total``."""
        phases = (
            ("at start-up", self.startup),
            ("while training", self.training),
            ("at a checkpoint save", self.saving),
        )
        return next(name for name, value in phases if value == self.total)


@dataclass(frozen=True)  # one per candidate plan
class NvmeMemory:
    """NVMe bytes per node the plan writes (ZeRO-Infinity offload) against the drive's capacity."""

    total: int
    capacity: int


@dataclass(frozen=True)  # one per candidate plan
class MemoryEstimate:
    """Every memory prediction for one plan: per GPU (worst rank), host and NVMe per node, and the
    model-state record they were summed from (for readers that need one tensor's size)."""

    gpu: GpuMemory
    cpu: HostMemory
    nvme: NvmeMemory
    model_states: ModelStates


def buffer_bytes(shape: ModelShape, plan: Plan) -> int:
    """DeepSpeed's communication buffers and ZeRO-3's gathered parameters on one GPU."""
    return _reduce_bucket_bytes(plan) + _gathered_bytes(shape, plan) + _hpz_secondary_bytes(shape, plan)


def step_buffer_bytes(shape: ModelShape, plan: Plan) -> int:
    """The part of :func:`buffer_bytes` still allocated while the optimizer steps. ZeRO-3's step
    first releases every gathered parameter (``stage3.py`` ``step`` -> ``_partition_all_parameters``),
    but its reduce bucket and hpZ's secondary partition live from the engine's start. ZeRO-1/2
    release their reduce buckets when backward ends (``stage_1_and_2.py``
    ``independent_gradient_partition_epilogue`` -> ``_release_ipg_buffers``)."""
    if plan.zero_stage < 3:
        return 0
    return _reduce_bucket_bytes(plan) + _hpz_secondary_bytes(shape, plan)


def one_reduce_bucket_bytes(plan: Plan) -> int:
    """One ZeRO reduce bucket, allocated whole however small the model:
    ``torch.empty(int(self.reduce_bucket_size), ...)`` (stage_1_and_2.py ``setup_buckets``,
    stage3.py; bench/model_state_accuracy.py measures it)."""
    return 0 if plan.zero_stage == 0 else plan.dtype_bytes * plan.knobs.reduce_bucket_size


def _reduce_bucket_bytes(plan: Plan) -> int:
    # ZeRO-1/2 double the reduce bucket with overlap_comm; ZeRO-3 keeps one (measured).
    copies = 2 if plan.knobs.overlap_comm and plan.zero_stage < 3 else 1
    return copies * one_reduce_bucket_bytes(plan)


def _gathered_bytes(shape: ModelShape, plan: Plan) -> int:
    """ZeRO-3's gathered parameters: one layer and the prefetch bucket (an MoE block is a leaf:
    gathered whole), or, for MoE models whose experts autograd keeps alive from forward to backward,
    what dsgen.estimate.zero3_moe measures at the start of backward."""
    if plan.zero_stage < 3:
        return 0
    k = plan.knobs
    live = min(k.max_live_parameters, shape.layer_gather_parameters() + k.prefetch_bucket_size)
    one_block = max(shape.largest_gathered_parameters(), live)
    return plan.dtype_bytes * max(one_block, backward_held_elements(shape, plan))


def _hpz_secondary_bytes(shape: ModelShape, plan: Plan) -> int:
    """ZeRO++ hpZ keeps a secondary copy of the parameters partitioned within the node only."""
    k = plan.knobs
    if plan.zero_stage < 3 or k.hpz_partition_size <= 1:
        return 0
    return plan.dtype_bytes * -(-shape.parameter_count() // k.hpz_partition_size)


def optimizer_step_temporary(states: ModelStates, plan: Plan, optimizer: Optimizer, deepspeed_version: str) -> int:
    """GPU bytes the optimizer's step allocates beyond its states (optimizers.step_temporary_bytes)
    over what DeepSpeed hands it at once (``Partitioning.stepped``). Offloaded optimizers step on
    the host with DeepSpeedCPUAdam (a client optimizer is never offloaded); on the releases of
    :data:`OFFLOAD_WRITE_BACK_COPY` the updated fp32 partition then comes back through the GPU."""
    if plan.offload_optimizer != "none":
        return FP32 * states.partitioning.stepped if offload_write_back_copy(plan, deepspeed_version) else 0
    return step_temporary_bytes(optimizer, states.partitioning.stepped)


def offloaded_host_bytes(states: ModelStates, plan: Plan, hardware: Hardware, deepspeed_version: str) -> int:
    """The offloaded model states in host RAM per node, from the engine's start to its end: each
    of the node's ranks holds what the record says one rank's offload holds, as this release
    allocates and pins it (:mod:`dsgen.estimate.zero12_offload`)."""
    ranks = hardware.gpus_per_node
    offloaded = 0
    if plan.offload_optimizer == "cpu":
        # fp32 master weights (also in fp32 training), optimizer states, fp32 gradients and the
        # 16-bit staging copies DeepSpeed pins for offload (ModelStates.offloaded_optimizer)
        per_rank = states.offloaded_optimizer - zero12_staging_bytes(states, plan, deepspeed_version)
        offloaded += int(ranks * per_rank * plan.offload_ratio)
    elif plan.offload_optimizer == "nvme":
        offloaded += ranks * states.nvme_optimizer_host
    offloaded += ranks * states.offloaded_parameters_host
    offloaded += ranks * (states.pinned_rounding + zero12_pinned_rounding(states, plan, deepspeed_version))
    return offloaded


def loaded_model_bytes(states: ModelStates, plan: Plan) -> int:
    """One process's whole model in memory without ZeRO-3: the trained parameters in the training
    dtype and the frozen ones as stored (quantized weights packed)."""
    return plan.dtype_bytes * states.partitioning.parameters + states.frozen.resident + states.frozen.partitions


def process_host_bytes(hardware: Hardware) -> int:
    """The node's training processes themselves (:data:`HOST_BYTES_PER_RANK` each)."""
    return hardware.gpus_per_node * HOST_BYTES_PER_RANK


def startup_host_bytes(states: ModelStates, plan: Plan, hardware: Hardware, deepspeed_version: str) -> int:
    """Host bytes per node before the offloaded states exist: the processes and the larger of the
    loading copies and ZeRO-1/2's host flattening (``deepspeed_version``: the release whose
    flattening is priced, :func:`zero12_host_flattening`). Loading a checkpoint without zero.Init
    materialises the full 16-bit model in every process; those host copies are freed once the
    engine moves the model to the GPU, before the offloaded states are allocated, so the two do
    not add up."""
    ranks = hardware.gpus_per_node
    loading = ranks * loaded_model_bytes(states, plan) if plan.zero_stage < 3 else 0
    flattening = zero12_host_flattening(states, plan, hardware, deepspeed_version)
    return process_host_bytes(hardware) + max(loading, flattening)


#: The first release that builds ZeRO-1/2's flat parameter buffer on the accelerator when it
#: fits: deepspeedai/DeepSpeed#7828 ("Z1/2 init: flatten params on device", commit 84af822),
#: released in 0.18.7 (2026-03-05). Every earlier ``DeepSpeedZeroOptimizer.__init__`` (read at
#: 0.14.5, 0.16.9 and 0.18.6) always copies the parameters to the host and flattens them there.
ZERO12_DEVICE_FLATTENING_SINCE: tuple[int, ...] = (0, 18, 7)


def zero12_host_flattening(states: ModelStates, plan: Plan, hardware: Hardware, deepspeed_version: str) -> int:
    """Host bytes per node while ZeRO-1/2 flattens its parameter group on the CPU (0 when it
    flattens on the GPU).

    On the CPU path of ``DeepSpeedZeroOptimizer.__init__`` (``stage_1_and_2.py``) each rank copies
    every parameter to the host (``param.cpu_data = param.data.cpu()``), flattens those copies
    into a second host buffer and only then moves the flat buffer to the GPU, so it holds the
    group twice on the host at once. Before :data:`ZERO12_DEVICE_FLATTENING_SINCE` that is the
    only path. DeepSpeed 0.19.8 takes it only when ``available_memory()`` (without pynvml:
    capacity less what torch has allocated, here the model's own parameters) cannot hold the flat
    buffer. The engine has moved the model to the GPU before (the loading copies are gone), and
    the offloaded optimizer states are allocated after, so the three host peaks do not add up."""
    if plan.zero_stage not in (1, 2):
        return 0
    model = loaded_model_bytes(states, plan)
    flat = plan.dtype_bytes * states.partitioning.flat_elements
    on_device = release_key(deepspeed_version) >= ZERO12_DEVICE_FLATTENING_SINCE
    if on_device and hardware.gpu.memory_bytes - model >= flat:
        return 0
    return hardware.gpus_per_node * (model + flat)


def nvme_bytes(states: ModelStates, hardware: Hardware) -> int:
    """NVMe bytes per node: what ZeRO-Infinity swaps out for each of the node's ranks."""
    return hardware.gpus_per_node * states.nvme


def backward_gradient_bytes(plan: Plan, states: ModelStates, step_gradients: int) -> int:
    """16-bit gradient memory while forward/backward run: whole ``param.grad`` without ZeRO, the
    rank's partition with it (DeepSpeed reduces buckets as backward proceeds; the buckets are in
    ``buffers``). Never more than the step's hand-off, which also holds the fp32 copy."""
    parts = states.partitioning
    elements = parts.parameters if plan.zero_stage == 0 else parts.even_share
    return min(step_gradients, plan.dtype_bytes * elements)


def estimator_model_states(
    shape: ModelShape, plan: Plan, hardware: Hardware, states: ModelStates
) -> tuple[ModelStates, int]:
    """(model states, host model states per node) in DeepSpeed's estimator accounting: its per-GPU
    figure split along its own formula (16-bit parameters; 2 + 4 bytes of gradients and 4 + 8 bytes
    of optimizer state per partitioned parameter; ZeRO-3's largest-layer allowance counted with the
    parameters). The three GPU terms add up to the estimator's number to the byte; the gradients'
    backward phase is :func:`backward_gradient_bytes`. ``states`` is dsgen's record of the plan:
    its partitioning and NVMe terms stay, its GPU and host terms are replaced."""
    from dsgen.estimate.ds_estimator import deepspeed_estimator

    if plan.zero_stage == 0:
        # DeepSpeed's estimators cover ZeRO-2/3 only; unpartitioned states are its one-GPU case.
        hardware = replace(hardware, gpus_per_node=1, nodes=1)
    cpu, gpu = deepspeed_estimator(shape, plan, hardware)
    p = states.partitioning.parameters
    if plan.zero_stage == 3:
        params = 4 * shape.largest_module_parameters()
        if plan.offload_param == "none":
            params += 2 * p // hardware.world_size
    else:
        params = 2 * p
    params = min(params, gpu)
    rest = gpu - params
    grads = rest * 6 // 18
    estimated = replace(
        states,
        parameters=params,
        backward_gradients=backward_gradient_bytes(plan, states, grads),
        step_gradients=grads,
        optimizer_states=rest - grads,
        partial_offload_on_gpu=0,
        offloaded_optimizer=0,
    )
    return estimated, cpu


def estimate_memory(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    accounting: Accounting = "dsgen",
    *,
    logits_released: bool = False,
    trainer_saves_model: bool = False,
) -> MemoryEstimate:
    """Predict the memory of ``plan`` (pure function of its inputs).

    ``logits_released``: the training loop drops the model's returned output (and its 16-bit
    logits) before backward, as the HF Trainer does (:attr:`dsgen.spec.types.Output.logits_released`).
    ``trainer_saves_model``: each checkpoint also saves the 16-bit model through the HF Trainer
    (:attr:`dsgen.spec.types.Output.trainer_saves_model`, :mod:`dsgen.estimate.checkpoint_save`).

    Host RAM peaks in one of three phases: start-up (the loading copies or ZeRO-1/2's host
    flattening, :func:`startup_host_bytes`), training, or a checkpoint save (:class:`HostMemory`).

    ``accounting="deepspeed-estimator"`` replaces the model-state terms (GPU parameters, gradients,
    optimizer states and the host's model states) with DeepSpeed's own
    ``estimate_zero2/3_model_states_mem_needs``; activations, buffers and overheads, which that
    estimator ignores, stay dsgen's.
    """
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"unknown accounting {accounting!r}; expected one of {ACCOUNTINGS}")
    process = process_host_bytes(hardware)
    finetuning = training.finetuning
    layout = _layout_terms(shape, plan, hardware, training, accounting, trainer_saves_model)
    states = layout.states
    # what one rank runs: under AutoTP its heads and MLP width, under AutoEP its experts
    # (dsgen.estimate.sharding); the model as a whole otherwise
    local = rank_shape(shape, plan)
    # activations, the loss or rebuilt-layer transient, and whatever Ulysses SP, tiling and
    # checkpoint offload change (a plan without them is the one-GPU, untiled case); a paired
    # objective runs both sequences of each sample in one micro-batch
    sequences = sequences_per_sample(finetuning.objective)
    forward_plan = plan if sequences == 1 else replace(plan, micro_batch_size=sequences * plan.micro_batch_size)
    long = long_context_memory(local, forward_plan, training, logits_released)
    acts = long.activations.total + method_activation_delta(local, forward_plan, training, finetuning, long.activations)
    transient = max(long.transient, layout.dequantized)
    checkpoints = hardware.gpus_per_node * long.host_per_rank
    host_total = max(layout.startup, process + layout.offloaded + max(checkpoints, layout.save.peak))
    zero_buffers = _zero_buffer_bytes(
        local, plan.precision, plan.zero_stage, plan.checkpointing, plan.knobs, plan.expert_parallel_size
    )
    buffers = zero_buffers + long.buffers
    dynamic = acts + buffers + transient
    fixed = CUDA_CONTEXT_BYTES + COMM_LIBRARY_BYTES
    trained_states = states.parameters + states.gpu_optimizer_states + states.step_gradients
    extra = objective_memory(shape, plan, finetuning, layout.split, trained_states, hardware.gpu.memory_bytes)
    first_layer_forward = 0
    if long.layer_forward:
        first_layer_forward = (
            states.parameters
            + states.frozen_on_gpu
            + states.gpu_optimizer_states
            + zero_buffers
            + fixed
            + int((1 + ALLOCATOR_SLACK) * long.layer_forward)
        )
    gpu = GpuMemory(
        parameters=states.parameters,
        optimizer_states=states.gpu_optimizer_states,
        activations=acts,
        buffers=buffers,
        transient=transient,
        overhead=fixed + int(ALLOCATOR_SLACK * dynamic),
        capacity=hardware.gpu.memory_bytes,
        backward_gradients=states.backward_gradients,
        step_gradients=states.step_gradients,
        step_overhead=fixed,
        step_buffers=layout.step_buffers,
        step_temporary=layout.step_temporary,
        first_layer_forward=first_layer_forward,
        frozen_parameters=states.frozen_on_gpu,
        reference_model=extra.reference,
        value_model=extra.value,
        vllm_reserved=extra.vllm_reserved,
        generation=extra.generation,
        generation_gather=extra.generation_gather,
        generates=finetuning.objective in GENERATION_OBJECTIVES,
    )
    cpu = HostMemory(
        total=host_total,
        capacity=hardware.cpu_memory_bytes,
        offloaded_states=layout.offloaded,
        process=process,
        checkpoints=checkpoints,
        capacity_assumed=hardware.cpu_memory_assumed,
        checkpoint_save=layout.save,
        startup=layout.startup,
    )
    return MemoryEstimate(gpu=gpu, cpu=cpu, nvme=layout.nvme, model_states=states)


@lru_cache(maxsize=4096)
def _zero_buffer_bytes(
    local: ModelShape,
    precision: Precision,
    zero_stage: int,
    checkpointing: Checkpointing,
    knobs: ZeroKnobs,
    expert_parallel_size: int,
) -> int:
    """:func:`buffer_bytes` of the rank's model ``local``, memoised on the plan fields it reads (the
    checkpointing mode and AutoEP only through ZeRO-3's MoE term, dsgen.estimate.zero3_moe); the
    plan priced has the others at their simplest."""
    plan = simplest_plan(
        precision,
        zero_stage=zero_stage,
        checkpointing=checkpointing,
        data_parallel_size=expert_parallel_size,
        knobs=knobs,
        model_parallel=ModelParallel(expert_parallel_size=expert_parallel_size),
    )
    return buffer_bytes(local, plan)


@dataclass(frozen=True)  # one per ZeRO layout of a spec (memoised)
class _LayoutTerms:
    """The terms of :func:`estimate_memory` that a plan's ZeRO layout decides, whatever its
    checkpointing, micro-batch, accumulation steps (beyond whether there are several) and
    long-context choices."""

    split: ParameterSplit  # what trains
    states: ModelStates  # in the accounting asked for
    startup: int  # host bytes per node before the offloaded states exist
    offloaded: int  # the offloaded model states in host RAM per node
    save: CheckpointSave
    step_buffers: int
    step_temporary: int
    dequantized: int  # a 4-bit layer's dequantized 16-bit weight, the transient floor
    nvme: NvmeMemory


#: The ``_LayoutTerms`` of each spec (the identities of its shape, hardware and training), by layout.
_layout_tables = memo_tables(maxsize=16)
_LAYOUT_FIELDS = PlanFields(
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "offload_ratio",
    "knobs",
    "model_parallel",
    "data_parallel_size",
)


def _layout_terms(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    accounting: Accounting,
    trainer_saves_model: bool,
) -> _LayoutTerms:
    """The layout terms of ``plan``, memoised per spec on the plan fields they read: the solver
    prices every micro-batch, accumulation and long-context variant of a layout, and they share
    these. The plan priced leaves the fields outside the key at their simplest."""
    table = _layout_tables(shape, hardware, training)
    accumulates = plan.gradient_accumulation_steps > 1
    key = (accounting, trainer_saves_model, *_LAYOUT_FIELDS.key(plan), accumulates)
    terms = table.get(key)
    if terms is None:
        layout = simplest_plan(**_LAYOUT_FIELDS.values(plan), gradient_accumulation_steps=2 if accumulates else 1)
        terms = table[key] = _price_layout(shape, layout, hardware, training, accounting, trainer_saves_model)
    return terms


def _price_layout(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    accounting: Accounting,
    trainer_saves_model: bool,
) -> _LayoutTerms:
    split = parameter_split(shape, training.finetuning)
    states = model_states(shape, plan, training.optimizer.type, split)
    if accounting == "dsgen":
        startup = startup_host_bytes(states, plan, hardware, training.deepspeed_version)
        offloaded = offloaded_host_bytes(states, plan, hardware, training.deepspeed_version)
    else:  # deepspeed-estimator
        states, offloaded = estimator_model_states(shape, plan, hardware, states)
        startup = process_host_bytes(hardware)
    nvme_capacity = hardware.nvme.capacity_bytes if hardware.nvme else 0
    return _LayoutTerms(
        split=split,
        states=states,
        startup=startup,
        offloaded=offloaded,
        save=checkpoint_save(shape, states, plan, hardware.gpus_per_node, trainer_saves_model),
        step_buffers=step_buffer_bytes(shape, plan),
        step_temporary=optimizer_step_temporary(states, plan, training.optimizer, training.deepspeed_version),
        dequantized=plan.dtype_bytes * largest_dequantized(split),
        nvme=NvmeMemory(total=nvme_bytes(states, hardware), capacity=nvme_capacity),
    )
