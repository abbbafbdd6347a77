"""The trl target (issue 50): a config for TRL's own CLI and a launch.sh that starts it.

Checked with TRL's code, not dsgen's: each objective's ``trl_config.yaml`` goes through the parser
``trl <objective>`` builds (``trl/scripts/<objective>.py`` ``make_parser``), which must name every
key; TRL's ``get_peft_config`` and ``get_quantization_config`` must build from it the same
``LoraConfig`` and ``BitsAndBytesConfig`` that the hf-trainer bundle's files give PEFT and
transformers; the trainer's arguments must carry the plan's batch split. The slow tests fill the
placeholders as a user would and start the bundle's own launch.sh on 2 CPU ranks: SFT, DPO and
GRPO train 2 optimizer steps, and the DeepSpeed checkpoint the Trainer saves holds the config
DeepSpeed's engine ran with.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsgen.api import load_spec, render_bundle, solve_spec
from dsgen.targets.own_script import PLACEHOLDER
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, require_module

TINY_LLAMA = EXAMPLES_DIR / "tiny-llama" / "config.json"

SPEC = """\
model:
  hf_config: {config}
hardware: {{gpu: a100-80gb, gpus_per_node: 2, nodes: 1, cpu_memory_gib: 64}}
training:
  sequence_length: 32
  global_batch_size: 8
  precision: bf16
  attention: sdpa
  finetuning: {method}
  objective: {objective}
{generation}constraints: {{zero_stage: {stage}, offload_optimizer: none, activation_checkpointing: {checkpointing}, micro_batch_size: 2}}
output: {{target: trl}}
"""


GRPO_GENERATION = (
    "  generation: {num_generations: 2, max_prompt_length: 16, max_completion_length: 8, engine: transformers}\n"
)


def _spec(tmp_path: Path, objective: str, method: str, stage: int = 2, checkpointing: str = "false") -> Path:
    path = tmp_path / f"{objective}-{method}.yaml"
    text = SPEC.format(
        config=TINY_LLAMA,
        objective=objective,
        method=method,
        stage=stage,
        checkpointing=checkpointing,
        generation=GRPO_GENERATION if objective == "grpo" else "",
    )
    # GRPO trains on prompt + completion (16 + 8)
    path.write_text(text.replace("sequence_length: 32", "sequence_length: 24") if objective == "grpo" else text)
    return path


def _bundles(spec_file: Path) -> tuple[Any, dict[str, str], dict[str, str]]:
    """The plan, and the trl and hf-trainer bundles' files for it."""
    spec = load_spec(spec_file)
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    trl = render_bundle(spec, plan, "trl", "accelerate").files
    hf = render_bundle(spec, plan, "hf-trainer", "torchrun").files
    return plan, trl, hf


def _parse(objective: str, config: Path) -> tuple[Any, ...]:
    """``trl <objective> --config`` as TRL's CLI parses it: (dataclasses..., unnamed config keys)."""
    module = __import__(f"trl.scripts.{objective}", fromlist=["make_parser"])
    parser = module.make_parser()
    *parsed, config_remaining, cli_remaining = parser.parse_args_and_config(
        ["--config", str(config), "--use_cpu", "true"], return_remaining_strings=True, separate_remaining_strings=True
    )
    assert cli_remaining == []
    return (*parsed, config_remaining)


CASES = [
    ("sft", "lora", 2),
    ("sft", "qlora", 3),
    ("sft", "full", 3),
    ("dpo", "lora", 2),
    ("kto", "lora", 1),
    ("reward", "lora", 2),
    ("grpo", "lora", 2),
]


@pytest.mark.parametrize(("objective", "method", "stage"), CASES)
def test_trls_own_parser_reads_every_key_and_builds_the_hf_trainer_bundles_objects(
    objective: str, method: str, stage: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_module("trl")
    from transformers import BitsAndBytesConfig
    from trl import get_peft_config, get_quantization_config

    plan, trl, hf = _bundles(_spec(tmp_path, objective, method, stage))
    assert set(trl) == {"ds_config.json", "trl_config.yaml", "launch.sh"}
    assert trl["ds_config.json"] == hf["ds_config.json"]  # the HF Trainer reads both
    for name in ("ds_config.json", "trl_config.yaml"):
        (tmp_path / name).write_text(trl[name])
    monkeypatch.chdir(tmp_path)  # where launch.sh runs TRL: the bundle's directory
    *parsed, unnamed = _parse(objective, tmp_path / "trl_config.yaml")
    assert unnamed == [], f"keys TRL's {objective} parser does not name: {unnamed}"
    script_args, training_args, model_args = parsed[0], parsed[1], parsed[2]
    # the plan's split and the DeepSpeed JSON, as the Trainer will read them
    assert training_args.per_device_train_batch_size == plan.micro_batch_size == 2
    assert training_args.gradient_accumulation_steps == plan.gradient_accumulation_steps == 2
    assert training_args.bf16 and not training_args.fp16
    assert training_args.gradient_checkpointing is False
    assert training_args.deepspeed == "ds_config.json"
    assert (training_args.__class__.__name__, model_args.attn_implementation) == (
        {"sft": "SFTConfig", "dpo": "DPOConfig", "kto": "KTOConfig", "reward": "RewardConfig", "grpo": "GRPOConfig"}[
            objective
        ],
        "sdpa",
    )
    assert model_args.model_name_or_path.startswith(PLACEHOLDER)
    assert script_args.dataset_name.startswith(PLACEHOLDER)
    assert training_args.output_dir.startswith(PLACEHOLDER)
    # the objective's keys, whichever file carries them, reach the same TRL config
    for key, value in json.loads(hf.get("trl_config.json", "{}")).items():
        assert getattr(training_args, key) == value, key
    # the adapter and the 4-bit load TRL builds are the ones the hf-trainer bundle's files give
    peft = get_peft_config(model_args)
    if "peft_config.json" in hf:
        from peft import LoraConfig

        expected = LoraConfig(**json.loads(hf["peft_config.json"])).to_dict()
        assert peft is not None and peft.to_dict() == expected
    else:
        assert peft is None
    quantization = get_quantization_config(model_args)
    if "quantization_config.json" in hf:
        expected = BitsAndBytesConfig(**json.loads(hf["quantization_config.json"])).to_dict()
        assert quantization is not None and quantization.to_dict() == expected
    else:
        assert quantization is None


def test_grpo_names_the_reward_function_to_fill_in(tmp_path: Path) -> None:
    _, trl, _ = _bundles(_spec(tmp_path, "grpo", "lora"))
    body = yaml.safe_load(trl["trl_config.yaml"])
    assert body["reward_funcs"][0].startswith(PLACEHOLDER)
    assert body["num_generations"] == 2 and body["max_completion_length"] == 8


def test_a_model_named_by_its_hugging_face_id_needs_no_placeholder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(TINY_LLAMA.read_text())
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    spec_file = _spec(tmp_path, "sft", "lora")
    spec_file.write_text(spec_file.read_text().replace(f"hf_config: {TINY_LLAMA}", "hf: acme/tiny"))
    _, trl, _ = _bundles(spec_file)
    assert yaml.safe_load(trl["trl_config.yaml"])["model_name_or_path"] == "acme/tiny"


@pytest.mark.parametrize(
    ("objective", "method", "extra", "key"),
    [
        ("orpo", "lora", "", "training.objective"),
        ("simpo", "lora", "", "training.objective"),
        ("sft", "freeze", "", "training.finetuning"),
        ("sft", "lora", "  sequence_parallel_size: 2\n", "output.target"),
    ],
)
def test_what_trls_scripts_cannot_run_is_refused_by_name(
    objective: str, method: str, extra: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec_file = _spec(tmp_path, objective, method)
    text = spec_file.read_text()
    if extra:
        text = text.replace("constraints: {", "constraints: {sequence_parallel_size: 2, ")
    spec_file.write_text(text)
    result = run_cli(["new", str(spec_file), "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert key in result.stderr
    assert not (tmp_path / "run").exists()


def test_trl_starts_only_through_accelerate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(
        ["new", str(_spec(tmp_path, "sft", "lora")), "--launcher", "torchrun", "-o", str(tmp_path / "r")], capsys
    )
    assert result.exit_code == 2 and "output.launcher" in result.stderr


def test_the_solver_does_not_choose_alst_for_trl(tmp_path: Path) -> None:
    """A length only Ulysses SP fits: the hf-trainer target gets the SP plan, trl no plan (its
    closest miss has no ALST either), rather than a plan its bundle would refuse."""
    spec_file = tmp_path / "long.yaml"
    spec_file.write_text(
        "model: {preset: llama-3.1-8b}\n"
        "hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"
        "training: {sequence_length: 131072, global_batch_size: 8, finetuning: lora}\n"
        "output: {target: trl}\n"
    )
    spec = load_spec(spec_file)
    from dataclasses import replace

    hf = solve_spec(replace(spec, output=replace(spec.output, target="hf-trainer")))
    assert hf.feasible and hf.best is not None and hf.best.plan.long_context.sequence_parallel_size > 1
    trl = solve_spec(spec)
    assert not trl.feasible
    assert trl.closest is not None and not trl.closest.plan.long_context.active


def test_launch_sh_refuses_to_start_while_a_placeholder_is_left(tmp_path: Path) -> None:
    _, trl, _ = _bundles(_spec(tmp_path, "sft", "lora"))
    run = tmp_path / "run"
    run.mkdir()
    for name, text in trl.items():
        (run / name).write_text(text)
    done = subprocess.run(["bash", str(run / "launch.sh")], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 2
    assert "REQUIRED" in done.stderr and "model_name_or_path" in done.stderr


# ---- the bundle's own launch.sh, on 2 CPU ranks ----------------------------------------------

REWARDS = '''\
def length_reward(completions, **kwargs):
    """A trivial reward: longer completions score higher."""
    return [float(len(str(c))) for c in completions]
'''


def _tiny_model(folder: Path) -> None:
    """A tiny Llama with random weights and a word-level tokenizer, saved as from_pretrained reads it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.hf_trl_script import _tokenizer

    config = json.loads(TINY_LLAMA.read_text())
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(folder)
    _tokenizer(config["vocab_size"]).save_pretrained(folder)


def _dataset(path: Path, objective: str, vocab: int) -> None:
    import random

    rng = random.Random(0)

    def words(n: int) -> str:
        return " ".join(f"t{rng.randrange(2, vocab)}" for _ in range(n))

    rows: list[dict[str, str]] = []
    for _ in range(32):
        if objective == "sft":
            rows.append({"text": words(16)})
        elif objective == "dpo":
            rows.append({"prompt": words(8), "chosen": words(8), "rejected": words(8)})
        else:
            rows.append({"prompt": words(8)})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _fill(config: str, model: Path, data: Path, output: Path) -> str:
    """The placeholders filled as a user would: a local model folder, a local JSONL file, an output folder."""
    config = re.sub(r"^model_name_or_path: .*$", f"model_name_or_path: {model}", config, flags=re.M)
    datasets = f"datasets:\n- {{path: json, data_files: {data}, split: train}}"
    config = re.sub(r"^dataset_name: .*$", datasets, config, flags=re.M)
    config = re.sub(r"^output_dir: .*$", f"output_dir: {output}", config, flags=re.M)
    config = re.sub(r"^reward_funcs:\n- .*$", "reward_funcs:\n- rewards.length_reward", config, flags=re.M)
    assert PLACEHOLDER not in config
    return config


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("objective", ["sft", "dpo", "grpo"])
def test_the_trl_bundle_trains_two_steps_through_its_own_launch_sh(objective: str, tmp_path: Path) -> None:
    require_module("trl")
    require_module("peft")
    import torch

    from tests import ds_oracle

    plan, trl, _ = _bundles(_spec(tmp_path, objective, "lora"))
    run = tmp_path / "run"
    run.mkdir()
    model, data, output = tmp_path / "model", tmp_path / "data.jsonl", tmp_path / "output"
    _tiny_model(model)
    _dataset(data, objective, json.loads(TINY_LLAMA.read_text())["vocab_size"])
    for name, text in trl.items():
        (run / name).write_text(_fill(text, model, data, output) if name == "trl_config.yaml" else text)
    (run / "launch.sh").chmod(0o755)
    (run / "rewards.py").write_text(REWARDS)  # TRL imports a dotted reward path from the working directory
    # CPU ranks: the Trainer on the CPU, the last optimizer step saved (its DeepSpeed checkpoint)
    args = ["--use_cpu", "true", "--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]
    args += ["--logging_steps", "1", "--report_to", "none", "--seed", "1234"]
    log = ds_oracle.run_launch_script(run, None, args, cwd=tmp_path)
    state = json.loads((output / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2, log[-4000:]
    losses = [entry["loss"] for entry in state["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(abs(x) < 100 for x in losses), state["log_history"]
    engine_dir = output / "checkpoint-2" / "global_step2"
    # one ZeRO partition per rank: 2 data-parallel ranks
    assert sorted(p.name for p in engine_dir.glob("*optim_states.pt")) == [
        f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(2)
    ], sorted(p.name for p in engine_dir.iterdir())
    saved = torch.load(engine_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    ran = saved["ds_config"]  # the config DeepSpeed's engine ran with, the Trainer's "auto"s filled
    assert ran["train_micro_batch_size_per_gpu"] == plan.micro_batch_size
    assert ran["gradient_accumulation_steps"] == plan.gradient_accumulation_steps
    assert ran["train_batch_size"] == plan.deepspeed_train_batch_size == 8
    assert ran["zero_optimization"]["stage"] == plan.zero_stage
