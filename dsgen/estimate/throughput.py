"""Step time of one plan: compute at an assumed MFU, ZeRO communication, offload traffic.

A first-order model (see docs/throughput-model.md, one section per function here): good enough to
rank plans that differ by stage, offload and micro-batch, which is what the solver needs. Figures
are per optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.memo import identity_cache, memo_tables
from dsgen.estimate.model_parallel_time import (
    model_parallel_comm_s,
    node_ring_elements,
    partition_elements,
    ring_elements,
    zero_groups,
)
from dsgen.estimate.model_states import parameter_shapes, parameter_tensors
from dsgen.estimate.objectives import reference_source, sequences_per_sample
from dsgen.estimate.optimizers import flat_state_bytes
from dsgen.estimate.sequence_parallel_time import long_context_time
from dsgen.estimate.sharding import rank_shape
from dsgen.estimate.trainable import parameter_split
from dsgen.plan import Plan, PlanFields, simplest_plan
from dsgen.spec.types import Hardware, Training
from dsgen.units import FP32

DEFAULT_MFU_MIXED = 0.40  # achievable model FLOPs utilisation for 16-bit training with DeepSpeed
DEFAULT_MFU_FP32 = 0.50  # fp32 peaks are low, so a larger share of them is reached
COLLECTIVE_EFFICIENCY = 0.70  # achieved bus bandwidth / link bandwidth for ring collectives
OVERLAP_SHARE = 0.80  # share of the compute that can hide communication (stage 2: backward; stage 3: all)
PCIE_EFFICIENCY = 0.80
MICRO_BATCH_TOKENS_HALF_EFFICIENCY = 256  # tokens per micro-batch at which kernels run at half MFU
ZERO3_COMPUTE_OVERHEAD = 1.10  # ZeRO-3 module hooks, partition bookkeeping and gather traffic contending with compute
COLLECTIVE_LATENCY_S = {"intra": 30e-6, "inter": 100e-6}  # fixed cost of launching one collective
# Host-side cost of DeepSpeed 0.19.8's per-module and per-tensor hooks, measured with
# bench/zero_hook_latency.py (one rank, CPU time of the step, 200 x Linear(8, 8)): ZeRO-3's
# pre/post-module hooks around PartitionedParameterCoordinator.fetch_sub_module/release_sub_module,
# per fetched module and pass; ZeRO-2's per-parameter gradient hook (process_gradients ->
# reduce_independent_p_g_buckets_and_remove_grads) beyond ZeRO-1's, per tensor and micro-step.
ZERO3_FETCH_HOST_S = 640e-6
ZERO2_HOOK_HOST_S = 13e-6


#: Plans whose predicted step times differ by less than this share are ties (the solver's ranking,
#: dsgen.search.ranking.rank_within_error). It is the step-time model's measured error on the choices the
#: solver makes: over the 21 measured pairs of bench/data/throughput_outcomes.yaml that differ in
#: stage, offload, checkpointing, micro-batch or accumulation, the median of |log(predicted ratio /
#: measured ratio)| is 0.186, a 20 % difference (bench/throughput_accuracy.py prints it as
#: "pair-ratio error"). docs/throughput-model.md, "Ranking within the model's error".
STEP_TIME_TIE_BAND = 0.20

#: Measured optimizer-offload seconds over the first-order price (PCIe transfers + DeepSpeedCPUAdam
#: at ``cpu_optimizer_gparams_per_s``): the median of (measured step with offload - measured step
#: without) / predicted offload seconds over the published offload pairs of
#: bench/data/throughput_outcomes.yaml: chenyaofo's gist, LLaMA-7B on 8 x A800, ZeRO-2 5.07 and
#: ZeRO-3 4.55; h2o-llmstudio PR #288, Pythia-1B on 3 x RTX 6000, 4.59 (bench/throughput_accuracy.py
#: prints them as "offload calibration"). What the first-order price leaves out: host-side fp32
#: gradient copies and accumulation (stage_1_and_2.py ``async_accumulate_grad_in_cpu_via_gpu``), the
#: fp32 -> 16-bit parameter copy back, and the node's ranks sharing one host's memory bandwidth.
CPU_OFFLOAD_MEASURED_FACTOR = 4.59


@dataclass(frozen=True)  # one per candidate plan
class StepTime:
    """One optimizer step's predicted wall time, split into what the plan's choices trade against each other."""

    compute_s: float
    exposed_comm_s: float
    offload_s: float
    model_flops: float  # per step, all GPUs, without recompute
    generation_s: float = 0.0  # GRPO/PPO: generating the step's completions (generation_time_s)

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_comm_s + self.offload_s + self.generation_s


@lru_cache(maxsize=1024)  # once per model and length: the solver asks for every candidate
def model_flops_per_token(shape: ModelShape, sequence_length: int) -> float:
    """Training FLOPs per token (forward + backward) in the PaLM accounting: 6N plus attention."""
    n = shape.active_parameter_count() - shape.embedding_parameters()
    attention = 12 * shape.num_layers * shape.attention_score_width * sequence_length  # MLA: (qk + v) / 2
    logits = 6 * shape.hidden_size * shape.vocab_size if shape.tie_word_embeddings else 0
    return 6 * n + attention + logits


def tokens_per_step(plan: Plan, training: Training) -> int:
    return plan.global_batch_size * training.sequence_length


def assumed_mfu(training: Training, plan: Plan) -> float:
    if training.mfu is not None:
        return training.mfu
    return DEFAULT_MFU_MIXED if plan.mixed_precision else DEFAULT_MFU_FP32


def _collective_bandwidth(hardware: Hardware) -> float:
    """Bytes per second one GPU achieves in a ring over the data-parallel group."""
    link = hardware.gpu.interconnect_bandwidth_gbps
    if hardware.nodes > 1:
        link = min(link, hardware.inter_node_bandwidth_gbps)
    return link * 1e9 * COLLECTIVE_EFFICIENCY


@identity_cache(maxsize=64)  # once per spec: the solver asks for every candidate
def trained_parameters(shape: ModelShape, training: Training) -> int:
    """Parameters that get gradients: the whole model in full training, else the method's."""
    if training.finetuning.method == "full":
        return shape.parameter_count()
    return parameter_split(shape, training.finetuning).trainable_count


@identity_cache(maxsize=64)  # once per spec: the solver asks for every candidate
def method_flops_factor(shape: ModelShape, training: Training, trained: int) -> float:
    """Model FLOPs of the method and objective, as a multiple of full training's on the same tokens.

    A frozen weight's matmul needs no weight gradient in backward: 4 of its 6 FLOPs per parameter
    and token remain. A paired objective runs two sequences per sample. A reference model, separate
    or the policy with its adapter disabled, runs one forward (2 of 6) over them as well.
    """
    finetuning = training.finetuning
    if finetuning.is_default:
        return 1.0
    frozen = 1 - trained / shape.parameter_count()
    factor = 1 - frozen / 3
    if reference_source(finetuning) in ("separate", "adapter-disabled"):
        factor += 1 / 3
    return factor * sequences_per_sample(finetuning.objective)


def estimate_step_time(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> StepTime:
    """Predict the wall time of one optimizer step (pure function of its inputs): compute, the
    communication compute does not hide, and offload traffic, each priced by its own function.
    AutoTP's all-reduces and AutoEP's all-to-alls are synchronous on the compute stream, so they
    join the exposed communication whole (:mod:`dsgen.estimate.model_parallel_time`)."""
    trained = trained_parameters(shape, training)
    flops = _step_flops(shape, plan, training, trained)
    compute, offload, long_exposed = _compute_and_offload(shape, plan, hardware, training, trained, flops)
    exposed = exposed_communication_s(shape, plan, hardware, compute, trained)
    if plan.long_context.active:
        exposed += long_exposed
    if plan.model_parallel.active:
        exposed += _model_parallel_s(shape, plan, hardware, training)
    return StepTime(
        compute_s=compute,
        exposed_comm_s=exposed,
        offload_s=offload,
        model_flops=flops,
        generation_s=generation_time_s(shape, plan, hardware, training),
    )


def _compute_and_offload(
    shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, trained: int, flops: float
) -> tuple[float, float, float]:
    """(compute, offload, the long-context terms' exposed communication) seconds of one step: what
    :func:`estimate_step_time` and :func:`step_time_floor` share."""
    if not plan.long_context.active:
        return compute_s(shape, plan, hardware, training, flops), offload_s(shape, plan, hardware, training, trained), 0.0
    # Ulysses SP, TiledMLP, checkpoint offload (sequence_parallel_time)
    long = long_context_time(
        shape,
        plan,
        hardware,
        training,
        COLLECTIVE_EFFICIENCY,
        PCIE_EFFICIENCY,
        _mfu_flops(plan, hardware, training),
    )
    # the attention core runs at its kernel's rate, apart from the MFU-priced matmuls
    compute = compute_s(shape, plan, hardware, training, flops - long.attention_model_flops, attention_apart=True)
    apart = _at_mfu_s(plan, hardware, training, long.tiled_mlp_flops) + long.attention_s
    compute += apart * _zero3_overhead(plan)
    offload = offload_s(shape, plan, hardware, training, trained) + long.offload_s
    return compute, offload, long.exposed_comm_s


def _model_parallel_s(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> float:
    """:func:`dsgen.estimate.model_parallel_time.model_parallel_comm_s` at this model's link
    efficiency and latencies, memoised per spec on the plan fields it reads: the solver prices
    each micro-batch and accumulation of a layout under every ZeRO stage, knob and offload."""
    table = _model_parallel_tables(shape, hardware, training)
    key = _MODEL_PARALLEL_FIELDS.key(plan)
    seconds = table.get(key)
    if seconds is None:
        mp = plan.model_parallel
        dp = mp.tensor_parallel_size * mp.expert_parallel_size
        layout = simplest_plan(**_MODEL_PARALLEL_FIELDS.values(plan), data_parallel_size=dp)
        seconds = table[key] = model_parallel_comm_s(
            shape, layout, hardware, training, COLLECTIVE_EFFICIENCY, COLLECTIVE_LATENCY_S
        )
    return seconds


def _step_flops(shape: ModelShape, plan: Plan, training: Training, trained: int) -> float:
    """Model FLOPs of one optimizer step, all GPUs, without recompute (:attr:`StepTime.model_flops`)."""
    flops = model_flops_per_token(shape, training.sequence_length) * tokens_per_step(plan, training)
    return flops * method_flops_factor(shape, training, trained)


def step_time_floor(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> float:
    """A lower bound on :func:`estimate_step_time`'s total, without the ZeRO communication (the
    costly term, and the only one the ZeRO knobs move): the same compute, model-parallel traffic,
    offload and generation seconds. The left-out terms are never negative, and a float sum never
    falls when a non-negative term joins it, so the bound holds to the last bit. The solver skips
    candidates this rules out (dsgen.search.solver, ``scope="choice"``)."""
    trained = trained_parameters(shape, training)
    compute, offload, _ = _compute_and_offload(
        shape, plan, hardware, training, trained, _step_flops(shape, plan, training, trained)
    )
    floor = compute
    if plan.model_parallel.active:
        floor += _model_parallel_s(shape, plan, hardware, training)
    return floor + offload + generation_time_s(shape, plan, hardware, training)


#: The share of a GPU's memory bandwidth a decoding step reaches while it reads the weights. Not
#: measured by dsgen: a first-order figure for bandwidth-bound batched decoding (docs/throughput-model.md).
DECODE_BANDWIDTH_EFFICIENCY = 0.5


def generation_time_s(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training) -> float:
    """Seconds to generate a step's completions (GRPO, PPO; 0 otherwise). Batched decoding is bound
    by reading the weights once per generated token: each rank decodes its generation batch for
    ``max_completion_length`` steps, every step reading the active 16-bit weights. vllm-server
    generates on other GPUs, overlapped with training (TRL's async generation is not assumed: the
    same bound applies)."""
    finetuning = training.finetuning
    if finetuning.objective not in ("grpo", "ppo"):
        return 0.0
    bandwidth = hardware.gpu.memory_bandwidth_gbps * 1e9 * DECODE_BANDWIDTH_EFFICIENCY
    if bandwidth <= 0:
        return 0.0
    weights = plan.dtype_bytes * shape.active_parameter_count()
    # one generation batch (micro-batch x accumulation completions per rank) per optimizer step
    return finetuning.generation.max_completion_length * weights / bandwidth


def _micro_batch_efficiency(plan: Plan, training: Training) -> float:
    """Small micro-batches run small kernels: ``t / (t + 256)`` for the ``t`` tokens one GPU holds
    (Ulysses: ``b·s/p``)."""
    tokens = plan.micro_batch_size * training.sequence_length // plan.sequence_parallel_size
    return tokens / (tokens + MICRO_BATCH_TOKENS_HALF_EFFICIENCY)


def _mfu_flops(plan: Plan, hardware: Hardware, training: Training) -> float:
    """FLOP/s one GPU reaches: its dense peak at the assumed MFU and micro-batch efficiency."""
    peak = hardware.gpu.peak_tflops(plan.precision) * 1e12
    return peak * assumed_mfu(training, plan) * _micro_batch_efficiency(plan, training)


def _at_mfu_s(plan: Plan, hardware: Hardware, training: Training, hardware_flops: float) -> float:
    """Seconds for ``hardware_flops`` spread over every GPU at :func:`_mfu_flops`."""
    return hardware_flops / (hardware.world_size * _mfu_flops(plan, hardware, training))


def compute_s(
    shape: ModelShape,
    plan: Plan,
    hardware: Hardware,
    training: Training,
    model_flops: float,
    *,
    attention_apart: bool = False,
) -> float:
    """Seconds of compute per step: the model's FLOPs plus what backward recomputes, at the assumed
    MFU scaled by micro-batch efficiency; ZeRO-3's hooks and gathers slow compute further.
    ``attention_apart``: the attention core is priced elsewhere (long-context plans), so selective
    recomputation, which recomputes only that core, adds nothing here.

    ``model_flops`` counts the step's distinct samples (:attr:`Plan.global_batch_size`) and is
    spread over every GPU, so the time is per GPU whatever the model parallelism: under AutoTP the
    ``tp`` ranks of a group run the same micro-batch, each with ``1/tp`` of the layer and head FLOPs,
    and ``world / tp`` groups meet the global batch, so a rank's share, ``micro·accum·s·flops/token
    / tp``, is the whole model's FLOPs over the world. Under AutoEP the tokens go to the ranks that
    hold their experts, so each rank's expert FLOPs are the active ones on average."""
    s = training.sequence_length
    hardware_flops = model_flops
    if plan.checkpointing == "full":
        hardware_flops += model_flops / 3  # one more forward pass
    elif plan.checkpointing == "selective" and not attention_apart:
        # the attention core's forward again (QK^T and PV: 4·L·q·s per token)
        hardware_flops += 4 * shape.num_layers * shape.q_size * s * tokens_per_step(plan, training)
    return _at_mfu_s(plan, hardware, training, hardware_flops) * _zero3_overhead(plan)


def _zero3_overhead(plan: Plan) -> float:
    return ZERO3_COMPUTE_OVERHEAD if plan.zero_stage == 3 else 1.0


def exposed_communication_s(
    shape: ModelShape, plan: Plan, hardware: Hardware, compute: float, trained: int | None = None
) -> float:
    """Seconds of ZeRO communication per step that compute does not hide, launch latency included:
    ``max(0, overlappable − hidden) + blocking + collectives × latency``. ``trained``: the
    parameters that get gradients (the whole model by default)."""
    overlappable, blocking, hooks, latency = _communication_terms(shape, plan, hardware, trained)
    exposed = max(0.0, overlappable - hidden_communication_s(shape, plan, compute)) + blocking
    exposed += hooks
    return exposed + latency if plan.zero_ranks > 1 else exposed


#: Memoised step-time terms of each model and hardware (or spec), by the plan fields they read.
_communication_tables = memo_tables()
_offload_tables = memo_tables()
_model_parallel_tables = memo_tables()
_COMMUNICATION_FIELDS = PlanFields(
    "precision",
    "zero_stage",
    "gradient_accumulation_steps",
    "checkpointing",
    "knobs",
    "model_parallel",
    "data_parallel_size",
)
_OFFLOAD_FIELDS = PlanFields(
    "precision",
    "offload_optimizer",
    "offload_param",
    "offload_ratio",
    "gradient_accumulation_steps",
    "model_parallel",
    "data_parallel_size",
)
_MODEL_PARALLEL_FIELDS = PlanFields(
    "precision", "micro_batch_size", "gradient_accumulation_steps", "checkpointing", "model_parallel"
)


def _communication_terms(
    shape: ModelShape, plan: Plan, hardware: Hardware, trained: int | None
) -> tuple[float, float, float, float]:
    """(overlappable, blocking, hooks, launch latency) seconds of :func:`exposed_communication_s`:
    what does not depend on the compute it overlaps. Memoised: the solver prices every micro-batch
    and offload of one ZeRO layout, none of which these read, so the plan priced has them (and the
    long-context choices) at their simplest. Launch latency is 0 for a single ZeRO rank (unused)."""
    table = _communication_tables(shape, hardware)
    key = (trained, *_COMMUNICATION_FIELDS.key(plan))
    terms = table.get(key)
    if terms is None:
        layout = simplest_plan(**_COMMUNICATION_FIELDS.values(plan))
        overlappable, blocking = communication_s(shape, layout, hardware, trained)
        latency = collective_latency_s(shape, layout, hardware) if layout.zero_ranks > 1 else 0.0
        terms = table[key] = (overlappable, blocking, hook_s(shape, layout), latency)
    return terms


@lru_cache(maxsize=256)  # a property of the model and one knob, asked for every candidate
def zero3_fetched_modules(shape: ModelShape, persistence_threshold: int) -> int:
    """Modules ZeRO-3 fetches in one pass: one per weight matrix (Linear, Embedding; a bias rides
    with its weight) larger than ``stage3_param_persistence_threshold`` (smaller parameters stay
    whole on every rank: ``persistent_parameters``), plus a tied output head, which fetches the
    shared embedding as its own module. Norms are 1-D and below any practical threshold."""
    matrices = sum(1 for s in parameter_shapes(shape) if len(s) >= 2 and prod(s) > persistence_threshold)
    return matrices + (1 if shape.tie_word_embeddings and not shape.encoder_only else 0)


def hook_s(shape: ModelShape, plan: Plan) -> float:
    """Seconds per step of ZeRO's host-side hooks, which neither bandwidth nor prefetch hide.

    ZeRO-3: every fetched module runs a pre- and post-module hook in forward, again in backward
    and again in a checkpointed recompute (``parameter_offload.py`` ``_pre_forward_module_hook``
    -> ``partitioned_param_coordinator.py`` ``fetch_sub_module``), each micro-step. ZeRO-2: one
    gradient hook per parameter tensor every micro-step; ZeRO-1 runs its loop once, at the boundary
    (the difference is what ZERO2_HOOK_HOST_S measures). Under AutoTP/AutoEP ZeRO-3 fetches the
    modules of the rank's model (:func:`dsgen.estimate.sharding.rank_shape`).
    """
    accum = plan.gradient_accumulation_steps
    if plan.zero_stage == 3:
        passes = 3 if plan.checkpointing == "full" else 2
        fetches = passes * zero3_fetched_modules(rank_shape(shape, plan), plan.knobs.param_persistence_threshold)
        return accum * fetches * ZERO3_FETCH_HOST_S
    if plan.zero_stage == 2:
        return accum * len(parameter_tensors(shape)) * ZERO2_HOOK_HOST_S
    return 0.0


def communication_s(
    shape: ModelShape, plan: Plan, hardware: Hardware, trained: int | None = None
) -> tuple[float, float]:
    """(overlappable, blocking) seconds of ZeRO communication per step, by stage. ZeRO-0/1/2 move
    only the ``trained`` parameters' gradients and updated weights (frozen ones are not in their
    flat group); ZeRO-3 gathers every parameter and reduces the trained ones' gradients. Under
    AutoTP/AutoEP each rank moves what it holds over the group that partitions it
    (:func:`dsgen.estimate.model_parallel_time.zero_groups`)."""
    p = shape.parameter_count() if trained is None else trained
    w = plan.dtype_bytes
    p_ring = ring_elements(zero_groups(shape, plan, p, hardware.gpus_per_node))  # p·(n−1)/n per group
    bandwidth = _collective_bandwidth(hardware)
    accum = plan.gradient_accumulation_steps
    if plan.zero_stage <= 1:
        return 0.0, 2 * w * p_ring / bandwidth  # all-reduce / reduce-scatter + all-gather once per step
    if plan.zero_stage == 2:
        overlappable = accum * w * p_ring / bandwidth  # reduce-scatter every micro-step
        return overlappable, w * p_ring / bandwidth  # all-gather of updated parameters after the step
    gathers, reduce = zero3_micro_step_comm_s(shape, plan, hardware, trained)
    # DeepSpeed 0.19.8 prefetches parameter all-gathers on the coordinator's own all-gather
    # stream in forward and backward whatever overlap_comm says; the gradient reduce-scatter
    # leaves the compute stream only with overlap_comm (stage3.py: reduce_and_partition_stream
    # is the default stream without it), so without it the reduce-scatter blocks.
    if plan.knobs.overlap_comm:
        return accum * (gathers + reduce), 0.0
    return accum * gathers, accum * reduce


def hidden_communication_s(shape: ModelShape, plan: Plan, compute: float) -> float:
    """Seconds of overlappable communication that compute can hide.

    ZeRO-1/2: with ``overlap_comm``, a share of backward (2/3 of compute). ZeRO-3: a share of all
    compute, forward and backward alike, but only as far as the prefetch bucket reaches ahead (one
    pooled budget: a first-order simplification). Under AutoTP/AutoEP a layer is the rank's layer
    (:func:`dsgen.estimate.sharding.rank_shape`).
    """
    k = plan.knobs
    if plan.zero_stage == 3:
        layer = rank_shape(shape, plan).layer_parameters()
        return OVERLAP_SHARE * compute * min(1.0, k.prefetch_bucket_size / max(layer, 1))
    backward_compute = compute * 2 / 3
    return OVERLAP_SHARE * backward_compute if k.overlap_comm else 0.0


def collective_latency_s(shape: ModelShape, plan: Plan, hardware: Hardware) -> float:
    """Seconds of launch latency: the number of collectives per step times the fixed cost of one.
    Stages 0-2 launch one per reduce bucket of each ZeRO group the rank's parameters fall in (under
    AutoEP the dense group and the local experts' expert-data-parallel group, when it has more than
    one rank)."""
    latency = COLLECTIVE_LATENCY_S["inter" if hardware.nodes > 1 else "intra"]
    accum = plan.gradient_accumulation_steps
    groups = zero_groups(shape, plan, shape.parameter_count(), hardware.gpus_per_node)
    groups = tuple(g for g in groups if g.ranks > 1) or groups  # a one-rank group reduces nothing
    buckets = sum(max(1, round(g.elements / plan.knobs.reduce_bucket_size)) for g in groups)
    if plan.zero_stage == 3:
        # one gather per layer forward and backward and one reduce per layer, every micro-step
        collectives = accum * 3 * shape.num_layers
    elif plan.zero_stage == 2:
        collectives = accum * buckets + 1
    else:
        collectives = 2 * buckets
    return collectives * latency


def zero3_micro_step_comm_s(
    shape: ModelShape, plan: Plan, hardware: Hardware, trained: int | None = None
) -> tuple[float, float]:
    """(parameter all-gathers, gradient reduce-scatter): seconds of ZeRO-3 communication per
    micro-step, the gathers of forward and backward together, with ZeRO++ where enabled.

    The two are returned apart because DeepSpeed overlaps them under different conditions
    (see :func:`communication_s`).

    qwZ sends int8 weights (half of 16-bit), hpZ serves the backward gather from a copy partitioned
    within the node (intra-node link), qgZ reduces gradients in int4 after an intra-node pass
    (a quarter of the inter-node volume). Rajbhandari et al., ZeRO++ (2023).

    Under AutoTP/AutoEP a rank gathers and reduces what it holds over the group that partitions it
    (:func:`dsgen.estimate.model_parallel_time.zero_groups`; intra-node passes over the group's
    ranks in the node).
    """
    p = shape.parameter_count()
    w = plan.dtype_bytes
    g = hardware.gpus_per_node
    k = plan.knobs
    gathered = zero_groups(shape, plan, p, g)
    reduced = gathered if trained is None else zero_groups(shape, plan, trained, g)
    wide = _collective_bandwidth(hardware)
    local = hardware.gpu.interconnect_bandwidth_gbps * 1e9 * COLLECTIVE_EFFICIENCY
    gather_bytes = (w / 2 if k.quantized_weights else w) * ring_elements(gathered)
    forward = gather_bytes / wide
    if k.hpz_partition_size > 1:
        backward = w * node_ring_elements(gathered) / local
    else:
        backward = gather_bytes / wide
    if k.quantized_gradients:
        reduce = w * node_ring_elements(reduced) / local + 0.25 * w * ring_elements(reduced) / wide
    else:
        reduce = w * ring_elements(reduced) / wide
    return forward + backward, reduce


def offload_s(
    shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, trained: int | None = None
) -> float:
    """Seconds of offload traffic per step: PCIe transfers, the CPU optimizer update, NVMe swaps.

    Partial offload (``offload_ratio`` < 1) moves and updates only that share on the CPU; the
    optimizer moves the ``trained`` parameters' states, parameter offload every parameter. A
    partition is one rank's share of what it holds (under AutoTP/AutoEP, of its shard:
    :func:`dsgen.estimate.model_parallel_time.zero_groups`).
    """
    if plan.offload_optimizer == "none" and plan.offload_param == "none":
        return 0.0  # what the sum below starts from (most candidates offload nothing)
    table = _offload_tables(shape, hardware, training)
    key = (trained, *_OFFLOAD_FIELDS.key(plan))
    seconds = table.get(key)
    if seconds is None:
        # memoised per spec: the solver prices each offload under many micro-batches, stages and
        # knobs, none of which this reads; the plan priced has them at their simplest
        layout = simplest_plan(**_OFFLOAD_FIELDS.values(plan))
        seconds = table[key] = _offload_s(shape, layout, hardware, training, trained)
    return seconds


def _offload_s(shape: ModelShape, plan: Plan, hardware: Hardware, training: Training, trained: int | None) -> float:
    g = hardware.gpus_per_node
    p = shape.parameter_count()
    w = plan.dtype_bytes
    accum = plan.gradient_accumulation_steps
    offload = 0.0
    partition = partition_elements(zero_groups(shape, plan, p if trained is None else trained, g))
    pcie = hardware.gpu.pcie_bandwidth_gbps * 1e9 * PCIE_EFFICIENCY
    if plan.offload_optimizer != "none":
        share = plan.offload_ratio
        transfers = share * (accum * w * partition + w * partition)  # gradients down each micro-step, params up
        cpu_update = share * partition * hardware.gpus_per_node / (hardware.cpu_optimizer_gparams_per_s * 1e9)
        offload += (transfers / pcie + cpu_update) * CPU_OFFLOAD_MEASURED_FACTOR
        if plan.offload_optimizer == "nvme" and hardware.nvme:
            state = FP32 * partition + flat_state_bytes(training.optimizer.type, (round(partition),))
            offload += 2 * state * hardware.gpus_per_node / (hardware.nvme.bandwidth_gbps * 1e9)
    if plan.offload_param != "none":
        partition = partition_elements(zero_groups(shape, plan, p, g))
        fetch = accum * 2 * w * partition  # parameters brought up for forward and backward
        offload += fetch / pcie
        if plan.offload_param == "nvme" and hardware.nvme:
            offload += accum * 2 * w * partition * hardware.gpus_per_node / (hardware.nvme.bandwidth_gbps * 1e9)
    return offload
