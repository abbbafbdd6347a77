"""The optimizer-step temporary of torch-built optimizers, and who builds the optimizer.

Expected values are computed here by hand from the formula in docs/memory-model.md ("Optimizer-step
temporary"): torch's foreach Adam/AdamW/Adagrad allocate one fp32 tensor per stepped element
(torch/optim/adam.py ``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(...)``), and
DeepSpeed 0.19.8 hands the optimizer the rank's flat partition (ZeRO-1/2), one sub-group (ZeRO-3) or
the flat fp32 master group (ZeRO-0). GPT-2 small has 124,439,808 parameters (the HF model card's
figure; a multiple of 16, so ZeRO's 2 x N alignment adds no padding for N = 8).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dsgen.api import solve_spec
from dsgen.errors import DsgenError
from dsgen.intake.loader import load_spec_text
from dsgen.search.evaluation import evaluate
from dsgen.targets.deepspeed_blocks import optimizer_block
from tests.conftest import EXAMPLES_DIR

GPT2_PARAMETERS = 124_439_808


def spec_text(
    stage: int, gpus: int, implementation: str | None, optimizer: str = "adamw", offload: str = "none"
) -> str:
    impl = f", implementation: {implementation}" if implementation else ""
    return (
        "model: {preset: gpt2}\n"
        f"hardware: {{gpu: a100-80gb, gpus_per_node: {gpus}, nodes: 1, cpu_memory_gib: 1024}}\n"
        f"training: {{sequence_length: 1024, global_batch_size: {gpus}, optimizer: {{type: {optimizer}{impl}}}}}\n"
        f"constraints: {{zero_stage: {stage}, offload_optimizer: {offload}, micro_batch_size: 1,"
        " activation_checkpointing: false, memory_headroom: 0}\n"
    )


def step_phase(text: str, sub_group_size: int | None = None) -> tuple[int, int]:
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    best = solve_spec(spec).best
    assert best is not None
    plan = (
        best.plan
        if sub_group_size is None
        else replace(best.plan, knobs=replace(best.plan.knobs, sub_group_size=sub_group_size))
    )
    gpu = evaluate(spec, plan).memory.gpu
    return gpu.step_temporary, gpu.optimizer_step


def test_the_model_has_the_parameter_count_the_hand_figures_use() -> None:
    spec = load_spec_text(spec_text(0, 1, None), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert spec.model.parameter_count() == GPT2_PARAMETERS


def test_zero2_torch_adamw_holds_one_fp32_copy_of_the_rank_partition() -> None:
    temporary, step = step_phase(spec_text(2, 8, "torch"))
    assert temporary == 4 * GPT2_PARAMETERS // 8  # 62,219,904 bytes
    fused, fused_step = step_phase(spec_text(2, 8, None))
    assert fused == 0  # DeepSpeed's FusedAdam updates in place
    assert step - fused_step == 4 * GPT2_PARAMETERS // 8


def test_zero1_steps_the_same_partition_as_zero2() -> None:
    assert step_phase(spec_text(1, 8, "torch"))[0] == 62_219_904


def test_zero0_steps_the_whole_flat_master_group() -> None:
    assert step_phase(spec_text(0, 1, "torch"))[0] == 4 * GPT2_PARAMETERS  # 497,759,232


def test_zero3_steps_one_sub_group_at_a_time() -> None:
    # one rank, sub-group larger than the model: the single sub-group is every parameter
    assert step_phase(spec_text(3, 1, "torch"), sub_group_size=10**9)[0] == 4 * GPT2_PARAMETERS
    # sub_group_size 50M: stage3.py _create_fp16_sub_groups closes a sub-group once it reaches 50M
    # elements, so no sub-group exceeds 50M + one tensor (GPT-2's largest is wte, 50257 x 768 =
    # 38,597,376) and the largest is at least 50M
    temporary = step_phase(spec_text(3, 1, "torch"), sub_group_size=50_000_000)[0]
    assert 4 * 50_000_000 <= temporary < 4 * (50_000_000 + 38_597_376)


def test_adagrad_has_the_temporary_and_sgd_does_not() -> None:
    assert step_phase(spec_text(2, 8, "torch", optimizer="adagrad"))[0] == 62_219_904
    assert step_phase(spec_text(2, 8, "torch", optimizer="sgd"))[0] == 0


def test_offloaded_optimizer_steps_on_the_host_without_a_gpu_temporary() -> None:
    assert step_phase(spec_text(2, 8, None, offload="cpu"))[0] == 0


def test_a_torch_built_optimizer_is_refused_where_torch_has_none_or_it_would_be_offloaded() -> None:
    with pytest.raises(DsgenError, match=r"training\.optimizer\.implementation"):
        load_spec_text(spec_text(2, 8, "torch", optimizer="lion"), file="spec.yaml", base_dir=EXAMPLES_DIR)
    with pytest.raises(DsgenError, match=r"constraints\.offload_optimizer"):
        load_spec_text(spec_text(2, 8, "torch", offload="cpu"), file="spec.yaml", base_dir=EXAMPLES_DIR)


def test_a_torch_built_optimizer_leaves_the_config_without_an_optimizer_block() -> None:
    spec = load_spec_text(spec_text(2, 8, "torch"), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert optimizer_block(spec)["type"] is None
    spec = load_spec_text(spec_text(2, 8, None), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert optimizer_block(spec)["type"] == "AdamW"


def test_torch_fused_adamw_steps_in_place_and_the_trainer_builds_it(tmp_path: Any) -> None:
    """implementation torch-fused: no step temporary, no optimizer block, and the hf-trainer bundle
    names adamw_torch_fused, which transformers' own TrainingArguments accepts as such."""
    import json

    from dsgen.api import render_bundle
    from tests.conftest import require_module

    assert step_phase(spec_text(2, 8, "torch-fused"))[0] == 0
    spec = load_spec_text(spec_text(2, 8, "torch-fused"), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert optimizer_block(spec)["type"] is None
    best = solve_spec(spec).best
    assert best is not None
    kwargs = json.loads(render_bundle(spec, best.plan, "hf-trainer").files["training_args.json"])
    assert kwargs["optim"] == "adamw_torch_fused"
    require_module("transformers")
    from transformers import TrainingArguments

    kwargs.update(output_dir=str(tmp_path), use_cpu=True, bf16=False, deepspeed=None)
    assert TrainingArguments(**kwargs).optim == "adamw_torch_fused"
    with pytest.raises(DsgenError, match=r"training\.optimizer\.implementation"):
        load_spec_text(spec_text(2, 8, "torch-fused", optimizer="sgd"), file="spec.yaml", base_dir=EXAMPLES_DIR)
