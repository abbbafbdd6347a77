"""Robustness of the CLI's edges: OS failures while writing, a missing home directory, an
unambiguous JSON plan, honest preset columns, and where validate and errors send their messages."""

from __future__ import annotations

import errno
import json
import os
import pathlib
from pathlib import Path

import pytest

from tests.cli_helpers import run_cli
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "llama-3.1-8b-8xh100.yaml"

SWEEP = """\
base: base.yaml
name: "{{ model.preset }}-n{{ hardware.nodes }}"
zip:
  hardware.nodes: [1, 2]
  training.global_batch_size: [64, 128]
"""


def _sweep_file(tmp_path: Path) -> Path:
    """A small two-run sweep over the example spec, in a directory of its own."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "base.yaml").write_text(EXAMPLE.read_text(encoding="utf-8"), encoding="utf-8")
    sweep = src / "sweep.yaml"
    sweep.write_text(SWEEP, encoding="utf-8")
    return sweep


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# --- 1. OS errors while writing ------------------------------------------------------------------


def test_new_reports_an_os_error_while_writing_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(src: str, dst: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system", src)

    monkeypatch.setattr("dsgen.output.os.replace", read_only)
    monkeypatch.setattr("dsgen.output.os.link", read_only)  # the exclusive (no --force) final step
    out = tmp_path / "ds.json"
    result = run_cli(["new", str(EXAMPLE), "-o", str(out)], capsys)
    assert result.exit_code == 2
    assert f"error: cannot write {out}: Read-only file system" in result.stderr
    _no_traceback(result.stderr)
    assert list(tmp_path.iterdir()) == [], "no temporary file may be left"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_new_refuses_to_replace_a_non_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = run_cli(["new", str(EXAMPLE), "-o", str(fifo), "--force"], capsys)
    assert result.exit_code == 2 and "is not a regular file" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_sweep_into_an_unwritable_place_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["sweep", str(_sweep_file(tmp_path)), "-o", "/proc/dsgen-runs"], capsys)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: cannot write /proc/dsgen-runs: ")
    _no_traceback(result.stderr)


@pytest.mark.parametrize("target", [".", "..", "ABS_PARENT"])
def test_sweep_refuses_the_current_directory_and_its_ancestors(
    target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = _sweep_file(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("mine")
    monkeypatch.chdir(work)
    output = str(tmp_path) if target == "ABS_PARENT" else target
    result = run_cli(["sweep", str(sweep), "-o", output, "--force"], capsys)
    assert result.exit_code == 2
    assert "is the current directory or contains it" in result.stderr
    _no_traceback(result.stderr)
    assert (work / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "work"]


def test_sweep_refuses_to_replace_the_directory_holding_the_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _sweep_file(tmp_path)
    result = run_cli(["sweep", str(sweep), "-o", str(sweep.parent), "--force"], capsys)
    assert result.exit_code == 2 and "contains the sweep file" in result.stderr
    assert sweep.exists()


def test_sweep_publish_failure_restores_the_old_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = _sweep_file(tmp_path)
    out = tmp_path / "runs"
    assert run_cli(["sweep", str(sweep), "-o", str(out)], capsys).exit_code == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real_rename = os.rename

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        if Path(dst) == out and ".dsgen-staging-" in Path(src).name:
            raise OSError(errno.EBUSY, "Device or resource busy", str(src))
        real_rename(src, dst)

    monkeypatch.setattr("dsgen.output.os.rename", rename)
    result = run_cli(["sweep", str(sweep), "-o", str(out), "--force", "--fail-on-infeasible"], capsys)
    assert result.exit_code == 2
    assert f"error: cannot write {out}: Device or resource busy" in result.stderr
    _no_traceback(result.stderr)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before, "the previous output must be put back"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "src"], "no staging or retired directory"


def test_sweep_write_failure_leaves_no_staging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = _sweep_file(tmp_path)
    real_write_text = pathlib.Path.write_text

    def full_disk(self: Path, data: str, encoding: str | None = None) -> int:
        if self.name == "manifest.csv":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write_text(self, data, encoding=encoding)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    out = tmp_path / "runs"
    result = run_cli(["sweep", str(sweep), "-o", str(out)], capsys)
    assert result.exit_code == 2
    assert f"error: cannot write {out}: No space left on device" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


# --- 2. no home directory ------------------------------------------------------------------------


def test_render_works_without_a_home_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HOME unset and a uid with no passwd entry: Path.home() raises RuntimeError."""
    from dsgen.targets import render

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(pathlib.Path, "home", staticmethod(no_home))
    render._environment.cache_clear()
    try:
        assert render._bytecode_cache() is None
        out = tmp_path / "ds.json"
        # AutoTP pinned off: its subject is the plain ZeRO config, whose train_batch_size is the spec's batch
        result = run_cli(["new", str(EXAMPLE), "-o", str(out), "--set", "constraints.tensor_parallel_size=1"], capsys)
        assert result.exit_code == 0, result.stderr
        assert json.loads(out.read_text())["train_batch_size"] == 256
    finally:
        render._environment.cache_clear()  # the next test builds an environment with its cache


# --- 3. an unambiguous plan ----------------------------------------------------------------------


def test_ranked_plans_are_distinct_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    # (AutoTP pinned off: its plans would crowd the partial-offload ones out of the first 40)
    result = run_cli(["solve", str(EXAMPLE), "--set", "constraints.tensor_parallel_size=1", "--top", "40", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    ranked = [r["plan"] for r in json.loads(result.stdout)["ranked"]]
    assert len(ranked) == 40
    keys = [json.dumps(p, sort_keys=True) for p in ranked]
    assert len(set(keys)) == len(keys), "two ranked entries with the same plan object"
    ratios = {p["offload_optimizer_ratio"] for p in ranked if p["offload_optimizer"] == "cpu"}
    assert ratios >= {0.25, 1.0}
    assert all(p["offload_optimizer_ratio"] == 0.0 for p in ranked if p["offload_optimizer"] == "none")
    assert set(ranked[0]["zeropp"]) == {"hpz_partition_size", "quantized_weights", "quantized_gradients"}


def test_zeropp_settings_are_in_the_plan_and_the_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["solve", str(EXAMPLE), "--set", "hardware.nodes=4", "--top", "200", "--json"], capsys)
    assert result.exit_code == 0, result.stderr
    ranked = [r["plan"] for r in json.loads(result.stdout)["ranked"]]
    assert {p["zeropp"]["hpz_partition_size"] for p in ranked} == {1, 8}
    keys = [json.dumps(p, sort_keys=True) for p in ranked]
    assert len(set(keys)) == len(keys)

    dry = run_cli(["sweep", str(_sweep_file(tmp_path)), "--dry-run", "--json"], capsys)
    assert dry.exit_code == 0, dry.stderr
    rows = json.loads(dry.stdout)
    for row in rows:
        assert isinstance(row["offload_optimizer_ratio"], float)
        assert row["zeropp"] in {"none", "hpz", "hpz+qwz+qgz"}
        assert list(row)[-11:] == [
            "offload_optimizer_ratio",
            "zeropp",
            "verdict",
            "fill",
            "likely",
            "seq_parallel_communication_data_type",
            "files",
            "launcher",
            "launch_files",
            "tensor_parallel_size",
            "expert_parallel_size",
        ]


# --- 4. presets --------------------------------------------------------------------------------


def test_presets_show_no_bf16_peak_for_gpus_without_bf16(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(["presets", "gpus"], capsys)
    assert result.exit_code == 0
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert rows["v100-16gb"][3:5] == ["no", "-"]
    assert rows["t4"][3:5] == ["no", "-"]
    assert rows["h100-80gb"][3:5] == ["yes", "989"]


# --- 5. validate: where messages go ----------------------------------------------------------------


def test_validate_reports_unreadable_files_in_the_report_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.json"
    human = run_cli(["validate", str(missing)], capsys)
    assert human.exit_code == 2
    assert f"{missing}: cannot read file" in human.stdout and human.stderr == ""
    as_json = run_cli(["validate", str(missing), "--json"], capsys)
    assert as_json.exit_code == 2
    assert "cannot read file" in json.loads(as_json.stdout)["files"][0]["load_error"]
    usage = run_cli(["validate", str(missing), "--format", "xml"], capsys)
    assert usage.exit_code == 2 and usage.stdout == "" and usage.stderr.startswith("error: unknown --format")


# --- 6. errors: exit codes -------------------------------------------------------------------------


def test_each_error_exits_with_its_own_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dsgen import errors

    infeasible = run_cli(
        [
            "solve",
            str(EXAMPLE),
            "--set",
            "hardware.gpu=t4",
            "--set",
            "training.attention=sdpa",
            "--set",
            "constraints.offload_optimizer=none",
        ],
        capsys,
    )
    assert infeasible.exit_code == errors.ExitCode.INFEASIBLE == errors.InfeasibleError("x").exit_code
