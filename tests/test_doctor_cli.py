"""``dsgen doctor`` as a user runs it: docs/my-run-crashed.md's commands, the JSON contract, --fix, bad input."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from dsgen.doctor.keys import get
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND
from tests.cli_helpers import run_cli
from tests.conftest import REPO_ROOT

EXAMPLE = ["doctor", "examples/doctor/ds_config.json", "--spec", "examples/doctor/cluster.yaml"]


@pytest.fixture
def in_repo_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A scratch working directory that sees the repository's examples (the docs' paths are relative)."""
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def readme_commands() -> list[list[str]]:
    section = (REPO_ROOT / "docs" / "my-run-crashed.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0] == "dsgen"
            commands.append(words[1:])
    return commands


def test_readme_section_covers_every_mode() -> None:
    joined = " ".join(" ".join(c) for c in readme_commands())
    for flag in ("--json", "--fix", "--training-args", "--world-size", "--error"):
        assert flag in joined


@pytest.mark.parametrize("args", readme_commands(), ids=lambda a: " ".join(a[3:]) or "plain")
def test_readme_commands_work_as_written(
    args: list[str], in_repo_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_cli(args, capsys)
    assert "Traceback" not in result.stderr
    if "--fix" in args:
        assert result.exit_code == 0, result.stderr
        assert (in_repo_copy / "fixed.json").is_file()
    elif "--world-size" in args:
        assert result.exit_code == 1  # 64 sequences cannot be micro 4 x accumulation 2 on 16 GPUs
        assert "64 != 4 * 2 * 16" in result.stdout
    else:
        assert result.exit_code == 3, result.stderr  # the example is a run that ran out of memory
    if "--json" in args:
        body = json.loads(result.stdout)
        assert body["verdict"] == "oom"
        assert set(body) >= {"verdict", "memory", "step_time_s", "findings", "fixes"}
        assert body["memory"]["gpu"]["total"] > body["memory"]["gpu"]["usable"]
        assert body["fill"] > 1 and body["band"]["low"] == 1.0 and body["safe_line"] == 0.9
        for fix in body["fixes"]:
            assert set(fix) >= {"changes", "config", "memory_gpu_total", "step_time_s", "script_changes"}
            assert fix["memory_gpu_total"] <= body["safe_line"] * body["memory"]["gpu"]["capacity"]
        # fastest first; within the tie band, fewer changes first (dsgen.doctor.fixes.order_fixes)
        fixes = body["fixes"]
        for i, fix in enumerate(fixes):
            for later in fixes[i + 1 :]:
                tied = fix["step_time_s"] <= later["step_time_s"] * (1 + STEP_TIME_TIE_BAND)
                assert later["step_time_s"] >= fix["step_time_s"] or tied
    if "--error" in args:
        assert "transient" in result.stdout and "expandable_segments:True" in result.stdout
    if "--json" not in args and "--fix" not in args and result.exit_code == 3:
        # each key a fix changes reads as the JSON file spells it: old -> new, "(unset)" if absent
        changes = [line for line in result.stdout.splitlines() if line.startswith("       ") and " -> " in line]
        assert changes, result.stdout
        for line in changes:
            old, new = line.split(": ", 1)[1].split(" -> ")
            for value in (new,) if old == "(unset)" else (old, new):
                json.loads(value)  # raises on Python's spellings: None, True, 'cpu'


def test_fix_writes_only_the_changed_keys(in_repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli([*EXAMPLE, "--json", "--fix", "-o", "fixed.json"], capsys)
    assert result.exit_code == 0, result.stderr
    best = json.loads(result.stdout)["fixes"][0]
    original = json.loads((REPO_ROOT / "examples/doctor/ds_config.json").read_text())
    fixed = json.loads((in_repo_copy / "fixed.json").read_text())
    assert fixed == best["config"]
    assert list(fixed)[: len(original)] == list(original)
    for key in ("gradient_clipping", "bf16.enabled", "zero_optimization.allgather_partitions", "train_batch_size"):
        if key not in best["changes"]:  # (an AutoTP fix changes train_batch_size: DeepSpeed counts TP peers)
            assert get(fixed, key) == get(original, key)
    for key, value in best["changes"].items():
        assert get(fixed, key) == value


def test_fix_refuses_to_overwrite(in_repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_repo_copy / "fixed.json").write_text("keep me")
    result = run_cli([*EXAMPLE, "--fix", "-o", "fixed.json"], capsys)
    assert result.exit_code == 2
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert (in_repo_copy / "fixed.json").read_text() == "keep me"
    assert run_cli([*EXAMPLE, "--fix", "-o", "fixed.json", "--force"], capsys).exit_code == 0
    assert json.loads((in_repo_copy / "fixed.json").read_text())["zero_optimization"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["doctor", "missing.json", "--spec", "examples/doctor/cluster.yaml"], "missing.json"),
        (["doctor", "examples/doctor/ds_config.json", "--spec", "missing.yaml"], "missing.yaml"),
        ([*EXAMPLE, "--fix"], "--output"),
        ([*EXAMPLE, "-o", "x.json"], "--fix"),
        ([*EXAMPLE, "--world-size", "0"], "--world-size"),
        ([*EXAMPLE, "--error", "segmentation fault"], "--error"),
        ([*EXAMPLE, "--training-args", "examples/doctor/cluster.yaml"], "invalid JSON"),
    ],
)
def test_bad_input_exits_2_with_one_message(
    args: list[str], words: str, in_repo_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_cli(args, capsys)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert not (in_repo_copy / "x.json").exists()


def test_bad_config_json_names_the_line(in_repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_repo_copy / "bad.json").write_text('{\n  "zero_optimization": {"stage": 2,,}\n}\n')
    result = run_cli(["doctor", "bad.json", "--spec", "examples/doctor/cluster.yaml"], capsys)
    assert result.exit_code == 2
    assert "bad.json:2" in result.stderr


def test_fitting_config_exits_0_and_writes_nothing(in_repo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((REPO_ROOT / "examples/doctor/ds_config.json").read_text())
    config["zero_optimization"]["stage"] = 3
    config["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    config["train_micro_batch_size_per_gpu"] = 1
    config["gradient_accumulation_steps"] = 8
    (in_repo_copy / "z3.json").write_text(json.dumps(config))
    # the script checkpoints activations: without, the run is predicted at 99 % (tight, exit 3)
    args = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 8, "bf16": True}
    (in_repo_copy / "args.json").write_text(json.dumps({**args, "gradient_checkpointing": True}))
    spec_args = ["--spec", "examples/doctor/cluster.yaml", "--training-args", "args.json"]
    result = run_cli(["doctor", "z3.json", *spec_args, "--fix", "-o", "out.json"], capsys)
    assert result.exit_code == 0, result.stdout
    assert "FITS" in result.stdout and "nothing written" in result.stdout
    assert not (in_repo_copy / "out.json").exists()


def test_host_ram_the_spec_does_not_state_is_not_judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen2.5-72B with ZeRO-3 and everything offloaded needs over 1 TiB of host RAM per node. On a
    cluster spec that states no host RAM the doctor prices the schema's 512 GiB, but does not call
    host-oom on it: the verdict is the GPU's (exit 0), and a warning says what the host needs and
    that its size was assumed. Stated as 512 GiB, the same config is host-oom (exit 3)."""
    spec = tmp_path / "cluster.yaml"
    cluster = (
        "model: {preset: qwen2.5-72b}\n"
        "hardware: {gpu: a100-40gb, gpus_per_node: 8%s}\n"
        "training: {sequence_length: 2048, global_batch_size: 8}\n"
        "constraints: {activation_checkpointing: true}\n"
    )
    spec.write_text(cluster % "")
    config = tmp_path / "ds_config.json"
    offload = {"device": "cpu", "pin_memory": True}
    zero = {"stage": 3, "offload_optimizer": offload, "offload_param": offload}
    config.write_text(json.dumps({"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": zero}))
    text = run_cli(["doctor", str(config), "--spec", str(spec)], capsys)
    assert text.exit_code == 0, text.stdout
    assert "host RAM not judged" in text.stdout.splitlines()[0]
    assert "hardware.cpu_memory_gib not set: 512.0 GiB per node assumed" in text.stdout
    assert "offloaded model states" in text.stdout
    body = json.loads(run_cli(["doctor", str(config), "--spec", str(spec), "--json"], capsys).stdout)
    assert body["verdict"] == "fits"
    assert [f["severity"] for f in body["findings"] if f["code"] == "host-memory"] == ["warning"]
    assert body["memory"]["cpu"]["capacity_assumed"] is True
    assert body["memory"]["cpu"]["model_states"] > 70e9 * 12  # fp32 master and Adam moments of 72B
    spec.write_text(cluster % ", cpu_memory_gib: 512")
    stated = run_cli(["doctor", str(config), "--spec", str(spec), "--json"], capsys)
    assert stated.exit_code == 3
    assert json.loads(stated.stdout)["verdict"] == "host-oom"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"per_device_eval_batch_size": "8"}, "per_device_eval_batch_size: must be an integer of at least 1, got '8'"),
        ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size: must be an integer of at least 1, got 0"),
        ({"eval_strategy": "sometimes"}, "eval_strategy: must be one of no, steps, epoch, got 'sometimes'"),
        ({"evaluation_strategy": 1}, "evaluation_strategy: must be one of no, steps, epoch"),
        ({"do_eval": "yes"}, "do_eval: must be true or false"),
        ({"optim": ["adamw_torch"]}, "optim: must be a non-empty string"),
        ({"max_length": "2048"}, "max_length: must be an integer of at least 1 or null"),
        ({"max_seq_length": 0}, "max_seq_length: must be an integer of at least 1 or null"),
        ({"packing": 1}, "packing: must be true or false"),
    ],
)
def test_bad_trainer_arguments_exit_2_naming_the_field(
    args: dict[str, Any], field: str, in_repo_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (in_repo_copy / "args.json").write_text(json.dumps(args))
    result = run_cli([*EXAMPLE, "--training-args", "args.json"], capsys)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    # one line naming the file, its line and the field once (the reader of a run's own files)
    assert f"args.json:1: {field}" in result.stderr and "Traceback" not in result.stderr
