"""dsgen sweep: expansion, naming, infeasible runs, all-or-nothing writing, determinism, and
DeepSpeed's own parser on every rendered config of a 50-run sweep."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from dsgen.errors import DsgenError
from dsgen.sweeps.runner import load_sweep
from tests.cli_helpers import run_cli
from tests.conftest import require_module

BASE = """\
model: {preset: llama-3.2-1b}
hardware: {gpu: a100-80gb, gpus_per_node: 8, nodes: 1, cpu_memory_gib: 512}
training: {sequence_length: 2048, global_batch_size: 64}
"""

SWEEP = """\
base: base.yaml
name: "{{ model.preset }}-s{{ training.sequence_length }}-n{{ hardware.nodes }}"
grid:
  model.preset: [llama-3.2-1b, qwen2.5-0.5b]
  training.sequence_length: [1024, 4096]
zip:
  hardware.nodes: [1, 2]
  training.global_batch_size: [64, 128]
"""


def write(tmp_path: Path, sweep: str = SWEEP, base: str = BASE) -> Path:
    (tmp_path / "base.yaml").write_text(base)
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep)
    return path


def test_grid_times_zip_expansion(tmp_path: Path) -> None:
    sweep = load_sweep(write(tmp_path))
    assert len(sweep.runs) == 2 * 2 * 2
    names = [r.name for r in sweep.runs]
    assert names[0] == "llama-3.2-1b-s1024-n1" and names[1] == "llama-3.2-1b-s1024-n2"
    assert len(set(names)) == 8
    second = sweep.runs[1]
    assert dict(second.varied) == {
        "model.preset": "llama-3.2-1b",
        "training.sequence_length": 1024,
        "hardware.nodes": 2,
        "training.global_batch_size": 128,
    }
    assert second.data["hardware"]["nodes"] == 2 and second.data["training"]["global_batch_size"] == 128
    assert sweep.varied_keys == (
        "model.preset",
        "training.sequence_length",
        "hardware.nodes",
        "training.global_batch_size",
    )


def test_writes_runs_and_manifests(tmp_path: Path, capsys) -> None:
    out = tmp_path / "runs"
    # AutoTP pinned off: its subject is the plain ZeRO configs, whose train_batch_size is the run's batch
    base = BASE + "constraints: {tensor_parallel_size: 1}\n"
    result = run_cli(["sweep", str(write(tmp_path, base=base)), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    assert "sweep: 8 runs, 8 feasible, 0 infeasible" in result.stdout
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    for row in rows:
        config = json.loads((out / row["files"][0]).read_text())
        assert config["train_batch_size"] == row["vars"]["training.global_batch_size"] == row["global_batch_size"]
        assert row["data_parallel_size"] == 8 * row["vars"]["hardware.nodes"]
        assert row["status"] == "ok" and row["gpu_memory_bytes"] > 0 and row["step_time_s"] > 0
    with (out / "manifest.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [r["name"] for r in table] == [r["name"] for r in rows]
    assert table[0]["training.sequence_length"] == "1024"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging directory may be left"


def test_rerun_is_byte_identical(tmp_path: Path, capsys) -> None:
    sweep = write(tmp_path)
    first, second = tmp_path / "a", tmp_path / "b"
    assert run_cli(["sweep", str(sweep), "-o", str(first)], capsys).exit_code == 0
    assert run_cli(["sweep", str(sweep), "-o", str(second)], capsys).exit_code == 0
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel


def test_existing_output_needs_force_and_dry_run_writes_nothing(tmp_path: Path, capsys) -> None:
    sweep = write(tmp_path)
    out = tmp_path / "runs"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    refused = run_cli(["sweep", str(sweep), "-o", str(out)], capsys)
    assert refused.exit_code == 2 and "already exists" in refused.stderr
    not_ours = run_cli(["sweep", str(sweep), "-o", str(out), "--force"], capsys)
    assert not_ours.exit_code == 2 and "is not a directory dsgen wrote" in not_ours.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and (out / "keep.txt").read_text() == "old"
    dry = run_cli(["sweep", str(sweep), "--dry-run"], capsys)
    assert dry.exit_code == 0 and "llama-3.2-1b-s4096-n2" in dry.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "runs", "sweep.yaml"]
    ours = tmp_path / "ours"
    assert run_cli(["sweep", str(sweep), "-o", str(ours)], capsys).exit_code == 0
    (ours / "stale.txt").write_text("from an older sweep")
    forced = run_cli(["sweep", str(sweep), "-o", str(ours), "--force"], capsys)
    assert forced.exit_code == 0, forced.stderr
    assert not (ours / "stale.txt").exists() and (ours / "manifest.jsonl").exists()


def test_published_directory_lists_what_dsgen_wrote(tmp_path: Path, capsys) -> None:
    """The marker file names every file of the sweep, so --force knows the directory is dsgen's."""
    out = tmp_path / "nested" / "runs"  # parents are created
    assert run_cli(["sweep", str(write(tmp_path)), "-o", str(out)], capsys).exit_code == 0
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".dsgen-output")
    assert json.loads((out / ".dsgen-output").read_text()) == on_disk
    assert len(on_disk) == 8 + 3  # one config per run, two manifests, the HTML report


def test_api_writes_the_same_directory_as_the_cli(tmp_path: Path, capsys) -> None:
    from dsgen.api import run_sweep_to

    sweep = write(tmp_path)
    assert run_cli(["sweep", str(sweep), "-o", str(tmp_path / "cli")], capsys).exit_code == 0
    seen: list[tuple[str, int]] = []
    result = run_sweep_to(sweep, tmp_path / "api", progress=lambda o, total: seen.append((o.run.name, total)))
    assert result.output == tmp_path / "api" and result.feasible == 8 and result.infeasible == 0
    assert [name for name, _ in seen] == [r["name"] for r in result.rows] and {t for _, t in seen} == {8}
    for path in (tmp_path / "cli").rglob("*"):
        if path.is_file():
            assert (tmp_path / "api" / path.relative_to(tmp_path / "cli")).read_bytes() == path.read_bytes()
    dry = run_sweep_to(sweep, None)
    assert dry.output is None and [r["files"] for r in dry.rows] == [[]] * 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["api", "base.yaml", "cli", "sweep.yaml"]


def test_infeasible_runs_are_recorded(tmp_path: Path, capsys) -> None:
    sweep = write(tmp_path, SWEEP.replace("qwen2.5-0.5b", "llama-3.1-405b"))
    out = tmp_path / "runs"
    result = run_cli(["sweep", str(sweep), "-o", str(out)], capsys)
    assert result.exit_code == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    bad = [r for r in rows if r["status"] == "infeasible"]
    assert bad and all(r["files"] == [] and "needs" in r["reason"] for r in bad)
    assert not (out / bad[0]["name"]).exists()
    assert f"{len(bad)} infeasible" in result.stdout
    strict = run_cli(["sweep", str(sweep), "-o", str(tmp_path / "strict"), "--fail-on-infeasible"], capsys)
    assert strict.exit_code == 3


@pytest.mark.parametrize(
    ("sweep_text", "expected"),
    [
        (
            SWEEP.replace("-n{{ hardware.nodes }}", ""),
            "sweep.yaml:2: name: run names collide: 'llama-3.2-1b-s1024' is produced by run 0 and run 1",
        ),
        (
            SWEEP.replace('name: "{{', 'name: "../{{'),
            "sweep.yaml:2: name: run 0 gets the unsafe directory name '../llama-3.2-1b-s1024-n1'",
        ),
        (SWEEP.replace('name: "{{', 'name: "x/{{'), "unsafe directory name 'x/llama-3.2-1b-s1024-n1'"),
        (
            SWEEP.replace("[1, 2]", "[1, 2, 4]"),
            "sweep.yaml:6: zip: zip lists must have the same length (hardware.nodes has 3, training.global_batch_size has 2)",
        ),
        (SWEEP.replace("grid:", "gird:"), "sweep.yaml:3: gird: unknown key 'gird' (did you mean 'grid'?)"),
        (SWEEP.replace("[1024, 4096]", "[1024, -5]"), "run 'llama-3.2-1b-s-5-n1'"),
        (
            SWEEP.replace("[1024, 4096]", "[1024, -5]"),
            "sweep.yaml:5: training.sequence_length: must be a positive integer, got -5",
        ),
        (SWEEP.replace("{{ model.preset }}", "{{ model.nope }}"), "sweep.yaml:2: name: name template"),
        (SWEEP.replace("base: base.yaml", "base: missing.yaml"), "sweep.yaml:1: base: cannot read base spec"),
    ],
    ids=[
        "collision",
        "dotdot",
        "slash",
        "zip-length",
        "unknown-key",
        "bad-value-run",
        "bad-value-line",
        "template",
        "base",
    ],
)
def test_bad_sweeps_fail_before_writing(tmp_path: Path, capsys, sweep_text: str, expected: str) -> None:
    sweep = write(tmp_path, sweep_text)
    out = tmp_path / "runs"
    result = run_cli(["sweep", str(sweep), "-o", str(out)], capsys)
    assert result.exit_code == 2, result
    assert expected in result.stderr.replace(str(tmp_path) + "/", ""), result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.yaml", "sweep.yaml"]


def test_inline_base_and_model_source_switch(tmp_path: Path) -> None:
    text = (
        "base:\n  model: {hf_config: cfg/config.json}\n  hardware: {gpu: l4, gpus_per_node: 2}\n"
        "  training: {sequence_length: 512, global_batch_size: 8}\n"
        'name: "run-{{ index }}"\n'
        "grid:\n  model.preset: [gpt2, bert-base]\n"
    )
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    sweep = load_sweep(path)
    assert [r.data["model"] for r in sweep.runs] == [{"preset": "gpt2"}, {"preset": "bert-base"}]
    assert [r.name for r in sweep.runs] == ["run-0", "run-1"]


def test_grid_and_zip_may_not_share_a_key(tmp_path: Path) -> None:
    with pytest.raises(DsgenError, match="varied in both grid and zip"):
        load_sweep(write(tmp_path, SWEEP + "  training.sequence_length: [1, 2]\n"))


def test_fifty_run_sweep_is_accepted_by_deepspeed(tmp_path: Path, capsys) -> None:
    require_module("deepspeed")
    from tests import ds_oracle

    text = (
        "base: base.yaml\n"
        'name: "{{ model.preset }}-{{ hardware.gpu }}-s{{ training.sequence_length }}-n{{ hardware.nodes }}"\n'
        "grid:\n"
        "  model.preset: [gpt2, llama-3.2-1b, qwen2.5-7b, mistral-7b, gemma-2-2b]\n"
        "  hardware.gpu: [a100-80gb, h100-80gb, v100-32gb, l4, mi300x]\n"
        "zip:\n  training.sequence_length: [1024, 4096]\n  hardware.nodes: [1, 2]\n"
    )
    out = tmp_path / "runs"
    result = run_cli(["sweep", str(write(tmp_path, text)), "-o", str(out)], capsys)
    assert result.exit_code == 0, result.stderr
    rows: list[dict[str, Any]] = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 50
    written = [r for r in rows if r["status"] == "ok"]
    assert len(written) >= 40
    for row in written:
        config = json.loads((out / row["files"][0]).read_text())
        ds_oracle.parse_with_deepspeed(config, row["data_parallel_size"])


def test_parallel_and_sequential_sweeps_agree(tmp_path: Path) -> None:
    from dsgen.sweeps.runner import manifest_row, run_sweep

    text = SWEEP.replace("[1024, 4096]", "[512, 1024, 2048, 4096, 8192]").replace(
        "[llama-3.2-1b, qwen2.5-0.5b]", "[llama-3.2-1b, qwen2.5-0.5b, gpt2, llama-3.1-8b]"
    )
    sweep = load_sweep(write(tmp_path, text))
    assert len(sweep.runs) == 40
    sequential = [manifest_row(sweep, o, []) for o in run_sweep(sweep, workers=1)]
    parallel = [manifest_row(sweep, o, []) for o in run_sweep(sweep, workers=2)]
    assert parallel == sequential
