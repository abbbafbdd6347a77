"""The loss backward's transient depends on whether the training loop still holds the model's output.

``ForCausalLMLoss`` upcasts the logits, so the loss backward forms the fp32 gradient of the
log-softmax and of its input (``2 x 4 x V`` bytes per token) beside the saved fp32 log-softmax. A
loop written ``out = model(...); engine.backward(out.loss)`` also keeps the 16-bit logits (``e x
V``) alive; the HF Trainer's ``compute_loss`` returns the loss alone, so they are freed first. The
first test watches that happen in transformers' own Trainer; the others check dsgen prices it.
"""

from __future__ import annotations

import weakref

import pytest

from dsgen.api import solve_spec
from dsgen.intake.loader import load_spec_text
from dsgen.search.evaluation import evaluate
from tests.conftest import EXAMPLES_DIR, require_module

SPEC = """\
model: {preset: llama-3.1-8b}
hardware: {gpu: h100-80gb, gpus_per_node: 8, cpu_memory_gib: 1024}
training: {sequence_length: 4096, global_batch_size: 64}
constraints: {zero_stage: 3, offload_optimizer: none, offload_param: none, activation_checkpointing: true, micro_batch_size: 4}
output: {target: TARGET}
"""


def spec_for(target: str):
    return load_spec_text(SPEC.replace("TARGET", target), file="spec.yaml", base_dir=EXAMPLES_DIR)


def test_the_trainer_frees_the_models_output_before_backward(tmp_path) -> None:
    require_module("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=128,
    )
    model = LlamaForCausalLM(config)
    logits: list[weakref.ref] = []
    model.register_forward_hook(
        lambda module, args, kwargs, out: logits.append(weakref.ref(out.logits)), with_kwargs=True
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        max_steps=1,
        per_device_train_batch_size=2,
        save_strategy="no",
    )
    data = [{"input_ids": torch.randint(0, 128, (16,)), "labels": torch.randint(0, 128, (16,))} for _ in range(2)]
    trainer = Trainer(model=model, args=args, train_dataset=data)
    alive_at_backward: list[bool] = []
    backward = trainer.accelerator.backward

    def watched(loss, **kwargs):  # type: ignore[no-untyped-def]
        alive_at_backward.append(logits[-1]() is not None)
        return backward(loss, **kwargs)

    trainer.accelerator.backward = watched  # type: ignore[method-assign]
    trainer.train()
    assert alive_at_backward == [False]


def test_hf_trainer_target_prices_the_loss_without_the_returned_logits() -> None:
    """Same plan, two loops: the HF Trainer's needs e x V bytes per token less in the loss backward
    (Llama-3's 128,256-token vocabulary, bf16, micro-batch 4 x 4,096 tokens)."""
    user_loop, trainer = spec_for("deepspeed"), spec_for("hf-trainer")
    best = solve_spec(user_loop).best
    assert best is not None
    kept = evaluate(user_loop, best.plan).memory.gpu
    freed = evaluate(trainer, best.plan).memory.gpu
    assert kept.transient - freed.transient == 4 * 4096 * 128256 * 2
    assert freed.total < kept.total


@pytest.mark.parametrize("target", ["accelerate", "lightning", "deepspeed"])
def test_user_loops_keep_the_logits(target: str) -> None:
    assert not spec_for(target).output.logits_released
    assert spec_for("hf-trainer").output.logits_released


def test_new_prices_the_target_it_writes(tmp_path) -> None:
    """``dsgen new --target hf-trainer`` solves for the Trainer's loop, whatever output.target says."""
    from dsgen.api import build_bundle

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.replace("TARGET", "deepspeed"))
    result, bundle = build_bundle(spec_file, target="hf-trainer")
    assert bundle.target == "hf-trainer" and result.spec.output.logits_released
    plain, _ = build_bundle(spec_file)
    assert result.best is not None and plain.best is not None
    assert result.best.memory.gpu.transient < plain.best.memory.gpu.transient


def test_doctor_with_trainer_arguments_prices_the_trainers_loop() -> None:
    """--training-args says the HF Trainer runs the loop: the doctor prices its loss backward."""
    from dsgen.doctor.diagnose import diagnose

    spec = spec_for("deepspeed")
    config = {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
    }
    args = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "bf16": True,
        "gradient_checkpointing": True,
    }
    with_trainer = diagnose(config, spec, trainer_args=args)
    without = diagnose(config, spec)
    assert with_trainer.evaluation is not None and without.evaluation is not None
    kept = without.evaluation.memory.gpu.transient
    freed = with_trainer.evaluation.memory.gpu.transient
    assert kept - freed == 4 * 4096 * 128256 * 2
