"""The doctor's readings of a config checked against the code that reads it for real:
transformers' HfTrainerDeepSpeedConfig (``"auto"``), DeepSpeedConfig (batch triple, ZeRO knobs
with their defaults, precision). Configs come from the public corpus ($DSGEN_CORPUS)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from dsgen.doctor.auto_values import auto_keys, resolve
from dsgen.doctor.batch import Parallel, derive
from dsgen.doctor.config_to_plan import config_to_plan, precision_of
from dsgen.doctor.keys import get
from dsgen.intake.loader import load_spec_text
from dsgen.validate import loader
from tests.conftest import EXAMPLES_DIR, require_module
from tests.doctor_scenarios import trainer_resolved

ARGS = {
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 4,
    "bf16": True,
    "learning_rate": 3e-5,
    "weight_decay": 0.1,
    "max_grad_norm": 0.5,
    "max_steps": 1000,
    "warmup_steps": 0,
}
HIDDEN = 4096
WORLD = 8


def _corpus_configs(corpus: Path, with_auto: bool) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(corpus.glob("*.json")):
        try:
            data = loader.load(path).data
        except Exception:  # unparseable corpus entries are the validator's business
            continue
        if isinstance(data, dict) and bool(auto_keys(data)) == with_auto:
            found.append((path.name, data))
    return found


def test_auto_values_match_the_hf_trainer(corpus_dir: Path) -> None:
    require_module("transformers")
    configs = _corpus_configs(corpus_dir, with_auto=True)
    assert len(configs) >= 50
    compared = refused = 0
    for name, config in configs:
        ours = resolve(config, trainer_args=ARGS, assumptions={}, world_size=WORLD, hidden_size=HIDDEN)
        try:
            theirs = trainer_resolved(config, ARGS, WORLD, HIDDEN)
        except ValueError as exc:  # the Trainer's fill_match mismatch
            assert ours.mismatches, f"{name}: the Trainer refused it ({exc}) but the doctor saw no mismatch"
            refused += 1
            continue
        assert not ours.mismatches, name
        assert ours.config == theirs, name
        compared += 1
    assert compared >= 50 and refused >= 1


def test_batch_derivation_matches_deepspeed() -> None:
    require_module("deepspeed")
    from tests.ds_oracle import deepspeed_verdict

    rng = random.Random(13)
    for _ in range(300):
        config: dict[str, Any] = {}
        for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
            if rng.random() < 0.7:
                config[key] = rng.randint(1, 48)
        world = rng.choice([1, 2, 3, 4, 7, 8, 16])
        sp = rng.choice([1, 1, 2])
        if sp > 1:
            config["sequence_parallel_size"] = sp
        batch = derive(config, Parallel(world_size=world * sp, sequence_parallel=sp))
        accepted, error = deepspeed_verdict(config, world, world_size=world * sp)
        assert batch.ok == accepted, (config, world, sp, error, batch)
        if not accepted:
            assert batch.error is not None and batch.error in error, (batch.error, error)
            for option in batch.consistent:
                fixed = {**config, **option}
                assert deepspeed_verdict(fixed, world, world_size=world * sp)[0], (fixed, world)


def test_knobs_and_defaults_match_deepspeed(corpus_dir: Path) -> None:
    require_module("deepspeed")
    from tests.ds_oracle import deepspeed_verdict, parse_with_deepspeed

    spec = load_spec_text(
        "model: {preset: llama-2-7b}\nhardware: {gpu: a100-80gb, gpus_per_node: 8}\n"
        "training: {sequence_length: 2048, global_batch_size: 64}\n",
        file="spec.yaml",
        base_dir=EXAMPLES_DIR,
    )
    configs = _corpus_configs(corpus_dir, with_auto=False) + _corpus_configs(corpus_dir, with_auto=True)
    checked = 0
    for name, raw in configs:
        try:  # "auto" configs as the HF Trainer hands them to DeepSpeed
            config = trainer_resolved(raw, ARGS, WORLD, HIDDEN) if auto_keys(raw) else raw
        except ValueError:
            continue
        if not isinstance(config.get("zero_optimization", {}), dict):
            continue
        parallel = Parallel(world_size=WORLD)
        batch = derive(config, parallel)
        if not batch.ok or not deepspeed_verdict(config, WORLD)[0]:
            continue
        ds = parse_with_deepspeed(config, WORLD)
        settings = {s.key: s.value for s in config_to_plan(config, spec, batch, parallel, "none", "test").settings}
        z = ds.zero_config
        stage = int(z.stage)
        assert settings["zero_optimization.stage"] == stage, name
        for key, field in (
            ("reduce_bucket_size", "reduce_bucket_size"),
            ("allgather_bucket_size", "allgather_bucket_size"),
            ("overlap_comm", "overlap_comm"),
            ("contiguous_gradients", "contiguous_gradients"),
            ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
            ("stage3_param_persistence_threshold", "param_persistence_threshold"),
            ("stage3_max_live_parameters", "max_live_parameters"),
            ("stage3_max_reuse_distance", "max_reuse_distance"),
            ("sub_group_size", "sub_group_size"),
            ("zero_hpz_partition_size", "zero_hpz_partition_size"),
            ("zero_quantized_weights", "zero_quantized_weights"),
            ("zero_quantized_gradients", "zero_quantized_gradients"),
        ):
            assert settings[f"zero_optimization.{key}"] == getattr(z, field), (name, key)
        device = z.offload_optimizer.device if z.offload_optimizer is not None else "none"
        offload = str(getattr(device, "value", device))
        if stage >= 1 and not (stage < 3 and offload == "nvme"):
            assert settings["zero_optimization.offload_optimizer.device"] == offload, name
        assert batch.micro_batch_size == ds.train_micro_batch_size_per_gpu, name
        assert batch.gradient_accumulation_steps == ds.gradient_accumulation_steps, name
        expected = "bf16" if ds.bfloat16_config.enabled else "fp16" if ds.float16_config.enabled else "fp32"
        assert precision_of(config)[0] == expected, name
        checked += 1
    assert checked >= 150


def test_without_trainer_arguments_the_assumptions_are_named() -> None:
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
    }
    resolved = resolve(
        config,
        trainer_args=None,
        assumptions={"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True},
        world_size=8,
        hidden_size=HIDDEN,
    )
    assert get(resolved.config, "gradient_accumulation_steps") == 8
    assert get(resolved.config, "bf16.enabled") is True
    assert all(fill.assumed for fill in resolved.fills)
    assert any("per_device_train_batch_size=1 (assumed)" in a for a in resolved.assumed_args)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
            "64 != 4 * 1 * 8",
        ),
        ({"gradient_accumulation_steps": 4}, "Either train_batch_size or train_micro_batch_size_per_gpu"),
    ],
)
def test_batch_errors_quote_deepspeed(config: dict[str, Any], message: str) -> None:
    assert message in (derive(config, Parallel(world_size=8)).error or "")


def test_the_doctors_trainer_defaults_are_transformers_own(tmp_path: Path) -> None:
    """What the doctor assumes for a TrainingArguments field nobody passed is what the installed
    transformers makes of it (its defaults after ``__post_init__``, aliases resolved); the doctor
    cannot import transformers at run time."""
    from dsgen.doctor.auto_values import TRAINER_DEFAULTS

    require_module("transformers")
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert {name: getattr(args, name) for name in TRAINER_DEFAULTS} == TRAINER_DEFAULTS


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"eval_strategy": "steps", "eval_steps": 10},
        {"eval_strategy": "epoch"},
        {"do_eval": True},
        {"do_eval": False},
    ],
)
def test_the_doctor_reads_whether_the_trainer_evaluates_as_transformers_does(
    tmp_path: Path, given: dict[str, Any]
) -> None:
    """``evaluation_batch.evaluates`` is the ``do_eval`` transformers derives (an evaluation
    strategy other than "no" turns it on), and the evaluation batch the doctor assumes when none is
    passed is transformers' own default."""
    from dsgen.doctor.evaluation_batch import EVALUATION_DEFAULTS, evaluates

    require_module("transformers")
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **given)
    assert evaluates(given) == args.do_eval
    if not given:
        assert {name: getattr(args, name) for name in EVALUATION_DEFAULTS} == EVALUATION_DEFAULTS
