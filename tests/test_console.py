"""The console entry (``python -m dsgen`` / the ``dsgen`` script) in a real process: everything
printed arrives whole through a pipe and the exit codes are the CLI's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "llama-3.1-8b-8xh100.yaml"


def _dsgen(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "dsgen", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_json_output_arrives_whole_through_a_pipe(tmp_path: Path) -> None:
    done = _dsgen("solve", str(EXAMPLE), "--json", "--top", "50", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)  # a truncated buffer would not parse
    assert body["feasible"] is True
    assert len(body["ranked"]) > 1


def test_new_writes_the_file_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "ds.json"
    # AutoTP pinned off: its subject is the plain ZeRO bundle, whose config states train_batch_size
    done = _dsgen("new", str(EXAMPLE), "-o", str(out), "--set", "constraints.tensor_parallel_size=1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith(f"wrote {out}")
    assert json.loads(out.read_text())["train_batch_size"] > 0


def test_exit_codes_reach_the_shell(tmp_path: Path) -> None:
    bad = _dsgen("new", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert bad.returncode == 2
    assert "spec file not found" in bad.stderr
    infeasible = _dsgen(
        "solve",
        str(EXAMPLE),
        "--set",
        "hardware.gpu=t4",
        "--set",
        "training.attention=sdpa",  # the example writes flash, which a T4 cannot run (exit 2)
        "--set",
        "constraints.offload_optimizer=none",
        cwd=tmp_path,
    )
    assert infeasible.returncode == 3, infeasible.stderr
    usage = _dsgen(cwd=tmp_path)
    assert usage.returncode == 2
    assert "Commands:" in usage.stdout + usage.stderr


def test_the_heap_is_frozen_at_exit_not_while_the_caller_still_runs(tmp_path: Path) -> None:
    """``main`` skips the collector's passes at interpreter exit (docs/start-up.md) without
    leaving a frozen heap to an in-process caller, and the caller's own exit handlers still run."""
    probe = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))  # runs after main's
from dsgen.cli import main
for _ in range(2):
    sys.argv = ["dsgen", "presets", "gpus"]
    try:
        main()
    except SystemExit:
        pass
print("frozen after main:", gc.get_freeze_count() > 0)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("h100-80gb") == 2  # both commands printed their table
    assert done.stdout.rstrip().endswith("frozen after main: False\nfrozen at exit: True")
