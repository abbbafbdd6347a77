"""A candidate plan: one point in the search space plus the ZeRO knobs it renders with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

from dsgen.units import FP32, HALF
from dsgen.vocabulary import Checkpointing, OffloadDevice, Precision


def _fields_hash(value: Any) -> int:
    """The hash of a frozen dataclass's fields, computed once and kept on the instance (not a
    field: equality, ``replace`` and ``asdict`` are unaffected). The plan's parts are keys of the
    pricing's memoised terms (dsgen.estimate), asked for every candidate the solver prices."""
    cached: int | None = value._hash
    if cached is None:
        cached = hash(tuple(getattr(value, f.name) for f in fields(value)))
        object.__setattr__(value, "_hash", cached)
    return cached


def _fields_state(value: Any) -> dict[str, Any]:
    """Pickle the fields only: a cached hash of strings differs between processes."""
    return {f.name: getattr(value, f.name) for f in fields(value)}


@dataclass(frozen=True)  # one per knob variant and ZeRO++ setting the solver prices
class ZeroKnobs:
    """DeepSpeed zero_optimization settings that trade memory for speed (sizes in elements)."""

    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    sub_group_size: int = 1_000_000_000
    hpz_partition_size: int = 1  # ZeRO++ hpZ: secondary parameter partition within a node
    quantized_weights: bool = False  # ZeRO++ qwZ: int8 parameter all-gather
    quantized_gradients: bool = False  # ZeRO++ qgZ: int4 gradient reduce-scatter
    # offload_optimizer / offload_param ``pin_memory``: what dsgen renders; a config's own value,
    # or its release's default, in the doctor (False before DeepSpeed 0.19, deepspeedai/DeepSpeed#8207)
    pin_optimizer_offload: bool = True
    pin_param_offload: bool = True
    # ZeRO-3 ``stage3_gather_16bit_weights_on_model_save``: dsgen renders true (the HF Trainer and
    # Accelerate then save a loadable 16-bit model); DeepSpeed's default, false, in the doctor
    gather_16bit_weights_on_model_save: bool = True

    _hash = None  # cache of __hash__ (_fields_hash), not a field

    def __hash__(self) -> int:
        return _fields_hash(self)

    def __getstate__(self) -> dict[str, Any]:
        return _fields_state(self)

    @property
    def zeropp(self) -> str:
        """Short label of the ZeRO++ features in use ('none', 'hpz', 'hpz+qwz+qgz', ...)."""
        parts = [
            name
            for name, on in (
                ("hpz", self.hpz_partition_size > 1),
                ("qwz", self.quantized_weights),
                ("qgz", self.quantized_gradients),
            )
            if on
        ]
        return "+".join(parts) or "none"


@dataclass(frozen=True)  # one per long-context variant the solver prices
class LongContext:
    """The Arctic Long Sequence Training (ALST) choices of a plan (arXiv 2506.13996; DeepSpeed
    ``runtime/sequence_parallel/ulysses_sp.py``): the Ulysses degree and the three memory tricks.
    The default is a plan without any of them. ``communication_dtype`` is the dtype ZeRO reduces
    gradients in under Ulysses (``seq_parallel_communication_data_type``; fp32 without SP, where
    DeepSpeed never reads it)."""

    sequence_parallel_size: int = 1
    tiled_mlp: bool = False
    tiled_loss: bool = False
    checkpoint_offload: bool = False
    communication_dtype: Precision = "fp32"

    _hash = None  # cache of __hash__ (_fields_hash), not a field

    def __hash__(self) -> int:
        return _fields_hash(self)

    def __getstate__(self) -> dict[str, Any]:
        return _fields_state(self)

    @property
    def communication_bytes(self) -> int:
        return FP32 if self.communication_dtype == "fp32" else HALF

    @property
    def active(self) -> bool:
        return self.sequence_parallel_size > 1 or self.tiled_mlp or self.tiled_loss or self.checkpoint_offload

    def label(self) -> str:
        """e.g. 'SP 8, tiled MLP, tiled loss, checkpoint offload' ('' when none is on)."""
        parts = [f"SP {self.sequence_parallel_size}"] if self.sequence_parallel_size > 1 else []
        if self.sequence_parallel_size > 1 and self.communication_dtype != "fp32":
            parts[0] += f" ({self.communication_dtype} gradient reduction)"
        parts += [
            name
            for name, on in (
                ("tiled MLP", self.tiled_mlp),
                ("tiled loss", self.tiled_loss),
                ("checkpoint offload", self.checkpoint_offload),
            )
            if on
        ]
        return ", ".join(parts)


@dataclass(frozen=True)  # one per model-parallel layout the solver prices
class ModelParallel:
    """DeepSpeed's model parallelism of a plan: the AutoTP degree (``tensor_parallel.autotp_size``)
    and the AutoEP degree (``expert_parallel.autoep_size``); 1 is off. The rules that decide which
    layouts a release runs are :mod:`dsgen.facts.model_parallel`'s."""

    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1

    _hash = None  # cache of __hash__ (_fields_hash), not a field

    def __hash__(self) -> int:
        return _fields_hash(self)

    def __getstate__(self) -> dict[str, Any]:
        return _fields_state(self)

    @property
    def active(self) -> bool:
        return self.tensor_parallel_size > 1 or self.expert_parallel_size > 1

    def label(self) -> str:
        """e.g. 'AutoTP 2', 'AutoEP 8' ('' when neither is on)."""
        parts = [f"AutoTP {self.tensor_parallel_size}"] if self.tensor_parallel_size > 1 else []
        if self.expert_parallel_size > 1:
            parts.append(f"AutoEP {self.expert_parallel_size}")
        return " + ".join(parts)


CHECKPOINTING_LABELS: dict[Checkpointing, str] = {
    "none": "",
    "selective": ", selective recompute",
    "full": ", checkpointing",
}


@dataclass(frozen=True)  # one per candidate plan
class Plan:
    """One point of the search space: every choice that changes memory or speed, and nothing else."""

    precision: Precision
    zero_stage: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    checkpointing: Checkpointing  # the output contract's two booleans: checkpointing_flags below
    micro_batch_size: int
    gradient_accumulation_steps: int
    data_parallel_size: int  # ranks ZeRO partitions over: every GPU (with Ulysses, DeepSpeed's seq_data_parallel_group)
    knobs: ZeroKnobs = ZeroKnobs()
    offload_ratio: float = 1.0  # share of optimizer work done on the CPU (ZeRO-3 partial offload)
    long_context: LongContext = LongContext()
    model_parallel: ModelParallel = ModelParallel()

    @property
    def sequence_parallel_size(self) -> int:
        return self.long_context.sequence_parallel_size

    @property
    def tensor_parallel_size(self) -> int:
        return self.model_parallel.tensor_parallel_size

    @property
    def expert_parallel_size(self) -> int:
        return self.model_parallel.expert_parallel_size

    @property
    def zero_ranks(self) -> int:
        """Ranks ZeRO partitions the dense model states over: every GPU, or every GPU / the AutoTP
        degree, DeepSpeed's data-parallel group under AutoTP (``runtime/engine.py``
        ``_configure_zero_optimizer``: ``dp_process_group=self.seq_data_parallel_group``, built by
        ``utils/groups.py`` ``_init_tp_mesh_device`` as world // autotp_size)."""
        return self.data_parallel_size // self.tensor_parallel_size

    @property
    def expert_zero_ranks(self) -> int:
        """Ranks ZeRO partitions AutoEP's local experts over: the expert-data-parallel group,
        world // autoep_size (``utils/groups.py`` ``_create_expert_and_data_parallel``;
        ``runtime/zero/stage_1_and_2.py`` ``_configure_moe_settings``)."""
        return self.data_parallel_size // self.expert_parallel_size

    @property
    def batch_parallel_size(self) -> int:
        """Ranks that each take their own micro-batches: the GPUs / the Ulysses degree / the AutoTP
        degree (every rank of a TP group consumes the same micro-batch). Under Ulysses it is the
        ``world_size`` DeepSpeed checks ``train_batch_size`` against (``runtime/config.py``:
        ``dist.get_world_size() / config["sequence_parallel_size"]``); under AutoTP DeepSpeed checks
        every rank (:attr:`deepspeed_batch_world`). ZeRO still partitions model states over every
        GPU / the AutoTP degree (:attr:`zero_ranks`)."""
        return self.data_parallel_size // self.long_context.sequence_parallel_size // self.tensor_parallel_size

    @property
    def deepspeed_batch_world(self) -> int:
        """The ``world_size`` DeepSpeed 0.19.8 multiplies into ``train_batch_size``: every GPU / the
        Ulysses degree, TP peers counted each (``deepspeed/__init__.py`` ``initialize`` builds
        ``DeepSpeedConfig(config, mpu=None)``, so ``runtime/config.py`` ``_batch_assertion`` sees the
        whole world; measured in docs/model-parallel-measurements.md)."""
        return self.data_parallel_size // self.long_context.sequence_parallel_size

    @property
    def deepspeed_train_batch_size(self) -> int:
        """The ``train_batch_size`` DeepSpeed accepts: :attr:`global_batch_size` x the AutoTP degree."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.deepspeed_batch_world

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.gradient_accumulation_steps * self.batch_parallel_size

    @property
    def mixed_precision(self) -> bool:
        return self.precision in ("bf16", "fp16")

    @property
    def dtype_bytes(self) -> int:
        return HALF if self.mixed_precision else FP32

    def offload_label(self) -> str:
        parts: list[str] = []
        if self.offload_optimizer != "none":
            share = f" {self.offload_ratio:.0%}" if self.offload_ratio < 1 else ""
            parts.append(f"{self.offload_optimizer}{share} optimizer")
        if self.offload_param != "none":
            parts.append(f"{self.offload_param} params")
        return ", ".join(parts) or "none"

    def describe(self) -> str:
        """Short human label, e.g. 'ZeRO-2 + CPU optimizer offload, checkpointing, bf16, micro 4 x accum 8'."""
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            share = f" ({self.offload_ratio:.0%})" if self.offload_ratio < 1 else ""
            parts.append(f"{self.offload_optimizer.upper()} optimizer offload{share}")
        if self.offload_param != "none":
            parts.append(f"{self.offload_param.upper()} param offload")
        if self.knobs.zeropp != "none":
            parts.append(f"ZeRO++ {self.knobs.zeropp}")
        label = " + ".join(parts)
        label += CHECKPOINTING_LABELS[self.checkpointing]
        if self.long_context.active:
            label += f", {self.long_context.label()}"
        if self.model_parallel.active:
            label += f", {self.model_parallel.label()}"
        return f"{label}, {self.precision}, micro {self.micro_batch_size} x accum {self.gradient_accumulation_steps}"


# ---- the plan's labels in the output contract (solve --json, sweep manifests) ----------------
def offload_optimizer_ratio(plan: Plan) -> float:
    """Share of the optimizer step run on the offload device: 1.0 full, 0.0 with no offload.

    Plans that differ only in this share (ZeRO-3 partial CPU offload) have different memory and
    step times, so the output must say which one it is.
    """
    return float(plan.offload_ratio) if plan.offload_optimizer != "none" else 0.0


def checkpointing_flags(plan: Plan | None) -> dict[str, bool | None]:
    """The output contract's two checkpointing booleans, derived here only from the one mode.

    ``activation_checkpointing``: every layer recomputed; ``selective_recompute``: only the
    attention function. Both ``None`` without a plan (a sweep run that found none).
    """
    return {
        "activation_checkpointing": None if plan is None else plan.checkpointing == "full",
        "selective_recompute": None if plan is None else plan.checkpointing == "selective",
    }


def zeropp_dict(plan: Plan) -> dict[str, Any]:
    """The ZeRO++ settings of ``plan`` (hpZ partition size 1 means hpZ is off)."""
    k = plan.knobs
    return {
        "hpz_partition_size": k.hpz_partition_size,
        "quantized_weights": k.quantized_weights,
        "quantized_gradients": k.quantized_gradients,
    }


#: The simplest value of each required :class:`Plan` field but the precision: no ZeRO, offload or
#: recomputation, one sequence, one step, one rank (the others default to their simplest).
SIMPLEST: dict[str, Any] = {
    "zero_stage": 0,
    "offload_optimizer": "none",
    "offload_param": "none",
    "checkpointing": "none",
    "micro_batch_size": 1,
    "gradient_accumulation_steps": 1,
    "data_parallel_size": 1,
}


def simplest_plan(precision: Precision, **fields: Any) -> Plan:
    """The plan with ``fields`` set and every other field at its simplest: what a term memoised
    on ``fields`` prices on a miss, so its result depends on its key alone."""
    return Plan(precision=precision, **{**SIMPLEST, **fields})


class PlanFields:
    """The plan fields a memoised term reads, written once: the key it is cached on (:meth:`key`,
    a tuple in this order) and the fields of the plan it prices on a miss (:meth:`values`, for
    :func:`simplest_plan`), so the two cannot drift apart."""

    def __init__(self, *names: str) -> None:
        assert "precision" in names and len(names) > 1  # attrgetter gives a tuple for several
        self.names = names
        self.key: Callable[[Plan], tuple[Any, ...]] = attrgetter(*names)

    def values(self, plan: Plan) -> dict[str, Any]:
        return {name: getattr(plan, name) for name in self.names}


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The ``plan`` object of the output contract: every choice that tells two plans apart.

    New keys go at the end; existing keys never change (other tools parse them).
    """
    return {
        "precision": plan.precision,
        "zero_stage": plan.zero_stage,
        "offload_optimizer": plan.offload_optimizer,
        "offload_param": plan.offload_param,
        **checkpointing_flags(plan),
        "micro_batch_size": plan.micro_batch_size,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "data_parallel_size": plan.batch_parallel_size,
        "global_batch_size": plan.global_batch_size,
        "offload_optimizer_ratio": offload_optimizer_ratio(plan),
        "zeropp": zeropp_dict(plan),
        **long_context_dict(plan),
        "seq_parallel_communication_data_type": plan.long_context.communication_dtype,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "expert_parallel_size": plan.expert_parallel_size,
    }


LONG_CONTEXT_KEYS = ("sequence_parallel_size", "tiled_mlp", "tiled_loss", "checkpoint_offload")


def long_context_dict(plan: Plan) -> dict[str, Any]:
    """The ALST choices of ``plan`` (Ulysses degree and the three memory tricks)."""
    lc = plan.long_context
    return {
        "sequence_parallel_size": lc.sequence_parallel_size,
        "tiled_mlp": lc.tiled_mlp,
        "tiled_loss": lc.tiled_loss,
        "checkpoint_offload": lc.checkpoint_offload,
    }
