"""FlashAttention-2's 32-bit indexing limit, FlashAttention-3 as its own attention kernel, and what
the solver and ``frontier`` make of both (dsgen/estimate/kernel_limits.py, docs/memory-model.md).

Expected values are worked out by hand from the limit, 2^31 elements in one rank's query tensor,
and Llama-3.1-8B's 32 query heads of 128 (4,096 query elements per token).
"""

from __future__ import annotations

import pytest

from dsgen.catalog.presets import get_model
from dsgen.errors import DsgenError, InfeasibleError
from dsgen.estimate.kernel_limits import INDEX_LIMIT, kernel_limit
from dsgen.estimate.layer_backward import _kernel_workspace
from dsgen.intake.loader import load_spec_text
from dsgen.plan import LongContext, Plan
from dsgen.search.evaluation import evaluate
from dsgen.search.frontier import frontier_point
from dsgen.search.solver import require_feasible, solve

LLAMA_8B = get_model("llama-3.1-8b")


def _plan(micro: int = 1, sp: int = 1) -> Plan:
    return Plan(
        precision="bf16",
        zero_stage=3,
        offload_optimizer="cpu",
        offload_param="none",
        checkpointing="full",
        micro_batch_size=micro,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
        long_context=LongContext(sequence_parallel_size=sp),
    )


@pytest.mark.parametrize(
    ("sequence", "micro", "sp", "limited"),
    [
        (524_287, 1, 1, False),  # 524,287 x 4,096 = 2,147,479,552 < 2^31
        (524_288, 1, 1, True),  # exactly 2^31
        (262_144, 2, 1, True),  # two sequences of 262,144: 2^31 again
        (4_194_296, 1, 8, False),  # Ulysses 8: the whole sequence x 4 heads x 128 = 2,147,479,552
        (4_194_304, 1, 8, True),
    ],
)
def test_flash_attention_2_stops_at_2_to_the_31_query_elements(
    sequence: int, micro: int, sp: int, limited: bool
) -> None:
    why = kernel_limit(LLAMA_8B, _plan(micro, sp), sequence, "flash")
    assert (why is not None) == limited
    if limited:
        assert "FlashAttention-2" in why and f"{micro * sequence * 4096 // sp:,}" in why


@pytest.mark.parametrize("attention", ["flash3", "sdpa", "eager"])
def test_other_kernels_have_no_such_limit(attention: str) -> None:
    assert kernel_limit(LLAMA_8B, _plan(), 16 * 2**20, attention) is None
    assert INDEX_LIMIT == 2**31


def test_the_attention_workspace_of_each_kernel() -> None:
    """Bytes per local token, bf16 (e = 2); 8 key/value heads of 128."""
    # FlashAttention-2: fp32 dq_accum 4 x 4,096, fp32 softmax_d 4 x 32, and dk/dv expanded to the
    # 32 query heads in bf16, 2 x 2 x 4,096
    assert _kernel_workspace(LLAMA_8B, 2, 1, "flash") == 16_384 + 128 + 16_384
    # FlashAttention-3: fp32 dq_accum, softmax_d and softmax_lse_log2, and fp32 dk/dv accumulators
    # over the 8 key/value heads, 4 x 2 x 8 x 128
    assert _kernel_workspace(LLAMA_8B, 2, 1, "flash3") == 16_384 + 256 + 8_192
    # SDPA: FlashAttention-2's accumulators, no expansion
    assert _kernel_workspace(LLAMA_8B, 2, 1, "sdpa") == 16_384 + 128
    # Ulysses 32: one query head and one (replicated) key/value head per rank: no grouped buffers
    assert _kernel_workspace(LLAMA_8B, 2, 32, "flash") == 16_384 + 128
    assert _kernel_workspace(LLAMA_8B, 2, 32, "flash3") == 16_384 + 256


ONE_H100 = """\
model: {{preset: llama-3.1-8b}}
hardware: {{gpu: {gpu}, gpus_per_node: 1, cpu_memory_gib: 1800}}
training: {{sequence_length: {sequence}, global_batch_size: 1, liger_kernel: true, attention: {attention}}}
"""


def test_the_solver_names_the_kernel_limit_when_only_it_stops_the_plan() -> None:
    spec = load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=600_000, attention="flash"))
    with pytest.raises(InfeasibleError) as error:
        require_feasible(solve(spec))
    assert "FlashAttention-2 indexes with 32-bit offsets" in error.value.message
    assert "flash3" in (error.value.hint or "")
    # the same run with FlashAttention-3 is priced on memory alone
    assert solve(load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=600_000, attention="flash3"))).feasible


def test_frontier_stops_at_the_limit_with_flash_attention_2_and_goes_past_it_with_3() -> None:
    fa2 = frontier_point(load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=4096, attention="flash")))
    fa3 = frontier_point(load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=4096, attention="flash3")))
    assert fa2.value is not None and fa3.value is not None
    assert fa2.value * 4096 < INDEX_LIMIT <= (fa2.value + 1024) * 4096  # the last multiple of 1,024 below it
    assert fa3.value > fa2.value


def test_flash_attention_3_is_refused_off_hopper() -> None:
    with pytest.raises(DsgenError) as error:
        load_spec_text(ONE_H100.format(gpu="a100-80gb", sequence=4096, attention="flash3"))
    assert error.value.path == "training.attention"
    assert "Hopper" in error.value.message
    assert load_spec_text(ONE_H100.format(gpu="h200", sequence=4096, attention="flash3")).training.attention == "flash3"


def test_a_plan_whose_memory_fits_but_whose_kernel_cannot_run_is_invalid() -> None:
    """530,432 tokens on one H100: FlashAttention-3's plan fits at 80 %; the same plan under
    FlashAttention-2 fits in memory too (85 %) but its queries pass 2^31 elements."""
    fa3 = load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=530_432, attention="flash3"))
    fa2 = load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=530_432, attention="flash"))
    best = solve(fa3).best
    assert best is not None and best.fit.verdict == "fits"
    under_fa2 = evaluate(fa2, best.plan)
    assert under_fa2.fits_gpu and not under_fa2.feasible
    assert under_fa2.fit.verdict == "invalid"
    assert under_fa2.reason().startswith("FlashAttention-2 indexes with 32-bit offsets")


def test_a_plan_that_runs_out_of_memory_keeps_its_oom_verdict_and_the_doctor_names_the_limit() -> None:
    from dsgen.doctor.diagnose import diagnose

    spec = load_spec_text(ONE_H100.format(gpu="h100-80gb", sequence=600_000, attention="flash"))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}},
    }
    found = diagnose(config, spec)
    assert found.verdict == "oom"  # no checkpointing in the spec: memory rules it out first
    limit = [f for f in found.findings if f.code == "kernel-limit"]
    assert len(limit) == 1 and limit[0].severity == "error" and "flash3" in (limit[0].hint or "")
