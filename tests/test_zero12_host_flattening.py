"""ZeRO-1/2 flattens its parameter group on the host exactly when DeepSpeed does.

DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer.__init__`` builds the flat buffer on the accelerator
when ``available_memory()`` holds ``flat_buffer_bytes``, else on the host (two host copies of the
group per rank). The test builds a real ZeRO-2 engine on one CPU rank (gloo) with a tiny Llama,
with ``available_memory`` reporting what a GPU of a given size would have left after the model
(CUDA's fallback: total less what torch allocated, the parameters), at the two GPU sizes on
either side of dsgen's threshold, and reads which branch DeepSpeed's own log line names. A
mismatch between dsgen's flat group size (``Partitioning.zero12_slice``) and DeepSpeed's
``aligned_numel`` fails here. The host bytes themselves cannot be measured on a CPU (``.cpu()``
of a CPU tensor is the tensor itself, not a copy).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.catalog.presets import get_gpu
from dsgen.estimate.memory import zero12_host_flattening
from dsgen.estimate.model_states import model_states
from dsgen.plan import Plan
from dsgen.spec.types import Hardware
from dsgen.units import GIB
from tests.conftest import free_port, require_module

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=176,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=503,
    use_cache=False,
)

# Build an engine with `available_memory` patched to each value given, in turn in one process (one
# start of Python, torch, transformers and DeepSpeed); print the branch DeepSpeed logged for each.
PROGRAM = r"""
import gc, json, logging, os, sys
os.environ.update(DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
import deepspeed, torch, transformers
from deepspeed.accelerator import get_accelerator
from deepspeed.utils import logger

messages = []
handler = logging.Handler()
handler.emit = lambda record: messages.append(record.getMessage())
logger.addHandler(handler)
logger.setLevel(logging.INFO)
config = transformers.AutoConfig.for_model("llama", **json.loads(sys.argv[1]))
for available in map(int, sys.argv[2:]):
    get_accelerator().available_memory = lambda device_index=None, available=available: available
    messages.clear()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    ds_config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=ds_config)
    flattened = [m for m in messages if m.startswith("Flattening param group 0")]
    print("DSGEN_BRANCH", available, "host" if "on CPU" in flattened[0] else "accelerator", flush=True)
    del engine, model
    gc.collect()
"""


def _gpu_of(total_bytes: int) -> GpuSpec:
    """An H100 whose capacity is exactly ``total_bytes`` (the catalog states GiB as a float)."""
    gib = total_bytes / GIB
    gpu = dataclasses.replace(get_gpu("h100-80gb"), memory_gib=gib)
    while gpu.memory_bytes < total_bytes:
        gib = math.nextafter(gib, math.inf)
        gpu = dataclasses.replace(gpu, memory_gib=gib)
    assert gpu.memory_bytes == total_bytes
    return gpu


def _deepspeed_branches(availables: list[int], port: int) -> dict[int, str]:
    """Where DeepSpeed flattens ZeRO-1/2's parameter group with each free-memory figure."""
    env = dict(os.environ, MASTER_PORT=str(port), OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(TINY_LLAMA), *map(str, availables)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("DSGEN_BRANCH")]
    assert proc.returncode == 0 and len(lines) == len(availables), proc.stdout[-2000:] + proc.stderr[-4000:]
    return {int(available): branch for _, available, branch in lines}


@pytest.mark.deepspeed
@pytest.mark.slow
def test_host_flattening_threshold_is_deepspeeds(tmp_path: Path) -> None:
    require_module("deepspeed")
    transformers = require_module("transformers")
    transformers.AutoConfig.for_model("llama", **TINY_LLAMA).save_pretrained(tmp_path)
    shape = shape_from_hf_config(tmp_path / "config.json")
    plan = Plan(
        precision="fp32",
        zero_stage=2,
        offload_optimizer="none",
        offload_param="none",
        checkpointing="none",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    states = model_states(shape, plan, "adamw")
    model_bytes = 4 * states.partitioning.parameters
    flat_bytes = 4 * states.partitioning.zero12_slice * states.partitioning.ranks
    cases = {flat_bytes - 1: "host", flat_bytes: "accelerator"}
    # what CUDA's fallback reports once the model is on the GPU: total less the parameters
    branches = _deepspeed_branches(list(cases), free_port())
    for free, expected in cases.items():
        hardware = Hardware(gpu=_gpu_of(model_bytes + free), gpus_per_node=1)
        on_host = zero12_host_flattening(states, plan, hardware, "0.19")
        assert on_host == (model_bytes + flat_bytes if expected == "host" else 0)
        assert branches[free] == expected
