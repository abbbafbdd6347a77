"""Tests of the fine-tuning measurement harness itself (tests/finetune_oracle.py, tests/finetune_worker.py).

One small LoRA ZeRO-2 run on two CPU ranks must come back as one record per rank with every
measured key, and the records must be self-consistent with what ZeRO-2 is known to do: the
adapters (trainable) are partitioned in the optimizer's fp32 copy, the frozen base is held whole
by every rank, and Adam's two fp32 moments cover exactly this rank's partition.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_module
from tests.finetune_oracle import RECORD_KEYS, ds_config_for, measure_finetune

RANKS = 2
LORA_ZERO2 = {
    "model": "llama",
    "dtype": "fp32",
    "method": "lora",
    "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"},
    "zero_stage": 2,
    "micro_batch": 2,
    "seq_len": 32,
    "steps": 2,
}


def test_ds_config_for_batch_triple_and_overrides() -> None:
    case = {**LORA_ZERO2, "learning_rate": 1e-4, "weight_decay": 0.0, "gradient_accumulation_steps": 3}
    case["ds_config_overrides"] = {"zero_optimization": {"contiguous_gradients": False}}
    config = ds_config_for(case, RANKS)
    assert config["train_batch_size"] == 2 * 3 * RANKS
    assert config["zero_optimization"] == {"stage": 2, "contiguous_gradients": False}
    assert config["bf16"] == {"enabled": False}


@pytest.fixture(scope="module")
def lora_zero2_records() -> list[dict[str, Any]]:
    for name in ("deepspeed", "transformers", "peft", "trl"):
        require_module(name)
    return measure_finetune(LORA_ZERO2, ranks=RANKS)


@pytest.mark.slow
@pytest.mark.deepspeed
def test_one_record_per_rank_with_every_key(lora_zero2_records: list[dict[str, Any]]) -> None:
    assert [r["rank"] for r in lora_zero2_records] == list(range(RANKS))
    for record in lora_zero2_records:
        missing = [key for key in RECORD_KEYS if key not in record]
        assert not missing, f"record of rank {record['rank']} lacks {missing}"
        assert record["world_size"] == RANKS
        assert len(record["losses"]) == LORA_ZERO2["steps"]
        assert set(record["versions"]) >= {"torch", "deepspeed", "transformers", "peft", "trl"}


@pytest.mark.slow
@pytest.mark.deepspeed
def test_lora_zero2_record_is_self_consistent(lora_zero2_records: list[dict[str, Any]]) -> None:
    for record in lora_zero2_records:
        trainable, frozen = record["trainable_elements"], record["frozen_elements"]
        assert 0 < trainable < frozen
        # ZeRO-2 partitions neither the module's trainable bit16 params nor the frozen base.
        assert record["trainable_bytes"] == 4 * trainable and record["frozen_bytes"] == 4 * frozen
        flat = record["zero12_bit16_groups_flat_elements"]
        partition = record["zero12_single_partition_of_fp32_groups_elements"]
        assert sum(flat) >= trainable and all(f == RANKS * p for f, p in zip(flat, partition, strict=True))
        # Adam: exp_avg + exp_avg_sq in fp32 over this rank's partition (plus a step counter).
        assert record["optimizer_state_elements"] == 2 * sum(partition)
        assert record["gradient_bytes"] > 0 and record["saved_activation_bytes"] > 0
