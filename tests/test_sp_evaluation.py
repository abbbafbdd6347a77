"""The HF Trainer's evaluation of a Ulysses plan: whole sequences on every rank, and what that costs.

Two things the note rests on are checked against the installed frameworks' own code: that
evaluation runs without SP (Accelerate registers Ulysses with ``disable_in_eval=True``, and
transformers wraps only the training DataLoader and takes the SP loss only while training), and
that an evaluation forward of whole sequences holds at least the floor the note states, measured
with a real transformers model on CPU.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from dsgen.api import load_spec
from dsgen.catalog.hf_config import shape_from_hf_config
from dsgen.doctor.diagnose import diagnose
from dsgen.targets.long_context import unsharded_evaluation_bytes
from tests.conftest import EXAMPLES_DIR, bench_module, require_module


def test_the_frameworks_evaluate_without_sequence_parallelism() -> None:
    require_module("accelerate")
    require_module("transformers")
    from accelerate import Accelerator
    from transformers import Trainer

    prepare = inspect.getsource(Accelerator._prepare_deepspeed)
    assert '"disable_in_eval"] = True' in prepare  # UlyssesSPAttentionHF bypassed in eval mode
    assert "deepspeed_ulysses_dl_adapter" in inspect.getsource(Trainer._prepare_for_training)  # the training DL
    for name in ("get_eval_dataloader", "_get_dataloader", "evaluation_loop", "prediction_step"):
        assert "ulysses" not in inspect.getsource(getattr(Trainer, name)).lower(), name
    assert "and self.model.training" in inspect.getsource(Trainer.compute_loss)  # the SP loss trains only


def test_a_whole_sequence_evaluation_forward_holds_at_least_the_floor() -> None:
    """A tiny Llama (examples/tiny-llama) in bf16 on CPU, evaluated as the Trainer's
    prediction_step does (eval mode, no grad, labels given): the storages its forward and loss
    create peak at or above the 16-bit logits plus their fp32 copy and fp32 log-softmax, and within
    a quarter above that (what the floor leaves out: the layers' working set, a few small tensors)."""
    require_module("transformers")
    torch = require_module("torch")
    from transformers import AutoConfig, AutoModelForCausalLM

    live_bytes = bench_module("live_bytes")
    config_path = EXAMPLES_DIR / "tiny-llama" / "config.json"
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_path), dtype=torch.bfloat16).eval()
    batch, sequence = 2, 512
    ids = torch.randint(0, model.config.vocab_size, (batch, sequence))
    tracker = live_bytes.LiveBytes()
    tracker.exclude([*model.parameters(), *model.buffers(), ids])
    with torch.no_grad(), tracker:
        loss = model(input_ids=ids, labels=ids).loss
    assert torch.isfinite(loss)
    floor = unsharded_evaluation_bytes(shape_from_hf_config(config_path), sequence, batch, 2)
    assert floor == batch * sequence * 4096 * (2 + 4 + 4)
    assert floor <= tracker.peak < 1.25 * floor, (floor, tracker.peak)


def test_the_doctor_names_an_sp_evaluation() -> None:
    """Trainer arguments that run Ulysses SP 4 and evaluate: the warning states the whole-sequence
    floor for 131,072 tokens of Llama-3.1-8B (128,256-token vocabulary), more than an H100 holds."""
    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml")
    config = {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3},
    }
    sp = {"sp_size": 4, "sp_backend": "deepspeed", "dp_shard_size": 2}
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "bf16": True}
    evaluating = {**args, "parallelism_config": sp, "eval_strategy": "steps", "eval_steps": 100}
    evaluating["per_device_eval_batch_size"] = 1

    def sp_findings(trainer_args: dict[str, Any]) -> list[Any]:
        d = diagnose(config, spec, trainer_args=trainer_args)
        return [f for f in d.findings if f.code == "eval-sequence-parallel"]

    (finding,) = sp_findings(evaluating)
    floor = 131_072 * 128_256 * (2 + 4 + 4)
    assert f"{floor / 2**30:.1f} GiB per GPU, more than" in finding.message
    assert "1 whole 131,072-token sequence" in finding.message and finding.severity == "warning"
    assert sp_findings({**args, "parallelism_config": sp}) == []  # no evaluation
    assert sp_findings({k: v for k, v in evaluating.items() if k != "parallelism_config"}) == []  # no SP


@pytest.mark.parametrize("target", ["hf-trainer", "accelerate", "deepspeed"])
def test_only_the_trainer_bundle_carries_the_note(target: str) -> None:
    from dsgen.api import render_bundle, solve_spec

    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml")
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    assert plan.sequence_parallel_size > 1
    bundle = render_bundle(spec, plan, target)
    notes = [n for n in bundle.notes if "evaluates without Ulysses SP" in n]
    assert len(notes) == (1 if target == "hf-trainer" else 0)


def test_the_installed_release_bypasses_ulysses_in_eval() -> None:
    """DeepSpeed 0.19.8's registration takes ``disable_in_eval`` (#7821, first in 0.18.6), which
    Accelerate passes when present: the releases dsgen treats as bypassing Ulysses in eval mode."""
    require_module("deepspeed")
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    from dsgen.targets.long_context import sp_bypassed_in_eval

    assert "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters
    assert sp_bypassed_in_eval("0.19.8") and sp_bypassed_in_eval("0.18.6") and not sp_bypassed_in_eval("0.18.5")


@pytest.mark.parametrize(("release", "words"), [("0.19.8", "156.6 GiB per GPU"), ("0.18.5", "before DeepSpeed 0.18.6")])
def test_the_notes_follow_the_release(release: str, words: str) -> None:
    """Before 0.18.6 Ulysses stays on in eval mode: the Trainer's whole sequences are refused
    rather than run, and an Accelerate loop must shard its evaluation batches instead."""
    from dataclasses import replace

    from dsgen.api import render_bundle, solve_spec

    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-128k-8xh100.yaml")
    spec = replace(spec, training=replace(spec.training, deepspeed_version=release))
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    trainer = [n for n in render_bundle(spec, plan, "hf-trainer").notes if "keep evaluation off" in n]
    loop = [
        n
        for n in render_bundle(spec, plan, "accelerate").notes
        if "evaluation DataLoader" in n or "eval_dataloader" in n
    ]
    assert len(trainer) == len(loop) == 1 and words in trainer[0], trainer
    assert ("prepared apart from the model" in loop[0]) == (release == "0.19.8"), loop
