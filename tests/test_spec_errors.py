"""Bad specs: one clear message naming the key path and YAML line, exit code 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

GOOD = """\
model:
  preset: llama-3.1-8b
hardware:
  gpu: h100-80gb
  gpus_per_node: 8
  nodes: 1
  cpu_memory_gib: 1024
training:
  sequence_length: 4096
  global_batch_size: 256
  precision: auto
  optimizer: {type: adamw, lr: 2.0e-5}
constraints:
  memory_headroom: 0.10
"""


def replace_line(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# (id, spec text, expected "line: path: message" fragment, extra CLI args)
CASES = [
    (
        "negative-gpus",
        replace_line(GOOD, "gpus_per_node: 8", "gpus_per_node: -3"),
        "spec.yaml:5: hardware.gpus_per_node: must be a positive integer, got -3",
        [],
    ),
    (
        "unknown-key",
        replace_line(GOOD, "gpus_per_node: 8", "gpus_per_nod: 8"),
        "spec.yaml:5: hardware.gpus_per_nod: unknown key 'gpus_per_nod' (did you mean 'gpus_per_node'?)",
        [],
    ),
    (
        "duplicate-key",
        replace_line(GOOD, "  nodes: 1\n", "  nodes: 1\n  nodes: 2\n"),
        "spec.yaml:7: hardware.nodes: duplicate key (first defined on line 6)",
        [],
    ),
    (
        "unknown-gpu",
        replace_line(GOOD, "gpu: h100-80gb", "gpu: h100-80"),
        "spec.yaml:4: hardware.gpu: unknown GPU preset 'h100-80'",
        [],
    ),
    (
        "unknown-model",
        replace_line(GOOD, "preset: llama-3.1-8b", "preset: llama-3.1-9b"),
        "spec.yaml:2: model.preset: unknown model preset 'llama-3.1-9b'",
        [],
    ),
    (
        "string-number",
        replace_line(GOOD, "sequence_length: 4096", 'sequence_length: "4096"'),
        "spec.yaml:9: training.sequence_length: must be a positive integer, got '4096'",
        [],
    ),
    (
        "bad-enum",
        replace_line(GOOD, "precision: auto", "precision: bf17"),
        "spec.yaml:11: training.precision: must be one of 'auto', 'bf16', 'fp16', 'fp32', got 'bf17' (did you mean 'bf16'?)",
        [],
    ),
    (
        "bf16-on-v100",
        replace_line(replace_line(GOOD, "gpu: h100-80gb", "gpu: v100-32gb"), "precision: auto", "precision: bf16"),
        "spec.yaml:11: training.precision: bf16 is not supported by v100-32gb",
        [],
    ),
    (
        "two-model-sources",
        replace_line(GOOD, "  preset: llama-3.1-8b\n", "  preset: llama-3.1-8b\n  hf_config: x.json\n"),
        "spec.yaml:1: model: give exactly one of preset, hf_config or architecture (got preset, hf_config)",
        [],
    ),
    (
        "missing-hf-config",
        replace_line(GOOD, "preset: llama-3.1-8b", "hf_config: nowhere/config.json"),
        "spec.yaml:2: model.hf_config: file not found",
        [],
    ),
    (
        "indivisible-batch",
        replace_line(GOOD, "global_batch_size: 256", "global_batch_size: 250"),
        "spec.yaml:10: training.global_batch_size: 250 sequences cannot be split evenly over 8 data-parallel GPUs",
        [],
    ),
    (
        "param-offload-below-stage3",
        GOOD + "  zero_stage: 1\n  offload_param: cpu\n",
        "spec.yaml:16: constraints.offload_param: parameter offload needs ZeRO stage 3",
        [],
    ),
    (
        "nvme-without-nvme",
        GOOD + "  offload_optimizer: nvme\n",
        "spec.yaml:15: constraints.offload_optimizer: nvme offload needs hardware.nvme",
        [],
    ),
    (
        "missing-required",
        replace_line(GOOD, "  sequence_length: 4096\n", ""),
        "spec.yaml:8: training: missing required key 'sequence_length'",
        [],
    ),
    ("yaml-syntax", replace_line(GOOD, "  nodes: 1\n", "  nodes: [1\n"), "spec.yaml:7: invalid YAML", []),
    (
        "headroom-range",
        replace_line(GOOD, "memory_headroom: 0.10", "memory_headroom: 1.5"),
        "spec.yaml:14: constraints.memory_headroom: must be a number >= 0 and < 1, got 1.5",
        [],
    ),
    (
        "micro-not-divisor",
        GOOD + "  micro_batch_size: 5\n",
        "spec.yaml:15: constraints.micro_batch_size: 5 does not divide the 32 sequences",
        [],
    ),
    (
        "gpu-mapping-typo",
        replace_line(GOOD, "gpu: h100-80gb", "gpu: {memory_gb: 80}"),
        "spec.yaml:4: hardware.gpu.memory_gb: unknown key 'memory_gb' (did you mean 'memory_gib'?)",
        [],
    ),
    (
        "python-tag",
        replace_line(GOOD, "nodes: 1", "nodes: !!python/object:os.system 1"),
        "spec.yaml:6: hardware.nodes: unsupported YAML value",
        [],
    ),
    ("not-a-mapping", "- just\n- a list\n", "spec.yaml:1: the spec must be a YAML mapping", []),
    (
        "set-override-type",
        GOOD,
        "--set: training.sequence_length: must be a positive integer, got 0",
        ["--set", "training.sequence_length=0"],
    ),
    (
        "set-override-format",
        GOOD,
        "--set 'training.sequence_length': expected KEY.PATH=VALUE",
        ["--set", "training.sequence_length"],
    ),
    (
        "list-too-short",
        replace_line(GOOD, "lr: 2.0e-5}", "lr: 2.0e-5, betas: [0.9]}"),
        "spec.yaml:12: training.optimizer.betas: must be a list of exactly 2 items, got 1",
        [],
    ),
    (
        "infinite-number",
        replace_line(GOOD, "cpu_memory_gib: 1024", "cpu_memory_gib: .inf"),
        "spec.yaml:7: hardware.cpu_memory_gib: must be a finite number, got inf",
        [],
    ),
    (
        "not-a-number",
        replace_line(GOOD, "memory_headroom: 0.10", "memory_headroom: .nan"),
        "spec.yaml:14: constraints.memory_headroom: must be a finite number, got nan",
        [],
    ),
    (
        "huge-integer",
        replace_line(GOOD, "nodes: 1", "nodes: " + "9" * 400),
        "spec.yaml:6: hardware.nodes: must be at most 2**53 in magnitude, got an integer of 1329 bits",
        [],
    ),
    (
        "empty-string",
        GOOD + "output: {path: ''}\n",
        "spec.yaml:15: output.path: must be a non-empty string, got ''",
        [],
    ),
    (
        "merge-key",
        "d: &d {gpus_per_node: 8}\n" + replace_line(GOOD, "  gpu: h100-80gb\n", "  <<: *d\n  gpu: h100-80gb\n"),
        "spec.yaml:5: hardware: YAML merge keys (<<) are not supported here",
        [],
    ),
    (
        "recursive-alias",
        replace_line(GOOD, "constraints:\n  memory_headroom: 0.10\n", "constraints: &c {x: *c}\n"),
        "spec.yaml:13: constraints.x: a YAML alias refers to a mapping or list that contains it",
        [],
    ),
    (
        "tagged-key",
        replace_line(GOOD, "  nodes: 1\n", "  !!python/name:os.system nodes: 1\n"),
        "spec.yaml:6: hardware: unsupported YAML key",
        [],
    ),
    (
        "set-replaces-a-mapping",
        GOOD,
        "--set: hardware.gpus_per_node: must be a positive integer, got -3",
        ["--set", "hardware={gpu: h100-80gb, gpus_per_node: -3}"],
    ),
    (
        "set-key-fails-the-solver",
        GOOD,
        "--set: training.global_batch_size: 12 sequences cannot be split evenly over 8 data-parallel GPUs",
        ["--set", "training.global_batch_size=12"],
    ),
    (
        "first-error-in-the-file-wins",
        replace_line(replace_line(GOOD, "gpus_per_node: 8", "zpus_per_node: 8"), "nodes: 1", "apu: 1"),
        "spec.yaml:5: hardware.zpus_per_node: unknown key",
        [],
    ),
]


def test_whole_number_floats_are_integers(tmp_path: Path, capsys) -> None:
    """JSON Schema counts 2.0 as an integer; the solver must then get the int 2, not crash on it."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(replace_line(GOOD, "nodes: 1", "nodes: 2.0"))
    result = run_cli(["solve", str(spec), "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["plan"]["data_parallel_size"] == 16


@pytest.mark.parametrize(("text", "expected", "extra"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_spec_is_one_clear_error(tmp_path: Path, capsys, text: str, expected: str, extra: list[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    out = tmp_path / "ds_config.json"
    result = run_cli(["new", str(spec), "-o", str(out), *extra], capsys)
    assert result.exit_code == 2, result
    message = result.stderr.replace(str(tmp_path) + "/", "")
    assert expected in message, message
    assert "Traceback" not in result.stderr
    assert not out.exists(), "no output may be written for a bad spec"
    assert list(tmp_path.iterdir()) == [spec], "no temporary files may be left behind"


def test_cases_are_distinct() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 15


def test_existing_output_is_not_overwritten(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD)
    out = tmp_path / "ds_config.json"
    out.write_text("precious\n")
    result = run_cli(["new", str(spec), "-o", str(out)], capsys)
    assert result.exit_code == 2
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert out.read_text() == "precious\n"
    forced = run_cli(["new", str(spec), "-o", str(out), "--force"], capsys)
    assert forced.exit_code == 0, forced.stderr
    assert out.read_text().startswith("{")


def test_missing_spec_file(tmp_path: Path, capsys) -> None:
    result = run_cli(["solve", str(tmp_path / "absent.yaml")], capsys)
    assert result.exit_code == 2
    assert "spec file not found" in result.stderr


def test_absurdly_nested_hf_config_is_a_clear_error(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    spec = tmp_path / "spec.yaml"
    spec.write_text(replace_line(GOOD, "preset: llama-3.1-8b", f"hf_config: {tmp_path / 'config.json'}"))
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2, result
    assert "config.json: invalid JSON: nested too deeply" in result.stderr
    assert "Traceback" not in result.stderr
