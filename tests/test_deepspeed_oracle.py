"""Configs dsgen emits are accepted by real DeepSpeed 0.19.8: its own parser on hundreds of
random specs at the plan's data-parallel size, and real training steps for representative plans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings

from dsgen.api import load_spec, render_plan, solve_spec
from dsgen.intake.loader import spec_from_data
from dsgen.plan import Plan
from dsgen.spec.yaml_source import SourceMap
from dsgen.validate import validate_config
from tests.conftest import EXAMPLES_DIR, require_module
from tests.spec_strategies import specs
from tests.train_cases import TRAINING_PLANS, plan_optimizer, rendered_plan, trained


@pytest.fixture(scope="module")
def oracle() -> Any:
    require_module("deepspeed")
    from tests import ds_oracle

    return ds_oracle


def _render(spec_data: dict[str, Any]) -> tuple[dict[str, Any], Plan] | None:
    spec = spec_from_data(spec_data, SourceMap(None), base_dir=EXAMPLES_DIR)
    result = solve_spec(spec)
    if not result.feasible:
        return None
    assert result.best is not None
    plan = result.best.plan
    rendered = render_plan(spec, plan)
    return rendered.config, plan


@pytest.mark.parametrize("example", sorted(EXAMPLES_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_is_accepted_by_deepspeed(example: Path, oracle: Any) -> None:
    spec = load_spec(example)
    result = solve_spec(spec)
    assert result.feasible, f"{example.name}: {result.closest and result.closest.reason()}"
    assert result.best is not None
    plan = result.best.plan
    config = render_plan(spec, plan).config
    _deepspeed_batch(config, plan, oracle, spec.training.global_batch_size)


def _deepspeed_batch(config: dict[str, Any], plan: Plan, oracle: Any, global_batch: int | None) -> None:
    """DeepSpeed's own parser on the plan's world, and the samples a step trains. ``dp`` is the
    ranks with distinct micro-batches (world / SP / TP). Without an mpu DeepSpeed divides the world by
    SP only, so under AutoTP it counts every rank of a TP group (docs/model-parallel-measurements.md)."""
    dp = plan.batch_parallel_size
    tp = plan.tensor_parallel_size
    assert validate_config(config, world_size=dp * tp).ok
    parsed = oracle.parse_with_deepspeed(config, dp, world_size=plan.data_parallel_size if tp > 1 else None)
    micro, accumulation = parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps
    assert parsed.train_batch_size == micro * accumulation * dp * tp
    if global_batch is not None:
        assert micro * accumulation * dp == global_batch


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
@given(spec_data=specs())
def test_random_specs_render_configs_deepspeed_accepts(spec_data: dict[str, Any], oracle: Any) -> None:
    outcome = _render(spec_data)
    assume(outcome is not None)
    assert outcome is not None
    config, plan = outcome
    # our schema and rules, DeepSpeed's own parser at the plan's world, and the spec's batch met
    _deepspeed_batch(config, plan, oracle, spec_data["training"]["global_batch_size"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRAINING_PLANS))
def test_rendered_plan_trains_two_steps_under_real_deepspeed(name: str, oracle: Any) -> None:
    require_module("transformers")
    plan, config = rendered_plan(name)  # what the shared launch trained (tests/train_cases.py)
    assert plan.data_parallel_size == 2
    optimizer = plan_optimizer(name)
    assert ("optimizer" in config) == (optimizer == "adamw")
    outcome = trained()[f"rendered-{name}"]
    assert outcome.returncode == 0, outcome.describe()[-4000:]
    assert len(outcome.losses) == 2, outcome.describe()[-4000:]
    if optimizer == "adafactor":
        assert outcome.info.get("optimizer") == "Adafactor", outcome.info
