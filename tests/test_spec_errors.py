"""Bad specs: one clear message naming the key path and YAML line, exit code 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
        "spec.yaml:1: model: give exactly one of preset, hf, hf_config or architecture (got preset, hf_config)",
        [],
    ),
    (
        "missing-hf-config",
        replace_line(GOOD, "preset: llama-3.1-8b", "hf_config: nowhere/config.json"),
        "spec.yaml:2: model.hf_config: file not found",
        [],
    ),
    (  # the file system refuses the name (ENAMETOOLONG): once a traceback from Path.is_dir
        "hf-config-name-too-long",
        replace_line(GOOD, "preset: llama-3.1-8b", "hf_config: " + "x" * 300),
        "spec.yaml:2: model.hf_config: cannot read ",
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
    # AutoTP pinned off: then every one of the 2 x 8 GPUs is a data-parallel rank
    result = run_cli(["solve", str(spec), "--json", "--set", "constraints.tensor_parallel_size=1"], capsys)
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


# The spec's sections and their keys, read from the schema the loader enforces (not from dsgen's code).
SPEC_SCHEMA: dict[str, Any] = json.loads((Path(__file__).parents[1] / "schemas" / "spec.schema.json").read_text())
SECTION_KEYS: dict[str, list[str]] = {
    name: list(sub["properties"]) for name, sub in SPEC_SCHEMA["properties"].items() if "properties" in sub
}


def misspell(key: str) -> str:
    """``key`` with two neighbouring, different letters swapped near its end (``sequence_lenght``)."""
    for i in range(len(key) - 2, -1, -1):
        if key[i] != key[i + 1] and "_" not in key[i : i + 2]:
            return key[:i] + key[i + 1] + key[i] + key[i + 2 :]
    raise AssertionError(f"cannot misspell {key!r}")


def section_lines(text: str, section: str) -> tuple[int, int]:
    """(index of ``section:``'s line, index one past its last indented line) in ``text``'s lines."""
    lines = text.splitlines()
    start = lines.index(f"{section}:")
    end = start + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return start, end


def with_line(text: str, section: str | None, line: str) -> tuple[str, int]:
    """``text`` with ``line`` added at the end of ``section`` (at the top level for None, and the
    section started if ``text`` lacks it), and the 1-based line number it landed on."""
    lines = text.splitlines()
    if section is None:
        lines.append(line)
        return "\n".join(lines) + "\n", len(lines)
    if f"{section}:" not in lines:
        lines.append(f"{section}:")
    _, end = section_lines("\n".join(lines), section)
    lines.insert(end, f"  {line}")
    return "\n".join(lines) + "\n", end + 1


def present_line(text: str, section: str, key: str) -> int | None:
    """The 0-based index of ``key``'s line inside ``section`` of ``text``, or None."""
    start, end = section_lines(text, section) if f"\n{section}:" in "\n" + text else (0, 0)
    lines = text.splitlines()
    return next((i for i in range(start + 1, end) if lines[i].startswith(f"  {key}:")), None)


MISSPELT = [(section, key) for section, keys in SECTION_KEYS.items() for key in keys]


@pytest.mark.parametrize(("section", "key"), MISSPELT, ids=[f"{s}.{k}" for s, k in MISSPELT])
def test_misspelt_key_names_the_key_it_meant(tmp_path: Path, capsys, section: str, key: str) -> None:
    """Every key of every section, misspelt where it is written (or added misspelt): one message, at
    the misspelt key's own line, naming the key it was meant to be. A misspelt required key
    (``training.sequence_lenght``) is reported this way, not as the missing ``sequence_length``."""
    typo = misspell(key)
    at = present_line(GOOD, section, key)
    if at is not None:
        lines = GOOD.splitlines()
        lines[at] = lines[at].replace(f"  {key}:", f"  {typo}:", 1)
        text, line = "\n".join(lines) + "\n", at + 1
    else:
        text, line = with_line(GOOD, section, f"{typo}: 1")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2, result
    message = result.stderr.replace(str(tmp_path) + "/", "")
    expected = f"spec.yaml:{line}: {section}.{typo}: unknown key {typo!r} (did you mean {key!r}?)"
    assert expected in message, message
    assert message.count("error:") == 1 and "Traceback" not in message, message
    assert "missing required key" not in message, message


def test_the_issues_misspelt_required_key(tmp_path: Path, capsys) -> None:
    """The exact case from the issue: ``sequence_lenght`` used to be 'missing required key'."""
    assert "sequence_length" in SPEC_SCHEMA["properties"]["training"]["required"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(replace_line(GOOD, "sequence_length: 4096", "sequence_lenght: 4096"))
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2, result
    line = GOOD.splitlines().index("  sequence_length: 4096") + 1
    assert f"spec.yaml:{line}: training.sequence_lenght: unknown key 'sequence_lenght'" in result.stderr
    assert "did you mean 'sequence_length'?" in result.stderr


MISPLACED = [
    (home, key, wrong)
    for home, keys in SECTION_KEYS.items()
    for key in keys
    for wrong in ("hardware" if home == "training" else "training", None)
]


@pytest.mark.parametrize(("home", "key", "wrong"), MISPLACED, ids=[f"{w or 'top'}.{k}->{h}" for h, k, w in MISPLACED])
def test_key_in_the_wrong_section_points_to_its_home(
    tmp_path: Path, capsys, home: str, key: str, wrong: str | None
) -> None:
    """Every key of every section, written in another section (or at the top level): one message,
    at that line, naming the section the schema defines it in."""
    text, line = with_line(GOOD, wrong, f"{key}: 1")
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2, result
    message = result.stderr.replace(str(tmp_path) + "/", "")
    where = f"{wrong}.{key}" if wrong else key
    assert f"spec.yaml:{line}: {where}: unknown key {key!r}" in message, message
    assert f"{home}.{key}" in message.splitlines()[0], message
    assert message.count("error:") == 1 and "Traceback" not in message, message


def test_moved_required_key_is_not_reported_missing(tmp_path: Path, capsys) -> None:
    """``gpus_per_node`` moved from hardware to training: the message is about where it went (the
    cause), not about hardware lacking it (hardware's line comes first in the file)."""
    lines = [ln for ln in GOOD.splitlines() if ln != "  gpu: h100-80gb"]
    text, line = with_line("\n".join(lines) + "\n", "training", "gpu: h100-80gb")
    assert "gpu" in SPEC_SCHEMA["properties"]["hardware"]["required"]
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2, result
    message = result.stderr.replace(str(tmp_path) + "/", "")
    assert f"spec.yaml:{line}: training.gpu: unknown key 'gpu'" in message, message
    assert "hardware.gpu" in message and "missing required key" not in message, message
