"""Turn a published run (bench/data/*_outcomes.yaml) into a fully pinned dsgen spec and price it.

Shared by bench/fit_accuracy.py and bench/throughput_accuracy.py. Every search dimension is pinned
through ``constraints`` (stage, both offloads, checkpointing, micro-batch, accumulation) and
``memory_headroom`` is 0, so ``solve`` reports exactly the plan that ran. Two pricings per run:

* ``dsgen`` - the plan ``solve`` returns, priced with the ZeRO knobs dsgen itself would render;
* ``run``   - the same plan re-priced (``dsgen.search.evaluation.evaluate``) with the knobs the run's own config
  used, DeepSpeed 0.19.8 defaults filled in where the config leaves them out, and the whole
  optimizer offloaded where it was (``offload_optimizer.ratio`` 1.0). dsgen's spec cannot pin knobs
  (bucket sizes, overlap_comm, live parameters, prefetch, sub_group_size) nor the partial-offload
  share, hence this side door.

Who built the optimizer is part of what ran: ``implementation: torch`` where the corpus says the
trainer built torch's AdamW (see :func:`implementation`), so the optimizer-step temporary is priced.

``dsgen.api.load_spec`` takes a path; until it accepts a mapping the spec is written to a
temporary YAML file first (the documented work-around).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from dsgen.api import load_spec, solve_spec
from dsgen.catalog.model_shape import ModelShape
from dsgen.doctor.config_to_plan import pins_offload_by_default
from dsgen.estimate.optimizers import TORCH_OPTIMIZERS
from dsgen.plan import ZeroKnobs
from dsgen.search.evaluation import Evaluation, evaluate
from dsgen.spec.defaults import spec_default
from dsgen.spec.types import Spec

DATA = Path(__file__).resolve().parent / "data"
# Where a source does not state the host RAM the spec leaves hardware.cpu_memory_gib out, as a user
# who does not know it would, and dsgen prices its own default (and says it was assumed).
UNKNOWN_HOST_GIB = float(spec_default("hardware.cpu_memory_gib"))

# DeepSpeed 0.19.8 zero_optimization defaults (deepspeed/runtime/zero/config.py), in elements
DS_DEFAULTS: dict[str, float] = {
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 5e8,
    "prefetch_bucket_size": 5e7,
    "param_persistence_threshold": 1e5,
    "max_live_parameters": 1e9,
    "max_reuse_distance": 1e9,
    "sub_group_size": 1e9,
}


def load_corpus(name: str) -> dict[str, Any]:
    """The parsed corpus file ``bench/data/<name>.yaml``."""
    with open(DATA / f"{name}.yaml", encoding="utf-8") as handle:
        data: dict[str, Any] = yaml.safe_load(handle)
    return data


def implementation(case: dict[str, Any]) -> str:
    """Who built the optimizer: ``torch`` when the run's trainer built torch.optim's class (the
    corpus's ``optimizer_impl``, torch by default), else ``deepspeed``. With optimizer offload
    DeepSpeed 0.19.8 refuses a client optimizer unless ``zero_force_ds_cpu_optimizer`` is false
    (runtime/engine.py, ``_configure_basic_optimizer``), so an offloaded run stepped with
    DeepSpeedCPUAdam whatever the trainer built."""
    offloaded = case["zero_stage"] > 0 and case["offload_optimizer"] != "none"
    torch_built = case.get("optimizer_impl", "torch") == "torch" and case["optimizer"] in TORCH_OPTIMIZERS
    return "torch" if torch_built and not offloaded else "deepspeed"


def spec_mapping(case: dict[str, Any], corpus: dict[str, Any]) -> dict[str, Any]:
    """The dsgen spec (as a mapping) that pins every search dimension to what the run used."""
    model = case["model"]
    model_block: dict[str, Any] = (
        {"preset": model["preset"]} if "preset" in model else {"architecture": dict(corpus["models"][model["arch"]])}
    )
    gpu = case["gpu"]
    gpu_block: Any = dict(corpus["gpus"][gpu]) if gpu in corpus.get("gpus", {}) else gpu
    world = case["gpus_per_node"] * case["nodes"]
    stage = case["zero_stage"]
    host = case.get("host_ram_gib")
    return {
        "model": model_block,
        "hardware": {
            "gpu": gpu_block,
            "gpus_per_node": case["gpus_per_node"],
            "nodes": case["nodes"],
            **({"cpu_memory_gib": host} if host else {}),
            **(
                {"inter_node_bandwidth_gbps": case["inter_node_bandwidth_gbps"]}
                if "inter_node_bandwidth_gbps" in case
                else {}
            ),
        },
        "training": {
            "sequence_length": case["sequence_length"],
            "global_batch_size": case["micro_batch"] * case["grad_accum"] * world,
            "precision": case["precision"],
            "attention": case["attention"],
            "optimizer": {"type": case["optimizer"], "implementation": implementation(case)},
            # Liger-Kernel where the run turned it on (its fused linear cross-entropy leaves no logits)
            **({"liger_kernel": True} if case.get("liger_kernel") else {}),
            # samples packed to the full length where the source says so (the verdict's lean, dsgen.search.verdict)
            **({"packed_samples": True} if case.get("packed_samples") else {}),
            # the DeepSpeed release of the run (the corpus's, unless the case names its own)
            **(
                {"deepspeed_version": str(v)}
                if (v := case.get("deepspeed_version", corpus.get("deepspeed_version")))
                else {}
            ),
        },
        "constraints": {
            "zero_stage": stage,
            "offload_optimizer": case["offload_optimizer"] if stage > 0 else "none",
            "offload_param": case["offload_param"] if stage == 3 else "none",
            "activation_checkpointing": case["activation_checkpointing"],
            "micro_batch_size": case["micro_batch"],
            "gradient_accumulation_steps": case["grad_accum"],
            "memory_headroom": 0,
        },
    }


def build_spec(mapping: dict[str, Any]) -> Spec:
    """``dsgen.api.load_spec`` on the mapping (through a temporary YAML file)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
        return load_spec(path)


def _knob_value(value: Any, key: str, shape: ModelShape) -> float:
    """A config value in elements: 'auto' is what the HF Trainer fills in, 'default' DeepSpeed's."""
    h = shape.hidden_size
    if value == "auto":
        return {
            "reduce_bucket_size": h * h,
            "prefetch_bucket_size": 0.9 * h * h,
            "param_persistence_threshold": 10 * h,
        }[key]
    if value in (None, "default"):
        return DS_DEFAULTS[key]
    if key in ("max_live_parameters", "sub_group_size") and value == 0:
        return 0  # axolotl writes 0: DeepSpeed then holds no live set beyond the module in use
    return float(value)


def _given_knobs(case: dict[str, Any], corpus: dict[str, Any]) -> dict[str, Any]:
    """The zero_optimization values the run's config states (its own, or a named block)."""
    return dict(corpus["knobs"][case["knobs_ref"]]) if "knobs_ref" in case else dict(case.get("knobs", {}))


def _stated_pin(case: dict[str, Any], corpus: dict[str, Any]) -> bool | None:
    """The run's config's ``pin_memory`` for its offload blocks, None where it says nothing."""
    pin = _given_knobs(case, corpus).get("offload_pin_memory")
    return pin if isinstance(pin, bool) else None


def run_knobs(case: dict[str, Any], corpus: dict[str, Any], shape: ModelShape) -> ZeroKnobs:
    """The ZeroKnobs of the run's own config, DeepSpeed's defaults where it says nothing."""
    given = _given_knobs(case, corpus)
    stage = case["zero_stage"]
    overlap = given.get("overlap_comm", "default")
    # DeepSpeed 0.19.8: overlap_comm defaults to True for stage 3 and False otherwise (zero/config.py)
    overlap_comm = (stage == 3) if overlap in (None, "default") else bool(overlap)
    values = {key: _knob_value(given.get(key, "default"), key, shape) for key in DS_DEFAULTS}
    return ZeroKnobs(
        reduce_bucket_size=int(values["reduce_bucket_size"]),
        allgather_bucket_size=int(values["allgather_bucket_size"]),
        overlap_comm=overlap_comm,
        prefetch_bucket_size=int(values["prefetch_bucket_size"]),
        param_persistence_threshold=int(values["param_persistence_threshold"]),
        max_live_parameters=int(values["max_live_parameters"]),
        max_reuse_distance=int(values["max_reuse_distance"]),
        sub_group_size=int(values["sub_group_size"]) or 1,
    )


@dataclass(frozen=True)
class Priced:
    """One published run priced by dsgen: with dsgen's own knobs and with the run's knobs."""

    spec: Spec
    dsgen: Evaluation
    run: Evaluation


def price(case: dict[str, Any], corpus: dict[str, Any]) -> Priced:
    """Solve the pinned spec of ``case`` and re-price its plan with the run's own knobs."""
    spec = build_spec(spec_mapping(case, corpus))
    result = solve_spec(spec)
    chosen = result.best
    assert chosen is not None, f"{case['id']}: a fully pinned spec always reports its plan"
    # The run offloaded its whole optimizer (DeepSpeed's default offload_optimizer.ratio is 1.0); the
    # solver may have picked a partial-offload share for ZeRO-3, which constraints cannot pin.
    # pin_memory as the run's config states it, else its release's default (as the doctor reads it)
    stated = _stated_pin(case, corpus)
    pin = stated if stated is not None else pins_offload_by_default(spec.training.deepspeed_version)
    knobs = replace(run_knobs(case, corpus, spec.model), pin_optimizer_offload=pin, pin_param_offload=pin)
    plan = replace(chosen.plan, knobs=knobs, offload_ratio=1.0)
    return Priced(spec=spec, dsgen=chosen, run=evaluate(spec, plan))


def doctor_config(case: dict[str, Any], corpus: dict[str, Any], shape: ModelShape) -> dict[str, Any]:
    """The DeepSpeed config the run used, as ``dsgen doctor`` reads one: its batch triple,
    precision, stage, offload devices and ZeRO knobs (DeepSpeed's defaults where it said nothing)."""
    knobs = run_knobs(case, corpus, shape)
    stage = case["zero_stage"]
    world = case["gpus_per_node"] * case["nodes"]
    # pin_memory where the run's config states it; else its release's default applies (False before 0.19)
    pin = _stated_pin(case, corpus)
    pinning = {} if pin is None else {"pin_memory": pin}
    zero: dict[str, Any] = {"stage": stage}
    if stage > 0:
        zero.update(
            reduce_bucket_size=knobs.reduce_bucket_size,
            overlap_comm=knobs.overlap_comm,
            contiguous_gradients=knobs.contiguous_gradients,
        )
        if case["offload_optimizer"] != "none":
            zero["offload_optimizer"] = {"device": "cpu" if stage < 3 else case["offload_optimizer"], **pinning}
    if stage in (1, 2):
        zero["allgather_bucket_size"] = knobs.allgather_bucket_size
    if stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=knobs.prefetch_bucket_size,
            stage3_param_persistence_threshold=knobs.param_persistence_threshold,
            stage3_max_live_parameters=knobs.max_live_parameters,
            stage3_max_reuse_distance=knobs.max_reuse_distance,
            sub_group_size=knobs.sub_group_size,
        )
        if case["offload_param"] != "none":
            zero["offload_param"] = {"device": case["offload_param"], **pinning}
    config: dict[str, Any] = {
        "train_batch_size": case["micro_batch"] * case["grad_accum"] * world,
        "train_micro_batch_size_per_gpu": case["micro_batch"],
        "gradient_accumulation_steps": case["grad_accum"],
        "zero_optimization": zero,
    }
    if case["precision"] in ("bf16", "fp16"):
        config[case["precision"]] = {"enabled": True}
    return config


def doctor_spec(case: dict[str, Any], corpus: dict[str, Any], target: str | None = None) -> Spec:
    """The spec ``dsgen doctor`` is given for the run: the cluster, sequence, attention, optimizer and
    whether the script checkpoints; nothing else pinned, the default memory_headroom. ``target``:
    whose training loop runs the config (``output.target``; the spec's default when None)."""
    mapping = spec_mapping(case, corpus)
    mapping["constraints"] = {"activation_checkpointing": case["activation_checkpointing"]}
    if target is not None:
        mapping["output"] = {"target": target}
    if case.get("nvme_gib") or case["offload_optimizer"] == "nvme" or case["offload_param"] == "nvme":
        mapping["hardware"]["nvme"] = {"path": "/local_nvme", "capacity_gib": case.get("nvme_gib", 3500)}
    return build_spec(mapping)
