"""Regression tests for reviewed defects in the memory model, the step-time model and the solver's
batch-split errors. Every expected value is worked out by hand from the formulas in
docs/memory-model.md and docs/throughput-model.md; the arithmetic is in the comments."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsgen.api import solve_spec
from dsgen.catalog.presets import get_model
from dsgen.errors import DsgenError
from dsgen.estimate.memory import estimate_memory, nvme_bytes
from dsgen.estimate.model_states import model_states
from dsgen.estimate.throughput import estimate_step_time
from dsgen.intake.loader import load_spec_text
from dsgen.plan import Plan, ZeroKnobs
from dsgen.spec.types import Spec
from tests.conftest import EXAMPLES_DIR


def _spec(model: str, extra: str = "", batch: int = 256) -> Spec:
    text = (
        f"model: {{preset: {model}}}\n"
        "hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
        f"training: {{sequence_length: 1024, global_batch_size: {batch}}}\n" + extra
    )
    return load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)


def _zero3(
    precision: str,
    *,
    opt: str = "cpu",
    ratio: float = 1.0,
    micro: int = 1,
    accumulation: int = 1,
    knobs: ZeroKnobs = ZeroKnobs(),  # noqa: B008 - frozen, so sharing the default is safe
) -> Plan:
    return Plan(
        precision=precision,
        zero_stage=3,
        offload_optimizer=opt,
        offload_param="none",
        checkpointing="none",
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        data_parallel_size=8,
        knobs=knobs,
        offload_ratio=ratio,
    )


# ---- 1. the fp32 master slice under partial and NVMe optimizer offload -----------------------
# Llama-3.1-8B: P = 8_030_261_248 parameters (model card); N = 8 ranks, so a rank's partition is
# ⌈P/N⌉ = 1_003_782_656 elements. ZeRO-3 keeps an fp32 master slice in fp32 training too, so the
# per-element optimizer bytes do not depend on the training dtype.
LLAMA_P = 8_030_261_248
PART = 1_003_782_656


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(
    ("optimizer", "ratio", "per_element"),
    [
        ("adamw", 0.5, 8),  # (1 - 0.5) * (4 master + 4 fp32 grad + 8 moments) = 8
        ("adamw", 0.25, 12),  # (1 - 0.25) * 16 = 12
        ("sgd", 0.5, 6),  # (1 - 0.5) * (4 master + 4 fp32 grad + 4 momentum) = 6
    ],
)
def test_partial_offload_keeps_the_fp32_master_on_gpu_in_every_dtype(
    precision: str, optimizer: str, ratio: float, per_element: int
) -> None:
    spec = _spec("llama-3.1-8b")
    shape = spec.model
    assert shape.parameter_count() == LLAMA_P and -(-LLAMA_P // 8) == PART
    plan = _zero3(precision, ratio=ratio)
    expected = per_element * PART
    assert model_states(shape, plan, optimizer).partial_offload_on_gpu == expected
    # With optimizer offload nothing else of the optimizer stays on the GPU, so the reported
    # optimizer_states is exactly the partial share.
    training = replace(spec.training, optimizer=replace(spec.training.optimizer, type=optimizer))
    gpu = estimate_memory(shape, plan, spec.hardware, training).gpu
    assert gpu.optimizer_states == expected


def test_full_offload_leaves_no_optimizer_bytes_on_gpu() -> None:
    shape = get_model("llama-3.1-8b")
    assert model_states(shape, _zero3("fp32", ratio=1.0), "adamw").partial_offload_on_gpu == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nvme_optimizer_offload_swaps_the_fp32_master_in_every_dtype(precision: str) -> None:
    spec = _spec("llama-3.1-8b")
    plan = _zero3(precision, opt="nvme")
    # g = 8 ranks per node, each swapping (4 master + 8 AdamW moments) bytes per element:
    # 8 * 12 * 1_003_782_656 = 96_363_134_976
    expected = 8 * 12 * PART
    assert expected == 96_363_134_976
    assert nvme_bytes(model_states(spec.model, plan, "adamw"), spec.hardware) == expected
    assert estimate_memory(spec.model, plan, spec.hardware, spec.training).nvme.total == expected


# ---- 2. ZeRO-3: the reduce-scatter overlaps only with overlap_comm ----------------------------
# GPT-2 (124_439_808 parameters, 12 layers), bf16, 8 x A100 (NVLink 300 GB/s at 70 % efficiency),
# micro-batch 8 x accumulation 4 x 8 ranks = 256 sequences of 1024 tokens.
# One micro-step's gradient reduce-scatter: w·P·(N−1)/N / bandwidth
#   = 2 * 124_439_808 * 7/8 / (300e9 * 0.7) = 217_769_664 / 210e9 s.
# Compute is ~0.25 s per step (~8.6e8 FLOPs/token * 262_144 tokens / (8 * 312e12 * 0.4 * 0.97),
# x1.1 for ZeRO-3), so 80 % of it (~0.20 s) hides all 4 * 3 collectives of ~1 ms each: with
# overlap_comm only the launch latencies (4 micro-steps * 3 * 12 layers * 30 µs) and the hooks stay exposed.
# Without overlap_comm the parameter gathers still hide (prefetched on their own stream), but the
# 4 reduce-scatters block.
GPT2_P = 124_439_808
REDUCE_S = 2 * GPT2_P * 7 / 8 / (300e9 * 0.7)
LATENCY_S = 4 * 3 * 12 * 30e-6
# ZeRO-3's host-side module hooks (docs/throughput-model.md, measured 640 µs per fetch): each
# micro-step fetches, in forward and again in backward, every weight matrix above the 1e5-element
# persistence threshold: 12 layers x 4 (c_attn, attn c_proj, c_fc, mlp c_proj), wte, wpe, and the
# tied head, which fetches wte as its own module: 51 modules x 2 passes x 4 micro-steps.
HOOK_S = 4 * 2 * (12 * 4 + 3) * 640e-6


@pytest.mark.parametrize(
    ("overlap", "expected"), [(True, LATENCY_S + HOOK_S), (False, LATENCY_S + HOOK_S + 4 * REDUCE_S)]
)
def test_zero3_reduce_scatter_hides_only_with_overlap_comm(overlap: bool, expected: float) -> None:
    spec = _spec("gpt2")
    assert spec.model.parameter_count() == GPT2_P and spec.model.num_layers == 12
    assert spec.hardware.gpu.interconnect_bandwidth_gbps == 300.0
    plan = _zero3("bf16", opt="none", micro=8, accumulation=4, knobs=ZeroKnobs(overlap_comm=overlap))
    step = estimate_step_time(spec.model, plan, spec.hardware, spec.training)
    assert step.exposed_comm_s == pytest.approx(expected, rel=1e-9)


# ---- 4. both batch pins: the error names the pair -------------------------------------------
# 256 sequences over 8 GPUs: 32 per rank per step.


def test_both_pins_with_the_wrong_product_name_both_keys() -> None:
    spec = _spec("gpt2", "constraints: {micro_batch_size: 2, gradient_accumulation_steps: 4}\n")
    with pytest.raises(DsgenError) as info:
        solve_spec(spec)
    error = info.value
    message = str(error)
    assert "does not divide" not in message  # 2 and 4 both divide 32: only their product is wrong
    assert "micro_batch_size x gradient_accumulation_steps = 2 x 4 = 8" in message
    assert "32 sequences each of the 8 GPUs" in message
    assert error.path == "constraints.micro_batch_size"
    assert error.location is not None and error.location.line == 4
    # keeping micro 2 needs 32 / 2 = 16 steps; keeping 4 steps needs a micro-batch of 32 / 4 = 8
    assert error.hint is not None and "2 x 16 or 8 x 4" in error.hint
    assert "1, 2, 4, 8, 16, 32" in error.hint


def test_both_pins_point_at_the_accumulation_when_only_it_cannot_divide() -> None:
    spec = _spec("gpt2", "constraints: {micro_batch_size: 2, gradient_accumulation_steps: 3}\n")
    with pytest.raises(DsgenError) as info:
        solve_spec(spec)
    assert "2 x 3 = 6" in str(info.value)
    assert info.value.path == "constraints.gradient_accumulation_steps"
    assert info.value.hint is not None and "2 x 16" in info.value.hint and " x 3" not in info.value.hint


def test_a_single_pin_that_does_not_divide_keeps_its_message() -> None:
    spec = _spec("gpt2", "constraints: {micro_batch_size: 3}\n")
    with pytest.raises(DsgenError) as info:
        solve_spec(spec)
    assert "3 does not divide the 32 sequences" in str(info.value)
    assert info.value.path == "constraints.micro_batch_size"
