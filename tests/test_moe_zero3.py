"""An MoE model under ZeRO-3 (issue 17): real DeepSpeed trains a tiny Qwen3-MoE for two steps on
two CPU ranks, with each sparse block set as a ZeRO-3 leaf module exactly as dsgen's plan tells
the script to, and the model-state bytes DeepSpeed holds match dsgen's prediction.

The measurement is ``bench/model_state_accuracy.py``'s (every storage DeepSpeed holds, classified
by the structure that holds it, peak over the step's probes, max over ranks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsgen.api import render_plan
from dsgen.intake.loader import load_spec_text
from dsgen.reporting.report import script_requirements
from dsgen.search.solver import solve
from tests.conftest import REPO_ROOT, require_module

sys.path.insert(0, str(REPO_ROOT / "bench"))
import model_state_accuracy as bench

TOLERANCE = 0.02  # the model-state bench's target


def _case(precision: str) -> bench.Case:
    return next(c for c in bench.CASES if c.name == f"zero3-{precision}")


def test_the_plan_tells_the_script_to_set_the_moe_block_as_a_leaf(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    import json

    config.write_text(json.dumps(bench.QWEN3_MOE_TINY))
    spec = load_spec_text(bench.spec_text(config, _case("bf16")), file="<moe>", base_dir=tmp_path)
    plan = solve(spec).best
    assert plan is not None and plan.plan.zero_stage == 3
    text = script_requirements(spec, plan.plan)
    assert "deepspeed.utils.set_z3_leaf_modules(model, [Qwen3MoeSparseMoeBlock])" in text
    render_plan(spec, plan.plan)  # renders


@pytest.mark.slow
def test_moe_trains_two_steps_under_zero3_with_leaf_modules_and_model_states_match(tmp_path: Path) -> None:
    require_module("deepspeed")
    require_module("transformers")
    rows = bench.run_model("tiny-qwen3-moe", [_case("bf16")], tmp_path, steps=2)
    assert len(rows) == 1 and "error" not in rows[0], rows
    row = rows[0]
    assert row["global_steps"] == 2
    assert row["z3_leaf_modules"] == ["Qwen3MoeSparseMoeBlock"]
    for term in bench.TERMS:
        predicted, measured = row["predicted"][term], row["measured"][term]
        assert measured > 0
        assert abs(predicted - measured) <= TOLERANCE * measured, (term, predicted, measured)
