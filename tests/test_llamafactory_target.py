"""The llamafactory target (issue 50): LLaMA-Factory's training YAML for the plan.

Checked with LLaMA-Factory's own ``get_train_args`` (0.9.5, in its own venv:
tests/llamafactory_oracle.py), which refuses any key its argument classes do not name: every
objective and method it trains parses, to the plan's batch split, sequence, adapter and
quantization. A misspelt key is refused, so the oracle can fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from dsgen.targets.own_script import PLACEHOLDER
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR

TINY_LLAMA = EXAMPLES_DIR / "tiny-llama" / "config.json"

SPEC = """\
model:
  hf_config: {config}
hardware: {{gpu: a100-80gb, gpus_per_node: 2, nodes: 1, cpu_memory_gib: 64}}
training:
  sequence_length: 64
  global_batch_size: 8
  precision: bf16
  attention: sdpa
  finetuning: {method}
  objective: {objective}
constraints: {{zero_stage: {stage}, offload_optimizer: none, activation_checkpointing: {checkpointing}, micro_batch_size: 2}}
output: {{target: llamafactory}}
"""

#: (objective, method, ZeRO stage, checkpointing) -> the stage and pref_loss LLaMA-Factory trains it with
CASES: dict[tuple[str, str, int, str], tuple[str, str]] = {
    ("sft", "lora", 2, "false"): ("sft", "sigmoid"),
    ("sft", "qlora", 3, "true"): ("sft", "sigmoid"),
    ("sft", "full", 3, "true"): ("sft", "sigmoid"),
    ("sft", "freeze", 2, "false"): ("sft", "sigmoid"),
    ("dpo", "lora", 2, "true"): ("dpo", "sigmoid"),
    ("orpo", "lora", 2, "false"): ("dpo", "orpo"),
    ("simpo", "lora", 1, "false"): ("dpo", "simpo"),
    ("kto", "lora", 2, "false"): ("kto", "sigmoid"),
    ("reward", "lora", 2, "false"): ("rm", "sigmoid"),
}


def _spec(folder: Path, objective: str, method: str, stage: int, checkpointing: str) -> Path:
    path = folder / "spec.yaml"
    path.write_text(
        SPEC.format(config=TINY_LLAMA, objective=objective, method=method, stage=stage, checkpointing=checkpointing)
    )
    return path


def _fill(text: str, output: Path) -> str:
    """The placeholders filled as a user would (nothing is loaded while parsing)."""
    values = {"model_name_or_path": "acme/tiny", "dataset": "identity", "template": "llama3", "output_dir": str(output)}
    for key, value in values.items():
        text = re.sub(rf"^{key}: .*$", f"{key}: {value}", text, flags=re.M)
    assert PLACEHOLDER not in text
    return text


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int, str], tuple[Any, dict[str, Any]]]:
    """Every case rendered, filled in and parsed by LLaMA-Factory in one process, with a
    misspelt key as the last file: (plan, what get_train_args made of it)."""
    from tests import llamafactory_oracle

    root = tmp_path_factory.mktemp("llamafactory")
    plans, files = [], []
    for index, case in enumerate(CASES):
        folder = root / str(index)
        folder.mkdir()
        spec = load_spec(_spec(folder, *case))
        plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
        bundle = render_bundle(spec, plan, "llamafactory", "none")
        assert set(bundle.files) == {"ds_config.json", "llamafactory.yaml"}
        (folder / "ds_config.json").write_text(bundle.files["ds_config.json"])
        (folder / "llamafactory.yaml").write_text(_fill(bundle.files["llamafactory.yaml"], folder / "out"))
        plans.append(plan)
        files.append(folder / "llamafactory.yaml")
    misspelt = root / "0" / "misspelt.yaml"
    misspelt.write_text(files[0].read_text().replace("cutoff_len:", "cutof_len:"))
    results = llamafactory_oracle.parse([*files, misspelt])
    out = {case: (plan, result) for case, plan, result in zip(CASES, plans, results, strict=False)}
    out[("misspelt", "", 0, "")] = (None, results[-1])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: "-".join(map(str, c)))
def test_llamafactory_parses_the_yaml_to_the_plan(
    case: tuple[str, str, int, str], parsed: dict[tuple[str, str, int, str], tuple[Any, dict[str, Any]]]
) -> None:
    plan, got = parsed[case]
    assert "error" not in got, got
    _, method, _, checkpointing = case
    assert (got["stage"], got["pref_loss"]) == CASES[case]
    assert got["finetuning_type"] == {"qlora": "lora"}.get(method, method)
    assert (got["per_device_train_batch_size"], got["gradient_accumulation_steps"]) == (2, 2)
    assert (plan.micro_batch_size, plan.gradient_accumulation_steps) == (2, 2)
    assert got["cutoff_len"] == 64 and got["deepspeed"] == "ds_config.json"
    assert got["bf16"] and not got["fp16"] and got["flash_attn"] == "sdpa"
    assert got["disable_gradient_checkpointing"] == (checkpointing != "true")
    if method in ("lora", "qlora"):
        # the spec's LoRA defaults (schemas/spec.schema.json), as LLaMA-Factory holds them
        assert (got["lora_rank"], got["lora_alpha"], got["lora_dropout"], got["lora_target"]) == (16, 32, 0.05, ["all"])
    assert got["quantization_bit"] == (4 if method == "qlora" else None)
    if method == "qlora":
        assert got["quantization_type"] == "nf4" and got["double_quantization"] is True
    if method == "freeze":
        assert got["freeze_trainable_layers"] == 2


@pytest.mark.slow
def test_llamafactory_refuses_a_key_it_does_not_name(
    parsed: dict[tuple[str, str, int, str], tuple[Any, dict[str, Any]]],
) -> None:
    _, got = parsed[("misspelt", "", 0, "")]
    assert "cutof_len" in got.get("error", ""), got


@pytest.mark.parametrize(("objective", "key"), [("grpo", "training.objective"), ("ppo", "training.objective")])
def test_what_llamafactory_cannot_train_is_refused_by_name(
    objective: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, objective, "lora", 2, "false")
    text = spec.read_text().replace("sequence_length: 64", "sequence_length: 768")  # GRPO/PPO: prompt + completion
    spec.write_text(text)
    result = run_cli(["new", str(spec), "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert key in result.stderr and not (tmp_path / "run").exists()


def test_llamafactory_starts_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, "sft", "lora", 2, "false")
    result = run_cli(["new", str(spec), "--launcher", "torchrun", "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 2 and "output.launcher" in result.stderr
    result = run_cli(["new", str(spec), "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 0, result.stderr
    assert "llamafactory-cli train llamafactory.yaml" in result.stdout
