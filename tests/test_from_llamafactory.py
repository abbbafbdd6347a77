"""``new``/``solve FILE --from llamafactory --spec cluster.yaml`` (issue 50): plan from the
LLaMA-Factory YAML a user already has, and write it back with the plan's keys set.

The YAMLs below have the shape of LLaMA-Factory's own examples (``examples/train_lora``,
``train_qlora``, ``train_full`` with ``ds_z3``): comments, section headers, keys dsgen never reads.
Checked: every line the plan does not decide comes back byte for byte; the plan equals ``solve`` on
the equivalent spec written by hand; ``doctor --llamafactory`` on the written files says it fits
with the same numbers; LLaMA-Factory's own parser reads the written YAML (slow: its own venv).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dsgen.plan import simplest_plan
from dsgen.targets.llamafactory import plan_keys
from tests.cli_helpers import run_cli

CLUSTER = "hardware: {gpu: h100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 1024}\n"

LORA_SFT = """\
### model
model_name_or_path: Qwen/Qwen2.5-7B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
deepspeed: examples/deepspeed/ds_z3_config.json  # copied from another repo

### dataset
dataset: identity,alpaca_en_demo
template: qwen
cutoff_len: 2048
max_samples: 1000

### output
output_dir: saves/qwen2.5-7b/lora/sft
logging_steps: 10

### train
per_device_train_batch_size: 8   # what crashed
gradient_accumulation_steps: 2
learning_rate: 1.0e-4
num_train_epochs: 3.0
bf16: true
"""

QLORA_DPO = """\
model_name_or_path: meta-llama/Llama-3.1-8B-Instruct
stage: dpo
do_train: true
finetuning_type: lora
lora_rank: 16
lora_target: all
pref_beta: 0.1
pref_loss: sigmoid
quantization_bit: 4
dataset: dpo_en_demo
template: llama3
cutoff_len: 4096
output_dir: saves/llama3-8b/qlora/dpo
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
bf16: true
"""

FULL_Z3 = """\
model_name_or_path: Qwen/Qwen2.5-14B
stage: sft
do_train: true
finetuning_type: full
deepspeed: examples/deepspeed/ds_z3_config.json
dataset: identity
template: qwen
cutoff_len: 4096
output_dir: saves/qwen-14b/full/sft
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
bf16: true
"""

#: name -> (YAML, the equivalent spec's training and constraints, written by hand)
CASES = {
    "lora-sft": (
        LORA_SFT,
        "model: {hf: Qwen/Qwen2.5-7B-Instruct}\n"
        "training: {sequence_length: 2048, global_batch_size: 128, precision: bf16, finetuning: lora,\n"
        "  lora: {rank: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}}\n"
        "constraints: {micro_batch_size: 8}\n",
    ),
    "qlora-dpo": (
        QLORA_DPO,
        "model: {hf: meta-llama/Llama-3.1-8B-Instruct}\n"
        "training: {sequence_length: 4096, global_batch_size: 128, precision: bf16, finetuning: qlora, objective: dpo,\n"
        "  lora: {rank: 16, alpha: 32, dropout: 0.0, target_modules: all-linear},\n"
        "  quantization: {bits: 4, type: nf4}}\n"
        "constraints: {micro_batch_size: 4}\n",
    ),
    "full-z3": (
        FULL_Z3,
        "model: {hf: Qwen/Qwen2.5-14B}\n"
        "training: {sequence_length: 4096, global_batch_size: 128, precision: bf16, finetuning: full}\n"
        "constraints: {micro_batch_size: 2}\n",
    ),
}


PLAN_SHAPE = simplest_plan("bf16")  # any plan: plan_keys names the same keys for all


def _keyed(text: str) -> dict[str, str]:
    """Each top-level line of a YAML by its key (comments and blank lines by their text)."""
    out = {}
    for line in text.splitlines():
        key = line.split(":", 1)[0] if line and not line.startswith(("#", " ")) and ":" in line else line
        out[key] = line
    return out


@pytest.fixture
def written(tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> dict[str, object]:
    name = request.param
    text, _ = CASES[name]
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / f"{name}.yaml").write_text(text)
    out = tmp_path / "run"
    args = ["new", str(tmp_path / f"{name}.yaml"), "--from", "llamafactory", "--spec", str(tmp_path / "cluster.yaml")]
    result = run_cli([*args, "-o", str(out), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    return {"name": name, "tmp": tmp_path, "out": out, "body": json.loads(result.stdout), "stdout": result.stdout}


@pytest.mark.parametrize("written", sorted(CASES), indirect=True)
def test_every_line_the_plan_does_not_decide_comes_back_byte_for_byte(written: dict[str, object]) -> None:
    name, out = str(written["name"]), Path(str(written["out"]))
    original = CASES[name][0]
    after = (out / f"{name}.yaml").read_text()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(
        ["ds_config.json", f"{name}.yaml"]
    )
    decided = set(plan_keys(PLAN_SHAPE, "ds_config.json"))  # the keys the plan decides
    before_lines, after_lines = _keyed(original), _keyed(after)
    for key, line in before_lines.items():
        if key not in decided:
            assert after_lines.get(key) == line, key
    body = written["body"]
    assert isinstance(body, dict)
    plan = body["plan"]
    values = yaml.safe_load(after)
    assert values["per_device_train_batch_size"] == plan["micro_batch_size"]
    assert values["gradient_accumulation_steps"] == plan["gradient_accumulation_steps"]
    assert values["deepspeed"] == "ds_config.json"
    assert values.get("disable_gradient_checkpointing", False) == (plan["activation_checkpointing"] == "none")
    if "# copied from another repo" in original:  # a plan key's own comment stays on its line
        assert "deepspeed: ds_config.json  # copied from another repo" in after


@pytest.mark.parametrize("written", sorted(CASES), indirect=True)
def test_the_plan_is_solves_on_the_equivalent_spec_and_the_doctor_says_it_fits_with_the_same_numbers(
    written: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    name, tmp, out = str(written["name"]), Path(str(written["tmp"])), Path(str(written["out"]))
    body = written["body"]
    assert isinstance(body, dict)
    equivalent = tmp / "equivalent.yaml"
    equivalent.write_text(CLUSTER + CASES[name][1] + "output: {target: llamafactory}\n")
    solved = run_cli(["solve", str(equivalent), "--json"], capsys)
    assert solved.exit_code == 0, solved.stderr
    assert json.loads(solved.stdout)["plan"] == body["plan"]
    doctor = run_cli(
        [
            "doctor",
            str(out / "ds_config.json"),
            "--llamafactory",
            str(out / f"{name}.yaml"),
            "--spec",
            str(tmp / "cluster.yaml"),
            "--json",
        ],
        capsys,
    )
    assert doctor.exit_code == 0, doctor.stdout + doctor.stderr
    diagnosis = json.loads(doctor.stdout)
    assert diagnosis["verdict"] == "fits"
    assert diagnosis["memory"]["gpu"]["total"] == body["memory"]["gpu"]["total"]  # to the byte
    assert diagnosis["memory"]["cpu"]["total"] == body["memory"]["cpu"]["total"]


def test_the_changed_keys_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "lf.yaml").write_text(LORA_SFT)
    args = ["new", str(tmp_path / "lf.yaml"), "--from", "llamafactory", "--spec", str(tmp_path / "cluster.yaml")]
    result = run_cli([*args, "-o", str(tmp_path / "run")], capsys)
    assert result.exit_code == 0, result.stderr
    assert "set deepspeed: examples/deepspeed/ds_z3_config.json -> ds_config.json" in result.stdout
    assert "llamafactory-cli train lf.yaml" in result.stdout


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--from", "llamafactory"], "--spec"),  # --from alone
        (["--from", "axolotl", "--spec", "{cluster}"], "--from"),
        (["--spec", "{cluster}"], "--from"),
    ],
)
def test_bad_from_arguments_are_refused_by_name(
    extra: list[str], key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "lf.yaml").write_text(LORA_SFT)
    args = [item.format(cluster=tmp_path / "cluster.yaml") for item in extra]
    for command in ("new", "solve"):
        output = ["-o", str(tmp_path / "run")] if command == "new" else []
        result = run_cli([command, str(tmp_path / "lf.yaml"), *args, *output], capsys)
        assert result.exit_code == 2, result.stdout + result.stderr
        assert key in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_bad_value_in_the_users_yaml_names_its_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "lf.yaml").write_text(LORA_SFT.replace("lora_rank: 8", "lora_rank: eight"))
    args = ["solve", str(tmp_path / "lf.yaml"), "--from", "llamafactory", "--spec", str(tmp_path / "cluster.yaml")]
    result = run_cli(args, capsys)
    assert result.exit_code == 2
    assert "lf.yaml:9: lora_rank" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_llamafactory_parses_each_written_yaml_to_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests import llamafactory_oracle

    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    files, plans = [], []
    for name, (text, _) in CASES.items():
        (tmp_path / f"{name}.yaml").write_text(text)
        out = tmp_path / name
        args = [
            "new",
            str(tmp_path / f"{name}.yaml"),
            "--from",
            "llamafactory",
            "--spec",
            str(tmp_path / "cluster.yaml"),
        ]
        result = run_cli([*args, "-o", str(out), "--json"], capsys)
        assert result.exit_code == 0, result.stderr
        files.append(out / f"{name}.yaml")
        plans.append(json.loads(result.stdout)["plan"])
    for plan, got in zip(plans, llamafactory_oracle.parse(files), strict=True):  # one process for all
        assert "error" not in got, got
        assert (got["per_device_train_batch_size"], got["gradient_accumulation_steps"]) == (
            plan["micro_batch_size"],
            plan["gradient_accumulation_steps"],
        )
        assert got["deepspeed"] == "ds_config.json"
        assert got["disable_gradient_checkpointing"] == (plan["activation_checkpointing"] == "none")
