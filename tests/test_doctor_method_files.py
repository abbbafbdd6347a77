"""The doctor reads the method and objective from the run's own files: PEFT's adapter_config.json
(written here by PEFT itself, ``LoraConfig.save_pretrained``) and a TRL config passed as training
arguments (written by TRL itself, ``to_dict``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import EXAMPLES_DIR, require_module

from dsgen.api import doctor
from dsgen.errors import DsgenError
from dsgen.estimate.objectives import reference_source

SPEC = EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml"
CONFIG = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 4,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
}


def test_peft_adapter_config_sets_the_adapters(tmp_path: Path) -> None:
    peft = require_module("peft")
    config = peft.LoraConfig(
        r=32, lora_alpha=64, lora_dropout=0.1, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"
    )
    config.save_pretrained(str(tmp_path))
    diagnosis = doctor(CONFIG, SPEC, peft=tmp_path / "adapter_config.json")
    finetuning = diagnosis.spec.training.finetuning
    assert (finetuning.method, finetuning.lora.rank, finetuning.lora.alpha, finetuning.lora.dropout) == (
        "lora",
        32,
        64.0,
        0.1,
    )
    assert set(finetuning.lora.target_modules) == {"q_proj", "v_proj"}
    assert diagnosis.evaluation is not None and diagnosis.evaluation.memory.gpu.frozen_parameters > 0


@pytest.mark.parametrize(
    ("config_class", "kwargs", "objective"),
    [
        ("DPOConfig", {"precompute_ref_log_probs": True}, "dpo"),
        ("KTOConfig", {}, "kto"),
        ("RewardConfig", {}, "reward"),
    ],
)
def test_a_trl_config_sets_the_objective(
    config_class: str, kwargs: dict[str, object], objective: str, tmp_path: Path
) -> None:
    trl = require_module("trl")
    args = getattr(trl, config_class)(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs).to_dict()
    diagnosis = doctor(CONFIG, SPEC, training_args=json.loads(json.dumps(args, default=str)))
    finetuning = diagnosis.spec.training.finetuning
    assert finetuning.objective == objective
    if config_class == "DPOConfig":
        assert reference_source(finetuning) == "precomputed"


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ({"peft_type": "PREFIX_TUNING", "r": 8}, "peft_type"),
        ({"peft_type": "LORA", "r": 0}, "r"),
        ({"peft_type": "LORA", "r": 8, "lora_dropout": 1.5}, "lora_dropout"),
        ({"peft_type": "LORA", "r": 8, "target_modules": ".*proj"}, "target_modules"),
    ],
)
def test_a_bad_adapter_config_names_the_field(content: dict[str, object], field: str, tmp_path: Path) -> None:
    """``file:line: field: ...``, the field said once (json.dumps with indent puts key i on line i + 2)."""
    path = tmp_path / "adapter_config.json"
    path.write_text(json.dumps(content, indent=2))
    with pytest.raises(DsgenError) as caught:
        doctor(CONFIG, SPEC, peft=path)
    line = list(content).index(field) + 2
    message = str(caught.value).splitlines()[0]
    assert message.startswith(f"{path}:{line}: {field}: "), message
    assert not re.search(rf"\b{field}\b", message.removeprefix(f"{path}:{line}: {field}: ")), message


LLAMAFACTORY = """\
### method
stage: dpo
finetuning_type: lora
lora_rank: 16
lora_target: q_proj,v_proj
quantization_bit: 4
pref_loss: sigmoid
### dataset
cutoff_len: 1024
### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
bf16: true
"""
AUTO_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
}


def test_a_llamafactory_yaml_gives_the_method_objective_batch_and_sequence(tmp_path: Path) -> None:
    path = tmp_path / "train_qlora_dpo.yaml"
    path.write_text(LLAMAFACTORY)
    diagnosis = doctor(AUTO_CONFIG, SPEC, llamafactory=path)
    finetuning = diagnosis.spec.training.finetuning
    assert (finetuning.method, finetuning.objective, finetuning.lora.rank) == ("qlora", "dpo", 16)
    assert finetuning.lora.alpha == 32  # LLaMA-Factory's default: twice the rank
    assert set(finetuning.lora.target_modules) == {"q_proj", "v_proj"}
    assert reference_source(finetuning) == "adapter-disabled"
    assert diagnosis.evaluation is not None
    plan = diagnosis.evaluation.plan
    assert (plan.micro_batch_size, plan.gradient_accumulation_steps) == (2, 4)  # "auto" resolved as the Trainer does
    assert diagnosis.evaluation.sequence_length == 1024


@pytest.mark.parametrize(
    ("replaced", "key", "line"),
    [
        ("stage: dpo", "stage: grpo", 2),
        ("quantization_bit: 4", "quantization_bit: 3", 6),
        ("lora_rank: 16", "lora_rank: zero", 4),
    ],
)
def test_a_bad_llamafactory_field_names_the_field_and_line(replaced: str, key: str, line: int, tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(LLAMAFACTORY.replace(replaced, key))
    with pytest.raises(DsgenError) as caught:
        doctor(AUTO_CONFIG, SPEC, llamafactory=path)
    assert f"{path}:{line}:" in str(caught.value) and key.split(":")[0] in str(caught.value)


GRPO_SPEC = """\
model: {preset: qwen2.5-0.5b}
hardware: {gpu: a100-80gb, gpus_per_node: 1, cpu_memory_gib: 64}
training:
  sequence_length: 768
  global_batch_size: 8
  objective: grpo
  generation: {num_generations: 4, max_prompt_length: 512, max_completion_length: 256}
"""


@pytest.mark.parametrize(("micro", "refused"), [(3, True), (4, False)])
def test_grpo_generation_batch_is_refused_where_trl_refuses_it(micro: int, refused: bool, tmp_path: Path) -> None:
    trl = require_module("trl")
    spec = tmp_path / "spec.yaml"
    spec.write_text(GRPO_SPEC)
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
    }
    codes = {f.code: f.severity for f in doctor(config, spec).findings}
    assert (codes.get("generation-batch") == "error") is refused
    kwargs = {"per_device_train_batch_size": micro, "num_generations": 4, "use_cpu": True, "report_to": "none"}
    if refused:
        with pytest.raises(ValueError, match="divisible by num_generations"):
            trl.GRPOConfig(output_dir=str(tmp_path), **kwargs)
    else:
        trl.GRPOConfig(output_dir=str(tmp_path), **kwargs)


def test_dpo_says_the_micro_batch_runs_two_sequences_per_sample(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        GRPO_SPEC.replace("objective: grpo", "objective: dpo").replace(
            "  generation: {num_generations: 4, max_prompt_length: 512, max_completion_length: 256}\n", ""
        )
    )
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 2}}
    finding = next(f for f in doctor(config, spec).findings if f.code == "paired-sequences")
    assert "4 sequences per forward" in finding.message


def test_a_run_that_does_not_fit_is_offered_lighter_methods_apart_from_config_fixes(tmp_path: Path) -> None:
    """Full DPO of a 7B model at micro-batch 4 under ZeRO-2 runs out; precomputing the reference
    log-probabilities, LoRA and QLoRA each fit (each at its own best plan), and are listed as changes
    to the training, never as config fixes."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "model: {preset: qwen2.5-7b}\nhardware: {gpu: a100-80gb, gpus_per_node: 8, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 2048, global_batch_size: 64, objective: dpo}\n"
        "constraints: {activation_checkpointing: true}\n"
    )
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
    }
    diagnosis = doctor(config, spec)
    assert diagnosis.verdict == "oom"
    changes = [dict(fix.changes) for fix in diagnosis.method_fixes]
    assert changes == [
        {"training.reference_model": "precomputed"},
        {"training.finetuning": "lora"},
        {"training.finetuning": "qlora"},
    ]
    # each lighter method is priced at its own best plan (issue 48), for the same batch
    assert all(
        fix.evaluation.feasible  # type: ignore[union-attr]
        and fix.evaluation.plan.global_batch_size == diagnosis.evaluation.plan.global_batch_size  # type: ignore[union-attr]
        for fix in diagnosis.method_fixes
    )
    assert all("training." not in key for fix in diagnosis.fixes for key, _ in fix.changes)


def test_the_doctor_checks_the_fine_tuning_rules_of_its_spec(tmp_path: Path) -> None:
    """The doctor validates with the spec's method: a DPO run with a separate reference model whose ZeRO-2 config turns off
    compute_grad_norm gets the reference engine's failure (TRL's prepare_deepspeed rebuilds the
    config at stage 0, which DeepSpeed refuses without it), a plain SFT spec does not."""
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 8,
                "gradient_clipping": 0,
                "bf16": {"enabled": True},
                "zero_optimization": {"stage": 2, "compute_grad_norm": False},
            }
        )
    )
    from dsgen.api import load_spec

    separate = ["training.reference_model=separate"]  # a second engine, which TRL prepares itself
    dpo = doctor(config, load_spec(EXAMPLES_DIR / "dpo-llama-3.1-8b-8xh100.yaml", separate))
    assert any(f.code == "trl-reference-engine" and f.severity == "error" for f in dpo.findings)
    assert dpo.verdict == "invalid"
    sft = doctor(config, EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml")
    assert not any(f.code == "trl-reference-engine" for f in sft.findings)
