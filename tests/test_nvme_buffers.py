"""The NVMe swap buffers dsgen renders are the ones its host-memory estimate prices.

The buffer counts and sizes are read back from the rendered DeepSpeed config, so a template that
renders other buffers than the estimator counts (or an estimator that stops counting them) fails.
"""

from __future__ import annotations

import pytest

from dsgen.api import render_plan, solve_spec
from dsgen.solver import require_feasible
from dsgen.spec.loader import load_spec_text
from tests.conftest import EXAMPLES_DIR

GPUS = 8
P = 8_030_261_248  # Llama-3.1-8B parameters (published)
PART = -(-P // GPUS)  # each rank's ZeRO-3 partition, elements
FP32, BF16 = 4, 2


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
    # per rank: the fp32 gradient partition stays on the host, and the optimizer swapper pins
    # buffer_count buffers of one sub-group (at most the partition) of fp32 each
    expected = GPUS * (FP32 * PART + optimizer["buffer_count"] * min(zero["sub_group_size"], PART) * FP32)
    if param == "nvme":
        swap = zero["offload_param"]
        assert swap["device"] == "nvme"
        # buffer_count pinned buffers of buffer_size 16-bit elements per rank
        expected += GPUS * swap["buffer_count"] * swap["buffer_size"] * BF16
    else:
        assert "offload_param" not in zero
    assert chosen.memory.cpu.offloaded_states == expected
