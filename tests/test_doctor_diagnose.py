"""The doctor's judgement on small, hand-checked cases: headroom, where the spec and the config
disagree, which source says the script checkpoints, model-parallel sizes, the launcher's world."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsgen.api import load_spec
from dsgen.doctor.diagnose import diagnose
from dsgen.doctor.keys import get
from dsgen.spec.types import Spec
from tests.conftest import EXAMPLES_DIR

CONFIG: dict[str, Any] = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 8,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
}


def _spec(**constraints: Any) -> Spec:
    spec = load_spec(EXAMPLES_DIR / "doctor" / "cluster.yaml")
    return replace(spec, constraints=replace(spec.constraints, **constraints))


def test_headroom_is_reported_but_the_config_fits() -> None:
    physical = diagnose(CONFIG, _spec(activation_checkpointing="full"))
    assert physical.verdict == "fits" and physical.headroom_met
    used = physical.evaluation.memory.gpu.total / physical.evaluation.memory.gpu.capacity  # type: ignore[union-attr]
    tight = diagnose(CONFIG, _spec(activation_checkpointing="full", memory_headroom=round(1.02 - used, 3)))
    assert tight.verdict == "fits" and not tight.headroom_met
    assert any(f.code == "headroom" for f in tight.findings)
    assert tight.exit_code == 0


def test_spec_pins_that_disagree_are_named() -> None:
    d = diagnose(CONFIG, _spec(activation_checkpointing="full", zero_stage=2, micro_batch_size=2))
    pins = [f.message for f in d.findings if f.code == "spec-pin"]
    assert any("constraints.zero_stage: 2" in m and "runs 3" in m for m in pins)
    assert any("constraints.micro_batch_size: 2" in m for m in pins)
    assert d.evaluation is not None and d.evaluation.plan.zero_stage == 3  # the config wins


def test_training_args_say_whether_the_script_checkpoints() -> None:
    spec = _spec(activation_checkpointing="none")
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}
    without = diagnose(CONFIG, spec, trainer_args={**args, "gradient_checkpointing": False})
    with_ckpt = diagnose(CONFIG, spec, trainer_args={**args, "gradient_checkpointing": True})
    assert without.evaluation is not None and with_ckpt.evaluation is not None
    assert without.evaluation.plan.checkpointing == "none" and with_ckpt.evaluation.plan.checkpointing == "full"
    assert with_ckpt.evaluation.memory.gpu.activations < without.evaluation.memory.gpu.activations
    assert any(f.code == "spec-pin" and "gradient_checkpointing=True" in f.message for f in with_ckpt.findings)
    assert not any(f.code == "spec-pin" for f in without.findings)


def test_unstated_checkpointing_is_an_assumption() -> None:
    d = diagnose(CONFIG, _spec(activation_checkpointing=None))
    assert any(f.code == "checkpointing-assumed" for f in d.findings)


def test_sequence_parallel_changes_the_batch_world() -> None:
    config = {**CONFIG, "sequence_parallel_size": 2}
    d = diagnose(config, _spec(activation_checkpointing="full"))
    # DeepSpeed divides the launcher's 8 ranks by 2: 64 != 1 * 8 * 4.0
    assert d.verdict == "invalid"
    assert any("64 != 1 * 8 * 4.0" in f.message for f in d.findings)
    assert d.parallel.data_parallel == 4
    assert d.fixes and dict(d.fixes[0].changes)["gradient_accumulation_steps"] == 16


def test_launcher_world_size_reprices() -> None:
    d = diagnose({**CONFIG, "train_batch_size": 128}, _spec(activation_checkpointing="full"), world_size=16)
    assert d.verdict == "fits"
    assert d.spec.hardware.world_size == 16 and d.evaluation is not None
    assert d.evaluation.plan.data_parallel_size == 16


def test_error_without_a_valid_batch_is_not_matched() -> None:
    bad = {**CONFIG, "train_micro_batch_size_per_gpu": 0}
    d = diagnose(
        bad, _spec(activation_checkpointing="full"), error_text="CUDA out of memory. Tried to allocate 1.00 GiB."
    )
    assert d.verdict == "invalid"


HOSTILE: list[Any] = [
    {"zero_optimization": ["stage", 3], "train_batch_size": 64},
    {"zero_optimization": {"stage": "3"}, "train_micro_batch_size_per_gpu": 1},
    {"train_micro_batch_size_per_gpu": -4, "gradient_accumulation_steps": 2},
    {"train_batch_size": "sixty-four"},
    {"train_micro_batch_size_per_gpu": 1_000_000, "bf16": {"enabled": "yes"}},
    {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_optimizer": "cpu", "reduce_bucket_size": -1},
    },
    {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 3},
    {},
]


def test_hostile_configs_give_a_diagnosis_never_a_crash() -> None:
    spec = _spec(activation_checkpointing="full")
    for config in HOSTILE:
        d = diagnose(config, spec)
        assert d.verdict in ("fits", "oom", "host-oom", "invalid"), config
        if any(f.severity == "error" for f in d.validation.findings):
            assert d.verdict == "invalid", config


def test_partial_offload_fixes_are_accepted_by_deepspeed() -> None:
    from dsgen.intake.loader import load_spec_text
    from dsgen.validate import validate_config
    from tests.conftest import require_module

    require_module("deepspeed")
    from tests.ds_oracle import parse_with_deepspeed

    spec = load_spec_text(
        "model: {preset: llama-3.1-8b}\nhardware: {gpu: a10g, gpus_per_node: 8}\n"
        "training: {sequence_length: 2048, global_batch_size: 64}\n"
        "constraints: {activation_checkpointing: true, memory_headroom: 0.0}\n",
        file="spec.yaml",
        base_dir=EXAMPLES_DIR,
    )
    config = {**CONFIG, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1}
    config["zero_optimization"] = {"stage": 2}
    partial = [f for f in diagnose(config, spec).fixes if "partial" in f.label]
    assert partial
    for fix in partial:
        assert validate_config(fix.config, world_size=8).ok
        parsed = parse_with_deepspeed(fix.config, 8)
        assert (
            parsed.zero_config.offload_optimizer.ratio == dict(fix.changes)["zero_optimization.offload_optimizer.ratio"]
        )
        # DeepSpeed's train_batch_size counts every AutoTP peer; a step trains it / autotp_size samples
        assert parsed.train_batch_size // max(1, get(fix.config, "tensor_parallel.autotp_size", 1) or 1) == 64


def test_a_fix_that_moves_to_zero3_keeps_saving_the_model() -> None:
    """A ZeRO-2 run whose fixes move it to ZeRO-3: each such fix turns on the 16-bit gather on save
    (without it, at ZeRO-3, the HF Trainer's save_model writes no weights and Accelerate's
    get_state_dict raises), and DeepSpeed's own parser reads it on. A config already at ZeRO-3
    keeps its own setting: the fixes leave the key alone."""
    from tests.conftest import require_module

    require_module("deepspeed")
    from tests.ds_oracle import parse_with_deepspeed

    key = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
    spec = _spec(activation_checkpointing=None)
    zero2 = {**CONFIG, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    zero2["zero_optimization"] = {"stage": 2}
    to_zero3 = [f for f in diagnose(zero2, spec, max_fixes=20).fixes if f.evaluation.plan.zero_stage == 3]
    assert to_zero3
    for fix in to_zero3:
        assert dict(fix.changes)[key] is True, fix.label
        assert parse_with_deepspeed(fix.config, 8).zero_config.gather_16bit_weights_on_model_save is True

    zero3 = {**zero2, "zero_optimization": {"stage": 3}}
    fixes = diagnose(zero3, spec, max_fixes=20).fixes
    assert fixes
    assert all(key not in dict(fix.changes) for fix in fixes)


def test_an_evaluation_batch_larger_than_the_micro_batch_is_named() -> None:
    """With Trainer arguments that evaluate, an evaluation batch above the training micro-batch
    (8, the Trainer's default, when none is passed) is a warning whose hint is the micro-batch;
    an evaluation at the micro-batch, or none at all, says nothing of it."""
    config = {**CONFIG, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    spec = _spec(activation_checkpointing="full")
    train = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}

    def eval_findings(**args: Any) -> list[Any]:
        d = diagnose(config, spec, trainer_args={**train, **args})
        return [f for f in d.findings if f.code == "eval-batch"]

    (default,) = eval_findings(eval_strategy="steps", eval_steps=100)
    assert "evaluation runs 8 sequences" in default.message and "the Trainer's default" in default.message
    assert default.severity == "warning" and default.hint.startswith("pass --per_device_eval_batch_size 1 ")
    # Qwen2.5-7B at 4,096 tokens: 8 sequences' 16-bit logits over its 152,064-token vocabulary, the
    # fp32 copy and the fp32 log-softmax: 46.4 GiB, more than the 40 GB A100 holds with the states
    assert "46.4 GiB of logits and loss), more than the 39.4 GiB the GPU holds" in default.message
    (given,) = eval_findings(do_eval=True, per_device_eval_batch_size=2)
    assert "runs 2 sequences" in given.message and "2x the micro-batch of 1" in given.message
    assert "11.6 GiB of logits and loss)" in given.message and "more than" not in given.message
    assert eval_findings(eval_strategy="steps", per_device_eval_batch_size=1) == []
    assert eval_findings() == []  # no evaluation: the default batch never runs


def test_trl_max_length_caps_the_priced_sequence_and_packing_fills_it() -> None:
    """TRL's SFTConfig arguments: max_length truncates (the spec's 4,096 becomes 2,048), packing
    fills rows to max_length (also above the spec's), max_seq_length is the older name,
    null truncates nothing; each change is a sequence-length finding."""
    spec = _spec(activation_checkpointing="full")
    train = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}

    def priced(**args: Any) -> tuple[int, bool, list[Any]]:
        d = diagnose(CONFIG, spec, trainer_args={**train, **args})
        notes = [f for f in d.findings if f.code == "sequence-length"]
        return d.spec.training.sequence_length, d.spec.training.packed_samples, notes

    length, packed, (note,) = priced(max_length=2048)
    assert (length, packed, note.severity) == (2048, False, "warning") and "truncate" in note.message
    assert priced(max_length=8192)[:2] == (4096, False) and priced(max_length=8192)[2] == []
    length, packed, (note,) = priced(max_length=8192, packing=True)
    assert (length, packed) == (8192, True) and "filled to it" in note.message
    length, packed, (note,) = priced(max_length=4096, packing=True)
    assert (length, packed, note.severity) == (4096, True, "info")
    assert priced(max_seq_length=1024)[0] == 1024
    assert priced(max_length=None)[:2] == (4096, False)
    assert diagnose(CONFIG, spec).spec.training.sequence_length == 4096  # no arguments: the spec's


def test_autotp_batch_over_count_is_named() -> None:
    """Under AutoTP DeepSpeed asserts train_batch_size over every rank while a TP group trains one
    micro-batch (measured: docs/model-parallel-measurements.md), so a step trains train_batch_size / TP
    distinct samples; a spec asking for train_batch_size samples is told how to get them."""
    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml", ["training.global_batch_size=64"])
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 8,
        "train_batch_size": 64,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "tensor_parallel": {"autotp_size": 2},
    }
    d = diagnose(config, spec)
    found = [f for f in d.findings if f.code == "tp-batch-overcount"]
    assert len(found) == 1 and found[0].severity == "warning"
    assert "32 distinct samples" in found[0].message and "by 2" in (found[0].hint or "")
    assert not any(f.code == "batch-assertion" for f in d.findings)  # DeepSpeed accepts it: 64 = 1 x 8 x 8
    plain = diagnose({**config, "tensor_parallel": {"autotp_size": 1}}, spec)
    assert not any(f.code == "tp-batch-overcount" for f in plain.findings)


def test_model_parallel_rules_that_need_the_model_are_the_doctors() -> None:
    """The validator cannot see the model; the doctor can: Mixtral's 8 experts do not split over an
    autoep_size of 3, and AutoTP on an MoE model needs a partition_config (DeepSpeed's own checks,
    docs/model-parallel.md). A dense model under AutoTP 2 breaks neither."""
    spec = load_spec(
        EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml",
        ["model.preset=mixtral-8x7b", "hardware.gpus_per_node=6", "training.global_batch_size=48"],
    )
    base = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 8,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    ep = diagnose({**base, "expert_parallel": {"enabled": True, "autoep_size": 3}}, spec)
    assert any(f.code == "autoep-size-experts" and f.severity == "error" for f in ep.findings)
    assert ep.verdict == "invalid"
    tp = diagnose({**base, "tensor_parallel": {"autotp_size": 2}}, spec)
    assert any(f.code == "autotp-moe-partition" for f in tp.findings)
    dense = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml", ["training.global_batch_size=64"])
    plain = diagnose({**base, "tensor_parallel": {"autotp_size": 2}}, dense)
    assert not any(f.code.startswith(("autotp-", "autoep-")) for f in plain.findings)
