"""The optimizer and scheduler blocks ``dsgen new`` writes carry the spec's choices under the names
DeepSpeed 0.19.8 reads (``runtime/engine.py`` ``_configure_basic_optimizer``, ``runtime/lr_schedules.py``).

Expected values come from the spec text and DeepSpeed's documented parameter names, not from
dsgen's rendering code.
"""

from __future__ import annotations

from typing import Any

import pytest

from dsgen.api import render_plan, solve_spec
from dsgen.intake.loader import load_spec_text
from dsgen.search.evaluation import Evaluation
from dsgen.search.solver import require_feasible
from dsgen.spec.types import Spec
from tests.conftest import EXAMPLES_DIR

BASE = """\
model: {preset: llama-3.2-1b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}
training:
  sequence_length: 2048
  global_batch_size: 64
  optimizer: {OPTIMIZER}
  scheduler: {SCHEDULER}
"""

LR, WD, B1, B2, EPS, MOMENTUM = 3.0e-4, 0.05, 0.8, 0.95, 1.0e-6, 0.7


def _best(text: str) -> tuple[Spec, Evaluation]:
    spec = load_spec_text(text, file="spec.yaml", base_dir=EXAMPLES_DIR)
    return spec, require_feasible(solve_spec(spec))


def _rendered(text: str) -> dict[str, Any]:
    spec, best = _best(text)
    return render_plan(spec, best.plan).config


def _config(optimizer: str, scheduler: str = "{type: none}") -> dict[str, Any]:
    return _rendered(BASE.replace("{OPTIMIZER}", optimizer).replace("{SCHEDULER}", scheduler))


# written out: PyYAML reads 1e-06 (no dot) as a string, YAML 1.1 style
HYPER = "lr: 3.0e-4, weight_decay: 0.05, betas: [0.8, 0.95], eps: 1.0e-6, momentum: 0.7"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        # DeepSpeed's "AdamW" is FusedAdam/CPUAdam with adam_w_mode=True (decoupled weight decay)
        ("adamw", {"type": "AdamW", "params": {"lr": LR, "betas": [B1, B2], "eps": EPS, "weight_decay": WD}}),
        # its "Adam" also defaults to adam_w_mode=True: plain Adam (L2 decay) must turn it off
        (
            "adam",
            {
                "type": "Adam",
                "params": {"lr": LR, "betas": [B1, B2], "eps": EPS, "weight_decay": WD, "adam_w_mode": False},
            },
        ),
        ("lion", {"type": "Lion", "params": {"lr": LR, "betas": [B1, B2], "weight_decay": WD}}),
        ("adagrad", {"type": "Adagrad", "params": {"lr": LR, "eps": EPS, "weight_decay": WD}}),
        # torch.optim.SGD: built from the config by name, outside ZeRO's tested list
        ("sgd", {"type": "SGD", "params": {"lr": LR, "momentum": MOMENTUM, "weight_decay": WD}}),
    ],
)
def test_optimizer_block_carries_the_spec_hyperparameters(kind: str, expected: dict[str, Any]) -> None:
    config = _config(f"{{type: {kind}, {HYPER}}}")
    assert config["optimizer"] == expected
    assert config.get("zero_allow_untested_optimizer", False) is (kind == "sgd")


@pytest.mark.parametrize("kind", ["adafactor", "adamw-8bit"])
def test_client_optimizers_leave_the_optimizer_to_the_training_script(kind: str) -> None:
    config = _config(f"{{type: {kind}, lr: 3.0e-4}}")
    assert "optimizer" not in config
    assert config["zero_allow_untested_optimizer"] is True


def test_no_scheduler() -> None:
    assert "scheduler" not in _config("{type: adamw}", "{type: none}")


def test_warmup_scheduler_ramps_to_the_optimizer_lr() -> None:
    block = _config("{type: adamw, lr: 3.0e-4}", "{type: warmup, warmup_steps: 250}")["scheduler"]
    assert block["type"] == "WarmupLR"
    assert block["params"]["warmup_max_lr"] == LR
    assert block["params"]["warmup_num_steps"] == 250
    assert block["params"]["warmup_min_lr"] == 0


def test_warmup_decay_scheduler_spans_the_requested_steps() -> None:
    block = _config("{type: adamw, lr: 3.0e-4}", "{type: warmup_decay, warmup_steps: 250, total_steps: 5000}")[
        "scheduler"
    ]
    assert block["type"] == "WarmupDecayLR"
    params = block["params"]
    assert (params["warmup_max_lr"], params["warmup_num_steps"], params["total_num_steps"]) == (LR, 250, 5000)


def test_warmup_cosine_scheduler_spans_the_requested_steps() -> None:
    block = _config("{type: adamw}", "{type: warmup_cosine, warmup_steps: 250, total_steps: 5000}")["scheduler"]
    assert block["type"] == "WarmupCosineLR"
    params = block["params"]
    assert (params["warmup_num_steps"], params["total_num_steps"]) == (250, 5000)
    assert 0 <= params["cos_min_ratio"] <= 1 and 0 <= params["warmup_min_ratio"] <= 1


@pytest.mark.parametrize("kind", ["WarmupDecayLR", "WarmupCosineLR"])
def test_total_steps_shorter_than_warmup_still_gives_deepspeed_a_valid_schedule(kind: str) -> None:
    """DeepSpeed divides by (total_num_steps - warmup_num_steps) after warm-up; a total below the
    warm-up would run the decay backwards. The rendered total is never below the warm-up."""
    name = {"WarmupDecayLR": "warmup_decay", "WarmupCosineLR": "warmup_cosine"}[kind]
    params = _config("{type: adamw}", f"{{type: {name}, warmup_steps: 400, total_steps: 100}}")["scheduler"]["params"]
    assert params["warmup_num_steps"] == 400
    assert params["total_num_steps"] >= 400


def test_documented_defaults_reach_the_config() -> None:
    """The spec's defaults (docs/spec-keys.md): gradient_clipping 1.0 and warmup_decay over 100 of 10,000 steps
    when the spec says nothing."""
    config = _rendered(
        "model: {preset: llama-3.2-1b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 2048, global_batch_size: 64}\n"
    )
    assert config["gradient_clipping"] == 1.0
    scheduler = config["scheduler"]
    assert scheduler["type"] == "WarmupDecayLR"
    assert (scheduler["params"]["warmup_num_steps"], scheduler["params"]["total_num_steps"]) == (100, 10_000)


def test_host_ram_usable_is_ninety_percent_of_the_node() -> None:
    """docs/memory-model.md: a plan fits when host memory is at most 90 % of cpu_memory_gib."""
    _, best = _best(
        "model: {preset: llama-3.2-1b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 100}\n"
        "training: {sequence_length: 2048, global_batch_size: 64}\n"
    )
    assert best.usable_cpu_bytes == 90 * 2**30
