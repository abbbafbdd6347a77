"""bench/gpu_peak.py runs end to end on CPU with a tiny model: the same code a GPU run takes
(DeepSpeed's accelerator API gives torch.cuda's counters there), so the GPU script is ready."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, bench_module, require_module


@pytest.mark.slow
def test_cpu_smoke_writes_measured_beside_predicted(tmp_path: Path) -> None:
    require_module("deepspeed")
    require_module("transformers")
    out = tmp_path / "peak.json"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "gpu_peak.py"), "--cpu-smoke", "--steps", "2", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 1
    row = rows[0]
    assert row["max_memory_allocated_gib"] > 0 and row["max_memory_reserved_gib"] >= row["max_memory_allocated_gib"]
    assert row["predicted_gpu_gib"] > 0 and row["measured_step_s"] > 0
    assert row["plan"].startswith("ZeRO-2")


def test_only_a_gpu_run_writes_the_gpu_figures_file(tmp_path: Path) -> None:
    """The CPU smoke prints its rows and writes them only where --out says: its counters are the
    process's, and bench/data/gpu_peak.json holds the GPU figures the docs cite."""
    bench = bench_module("gpu_peak")
    figures = REPO_ROOT / "bench" / "data" / "gpu_peak.json"
    assert bench.output_path(None, cpu_smoke=False) == figures
    assert bench.output_path(None, cpu_smoke=True) is None
    assert bench.output_path(tmp_path / "peak.json", cpu_smoke=True) == tmp_path / "peak.json"
