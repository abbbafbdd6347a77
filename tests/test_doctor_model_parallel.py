"""``dsgen doctor`` on configs with AutoTP: the plan it prices and the fixes it offers.

The fixes come from the solver's own search, which now includes the AutoTP degree. Each fixed
config is judged by DeepSpeed's own ``DeepSpeedConfig`` on the job's whole world (what
``deepspeed.initialize`` builds without an mpu, tests/ds_oracle.py), and its batch by the facts the
CPU runs established: the ranks of a TP group share a micro-batch, so a step trains micro x
accumulation x world / TP distinct samples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dsgen import api
from dsgen.doctor.keys import get
from tests.ds_oracle import parse_with_deepspeed

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "llama-3.1-8b-8xh100.yaml"  # 8 x H100, llama-3.1-8b
WORLD = 8

#: an AutoTP 2 config that runs out of memory: micro 8 at 4096 tokens without checkpointing
OOM_TP2: dict[str, Any] = {
    "train_batch_size": 256,
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
    "zero_optimization": {"stage": 1},
    "tensor_parallel": {"autotp_size": 2},
}


def _distinct_samples(config: dict[str, Any]) -> int:
    tp = max(1, get(config, "tensor_parallel.autotp_size") or 1)
    return config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * WORLD // tp


def test_the_config_is_priced_with_its_autotp_degree() -> None:
    diagnosis = api.doctor(OOM_TP2, SPEC, world_size=WORLD)
    plan = diagnosis.evaluation.plan
    assert (plan.tensor_parallel_size, plan.zero_ranks, plan.batch_parallel_size) == (2, 4, 4)
    assert plan.global_batch_size == _distinct_samples(OOM_TP2) == 128


@pytest.mark.deepspeed
def test_every_fix_is_accepted_by_deepspeed_and_keeps_the_samples_per_step() -> None:
    fixes = api.doctor(OOM_TP2, SPEC, world_size=WORLD).fixes
    assert fixes, "the solver finds plans for this spec, so the doctor must offer fixes"
    changed_tp = [f for f in fixes if any(key == "tensor_parallel.autotp_size" for key, _ in f.changes)]
    assert changed_tp, [f.label for f in fixes]  # the TP degree is a dimension fixes consider
    for fix in fixes:
        parse_with_deepspeed(fix.config, WORLD, world_size=WORLD)  # raises on a bad batch triple
        assert _distinct_samples(fix.config) == 128, fix.label
        assert fix.evaluation.plan.tensor_parallel_size == max(1, get(fix.config, "tensor_parallel.autotp_size") or 1)
