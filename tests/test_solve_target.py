"""One plan per target: ``solve --target T --json`` states the plan the bundle ``new --target T``
writes, read back from the bundle's own files (the DeepSpeed JSON, the Trainer's arguments,
Lightning's trainer keywords), for every example and every target. When the target changes the
plan, ``solve`` names the priced term that made the difference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SPECS = sorted(p for p in EXAMPLES.glob("*.yaml"))
TARGETS = ("deepspeed", "hf-trainer", "accelerate", "lightning", "trl", "llamafactory")
# 2 x T4 (fp16, 15 GiB): the HF Trainer frees the logits before backward, which here lets the
# Trainer's loop fit a plan a bare DeepSpeed loop does not (the gpt2-xl case).
GPT2_T4 = ["--set", "hardware.gpu=t4", "--set", "hardware.gpus_per_node=2"]


def _concrete(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bundle_plan(out: Path) -> dict[str, Any]:
    """The plan a bundle directory runs, read from its files as the consumers read them."""
    ds = json.loads((out / "ds_config.json").read_text())
    args_file, lightning_file = out / "training_args.json", out / "lightning_trainer.json"
    args = json.loads(args_file.read_text()) if args_file.is_file() else {}
    for framework_yaml in ("trl_config.yaml", "llamafactory.yaml"):  # the same trainer arguments, in YAML
        if (out / framework_yaml).is_file():
            args = yaml.safe_load((out / framework_yaml).read_text())
    trainer = json.loads(lightning_file.read_text()) if lightning_file.is_file() else {}
    micro = _concrete(ds.get("train_micro_batch_size_per_gpu")) or args.get("per_device_train_batch_size")
    accum = (
        _concrete(ds.get("gradient_accumulation_steps"))
        or args.get("gradient_accumulation_steps")
        or trainer.get("trainer", trainer).get("accumulate_grad_batches")
    )
    zero = ds.get("zero_optimization", {})
    offload_optimizer = zero.get("offload_optimizer", {})
    offloaded = offload_optimizer.get("device", "none") != "none"
    return {
        "zero_stage": zero.get("stage", 0),
        "offload_optimizer": offload_optimizer.get("device", "none"),
        # the contract's share of optimizer work on the CPU: 0 without offload, DeepSpeed's default 1 with it
        "offload_optimizer_ratio": offload_optimizer.get("ratio", 1.0) if offloaded else 0.0,
        "offload_param": zero.get("offload_param", {}).get("device", "none"),
        "micro_batch_size": micro,
        "gradient_accumulation_steps": accum,
    }


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_solve_for_a_target_states_the_plan_its_bundle_writes(
    spec: Path, target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    destination = out / "ds_config.json" if target == "deepspeed" else out  # one file, or a directory
    out.mkdir()
    made = run_cli(["new", str(spec), "--target", target, "-o", str(destination)], capsys)
    solved = run_cli(["solve", str(spec), "--target", target, "--json"], capsys)
    if made.exit_code != 0:  # the target refuses the plan (or nothing fits): solve says no plan either
        assert solved.exit_code != 0 or made.exit_code == 2, made.stderr
        assert made.stderr.strip(), "a refusal names its reason"
        return
    assert solved.exit_code == 0, solved.stderr
    body = json.loads(solved.stdout)
    assert body["target"] == target
    bundle = _bundle_plan(out)
    assert {key: body["plan"][key] for key in bundle} == bundle


def test_the_trainer_target_changes_the_plan_and_solve_names_the_term(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(EXAMPLES / "gpt2-xl-rtx4090.yaml")
    plain = json.loads(run_cli(["solve", spec, *GPT2_T4, "--json"], capsys).stdout)
    trainer = run_cli(["solve", spec, *GPT2_T4, "--target", "hf-trainer", "--json"], capsys)
    body = json.loads(trainer.stdout)
    assert plain["plan"] != body["plan"]
    difference = body["target_difference"]
    assert difference["baseline_target"] == "deepspeed" and difference["target"] == "hf-trainer"
    assert difference["baseline_plan"] == plain["plan"]
    # the Trainer's compute_loss frees the 16-bit logits before backward: the transient shrinks
    assert difference["where"] == "gpu" and difference["term"] == "transient"
    assert difference["value"] < difference["baseline_value"]
    text = run_cli(["solve", spec, *GPT2_T4, "--target", "hf-trainer"], capsys).stdout
    assert "the hf-trainer target changes the plan" in text and "transient" in text


def test_a_target_that_keeps_the_plan_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(EXAMPLES / "llama-3.1-8b-8xh100.yaml")
    body = json.loads(run_cli(["solve", spec, "--target", "accelerate", "--json"], capsys).stdout)
    assert body["target"] == "accelerate" and body["target_difference"] is None
    assert "target_difference" not in json.loads(run_cli(["solve", spec, "--json"], capsys).stdout)


@pytest.mark.parametrize("command", ["solve", "explain", "frontier"])
def test_an_unknown_target_is_bad_input(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli([command, str(EXAMPLES / "llama-3.1-8b-8xh100.yaml"), "--target", "megatron"], capsys)
    assert result.exit_code == 2
    assert "unknown target 'megatron'" in result.stderr and "Traceback" not in result.stderr


def test_explain_and_frontier_price_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(EXAMPLES / "gpt2-xl-rtx4090.yaml")
    explained = run_cli(["explain", spec, *GPT2_T4, "--target", "hf-trainer"], capsys)
    assert explained.exit_code == 0 and "the hf-trainer target changes the plan" in explained.stdout
    args = ["frontier", spec, "--set", "hardware.gpu=t4", "--over", "micro_batch_size", "--json"]
    plain = json.loads(run_cli(args, capsys).stdout)
    trainer = json.loads(run_cli([*args, "--target", "hf-trainer"], capsys).stdout)
    # the Trainer's loop holds less at the loss, so it reaches at least the same micro-batch
    assert trainer["max_micro_batch_size"] >= plain["max_micro_batch_size"]
