"""The DeepSpeed training runs two test files check, trained in one torchrun launch per test session.

``tests/test_ds_oracle_harness.py`` checks the harness on hand-written configs whose outcome is
known; ``tests/test_deepspeed_oracle.py`` checks that configs dsgen renders for a tiny model train.
Both read :func:`trained`, so their ten runs share one launch (the ranks' imports of torch,
transformers and DeepSpeed, and the process-group start, paid once; ``bench/batched_launch_identity.py``
shows each run reports what it reports in a launch of its own). The runs that must fail stay in
launches of their own, in the test files.
"""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.conftest import EXAMPLES_DIR
from tests.ds_oracle import TrainCase, TrainResult, train_cases

if TYPE_CHECKING:
    from dsgen.plan import Plan

RANKS = 2
MICRO = 2
ACCUMULATION = 2  # > 1 so every run also exercises DeepSpeed's gradient accumulation boundary
STEPS = 2


def hand_written_config(stage: int, *, offload: bool = False) -> dict[str, Any]:
    """A hand-written bf16 AdamW config for RANKS data-parallel CPU ranks."""
    zero: dict[str, Any] = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_batch_size": MICRO * ACCUMULATION * RANKS,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": ACCUMULATION,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8}},
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }


#: the hand-written runs: name -> (config, HF activation checkpointing)
HAND_WRITTEN: dict[str, tuple[dict[str, Any], bool]] = {
    "zero1-bf16": (hand_written_config(1), False),
    "zero2-bf16": (hand_written_config(2), False),
    "zero3-bf16": (hand_written_config(3), False),
    "zero2-cpu-optimizer-offload": (hand_written_config(2, offload=True), False),
    # ZeRO-3 is the combination where recomputation has to re-gather partitioned parameters
    "zero3-activation-checkpointing": (hand_written_config(3), True),
}

TINY_SPEC = """\
model:
  hf_config: {config}
hardware:
  gpu: a100-80gb
  gpus_per_node: 2
  nodes: 1
  cpu_memory_gib: 64
training:
  sequence_length: 32
  global_batch_size: 8
  precision: bf16
  attention: sdpa
  optimizer: {{type: {optimizer}, lr: 1.0e-3}}
constraints:
{constraints}
"""

#: the plans dsgen renders for a tiny Llama: name -> its pinned constraints
TRAINING_PLANS = {
    "zero1": "  zero_stage: 1\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 2",
    "zero2": "  zero_stage: 2\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 4",
    "zero3": "  zero_stage: 3\n  offload_optimizer: none\n  offload_param: none\n  activation_checkpointing: true\n  micro_batch_size: 2",
    "zero2-cpu-offload": "  zero_stage: 2\n  offload_optimizer: cpu\n  activation_checkpointing: false\n  micro_batch_size: 1",
    # a client optimizer: no optimizer block; the script passes torch.optim.Adafactor
    "zero2-adafactor": "  zero_stage: 2\n  offload_optimizer: none\n  activation_checkpointing: false\n  micro_batch_size: 2",
}


def plan_optimizer(name: str) -> str:
    """The optimizer a rendered plan's spec names: a client optimizer for the Adafactor plan."""
    return "adafactor" if name.endswith("adafactor") else "adamw"


def plan_spec_text(name: str) -> str:
    """The spec of rendered plan ``name``, pinned to one plan for the tiny Llama on 2 ranks."""
    config = EXAMPLES_DIR / "tiny-llama" / "config.json"
    return TINY_SPEC.format(config=config, constraints=TRAINING_PLANS[name], optimizer=plan_optimizer(name))


def rendered_plan(name: str) -> tuple[Plan, dict[str, Any]]:
    """Rendered plan ``name``: the plan dsgen chooses for its spec (every dimension pinned) and the
    DeepSpeed config dsgen renders for it."""
    from dsgen.api import load_spec, render_plan, solve_spec

    with tempfile.TemporaryDirectory() as tmp:
        spec_file = Path(tmp) / "spec.yaml"
        spec_file.write_text(plan_spec_text(name))
        spec = load_spec(spec_file)
        result = solve_spec(spec)
        assert result.fully_pinned and result.best is not None
        plan = result.best.plan
        return plan, render_plan(spec, plan).config


def rendered_case(name: str) -> TrainCase:
    """The run of rendered plan ``name``: dsgen's config, trained as its plan says."""
    plan, config = rendered_plan(name)
    optimizer = plan_optimizer(name)
    return TrainCase(
        config,
        steps=STEPS,
        checkpointing=plan.checkpointing == "full",
        client_optimizer=None if optimizer == "adamw" else optimizer,
    )


@cache
def trained() -> dict[str, TrainResult]:
    """Every run above, trained in one launch on RANKS ranks: the hand-written ones under their
    names, the rendered ones as ``rendered-<name>``. ZeRO-1 and 2 runs follow ZeRO-3 ones, so a
    state a ZeRO-3 run left behind would show."""
    cases = {name: TrainCase(config, STEPS, checkpointing=ckpt) for name, (config, ckpt) in HAND_WRITTEN.items()}
    cases.update({f"rendered-{name}": rendered_case(name) for name in TRAINING_PLANS})
    with tempfile.TemporaryDirectory(prefix="dsgen_train_cases_") as tmp:
        results = train_cases(list(cases.values()), tmp_path=Path(tmp), ranks=RANKS)
    return dict(zip(cases, results, strict=True))
