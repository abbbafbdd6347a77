"""The NVMe swap buffers dsgen renders are the ones its host-memory estimate prices.

The buffer counts and sizes are read back from the rendered DeepSpeed config, so a template that
renders other buffers than the estimator counts (or an estimator that stops counting them) fails.
"""

from __future__ import annotations

import pytest

from dsgen.api import render_plan, solve_spec
from dsgen.intake.loader import load_spec_text
from dsgen.search.solver import require_feasible
from tests.conftest import EXAMPLES_DIR

GPUS = 8
P = 8_030_261_248  # Llama-3.1-8B parameters (published)
PART = -(-P // GPUS)  # each rank's ZeRO-3 partition, elements (every tensor divides by 8)
FP32, BF16 = 4, 2
# Llama-3.1-8B's tensors in parameters() order, each rank's share (published config: hidden 4096,
# 8 KV heads of 128, MLP 14336, vocabulary 128256, 32 layers, untied head), elements / 8
EMBED = 128256 * 4096 // GPUS
LAYER = [4096 * 4096 // GPUS, 1024 * 4096 // GPUS, 1024 * 4096 // GPUS, 4096 * 4096 // GPUS]
LAYER += [14336 * 4096 // GPUS] * 3 + [4096 // GPUS] * 2
TENSORS = [EMBED, *LAYER * 32, 4096 // GPUS, EMBED]
assert sum(TENSORS) == PART


def largest_sub_group(sub_group_size: int) -> int:
    """stage3.py ``_create_fp16_sub_groups``: add tensors' partitions to a sub-group until it
    reaches ``sub_group_size`` (or the tensors run out)."""
    groups, current = [], 0
    for n in TENSORS:
        current += n
        if current >= sub_group_size:
            groups.append(current)
            current = 0
    return max([*groups, current])


@pytest.mark.parametrize("param", ["none", "nvme"])
def test_rendered_nvme_buffers_are_the_ones_priced(param: str) -> None:
    text = (
        "model: {preset: llama-3.1-8b}\n"
        f"hardware: {{gpu: a100-80gb, gpus_per_node: {GPUS}, nodes: 1, cpu_memory_gib: 1024,\n"
        "           nvme: {path: /local_nvme, capacity_gib: 7000}}\n"
        "training: {sequence_length: 1024, global_batch_size: 256, precision: bf16}\n"
        f"constraints: {{zero_stage: 3, offload_optimizer: nvme, offload_param: {param}}}\n"
    )
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    chosen = require_feasible(solve_spec(spec))
    zero = render_plan(spec, chosen.plan).config["zero_optimization"]

    optimizer = zero["offload_optimizer"]
    assert optimizer["device"] == "nvme"
    # per rank (stage3.py, DeepSpeed 0.19.8): the 16-bit gradient partitions on the host, one fp32
    # gradient buffer of the largest sub-group, and buffer_count pinned swap buffers of the largest
    # sub-group in fp32 (SwapBufferManager); the fp32 gradients themselves are swapped to NVMe
    largest = largest_sub_group(zero["sub_group_size"])
    assert optimizer["buffer_count"] == 4  # AdamW: master, two moments and the gradient at once
    expected = GPUS * (BF16 * PART + FP32 * largest + optimizer["buffer_count"] * largest * FP32)
    if param == "nvme":
        swap = zero["offload_param"]
        assert swap["device"] == "nvme"
        # buffer_count pinned buffers of buffer_size 16-bit elements per rank
        expected += GPUS * swap["buffer_count"] * swap["buffer_size"] * BF16
    else:
        assert "offload_param" not in zero
    assert chosen.memory.cpu.offloaded_states == expected


def test_host_ram_binding_shrinks_the_sub_groups_and_the_render_carries_them() -> None:
    """Qwen2.5-7B on 2 x L4 with 64 GiB of host RAM and an NVMe drive: ZeRO-3 with the optimizer on
    NVMe fits once sub_group_size is smaller than DeepSpeed's 1e9, and the config says so."""
    text = (
        "model: {preset: qwen2.5-7b}\n"
        "hardware: {gpu: l4, gpus_per_node: 2, nodes: 1, cpu_memory_gib: 64,\n"
        "           nvme: {path: /local_nvme, capacity_gib: 1000}}\n"
        "training: {sequence_length: 2048, global_batch_size: 16}\n"
        "constraints: {zero_stage: 3, offload_optimizer: nvme, offload_param: none}\n"
    )
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    chosen = require_feasible(solve_spec(spec))
    zero = render_plan(spec, chosen.plan).config["zero_optimization"]
    assert zero["sub_group_size"] < 1_000_000_000
    assert zero["sub_group_size"] == chosen.plan.knobs.sub_group_size
    # at DeepSpeed's default sub_group_size the whole 3.8e9-element partition per rank would be
    # swapped through 4 + 1 buffers of up to 1e9 fp32 elements: 2 x 5 x 4 GB = 40 GB of pinned
    # host memory beside the 2 x 7.6 GB of 16-bit gradient partitions, more than 64 GiB less the
    # 10 % reserve and 2 x 3 GiB of process memory
    assert chosen.memory.cpu.total <= 0.9 * 64 * 2**30


def test_one_state_optimizers_swap_through_three_buffers() -> None:
    text = (
        "model: {preset: llama-3.1-8b}\n"
        f"hardware: {{gpu: a100-80gb, gpus_per_node: {GPUS}, nodes: 1, cpu_memory_gib: 1024,\n"
        "           nvme: {path: /local_nvme, capacity_gib: 7000}}\n"
        "training: {sequence_length: 1024, global_batch_size: 256, precision: bf16, optimizer: {type: lion}}\n"
        "constraints: {zero_stage: 3, offload_optimizer: nvme, offload_param: none}\n"
    )
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    chosen = require_feasible(solve_spec(spec))
    zero = render_plan(spec, chosen.plan).config["zero_optimization"]
    assert zero["offload_optimizer"]["buffer_count"] == 3  # master, momentum, gradient
    largest = largest_sub_group(zero["sub_group_size"])
    assert chosen.memory.cpu.offloaded_states == GPUS * (BF16 * PART + FP32 * largest + 3 * largest * FP32)
