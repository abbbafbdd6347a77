"""Which optimizer the doctor prices: the one the config and the HF Trainer's arguments build.

The optimizer-step temporary is what it decides (docs/memory-model.md): torch's foreach AdamW holds
one fp32 tensor per stepped element, its fused AdamW and DeepSpeed's kernels none. Both are
measured here with torch's own optimizers on CPU; the doctor's readings are checked against
GPT-2's hand figure (124,439,808 parameters; ZeRO-2 on 8 GPUs steps a 15,554,976-element slice).
"""

from __future__ import annotations

from typing import Any

import pytest

from dsgen.doctor.diagnose import diagnose
from dsgen.intake.loader import load_spec_text
from tests.conftest import EXAMPLES_DIR, bench_module, require_module

SLICE = 124_439_808 // 8


def _spec(implementation: str = "deepspeed") -> Any:
    return load_spec_text(
        "model: {preset: gpt2}\n"
        "hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
        f"training: {{sequence_length: 1024, global_batch_size: 8, optimizer: {{type: adamw, implementation: {implementation}}}}}\n"
        "constraints: {activation_checkpointing: false}\n",
        file="spec.yaml",
        base_dir=EXAMPLES_DIR,
    )


def _config(**extra: Any) -> dict[str, Any]:
    zero = {"stage": 2, **extra.pop("zero", {})}
    return {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        **extra,
    }


def _reading(config: dict[str, Any], spec: Any, trainer_args: dict[str, Any] | None = None) -> tuple[int, list[Any]]:
    d = diagnose(config, spec, trainer_args=trainer_args)
    assert d.evaluation is not None
    return d.evaluation.memory.gpu.step_temporary, [f for f in d.findings if f.code == "optimizer"]


TRAIN = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "bf16": True}


def test_an_optimizer_block_is_built_by_deepspeed_whatever_the_spec_says() -> None:
    temporary, (note,) = _reading(_config(optimizer={"type": "AdamW", "params": {"lr": 1e-5}}), _spec("torch"))
    assert temporary == 0 and note.severity == "info" and "DeepSpeed" in note.message
    # torch_adam: DeepSpeed builds torch.optim's class instead of FusedAdam
    block = {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}}
    temporary, (note,) = _reading(_config(optimizer=block), _spec())
    assert temporary == 4 * SLICE and "torch_adam" in note.message


def test_the_trainer_builds_its_optim_when_the_config_has_no_block() -> None:
    assert _reading(_config(), _spec(), {**TRAIN, "optim": "adamw_torch"})[0] == 4 * SLICE
    temporary, (note,) = _reading(_config(), _spec("torch"), TRAIN)  # unset: the torch >= 2.8 default
    assert temporary == 0 and "adamw_torch_fused, the Trainer's default" in note.message
    # optimizer offload: Accelerate hands the step to DeepSpeed's CPU optimizer
    offloaded = _config(zero={"offload_optimizer": {"device": "cpu"}})
    assert _reading(offloaded, _spec(), {**TRAIN, "optim": "adamw_torch"})[0] == 0


def test_without_a_block_or_trainer_arguments_the_spec_decides() -> None:
    assert _reading(_config(), _spec("torch"))[0] == 4 * SLICE
    assert _reading(_config(), _spec())[1] == []


def test_an_optimizer_dsgen_does_not_model_is_a_warning() -> None:
    _, (note,) = _reading(_config(optimizer={"type": "Lamb"}), _spec())
    assert note.severity == "warning" and "'Lamb' is not modelled" in note.message
    _, (note,) = _reading(_config(), _spec(), {**TRAIN, "optim": "paged_adamw_32bit"})
    assert note.severity == "warning" and "'paged_adamw_32bit'" in note.message


@pytest.mark.parametrize(("kwargs", "low", "high"), [({"foreach": True}, 4.0, 4.05), ({"fused": True}, 0.0, 0.01)])
def test_torch_adamw_step_temporary_measured(kwargs: dict[str, bool], low: float, high: float) -> None:
    """torch's own AdamW on CPU, its second step (the moments exist after the first): the foreach
    path creates about 4 bytes per element beyond the states (its sqrt of the second moment), the
    fused kernel next to none."""
    torch = require_module("torch")
    live_bytes = bench_module("live_bytes")
    params = [torch.nn.Parameter(torch.randn(1 << 20)) for _ in range(4)]
    optimizer = torch.optim.AdamW(params, lr=1e-3, **kwargs)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    tracker = live_bytes.LiveBytes()
    tracker.exclude([*params, *(p.grad for p in params)])
    tracker.exclude(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))
    with tracker:
        optimizer.step()
    elements = sum(p.numel() for p in params)
    assert low * elements <= tracker.peak <= high * elements, tracker.peak / elements
