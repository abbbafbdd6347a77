"""`--accounting deepspeed-estimator` reproduces DeepSpeed's own model-state estimator to the byte,
and dsgen's default accounting is never below it where DeepSpeed's estimate is known to be low."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from tests.conftest import require_module

SPEC = """\
model: {{preset: {model}}}
hardware: {{gpu: a100-80gb, gpus_per_node: {gpus}, nodes: {nodes}, cpu_memory_gib: 4096}}
training: {{sequence_length: 512, global_batch_size: {batch}}}
constraints: {{zero_stage: {stage}, offload_optimizer: {opt}, offload_param: {param}, activation_checkpointing: true, micro_batch_size: 1}}
"""

CASES = [
    ("llama-3.1-8b", 8, 1, 2, "none", "none"),
    ("llama-3.1-8b", 8, 2, 2, "cpu", "none"),
    ("qwen2.5-7b", 4, 1, 1, "none", "none"),
    ("llama-3.1-70b", 8, 2, 3, "none", "none"),
    ("llama-3.1-70b", 8, 1, 3, "cpu", "none"),
    ("mistral-7b", 8, 1, 3, "cpu", "cpu"),
]


@pytest.mark.parametrize(("model", "gpus", "nodes", "stage", "opt", "param"), CASES)
def test_estimator_accounting_matches_deepspeed(
    capsys, tmp_path: Path, model: str, gpus: int, nodes: int, stage: int, opt: str, param: str
) -> None:
    require_module("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    from dsgen.catalog.presets import get_model

    spec = tmp_path / "spec.yaml"
    spec.write_text(
        SPEC.format(model=model, gpus=gpus, nodes=nodes, batch=gpus * nodes, stage=stage, opt=opt, param=param)
    )
    result = run_cli(["solve", str(spec), "--json", "--accounting", "deepspeed-estimator"], capsys)
    body = json.loads(result.stdout)
    assert body["accounting"] == "deepspeed-estimator"
    gpu = body["memory"]["gpu"]
    shape = get_model(model)
    if stage == 3:
        cpu_ds, gpu_ds, _ = estimate_zero3_model_states_mem_needs(
            shape.parameter_count(),
            shape.largest_module_parameters(),
            num_gpus_per_node=gpus,
            num_nodes=nodes,
            cpu_offload=opt != "none",
            cpu_offload_params=param != "none",
            zero_init=True,
        )
    else:
        cpu_ds, gpu_ds = estimate_zero2_model_states_mem_needs(
            shape.parameter_count(), num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=opt != "none"
        )
    assert gpu["parameters"] + gpu["gradients"] + gpu["optimizer_states"] == int(gpu_ds)
    assert body["memory"]["cpu"]["model_states"] == int(cpu_ds)


def test_unknown_accounting_is_a_usage_error(capsys, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="gpt2", gpus=1, nodes=1, batch=1, stage=2, opt="none", param="none"))
    result = run_cli(["solve", str(spec), "--accounting", "guess"], capsys)
    assert result.exit_code == 2
