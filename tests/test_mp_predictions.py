"""dsgen's per-rank predictions for AutoTP and AutoEP plans against real DeepSpeed 0.19.8 runs.

The runs are tests/mp_cases.py's (tiny Llama under TP 2 at ZeRO 1, 2, 3 and TP 2 x DP 2 in bf16;
tiny Qwen3-MoE and Mixtral under EP 2), measured by tests/mp_worker.py on CPU ranks. dsgen reads
the same model from its transformers config.json, through the spec loader and the solver, with
every search dimension pinned to the run's, and predicts what each rank holds: the parameter
elements (ZeRO-3: the rank's partition), the fp32 master partition, the gradient partition and
Adam's two moments, and the bytes autograd saves in one forward. The expected values are the
measurements; nothing here is computed by dsgen's own formulas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsgen import api
from dsgen.search.evaluation import Evaluation
from tests.mp_cases import CASES, EP_CASES, TP_CASES, measured
from tests.mp_oracle import DEFAULT_CASE
from tests.tiny_models import TINY_MODELS

MODEL_TYPES = {"llama": "llama", "qwen3_moe": "qwen3_moe", "mixtral": "mixtral"}


def _case(name: str) -> tuple[dict[str, Any], int]:
    overrides, ranks = CASES[name]
    return {**DEFAULT_CASE, **overrides}, ranks


def _predicted(name: str, tmp_path: Path) -> Evaluation:
    """The plan of the measured run as dsgen prices it: the run's model, GPUs and every choice pinned."""
    case, ranks = _case(name)
    config = {"model_type": MODEL_TYPES[case["model"]], **TINY_MODELS[case["model"]]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tp = max(int(case["autotp_size"]), 1)
    ep = max(int(case["autoep_size"]), 1)
    spec = api.load_spec(
        {
            "model": {"hf_config": str(tmp_path / "config.json")},
            "hardware": {"gpu": "a100-80gb", "gpus_per_node": ranks, "cpu_memory_gib": 64},
            "training": {
                "sequence_length": case["seq_len"],
                "global_batch_size": case["micro_batch"] * case["gradient_accumulation_steps"] * ranks // tp,
                "precision": case["dtype"],
                "attention": "sdpa",
                "optimizer": {"type": "adamw"},
            },
            "constraints": {
                "zero_stage": case["zero_stage"],
                "offload_optimizer": "none",
                "offload_param": "none",
                "activation_checkpointing": False,
                "micro_batch_size": case["micro_batch"],
                "tensor_parallel_size": tp,
                "expert_parallel_size": ep,
            },
        }
    )
    evaluation = api.solve_spec(spec).best
    assert evaluation is not None
    plan = evaluation.plan
    assert (plan.tensor_parallel_size, plan.expert_parallel_size, plan.zero_stage) == (tp, ep, case["zero_stage"])
    return evaluation


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("name", list(CASES))
def test_per_rank_model_state_elements_are_exact(name: str, tmp_path: Path) -> None:
    """Parameters held, fp32 master, gradient partition and Adam states, element for element, on
    every rank (TP peers and EP ranks hold the same counts)."""
    parts = _predicted(name, tmp_path).memory.model_states.partitioning
    zero3 = parts.zero3
    held = zero3.partition if zero3 is not None and _case(name)[0]["zero_stage"] == 3 else parts.parameters
    master = zero3.partition if zero3 is not None and _case(name)[0]["zero_stage"] == 3 else parts.zero12_slice
    for record in measured(name):
        assert record["param_elements"] == held, record["rank"]
        assert record["fp32_master_elements"] == master, record["rank"]
        assert record["gradient_partition_elements"] == master, record["rank"]
        assert record["optimizer_state_elements"] == 2 * master, record["rank"]


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("name", list(TP_CASES))
def test_saved_activations_under_tp_within_three_percent(name: str, tmp_path: Path) -> None:
    """The bytes autograd saves in one forward on each TP rank (measured as bench/activation_accuracy.py
    counts them): the TP-local heads and MLP width, the hidden-size tensors and the gathered
    full-vocabulary logits whole. The bar is the issue's, 3 % (the median and worst are printed)."""
    predicted = _predicted(name, tmp_path).memory.gpu.activations
    errors = [record["saved_activation_bytes"] / predicted - 1 for record in measured(name)]
    print(name, predicted, [f"{e:+.4%}" for e in errors])
    assert max(abs(e) for e in errors) <= 0.03


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("name", list(EP_CASES))
def test_saved_activations_under_ep_are_a_known_gap(name: str, tmp_path: Path) -> None:
    """AutoEP's layer saves more than transformers' MoE block that dsgen prices (its grouped GEMM and
    token dispatch): measured 4-11 % above the prediction on the two ranks. Kept as a bound that
    fails if the gap grows past 15 % or closes below 0 (then the term needs revisiting either way)."""
    predicted = _predicted(name, tmp_path).memory.gpu.activations
    errors = [record["saved_activation_bytes"] / predicted - 1 for record in measured(name)]
    print(name, predicted, [f"{e:+.4%}" for e in errors])
    assert all(0 <= e <= 0.15 for e in errors)
