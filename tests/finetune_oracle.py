"""Real DeepSpeed as a measurement oracle for fine-tuning setups (LoRA, QLoRA, freezing, DPO).

:func:`measure_finetune` (:func:`measure_finetunes`: several cases in one launch) runs
``tests/finetune_worker.py`` under ``torchrun`` on DeepSpeed's CPU
accelerator (gloo, ``OMP_NUM_THREADS=1``) and returns one record per rank: what that rank holds
after a few optimizer steps (trainable / frozen parameter elements and bytes, ZeRO's flat buffers,
optimizer state, gradient buffers, the DPO reference engine's parameters, the bytes autograd saves
in one policy forward), with the versions and the losses. It measures only; nothing here predicts.

A ``case`` is a plain dict::

    {
        "model": "llama" | "qwen3",            # tiny configs in tests/tiny_models.py
        "dtype": "fp32" | "bf16",              # bf16 through DeepSpeed's bf16 block
        "method": "full" | "lora" | "freeze" | "qlora",
        "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"},
        "freeze": {"last_layers": 1, "modules": ["lm_head", "model.norm"]},
        "zero_stage": 0 | 1 | 2 | 3,
        "micro_batch": 2, "seq_len": 64, "gradient_accumulation_steps": 1,
        "gradient_checkpointing": False,
        "objective": "sft" | "dpo",            # dpo: separate reference via TRL's prepare_deepspeed
        "steps": 2,
        "ds_config_overrides": {...},          # deep-merged into the composed DeepSpeed config
    }

The DeepSpeed config is composed here (:func:`ds_config_for`) and handed to the worker inside the
case file, so the ops to prebuild are known without importing torch. Like ``tests/ds_oracle.py``
this is a support module: torch, DeepSpeed and transformers are only imported by the worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.ds_oracle import measure_cases, merge_config

WORKER = Path(__file__).resolve().parent / "finetune_worker.py"
RECORD_KIND = "DSGEN_FINETUNE"  # keep in sync with finetune_worker.RECORD_KIND

#: Keys every record carries (the harness test checks them).
RECORD_KEYS = (
    "rank",
    "world_size",
    "versions",
    "trainable_elements",
    "frozen_elements",
    "trainable_bytes",
    "frozen_bytes",
    "optimizer_state_bytes",
    "gradient_bytes",
    "saved_activation_bytes",
    "losses",
)

DEFAULT_CASE: dict[str, Any] = {
    "model": "llama",
    "dtype": "fp32",
    "method": "full",
    "zero_stage": 2,
    "micro_batch": 2,
    "seq_len": 64,
    "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False,
    "objective": "sft",
    "steps": 2,
    "seed": 1234,
    "learning_rate": 1e-4,
    "weight_decay": 0.0,
}


def ds_config_for(case: dict[str, Any], ranks: int) -> dict[str, Any]:
    """The DeepSpeed config a run of ``case`` on ``ranks`` data-parallel ranks uses.

    AdamW from DeepSpeed's ``optimizer`` block (its CPU FusedAdam), the ZeRO stage with
    DeepSpeed's defaults otherwise, bf16 through the ``bf16`` block; no gradient clipping, no
    scheduler. ``ds_config_overrides`` is deep-merged last.
    """
    micro = int(case["micro_batch"])
    accumulation = int(case["gradient_accumulation_steps"])
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": micro * accumulation * ranks,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": float(case["learning_rate"]), "weight_decay": float(case["weight_decay"])},
        },
        "zero_optimization": {"stage": int(case["zero_stage"])},
        "bf16": {"enabled": case["dtype"] == "bf16"},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }
    if case["dtype"] not in ("fp32", "bf16"):
        raise ValueError(f"dtype must be fp32 or bf16, got {case['dtype']!r}")
    return merge_config(config, case.get("ds_config_overrides", {}))


def measure_finetune(case: dict[str, Any], ranks: int = 2, timeout: float = 600) -> list[dict[str, Any]]:
    """Run ``case`` on ``ranks`` CPU ranks with real DeepSpeed; one measured record per rank."""
    return measure_finetunes([case], ranks=ranks, timeout=timeout)[0]


def measure_finetunes(cases: list[dict[str, Any]], ranks: int = 2, timeout: float = 600) -> list[list[dict[str, Any]]]:
    """Run every case of ``cases`` in one launch on ``ranks`` CPU ranks; per case, one measured
    record per rank.

    Missing case keys take :data:`DEFAULT_CASE`'s values. Launched and read by
    :func:`tests.ds_oracle.measure_cases` (which raises ``OracleRunError`` with the log tail);
    ``timeout`` is per case."""
    full_cases = []
    for case in cases:
        full_case = {**DEFAULT_CASE, **case}
        full_case["ds_config"] = ds_config_for(full_case, ranks)
        full_cases.append(full_case)
    return measure_cases(WORKER, RECORD_KIND, full_cases, ranks=ranks, timeout=timeout, what="finetune")
