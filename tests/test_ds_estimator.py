"""dsgen's transcription of DeepSpeed's model-state estimators against DeepSpeed itself, to the byte.

DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
(0.19.8) are pure arithmetic on a few numbers, so they are called directly (no GPU, no process
group) for every preset model, several GPU/node counts and every offload combination.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.catalog.presets import get_gpu, model_presets
from dsgen.estimate.ds_estimator import (
    deepspeed_estimator,
    estimate_zero2_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs,
)
from dsgen.plan import Plan
from dsgen.spec.types import Hardware
from tests.conftest import EXAMPLES_DIR, require_module

pytestmark = pytest.mark.deepspeed

LAYOUTS = [(1, 1), (2, 1), (8, 1), (8, 4), (8, 8), (4, 16)]  # (gpus_per_node, nodes)
OFFLOADS = [("none", "none"), ("cpu", "none"), ("cpu", "cpu"), ("none", "cpu"), ("nvme", "nvme")]


@pytest.fixture(scope="module")
def ds_zero() -> tuple[Any, Any]:
    """DeepSpeed's stage_1_and_2 and stage3 modules (CPU accelerator, as everywhere in the suite)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    require_module("deepspeed")
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    return stage_1_and_2, stage3


def _plan(stage: int, offload_optimizer: str, offload_param: str, dp: int) -> Plan:
    return Plan(
        precision="bf16",
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        checkpointing="none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=dp,
    )


@pytest.mark.parametrize("name", sorted(model_presets()))
def test_deepspeed_estimator_matches_deepspeed_for_every_preset(name: str, ds_zero: tuple[Any, Any]) -> None:
    stage_1_and_2, stage3 = ds_zero
    shape = model_presets()[name]
    total, largest = shape.parameter_count(), shape.largest_module_parameters()
    gpu = get_gpu("h100-80gb")
    for (per_node, nodes), (opt, param), zero_init in itertools.product(LAYOUTS, OFFLOADS, (True, False)):
        hardware = Hardware(gpu=gpu, gpus_per_node=per_node, nodes=nodes)
        cpu_offload, cpu_offload_params = opt != "none", param != "none"
        zero3 = stage3.estimate_zero3_model_states_mem_needs(
            total, largest, per_node, nodes, cpu_offload, cpu_offload_params, zero_init, 1.5
        )
        plan = _plan(3, opt, param, per_node * nodes)
        assert deepspeed_estimator(shape, plan, hardware, zero_init=zero_init) == zero3[:2], (
            per_node,
            nodes,
            opt,
            param,
        )
        assert (
            estimate_zero3_model_states_mem_needs(
                total, largest, per_node, nodes, cpu_offload, cpu_offload_params, zero_init
            )
            == zero3
        )
        if param != "none":
            continue
        zero2 = stage_1_and_2.estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload, 1.5)
        for stage in (0, 1, 2) if opt == "none" else (1, 2):
            assert deepspeed_estimator(shape, _plan(stage, opt, "none", per_node * nodes), hardware) == zero2
        assert estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload) == zero2


@pytest.mark.parametrize(
    ("total", "largest"),
    [
        (2_851_000_000, 32_000_000),  # DeepSpeed's memory.rst example (t5-3b-like)
        (7_000_000_000, 131_072_000),
        (70_000_000_000, 1_050_673_152),
        (1, 1),
        (123_456_789, 9_876_543),  # odd counts: int() truncation of the float products must agree
        (405_000_000_001, 2_101_346_304),
    ],
)
def test_raw_estimators_match_deepspeed_including_buffer_factor(
    total: int, largest: int, ds_zero: tuple[Any, Any]
) -> None:
    stage_1_and_2, stage3 = ds_zero
    for per_node, nodes, factor in itertools.product((1, 3, 8), (1, 2, 7), (1.5, 1.0, 1.25)):
        for offload in (True, False):
            assert estimate_zero2_model_states_mem_needs(
                total, per_node, nodes, offload, factor
            ) == stage_1_and_2.estimate_zero2_model_states_mem_needs(total, per_node, nodes, offload, factor)
            for params, init in itertools.product((True, False), (True, False)):
                assert estimate_zero3_model_states_mem_needs(
                    total, largest, per_node, nodes, offload, params, init, factor
                ) == stage3.estimate_zero3_model_states_mem_needs(
                    total, largest, per_node, nodes, offload, params, init, factor
                )


def test_reference_vectors_from_the_research_notes() -> None:
    """Raw bytes recorded from DeepSpeed 0.19.8 in shared/reference/deepspeed-config.md §7.4."""
    assert estimate_zero2_model_states_mem_needs(2_851_000_000, 8, 1, True) == (136848000000, 5702000000)
    assert estimate_zero2_model_states_mem_needs(2_851_000_000, 8, 1, False) == (136848000000, 12116750000)
    assert estimate_zero2_model_states_mem_needs(70_000_000_000, 8, 8, True) == (26880000000000, 140000000000)
    z3 = estimate_zero3_model_states_mem_needs
    assert z3(7_000_000_000, 131_072_000, 8, 1, True, True, True)[:2] == (189000000000, 524288000)
    assert z3(7_000_000_000, 131_072_000, 8, 1, True, False, True)[:2] == (168000000000, 2274288000)
    assert z3(7_000_000_000, 131_072_000, 8, 1, False, False, True)[:2] == (6291456000, 16274288000)
    assert z3(7_000_000_000, 131_072_000, 8, 1, False, False, False)[:2] == (336000000000, 16274288000)
    assert z3(70_000_000_000, 1_050_673_152, 8, 8, False, False, True)[:2] == (50432311296, 23890192608)


def test_model_to_params_of_a_real_model_is_what_dsgen_counts(ds_zero: tuple[Any, Any]) -> None:
    """DeepSpeed's own parameter counting (``model_to_params``) on a real model built by transformers."""
    _, stage3 = ds_zero
    torch = require_module("torch")
    transformers = require_module("transformers")
    config_dir = Path(EXAMPLES_DIR) / "tiny-llama"
    shape = shape_from_hf_config(config_dir / "config.json")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(str(config_dir)))
    assert stage3.model_to_params(model) == (shape.parameter_count(), shape.largest_module_parameters())
    hardware = Hardware(gpu=get_gpu("h100-80gb"), gpus_per_node=2, nodes=1)
    total, largest = stage3.model_to_params(model)
    expected = stage3.estimate_zero3_model_states_mem_needs(total, largest, 2, 1, True, False, True)
    assert deepspeed_estimator(shape, _plan(3, "cpu", "none", 2), hardware) == expected[:2]
