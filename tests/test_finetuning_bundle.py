"""The hf-trainer bundle of a fine-tuning plan, read by the libraries that consume it.

``peft_config.json`` must build a ``peft.LoraConfig``, ``quantization_config.json`` a
``transformers.BitsAndBytesConfig``, and ``training_args.json`` with ``trl_config.json`` the
objective's TRL config; a LoRA SFT and a DPO bundle train a tiny Llama for 2 optimizer steps
through their own launch.sh on 2 CPU ranks.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES_DIR, require_module

from dsgen.api import load_spec, solve_spec
from dsgen.errors import DsgenError
from dsgen.targets.bundle import render_bundle, write_bundle
from dsgen.targets.finetuning_files import TRL_CONFIG_CLASS

TINY = EXAMPLES_DIR / "tiny-llama" / "config.json"
SPEC = """\
model: {{hf_config: {config}}}
hardware: {{gpu: a100-80gb, gpus_per_node: 2, cpu_memory_gib: 64}}
training:
  sequence_length: {seq}
  global_batch_size: 8
  precision: bf16
  attention: sdpa
{training}
constraints: {{zero_stage: {stage}, offload_optimizer: none, offload_param: none, activation_checkpointing: false, micro_batch_size: 2}}
"""


def _bundle(tmp_path: Path, training: str, stage: int = 2, seq: int = 32) -> dict[str, Any]:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(SPEC.format(config=TINY, training=training, stage=stage, seq=seq))
    spec = load_spec(spec_file)
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    bundle = render_bundle(spec, plan, "hf-trainer", "torchrun")
    dest = tmp_path / "bundle"
    write_bundle(bundle, dest, force=False)
    return {"dest": dest, "bundle": bundle, "files": {name: dest / name for name in bundle.files}}


def _json(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(path.read_text())
    return value


def _trl_class(objective: str) -> Any:
    module, _, name = TRL_CONFIG_CLASS[objective].rpartition(".")
    return getattr(importlib.import_module(module), name)


OBJECTIVES = {
    "sft": "  finetuning: lora",
    "dpo": "  finetuning: lora\n  objective: dpo",
    "kto": "  objective: kto\n  reference_model: precomputed",
    "orpo": "  finetuning: lora\n  objective: orpo",
    "simpo": "  objective: simpo",
    "reward": "  finetuning: lora\n  objective: reward",
    "grpo": "  finetuning: lora\n  objective: grpo\n  generation: {num_generations: 4, max_prompt_length: 16, max_completion_length: 16, engine: vllm-colocate}",
}


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_training_and_trl_arguments_build_the_objectives_trl_config(
    objective: str, tmp_path: Path, monkeypatch: Any
) -> None:
    require_module("trl")
    made = _bundle(tmp_path, OBJECTIVES[objective])
    monkeypatch.chdir(made["dest"])
    kwargs = {**_json(made["dest"] / "training_args.json"), **_json(made["dest"] / "trl_config.json")}
    kwargs.update(output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    args = _trl_class(objective)(**kwargs)
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 2
    if objective == "grpo":
        # TRL's own check: the generation batch holds whole groups of num_generations completions
        assert args.num_generations == 4 and args.generation_batch_size % args.num_generations == 0
        assert args.vllm_mode == "colocate" and args.use_vllm
    if objective in ("dpo", "kto"):
        assert args.precompute_ref_log_probs is (objective == "kto")


def test_peft_and_bitsandbytes_configs_load_with_their_libraries(tmp_path: Path, monkeypatch: Any) -> None:
    peft = require_module("peft")
    transformers = require_module("transformers")
    made = _bundle(
        tmp_path, "  finetuning: qlora\n  lora: {rank: 8, alpha: 16, target_modules: [q_proj, v_proj]}", stage=3
    )
    lora = peft.LoraConfig(**_json(made["dest"] / "peft_config.json"))
    assert (lora.r, lora.lora_alpha, set(lora.target_modules)) == (8, 16, {"q_proj", "v_proj"})
    quant = transformers.BitsAndBytesConfig(**_json(made["dest"] / "quantization_config.json"))
    # ZeRO-3 partitions the 4-bit weights only when they are packed in the compute dtype (PEFT's guide)
    assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4"
    assert quant.bnb_4bit_quant_storage == quant.bnb_4bit_compute_dtype == require_module("torch").bfloat16
    notes = " ".join(made["bundle"].notes)
    assert "prepare_model_for_kbit_training" in notes and "get_peft_model" in notes


def test_full_sft_bundles_have_no_finetuning_files(tmp_path: Path) -> None:
    made = _bundle(tmp_path, "")
    assert set(made["bundle"].files) == {"ds_config.json", "training_args.json", "launch.sh"}


def test_ppo_has_no_trl_trainer_and_the_hf_trainer_target_says_so(tmp_path: Path) -> None:
    ppo = "  objective: ppo\n  generation: {max_prompt_length: 16, max_completion_length: 16}"
    with pytest.raises(DsgenError, match="TRL has no trainer"):
        _bundle(tmp_path, ppo)


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize(
    ("objective", "training"),
    [
        ("sft", "  finetuning: lora\n  lora: {rank: 4, target_modules: all-linear}"),
        ("dpo", "  finetuning: lora\n  objective: dpo"),
    ],
)
def test_finetuning_bundle_trains_two_steps_through_its_launch_script(
    objective: str, training: str, tmp_path: Path
) -> None:
    require_module("trl")
    require_module("peft")
    from tests import ds_oracle, rank_reports

    made = _bundle(tmp_path, training, seq=16)
    script = Path(__file__).resolve().parent / "hf_trl_script.py"
    args = [
        "--model-config",
        str(TINY),
        "--objective",
        objective,
        "--max-steps",
        "2",
        "--output-dir",
        str(tmp_path / "out"),
    ]
    log = ds_oracle.run_launch_script(made["dest"], script, args, cwd=tmp_path)
    reports = rank_reports.read(tmp_path, "DSGEN_TRL")  # rank 0's, from its own file
    assert len(reports) == 1, log[-6000:]
    info = reports[0]
    assert {
        k: info[k] for k in ("global_step", "world_size", "zero_stage", "train_batch_size", "micro", "accumulation")
    } == {
        "global_step": 2,
        "world_size": 2,
        "zero_stage": 2,
        "train_batch_size": 8,
        "micro": 2,
        "accumulation": 2,
    }
    spec = load_spec(tmp_path / "spec.yaml")
    from dsgen.estimate.trainable import parameter_split

    assert info["trained"] == parameter_split(spec.model, spec.training.finetuning).trainable_count
