"""dsgen's fine-tuning terms against what real DeepSpeed runs hold, per rank (2 CPU ranks, gloo).

Each case trains a tiny Llama or Qwen3 two steps with PEFT's LoRA, freeze-tuning, QLoRA
(bitsandbytes' 4-bit layers, which run on the CPU) or TRL's DPO reference model
(``tests/finetune_worker.py``), and the records are compared with dsgen's model states for the same
plan: trained and frozen bytes, ZeRO's partitions and persistent tensors, Adam's states, the
reference engine's bytes, exactly; the activations autograd saves, within 3 % each (the activation
bench's bar: 3 % median, 8 % worst).
"""

from __future__ import annotations

import json
import statistics
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module

from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.catalog.model_shape import ModelShape
from dsgen.catalog.presets import get_gpu
from dsgen.estimate.memory import MemoryEstimate, estimate_memory
from dsgen.estimate.optimizers import flat_state_bytes
from dsgen.plan import Plan
from dsgen.spec.types import FineTuning, Freeze, Hardware, Lora, Training
from dsgen.units import FP32
from tests.finetune_oracle import measure_finetunes
from tests.tiny_models import TINY_MODELS

pytestmark = [pytest.mark.slow, pytest.mark.deepspeed]

LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"}
CASES: dict[str, dict[str, Any]] = {
    "llama-lora-z2": {"model": "llama", "method": "lora", "lora": LORA, "zero_stage": 2},
    "llama-lora-z3": {"model": "llama", "method": "lora", "lora": LORA, "zero_stage": 3},
    "qwen3-lora-z2": {"model": "qwen3", "method": "lora", "lora": LORA, "zero_stage": 2},
    "llama-lora-z1-bf16-checkpointed": {
        "model": "llama",
        "method": "lora",
        "lora": LORA,
        "zero_stage": 1,
        "dtype": "bf16",
        "gradient_checkpointing": True,
        "gradient_accumulation_steps": 2,
    },
    "llama-freeze-last-layer-z2": {
        "model": "llama",
        "method": "freeze",
        "freeze": {"last_layers": 1, "modules": []},
        "zero_stage": 2,
    },
    "llama-qlora-z2-bf16": {"model": "llama", "method": "qlora", "lora": LORA, "zero_stage": 2, "dtype": "bf16"},
    "llama-dpo-separate-reference-z2": {"model": "llama", "method": "full", "objective": "dpo", "zero_stage": 2},
    "llama-dpo-separate-reference-z3": {"model": "llama", "method": "full", "objective": "dpo", "zero_stage": 3},
}
MICRO, SEQUENCE, RANKS = 2, 64, 2


@cache
def _shape(model: str, tmp: str) -> ModelShape:
    path = Path(tmp) / f"{model}.json"
    path.write_text(json.dumps({**TINY_MODELS[model], "model_type": model, "max_position_embeddings": 2048}))
    return shape_from_hf_config(path)


@cache
def _all_measured() -> dict[str, tuple[dict[str, Any], ...]]:
    """Every case, measured in one launch (the ranks start and import once for all eight)."""
    require_module("peft")
    require_module("trl")
    names = sorted(CASES)
    measured = measure_finetunes([{"micro_batch": MICRO, "seq_len": SEQUENCE, **CASES[n]} for n in names], ranks=RANKS)
    return {name: tuple(records) for name, records in zip(names, measured, strict=True)}


def _measured(name: str) -> tuple[dict[str, Any], ...]:
    return _all_measured()[name]


def _predicted(name: str, shape: ModelShape) -> MemoryEstimate:
    case = CASES[name]
    precision = case.get("dtype", "fp32")
    finetuning = FineTuning(
        method=case["method"],
        lora=Lora(rank=LORA["r"], alpha=LORA["lora_alpha"], dropout=LORA["lora_dropout"]),
        freeze=Freeze(trainable_layers=case.get("freeze", {}).get("last_layers", 2)),
        objective=case.get("objective", "sft"),
        reference_model="separate" if case.get("objective") == "dpo" else "auto",
    )
    training = Training(
        sequence_length=SEQUENCE, global_batch_size=8, precision=precision, attention="sdpa", finetuning=finetuning
    )
    plan = Plan(
        precision=precision,
        zero_stage=case["zero_stage"],
        offload_optimizer="none",
        offload_param="none",
        checkpointing="full" if case.get("gradient_checkpointing") else "none",
        micro_batch_size=MICRO,
        gradient_accumulation_steps=case.get("gradient_accumulation_steps", 1),
        data_parallel_size=RANKS,
    )
    return estimate_memory(shape, plan, Hardware(gpu=get_gpu("a100-80gb"), gpus_per_node=RANKS), training)


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_states_equal_what_each_rank_holds(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    shape = _shape(CASES[name]["model"], str(tmp_path_factory.getbasetemp()))
    predicted = _predicted(name, shape)
    states = predicted.model_states
    parts = states.partitioning
    w = 2 if CASES[name].get("dtype") == "bf16" else FP32
    for record in _measured(name):
        if CASES[name]["zero_stage"] == 3:
            layout = parts.zero3
            assert layout is not None
            assert record["trainable_elements"] == layout.partition
            assert record["frozen_bytes"] == states.frozen.partitions
            # small tensors are also kept whole on every rank: the trained ones and the frozen ones
            assert record["zero3_persistent_bytes"] == w * layout.persistent + states.frozen.resident
        else:
            assert sum(record["zero12_bit16_groups_flat_elements"]) == parts.zero12_slice * RANKS - _padding(parts)
            assert sum(record["zero12_single_partition_of_fp32_groups_elements"]) <= parts.zero12_slice
            frozen = record["frozen_bytes"] + _quantization_constants(record)
            assert frozen == states.frozen.resident
        stepped = parts.zero3.partition if parts.zero3 else parts.zero12_slice
        assert record["optimizer_state_bytes"] == flat_state_bytes("adamw", (stepped,))
        if "ref_param_bytes" in record:
            persistent = record.get("ref_zero3_persistent_elements") or 0
            assert record["ref_param_bytes"] + w * persistent == predicted.gpu.reference_model


def _padding(parts: Any) -> int:
    """ZeRO-1/2 pad their flat group to a multiple of 2·N elements; the records count it unpadded."""
    return parts.zero12_slice * parts.ranks - parts.parameters


def _quantization_constants(record: dict[str, Any]) -> int:
    """bitsandbytes' block constants of every 4-bit layer (its absmax, nested absmax), which are not parameters."""
    layers = record.get("qlora", {}).get("layers", {})
    return sum(layer["absmax_bytes"] + layer["nested_absmax_bytes"] for layer in layers.values())


def test_saved_activations_within_the_activation_benchs_bar(tmp_path_factory: pytest.TempPathFactory) -> None:
    errors = {}
    for name, case in CASES.items():
        shape = _shape(case["model"], str(tmp_path_factory.getbasetemp()))
        predicted = _predicted(name, shape).gpu.activations
        measured = max(record["saved_activation_bytes"] for record in _measured(name))
        errors[name] = predicted / measured - 1
    worst = max(abs(e) for e in errors.values())
    assert statistics.median(abs(e) for e in errors.values()) <= 0.03, errors
    assert worst <= 0.08, errors
