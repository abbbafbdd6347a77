"""The solver's ranking respects the step-time model's own error (issue 22).

Plans predicted within ``STEP_TIME_TIE_BAND`` of the fastest are ties; ties go to the simpler
plan (less offload, lower stage, no quantization, fewer tuned knobs). The step times below are set
by hand where the test is about the rule, and come from the model where it is about a choice an
expert would make.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsgen.api import load_spec, solve_spec
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND, StepTime
from dsgen.evaluation import Evaluation, evaluate
from dsgen.knob_variants import default_knobs
from dsgen.plan import Plan
from dsgen.ranking import rank_within_error
from dsgen.spec.loader import load_spec_text
from tests.conftest import EXAMPLES_DIR

SPEC = """
model: {preset: llama-3.2-1b}
hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}
training: {sequence_length: 2048, global_batch_size: 64}
"""


def _spec(text: str = SPEC):
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def _priced(spec, seconds: float, **choices: object) -> Evaluation:
    """A real evaluation of the plan ``choices`` describe, with its step time set to ``seconds``."""
    stage = int(choices.pop("zero_stage", 1))  # type: ignore[call-overload]
    plan = Plan(
        precision="bf16",
        zero_stage=stage,
        offload_optimizer="none",
        offload_param="none",
        checkpointing="none",
        micro_batch_size=1,
        gradient_accumulation_steps=8,
        data_parallel_size=8,
        knobs=default_knobs(spec.model, stage),
    )
    plan = replace(plan, **choices)  # type: ignore[arg-type]
    e = evaluate(spec, plan)
    return replace(e, step=StepTime(compute_s=seconds, exposed_comm_s=0.0, offload_s=0.0, model_flops=1.0))


def test_a_faster_plan_within_the_band_loses_to_the_simpler_one() -> None:
    spec = _spec()
    zero1 = _priced(spec, 1.0 + STEP_TIME_TIE_BAND * 0.9, zero_stage=1)
    zero2 = _priced(spec, 1.0, zero_stage=2)
    assert [e.plan.zero_stage for e in rank_within_error([zero2, zero1], spec.model)] == [1, 2]


def test_a_faster_plan_beyond_the_band_wins() -> None:
    spec = _spec()
    zero1 = _priced(spec, 1.0 + STEP_TIME_TIE_BAND * 1.1, zero_stage=1)
    zero2 = _priced(spec, 1.0, zero_stage=2)
    assert [e.plan.zero_stage for e in rank_within_error([zero1, zero2], spec.model)] == [2, 1]


def test_tie_order_offload_then_stage_then_quantization_then_checkpointing_then_knobs() -> None:
    spec = _spec()
    t = 1.0
    plans = {
        "offload": _priced(spec, t * 0.90, zero_stage=2, offload_optimizer="cpu"),
        "zero3": _priced(spec, t * 0.92, zero_stage=3),
        "zero3-qwz": _priced(
            spec, t * 0.88, zero_stage=3, knobs=replace(default_knobs(spec.model, 3), quantized_weights=True)
        ),
        "zero2-ckpt": _priced(spec, t * 0.91, zero_stage=2, checkpointing="full"),
        "zero2-tuned": _priced(
            spec, t * 0.93, zero_stage=2, knobs=replace(default_knobs(spec.model, 2), reduce_bucket_size=12_345_678)
        ),
        "zero2": _priced(spec, t * 0.95, zero_stage=2),
    }
    ranked = rank_within_error(list(plans.values()), spec.model)
    names = {id(e): name for name, e in plans.items()}
    assert [names[id(e)] for e in ranked] == ["zero2", "zero2-tuned", "zero2-ckpt", "zero3", "zero3-qwz", "offload"]


def test_equally_simple_plans_keep_the_faster_first() -> None:
    spec = _spec()
    slow = _priced(spec, 1.1, zero_stage=1, micro_batch_size=1, gradient_accumulation_steps=8)
    fast = _priced(spec, 1.0, zero_stage=1, micro_batch_size=2, gradient_accumulation_steps=4)
    assert rank_within_error([slow, fast], spec.model)[0] is fast


def test_70b_on_32_h100_runs_zero3_without_offload() -> None:
    """Issue 22: ZeRO-3's model states are 34.5 GB per GPU here, and an expert runs no offload; the
    solver took CPU optimizer offload for micro-batch 8 before the offload price was corrected and
    ties were ranked to the simpler plan."""
    text = """
model: {preset: llama-3.1-70b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 4, cpu_memory_gib: 1024}
training: {sequence_length: 2048, global_batch_size: 256}
"""
    from dsgen.solver import solve

    # the question, asked before AutoTP was a dimension: ZeRO-3 without offload
    result = solve(_spec(text + "constraints: {tensor_parallel_size: 1}\n"))
    assert result.best is not None and result.feasible
    plan = result.best.plan
    assert (plan.zero_stage, plan.offload_optimizer, plan.offload_param) == (3, "none", "none")
    assert result.best.fit.verdict == "fits"
    # with AutoTP searched too, still no offload
    best = solve(_spec(text)).best
    assert best is not None and (best.plan.offload_optimizer, best.plan.offload_param) == ("none", "none")


def test_band_and_offload_factor_are_the_measured_figures() -> None:
    """STEP_TIME_TIE_BAND is the median pair-ratio error and CPU_OFFLOAD_MEASURED_FACTOR the median
    measured/priced offload seconds on bench/data/throughput_outcomes.yaml, re-derived here."""
    import math
    import statistics

    from dsgen.estimate.throughput import CPU_OFFLOAD_MEASURED_FACTOR
    from tests.conftest import bench_module

    bench = bench_module("throughput_accuracy")
    corpus = bench.load_corpus("throughput_outcomes")
    cases, predicted, evaluations = bench.price_corpus(corpus)
    errors = bench.pair_ratio_errors(corpus, cases, predicted)
    assert len(errors) >= 20
    assert math.exp(statistics.median(errors)) - 1 == pytest.approx(STEP_TIME_TIE_BAND, abs=0.01)
    calibration = bench.offload_calibration(corpus, cases, evaluations)
    assert len(calibration) == 3
    ratios = [measured / priced for measured, priced in calibration.values()]
    assert statistics.median(ratios) == pytest.approx(CPU_OFFLOAD_MEASURED_FACTOR, abs=0.01)


def test_plans_not_chosen_say_when_they_tie_with_the_chosen_one() -> None:
    # Llama-3.1-8B at 128K on 8 x H100: ZeRO-3 is predicted faster than the chosen ZeRO-1 but
    # within the documented 20 % band, so the line a user reads must say it is a tie; full CPU
    # offload, 1.25x slower, is not one
    result = solve_spec(load_spec(EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml"))
    fastest = min(e.step.total_s for e in result.ranked)
    lines = [(a.evaluation, a.reason) for a in result.alternatives if a.evaluation is not None]
    lines += [(e, reason) for _label, e, reason in result.offload_alternatives]
    feasible = [(e, reason) for e, reason in lines if e.feasible]
    ties = [("a tie" in reason) == (e.step.total_s <= 1.2 * fastest) for e, reason in feasible]
    assert all(ties) and len(ties) >= 4
    assert any("a tie" in reason for _e, reason in feasible)
    assert any("a tie" not in reason for _e, reason in feasible)
