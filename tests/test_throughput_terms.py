"""Step-time terms pinned by hand: the PaLM FLOP count, the compute time and recomputation.

Figures: Llama-3.1-8B's config.json (32 layers, hidden 4096, 32 query heads of 128, vocab 128,256,
untied embeddings; 8,030,261,248 parameters); the H100 preset's dense bf16 peak; the documented
40 % MFU for 16-bit training and the micro-batch size efficiency t / (t + 256)
(docs/throughput-model.md).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsgen.api import load_spec, solve_spec
from dsgen.estimate.throughput import estimate_step_time, model_flops_per_token
from dsgen.search.solver import require_feasible
from tests.conftest import EXAMPLES_DIR

EXAMPLE = EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"  # 8 x H100, 4,096-token sequences, 256 per step


def _pinned(checkpointing: bool):
    spec = load_spec(EXAMPLE)
    pins = replace(
        spec.constraints,
        zero_stage=2,
        offload_optimizer="none",
        offload_param="none",
        micro_batch_size=1,
        activation_checkpointing="full" if checkpointing else "none",
    )
    spec = replace(spec, constraints=pins)
    return spec, require_feasible(solve_spec(spec))


def test_llama_3_1_8b_flops_per_token_is_palm_6n_plus_attention() -> None:
    spec = load_spec(EXAMPLE)
    embedding = 128_256 * 4_096  # the input embedding: a lookup, no matmul FLOPs
    non_embedding = 8_030_261_248 - embedding  # includes the untied 128,256 x 4,096 LM head
    attention = 12 * 32 * 4_096 * 4_096  # 12 * layers * (heads * head_dim) * sequence length
    assert model_flops_per_token(spec.model, 4_096) == 6 * non_embedding + attention == 51_471_998_976


def test_compute_time_of_the_example_plan() -> None:
    spec, best = _pinned(checkpointing=False)
    peak = spec.hardware.gpu.peak_tflops("bf16") * 1e12
    tokens = 256 * 4_096
    size_efficiency = 4_096 / (4_096 + 256)  # one 4,096-token sequence per micro-batch
    expected = 51_471_998_976 * tokens / (8 * peak * 0.40 * size_efficiency)
    assert best.step.compute_s == pytest.approx(expected, rel=1e-12)


def test_full_checkpointing_adds_one_forward_pass() -> None:
    """Forward is a third of forward + backward (2N of 6N per token): recomputing it costs 4/3."""
    _, plain = _pinned(checkpointing=False)
    spec, recomputed = _pinned(checkpointing=True)
    step = estimate_step_time(spec.model, recomputed.plan, spec.hardware, spec.training)
    assert step.compute_s == pytest.approx(plain.step.compute_s * 4 / 3, rel=1e-12)
