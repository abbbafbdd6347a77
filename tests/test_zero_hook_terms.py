"""ZeRO's host-side hook terms of the step time, pinned to hand-computed values.

The constants are DeepSpeed 0.19.8 measurements (bench/zero_hook_latency.py; docs/throughput-model.md,
"Hooks"): 640 us per ZeRO-3 module fetch and pass, 13 us per ZeRO-2 gradient hook (per parameter
tensor and micro-step, beyond ZeRO-1). GPT-2 small's tensors, by hand (transformers' GPT2LMHeadModel):
wte 50257 x 768, wpe 1024 x 768, per layer ln_1 (w, b), c_attn (768 x 2304, b), c_proj (768 x 768, b),
ln_2 (w, b), c_fc (768 x 3072, b), c_proj (3072 x 768, b), final ln_f (w, b); lm_head tied to wte.
"""

from __future__ import annotations

import pytest

from dsgen.catalog.presets import get_model
from dsgen.estimate.throughput import hook_s, zero3_fetched_modules
from dsgen.plan import Plan, ZeroKnobs

GPT2 = get_model("gpt2")
MATRICES = 2 + 4 * 12  # wte, wpe and four weight matrices per layer
TENSORS = 2 + 12 * 12 + 2  # 148: the embeddings, twelve per layer, ln_f's two


def plan(stage: int, checkpointing: str = "none", accumulation: int = 1, threshold: int = 100_000) -> Plan:
    return Plan(
        precision="bf16",
        zero_stage=stage,
        offload_optimizer="none",
        offload_param="none",
        checkpointing=checkpointing,  # type: ignore[arg-type]
        micro_batch_size=1,
        gradient_accumulation_steps=accumulation,
        data_parallel_size=8,
        knobs=ZeroKnobs(param_persistence_threshold=threshold),
    )


def test_fetched_modules_are_the_weight_matrices_above_the_threshold_and_the_tied_head() -> None:
    assert zero3_fetched_modules(GPT2, 100_000) == MATRICES + 1  # 51
    # above 1e6 elements: wte (38.6M) and per layer c_attn (1.77M), c_fc and c_proj (2.36M each);
    # wpe (786,432) and the attention c_proj (589,824) stay whole on every rank
    assert zero3_fetched_modules(GPT2, 1_000_000) == 1 + 3 * 12 + 1  # 38


@pytest.mark.parametrize(
    ("stage", "checkpointing", "accumulation", "expected"),
    [
        (3, "none", 1, 2 * 51 * 640e-6),  # forward + backward: 0.06528 s
        (3, "full", 4, 4 * 3 * 51 * 640e-6),  # + recompute, four micro-steps: 0.39168 s
        (2, "none", 2, 2 * TENSORS * 13e-6),  # 0.003848 s
        (1, "none", 8, 0.0),
        (0, "none", 1, 0.0),
    ],
)
def test_hook_seconds(stage: int, checkpointing: str, accumulation: int, expected: float) -> None:
    assert hook_s(GPT2, plan(stage, checkpointing, accumulation)) == pytest.approx(expected, rel=1e-12)
