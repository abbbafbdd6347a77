"""dsgen's ZeRO-3 MoE backward term (dsgen/estimate/zero3_moe.py) against the CPU measurement of
tests/test_z3_leaf_measured.py: the tiny Mixtral with the published run's proportions, read by dsgen
from its transformers config.json, with the run's scaled ZeRO-3 knobs.

The measured figure is the backward peak of gathered + released-but-referenced + full-size gradient
elements, less the gradients that sit inside the preallocated reduce bucket (dsgen prices the bucket
as a bucket, whatever it holds).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dsgen.api import load_spec
from dsgen.estimate.zero3_moe import backward_held_elements
from dsgen.plan import ModelParallel, Plan, ZeroKnobs
from tests.z3_leaf_cases import measured
from tests.z3_leaf_worker import TINY_MIXTRAL, scaled_zero_knobs


def _plan(checkpointing: str = "none") -> Plan:
    k = scaled_zero_knobs()
    knobs = ZeroKnobs(
        reduce_bucket_size=k["reduce_bucket_size"],
        max_reuse_distance=k["stage3_max_reuse_distance"],
        max_live_parameters=k["stage3_max_live_parameters"],
        prefetch_bucket_size=k["stage3_prefetch_bucket_size"],
        param_persistence_threshold=k["stage3_param_persistence_threshold"],
        sub_group_size=k["sub_group_size"],
    )
    return Plan(
        precision="bf16",
        zero_stage=3,
        offload_optimizer="none",
        offload_param="none",
        checkpointing=checkpointing,  # type: ignore[arg-type]
        micro_batch_size=1,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
        knobs=knobs,
    )


def _predicted(tmp_path: Path) -> int:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mixtral", **TINY_MIXTRAL}))
    spec = load_spec(
        {
            "model": {"hf_config": str(config)},
            "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
            "training": {"sequence_length": 64, "global_batch_size": 4},
        }
    )
    return backward_held_elements(spec.model, _plan())


@pytest.mark.slow
@pytest.mark.deepspeed
def test_the_backward_term_is_what_zero3_holds(tmp_path: Path) -> None:
    predicted = _predicted(tmp_path)
    for record in measured("leaf-gas2"):
        for micro in (m for m in record["micro_steps"] if m["index"] >= 1):  # the trace is complete
            peak = micro["peaks"]["bwd"]["held_grads"]
            grads = micro["peaks"]["bwd"]["grads"]["grads_by"]
            in_bucket = sum(n for owner, n in grads.items() if owner.endswith("(in bucket)"))
            assert predicted == peak["value"] - in_bucket, (record["rank"], micro["index"])


def test_checkpointing_and_autoep_fall_back_to_the_one_block_term(tmp_path: Path) -> None:
    """Neither was measured: whole-layer checkpointing saves no view in the forward, and AutoEP
    replaces transformers' block with its own layer."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mixtral", **TINY_MIXTRAL}))
    shape = load_spec(
        {
            "model": {"hf_config": str(config)},
            "hardware": {"gpu": "a100-80gb", "gpus_per_node": 2},
            "training": {"sequence_length": 64, "global_batch_size": 4},
        }
    ).model
    assert backward_held_elements(shape, _plan("full")) == 0
    assert backward_held_elements(shape, replace(_plan(), model_parallel=ModelParallel(expert_parallel_size=2))) == 0
    assert backward_held_elements(shape, _plan()) > 0
